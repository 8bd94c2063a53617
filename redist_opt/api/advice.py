"""Which flattened groups to create: the set of at most k new groups that minimizes a
recorded step's modelled communication time.

Candidates are the sets of at least two mesh dims (of size > 1) of every recorded
mesh, taken in the order a communicator over them ranks its members
(``MeshSpec.rank_order``, ascending dims on a row-major mesh, the only order
``DeviceMesh._flatten`` builds), whose group does not exist yet. A candidate set
is priced by re-planning every recorded redistribution on the rank-free MeshSpec
of its mesh with those groups added as flattened, ``optimize(groups="existing")``,
and summing each plan's modelled time (``CostModel.plan_time``, as ``explain``
prices plans) times its count per step, plus, per new group, the cost model's
amortized creation time (``CostModel.group_creation_time``: one creation spread
over the run's expected reuse), so a group that saves nothing is never advised.
All subsets of size <= k are tried when there are at most :data:`EXACT_LIMIT` of
them, else groups are added greedily, the best first, while one still pays.

The "torch" column is what torch 2.13 ships: DTensor's plan after its merge pass
(``redist_opt.ir.torch_merge``), given the groups that pass can find, the root's
flattened meshes (a recording's ``"flattened"`` layouts; not the world group nor
an ``_unflatten`` view's root dims, which redist_opt uses and torch does not).

A group is identified by its layout in its root's rank space, so two recorded
meshes of one root (a mesh and its submesh) share it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Sequence

import torch

from redist_opt.api.planning import optimize
from redist_opt.debug import advice_report
from redist_opt.ir import layout as L
from redist_opt.ir.cost import CostModel, resolve
from redist_opt.ir.layout_algebra import FlatLayout
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.plan import make_plan
from redist_opt.ir.torch_merge import torch_merged_plan

__all__ = [
    "Advice",
    "Candidate",
    "advise",
    "candidates",
    "search",
    "greedy",
    "EXACT_LIMIT",
    "mesh_spec_of_record",
    "mesh_record_of_spec",
    "layout_of",
]

# Exact search over all subsets of size <= k up to this many subsets; greedy beyond.
EXACT_LIMIT = 2000


def layout_of(data) -> FlatLayout:
    """The layout of a record's ``[shape, stride]``."""
    shape, stride = data
    return FlatLayout(tuple(int(s) for s in shape), tuple(int(s) for s in stride))


def _torch_layouts_of_record(mesh: dict) -> tuple | None:
    """Layouts of the root's ``_flatten`` meshes, the groups torch's merge pass finds
    (None for recordings without their layouts: every existing group)."""
    flattened = mesh.get("flattened") or []
    if not all("layout" in f for f in flattened):
        return None
    return tuple(layout_of(f["layout"]) for f in flattened)


def mesh_spec_of_record(mesh: dict, extra_layouts: Iterable = ()) -> MeshSpec:
    """The rank-free MeshSpec of a recorded mesh, with ``extra_layouts`` also flattened
    (created as ``_flatten`` meshes, so torch's merge pass finds them too)."""
    existing = [layout_of(x) for x in mesh["existing"]]
    torch_layouts = _torch_layouts_of_record(mesh)
    return MeshSpec(
        sizes=tuple(mesh["sizes"]),
        names=None if mesh["names"] is None else tuple(mesh["names"]),
        flattened=tuple(existing) + tuple(extra_layouts),
        torch_flattened=None if torch_layouts is None else torch_layouts + tuple(extra_layouts),
        dim_layouts=tuple(layout_of(x) for x in mesh["dim_layouts"]),
        index_space=int(mesh["index_space"]),
        backend=mesh.get("backend"),
        ranks_ascending=bool(mesh.get("ranks_ascending", True)),
        preserve_rank_order=bool(mesh.get("preserve_rank_order", False)),
    )


def layout_json(layout) -> list:
    """A layout as a record writes it, ``[shape, stride]`` (the inverse of :func:`layout_of`)."""
    return [list(layout.shape), list(layout.stride)]


def _flattened_of_spec(spec: MeshSpec) -> list[dict]:
    """A rank-free spec's groups, described as the root's flattened meshes."""
    out = []
    for layout in spec.flattened_layouts:
        dims = L.dims_of_layout(layout, spec.dim_layouts, min_dims=2)
        named = None if dims is None else [spec.names[d] if spec.names else d for d in dims]
        out.append(
            {
                "name": "_".join(map(str, named)) if named else None,
                "root_dims": named,
                "layout": layout_json(layout),
            }
        )
    return out


def mesh_record_of_spec(
    spec: MeshSpec, root: dict | None = None, flattened: Sequence[dict] | None = None
) -> dict:
    """A recording's mesh entry for ``spec`` (``root``: the root mesh's sizes and names,
    default: the mesh itself; ``flattened``: the root's flattened meshes, default: every
    group ``spec`` lists, as a rank-free spec's groups are the ones the user flattened)."""
    names = None if spec.names is None else list(spec.names)
    if flattened is None:
        flattened = _flattened_of_spec(spec)
    return {
        "sizes": list(spec.sizes),
        "names": names,
        "dim_layouts": [layout_json(x) for x in spec.dim_layouts],
        "index_space": spec.index_space,
        "backend": spec.backend,
        "ranks_ascending": spec.ranks_ascending,
        "preserve_rank_order": spec.preserve_rank_order,
        "existing": sorted(layout_json(x) for x in spec.flattened_layouts),
        "root": root or {"sizes": list(spec.sizes), "names": names},
        "flattened": list(flattened),
    }


def _root_key(mesh: dict) -> tuple:
    root = mesh.get("root") or {}
    names = root.get("names")
    return (tuple(root.get("sizes") or ()), tuple(names) if names else None, mesh["index_space"])


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A flattened group that could be created: mesh dims of a recorded mesh."""

    mesh: int  # index of the first recorded mesh that has it
    dims: tuple[int, ...]
    names: tuple[str, ...] | None
    layout: FlatLayout
    root: tuple  # the root it belongs to (see _root_key)

    @property
    def label(self) -> str:
        return "+".join(self.names) if self.names else "+".join(map(str, self.dims))

    @property
    def code(self) -> str:
        """The line a user pastes to create it."""
        if self.names:
            return "mesh[" + ", ".join(json.dumps(n) for n in self.names) + "]._flatten()"
        return f"# mesh dims {self.dims} (the mesh has no dim names: name them to flatten it)"


def candidates(meshes: Sequence[dict]) -> list[Candidate]:
    """Every group of >= 2 dims of a recorded mesh that does not exist, once per root."""
    out: dict = {}
    for i, mesh in enumerate(meshes):
        spec = mesh_spec_of_record(mesh)
        real = [d for d, n in enumerate(spec.sizes) if n > 1]
        for k in range(2, len(real) + 1):
            for dims in itertools.combinations(real, k):
                order = spec.rank_order(dims)
                if order != dims:  # DeviceMesh flattens ascending dims, ranked ascending
                    continue
                group = spec.group(dims)
                if not group.layout.check_orthogonal() or spec.group_exists(group):
                    continue
                names = tuple(spec.names[d] for d in dims) if spec.names else None
                out.setdefault(
                    (_root_key(mesh), group.layout), Candidate(i, dims, names, group.layout, _root_key(mesh))
                )
    return list(out.values())


@dataclasses.dataclass
class _Row:
    collectives: int = 0
    nbytes: int = 0
    time: float = 0.0

    def add(self, plan, model, count: int) -> None:
        self.collectives += count * plan.num_collectives
        self.nbytes += count * plan.bytes_per_rank
        self.time += count * model.plan_time(plan)

    def to_dict(self) -> dict:
        return {"collectives": self.collectives, "bytes": self.nbytes, "time_s": self.time}


class _Planner:
    """Plans of the recorded redistributions under a set of new groups, cached."""

    def __init__(self, meshes, entries, cost, cost_source="given"):
        self.meshes = meshes
        self.entries = entries
        self.specs = [mesh_spec_of_record(m) for m in meshes]
        self.models = [(cost, cost_source) if cost is not None else resolve(s) for s in self.specs]
        self._cache: dict = {}

    def spec(self, mesh: int, chosen: Iterable[Candidate]) -> MeshSpec:
        extra = sorted({c.layout for c in chosen if c.root == _root_key(self.meshes[mesh])}, key=str)
        return self.specs[mesh].with_flattened(extra) if extra else self.specs[mesh]

    def plans(self, i: int, chosen: Iterable[Candidate]):
        """(naive, optimized) plan of entry ``i`` with ``chosen`` created, or None (not plannable)."""
        e = self.entries[i]
        spec = self.spec(e["mesh"], chosen)
        key = (i, spec)
        if key not in self._cache:
            self._cache[key] = self._plan(e, spec)
        return self._cache[key]

    def _plan(self, e, spec):
        if e.get("torch_only") or not all(isinstance(s, int) for s in e["shape"]):
            return None
        try:
            naive = make_plan(spec, e["src"], e["dst"], tuple(e["shape"]), getattr(torch, e["dtype"]))
        except RedistributeError:
            return None
        if naive.fallback:
            return None
        model = self.models[e["mesh"]][0]
        return naive, optimize(naive, groups="existing", cost=model)

    def step_time(self, chosen: Sequence[Candidate]) -> float:
        total = sum(self.creation_time(c) for c in chosen)
        for i, e in enumerate(self.entries):
            plans = self.plans(i, chosen)
            if plans is not None:
                total += e["count"] * self.models[e["mesh"]][0].plan_time(plans[1])
        return total

    def creation_time(self, c: Candidate) -> float:
        spec = self.specs[c.mesh]
        return self.models[c.mesh][0].group_creation_time(spec.group(c.dims), spec)


def search(planner: _Planner, pool: Sequence[Candidate], k: int) -> tuple[tuple[Candidate, ...], str]:
    """The best set of at most ``k`` of ``pool`` and how it was found ("exact" / "greedy")."""
    k = max(0, min(k, len(pool)))
    subsets = sum(math.comb(len(pool), j) for j in range(k + 1))
    if subsets <= EXACT_LIMIT:
        best, best_time = (), planner.step_time(())
        for j in range(1, k + 1):
            for combo in itertools.combinations(pool, j):
                t = planner.step_time(combo)
                if t < best_time:  # strictly better: fewer groups win ties
                    best, best_time = combo, t
        return best, "exact"
    return greedy(planner, pool, k), "greedy"


def greedy(planner: _Planner, pool: Sequence[Candidate], k: int) -> tuple[Candidate, ...]:
    """Add the group that lowers the step's time most, while one does, up to ``k``."""
    chosen: tuple[Candidate, ...] = ()
    current = planner.step_time(chosen)
    while len(chosen) < k:
        options = [(planner.step_time(chosen + (c,)), n, c) for n, c in enumerate(pool) if c not in chosen]
        if not options:
            break
        t, _, c = min(options, key=lambda o: (o[0], o[1]))
        if not t < current:
            break
        chosen, current = chosen + (c,), t
    return chosen


@dataclasses.dataclass
class Advice:
    """What :func:`advise` found; ``str()`` is the text report, :meth:`to_dict` the JSON,
    :meth:`to_svg` a bar chart of modelled time per call site before and after."""

    data: dict

    @property
    def groups(self) -> list[dict]:
        return self.data["groups"]

    @property
    def flatten_lines(self) -> list[str]:
        return [g["code"] for g in self.data["groups"]]

    def to_dict(self) -> dict:
        return self.data

    def __str__(self) -> str:
        return advice_report.format_text(self.data)

    def to_svg(self) -> str:
        return advice_report.render_svg(self.data)


def advise(
    meshes: Sequence[dict],
    entries: Sequence[dict],
    *,
    max_new_groups: int = 1,
    cost: CostModel | None = None,
    cost_source: str = "given",
) -> Advice:
    """The best set of at most ``max_new_groups`` new flattened groups for a recorded step
    (``Recording.meshes`` / ``.redistributions``), with per-site collectives, bytes and
    modelled time per step: torch (what torch 2.13 ships: DTensor's plan after its merge
    pass, given the root's flattened meshes), with the existing groups, with the
    advised groups, and torch alone with the advised groups (``"torch_advised"``)."""
    if max_new_groups < 0:
        raise RedistributeError(f"max_new_groups={max_new_groups} must be >= 0")
    planner = _Planner(list(meshes), list(entries), cost, cost_source)
    pool = candidates(planner.meshes)
    chosen, how = search(planner, pool, max_new_groups)
    data = {
        "format": "redist_opt.advice/1",
        "max_new_groups": max_new_groups,
        "search": how,
        "cost_models": sorted({f"{m.name} ({src})" for m, src in planner.models}),
        "candidates": [_candidate_dict(planner, c) for c in pool],
        "groups": [dict(_candidate_dict(planner, c), code=c.code) for c in chosen],
    }
    data.update(_site_table(planner, chosen))
    return Advice(data)


def _candidate_dict(planner: _Planner, c: Candidate) -> dict:
    mesh = planner.meshes[c.mesh]
    return {
        "mesh": c.mesh,
        "mesh_shape": "x".join(map(str, mesh["sizes"])),
        "dims": list(c.names) if c.names else list(c.dims),
        "label": c.label,
        "layout": L.format_layout(c.layout),
        "creation_time_s": planner.creation_time(c),
        "step_time_alone_s": planner.step_time((c,)),
    }


def _site_table(planner: _Planner, chosen: Sequence[Candidate]) -> dict:
    """Per call site and in total: torch / existing groups / advised groups / torch alone
    with the advised groups (its merge pass finds them too)."""
    sites: dict[str, dict] = {}
    totals = {k: _Row() for k in ("torch", "existing", "advised", "torch_advised")}
    for i, e in enumerate(planner.entries):
        label = e["site"]["label"]
        site = sites.setdefault(label, {"site": label, "calls": 0, "redistributions": [], "rows": None})
        site["calls"] += e["count"]
        rows = site["rows"] = site["rows"] or {k: _Row() for k in totals}
        before, after = planner.plans(i, ()), planner.plans(i, chosen)
        desc = f"{e['src']} -> {e['dst']} {tuple(e['shape'])} {e['dtype']} x{e['count']}"
        if before is None:
            desc += f" (runs through torch: {e.get('torch_only') or 'not planned by redist_opt'})"
        site["redistributions"].append(desc)
        if before is None:
            continue
        model = planner.models[e["mesh"]][0]
        # torch's shipped plan: its merge pass over the groups it finds (MeshSpec.torch_flattened)
        shipped = [torch_merged_plan(before[0]), torch_merged_plan(after[0])]
        pairs = (
            ("torch", shipped[0]),
            ("existing", before[1]),
            ("advised", after[1]),
            ("torch_advised", shipped[1]),
        )
        for key, plan in pairs:
            rows[key].add(plan, model, e["count"])
            totals[key].add(plan, model, e["count"])
    creation = sum(planner.creation_time(c) for c in chosen)
    out_sites = [dict(s, rows={k: r.to_dict() for k, r in s["rows"].items()}) for s in sites.values()]
    total = {k: r.to_dict() for k, r in totals.items()}
    total["advised"]["group_creation_s"] = creation
    return {"sites": out_sites, "total": total}
