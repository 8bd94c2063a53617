"""A model of torch 2.13's redistribute *with* its merge pass, on our step lists,
plus the execution helpers the public-case and property tests share.

``torch_model(plan, flattened)`` answers: given the same flattened meshes, which
collectives does ``DTensor.redistribute`` (torch 2.13, merge pass ON) issue for
the redistribution of ``plan``, and how many bytes does each rank feed them?
It replays ``torch.distributed.tensor._redistribute._optimize_transform_infos``
on ``plan.steps`` (which replay torch's greedy planner, one step per mesh dim,
size-1 mesh dims included, as torch's transform infos) and lowers the result
with ``redist_opt.ir.lower.lower_steps``, so its ``Plan`` (``plan.replace(graph=...)``)
reports collectives and bytes exactly as our optimized plans do.

torch's rules, as read in torch/distributed/tensor/_redistribute.py (2.13.0):

1. only *consecutive* transforms merge; a run is the maximal sequence of
   transforms with a mergeable comm type (all_reduce, reduce_scatter,
   all_gather; never all_to_all, never local ops) whose ``src_dst_placements``
   are mergeable with the run's *first* one (equal, or sum/avg partials with the
   same destination);
2. all-or-nothing: the whole run becomes one collective or none of it does;
3. a flattened mesh whose layout equals the collapsed layout of the run's mesh
   dims *sorted ascending* must exist in the root's ``_flatten_mapping`` (never
   the world group, never created; the mesh needs dim names);
4. reduce_scatter runs must be in ascending mesh-dim order, all_gather runs in
   descending order ("non_ascending_mesh_dims" otherwise);
5. reduce_scatter: the outermost transform's logical size of the scattered dim
   must be divisible by the product of the run's mesh-dim sizes. That logical
   size is computed with the *calling rank's* coordinate, so the decision can
   differ between ranks (it is uniform within each flattened group): the model
   then returns one variant per class of ranks;
6. all_gather: no evenness check (hence the wrong result of pytorch PR 194457
   for uneven nested shards; the bytes torch moves equal the correct lowering's,
   ceil(ceil(L/a)/b) == ceil(L/(a*b)), so lowering the merged step with our
   ``lower_step`` counts them exactly).

The model is validated against torch's real ``CommDebugMode`` counts in
``test_public_cases.py::test_torch_merge_model_matches_torch``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence

import torch
from harness import (
    collective_kind,
    global_reference,
    local_slice,
    local_tensors,
    normalize,
    pstr,
    rank_coordinates,
)
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor._redistribute import (
    disable_redistribute_transform_optimization,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.placement_types import Partial, Placement, Shard

import redist_opt
from redist_opt import ir
from redist_opt.ir import symbolic as sym
from redist_opt.ir.lower import lower_steps
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.plan import Plan

__all__ = [
    "TorchModel",
    "signature",
    "torch_flattened_layouts",
    "torch_merged_steps",
    "torch_model",
]

_MERGEABLE = ("all_gather", "all_reduce", "reduce_scatter")


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------


def torch_flattened_layouts(device_mesh) -> frozenset:
    """Collapsed layouts of the flattened meshes torch's merge pass can find
    (``root._flatten_mapping``): not the world group, not the root's own dims."""
    root = device_mesh._get_root_mesh()
    return frozenset(flat._layout.collapse() for flat in root._flatten_mapping.values())


def _layouts_of(mesh: MeshSpec, flattened) -> frozenset:
    if flattened is None:
        return frozenset(mesh.flattened_layouts)
    out = set()
    for g in flattened:
        if hasattr(g, "check_orthogonal"):  # already a layout
            out.add(g)
        else:
            out.add(mesh.group(tuple(sorted(mesh.dims_of(g)))).layout)
    return frozenset(out)


def _comm_type(step: ir.StepInfo) -> str | None:
    kind = step.kind
    return kind if kind in _MERGEABLE else None


def _placements_mergeable(a: ir.StepInfo, b: ir.StepInfo) -> bool:
    """torch's ``are_placements_mergeable(p1, p2)``."""
    if (a.src, a.dst) == (b.src, b.dst):
        return True
    if a.dst != b.dst or not (a.src.is_partial() and b.src.is_partial()):
        return False
    return a.src.reduce_op in ("sum", "avg") and b.src.reduce_op in ("sum", "avg")


def _runs(steps: Sequence[ir.StepInfo]) -> list[tuple[int, int]]:
    """(start, end) of every run torch's loop forms (single steps included)."""
    out, i = [], 0
    while i < len(steps):
        if _comm_type(steps[i]) is None:
            out.append((i, i + 1))
            i += 1
            continue
        j = i + 1
        while (
            j < len(steps)
            and _comm_type(steps[j]) is not None
            and _placements_mergeable(steps[j], steps[i])
        ):
            j += 1
        out.append((i, j))
        i = j
    return out


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """A run's fate: merged (True/False) or, for reduce_scatter evenness, an
    expression whose divisibility by ``n`` decides it per rank."""

    merged: bool | None
    why: str
    expr: object = None
    n: int = 1


def _verdict(mesh: MeshSpec, run: Sequence[ir.StepInfo], layouts: frozenset) -> _Verdict:
    if len(run) < 2:
        return _Verdict(False, "too_few_transforms")
    kind = run[0].kind
    dims = tuple(s.mesh_dims[0] for s in run)
    sorted_dims = tuple(sorted(dims))
    if kind == "reduce_scatter" and dims != sorted_dims:
        return _Verdict(False, "non_ascending_mesh_dims")
    if kind == "all_gather" and dims != sorted_dims[::-1]:
        return _Verdict(False, "non_ascending_mesh_dims")
    if mesh.names is None:
        return _Verdict(False, "no_flattened_mesh (mesh has no dim names)")
    if mesh.group(sorted_dims).layout not in layouts:
        return _Verdict(False, "no_flattened_mesh")
    if kind == "reduce_scatter":
        outer = min(run, key=lambda s: s.mesh_dims[0])
        expr = outer.logical_shape[outer.dst.dim]
        n = math.prod(mesh.sizes[d] for d in dims)
        values = sym.possible_values(expr, mesh.sizes)
        even = {v % n == 0 for v in values}
        if even == {True}:
            return _Verdict(True, "merged")
        if even == {False}:
            return _Verdict(False, "uneven_tensor_shape")
        return _Verdict(None, "rank-dependent evenness", expr, n)
    return _Verdict(True, "merged")


def _merged_step(mesh: MeshSpec, run: Sequence[ir.StepInfo]) -> ir.StepInfo:
    dims = tuple(sorted(s.mesh_dims[0] for s in run))
    # torch keeps the outermost transform's logical shape (the largest on the
    # affected dim: logical shapes shrink monotonically along the mesh dims).
    outer = min(run, key=lambda s: s.mesh_dims[0])
    src = run[0].src
    scale = 1
    if src.is_partial():
        src = Partial(src.reduce_op)
        if len({s.src.reduce_op for s in run}) > 1:
            # torch runs a sum+avg mix as a sum, then divides by avg_scale (the
            # sizes of the avg dims); the count and bytes do not depend on it.
            src = Partial("sum")
            scale = math.prod(mesh.sizes[s.mesh_dims[0]] for s in run if s.src.reduce_op == "avg")
    return ir.StepInfo(run[0].index, dims, src, run[0].dst, outer.logical_shape, scale)


def torch_merged_steps(
    mesh: MeshSpec,
    steps: Sequence[ir.StepInfo],
    flattened=None,
    coords: Sequence[int] | None = None,
) -> list[ir.StepInfo]:
    """torch's ``_optimize_transform_infos`` on ``steps`` for the rank at ``coords``
    (only needed when a reduce_scatter's evenness depends on the rank)."""
    layouts = _layouts_of(mesh, flattened)
    out: list[ir.StepInfo] = []
    for start, end in _runs(steps):
        run = list(steps[start:end])
        v = _verdict(mesh, run, layouts)
        merged = v.merged
        if merged is None:
            if coords is None:
                raise ValueError("reduce_scatter evenness depends on the rank: pass coords")
            merged = sym.evaluate(v.expr, tuple(coords)) % v.n == 0
        if merged:
            out.append(_merged_step(mesh, run))
        else:
            out.extend(run)
    return out


@dataclasses.dataclass(frozen=True)
class TorchModel:
    """What torch 2.13 (merge ON) runs: one Plan per class of ranks (usually one)."""

    variants: tuple[Plan, ...]
    why: tuple[str, ...]  # per run: merged / reason it was not

    @property
    def uniform(self) -> bool:
        return len(self.variants) == 1

    @property
    def plan(self) -> Plan:
        assert self.uniform, "torch's plan depends on the rank here; use .variants"
        return self.variants[0]

    @property
    def min_collectives(self) -> int:
        return min(v.num_collectives for v in self.variants)

    @property
    def min_bytes_per_rank(self) -> int:
        return min(v.bytes_per_rank for v in self.variants)

    def describe(self) -> str:
        return " | ".join(" ".join(signature(v)) or "(none)" for v in self.variants)


def _lower(plan: Plan, steps: Sequence[ir.StepInfo]) -> Plan:
    mesh = plan.mesh
    gm = lower_steps(mesh, steps, ir.local_shape(plan.shape, plan.src, mesh.sizes))
    # the model's own sanity: the lowering ends in the destination's local shape
    ir.verify(gm, mesh.sizes, ir.local_shape(plan.shape, plan.dst, mesh.sizes))
    return plan.replace(graph=gm, steps=tuple(steps), applied_passes=("torch-2.13-merge",), notes=())


def torch_model(plan: Plan, flattened=None) -> TorchModel:
    """The torch 2.13 plan for ``plan``'s redistribution given ``flattened``
    (dim groups like ``("a", "c")``, or layouts; default: ``plan.mesh``'s own
    flattened groups, which for a rank-free ``MeshSpec`` are exactly the ones
    it was given; a MeshSpec read off a DeviceMesh also lists the world group
    and the root's dims, which torch's merge pass does not use: pass
    ``torch_flattened_layouts(device_mesh)`` for those)."""
    assert not plan.fallback, "fallback plans are not modelled"
    mesh = plan.mesh
    layouts = _layouts_of(mesh, flattened)
    steps = list(plan.steps)
    verdicts = [
        (start, end, _verdict(mesh, steps[start:end], layouts)) for start, end in _runs(steps)
    ]
    why = tuple(v.why for s, e, v in verdicts if e - s > 1)
    open_ = [v for _, _, v in verdicts if v.merged is None]
    if not open_:
        return TorchModel((_lower(plan, torch_merged_steps(mesh, steps, layouts)),), why)
    # rank-dependent: enumerate the coordinates the open decisions depend on
    free = sorted({int(s.name[1:]) for v in open_ for s in v.expr.free_symbols})
    variants: dict[tuple, Plan] = {}
    for values in itertools.product(*(range(mesh.sizes[d]) for d in free)):
        coords = [0] * mesh.ndim
        for d, c in zip(free, values):
            coords[d] = c
        merged = torch_merged_steps(mesh, steps, layouts, coords)
        key = tuple((s.mesh_dims, s.kind) for s in merged)
        if key not in variants:
            variants[key] = _lower(plan, merged)
    return TorchModel(tuple(variants.values()), why)


def signature(plan: Plan) -> list[str]:
    """``kind[op](a+c)`` per collective, in order."""
    out = []
    for c in plan.collectives():
        op = f"[{c.reduce_op}]" if c.reduce_op else ""
        out.append(f"{c.kind}{op}({c.group.name(plan.mesh)})")
    return out


# ----------------------------------------------------------------------------
# Execution helpers (LocalTensorMode on the fake backend)
# ----------------------------------------------------------------------------


def int_input(mesh, lm: LocalTensorMode, src: Sequence[Placement], shape, dtype, seed: int, coords=None):
    """A DTensor with placements ``src`` holding small integers (exact sums in
    float32/float64). Partial ranks hold different integers that depend only on
    their coordinates along the non-Replicate mesh dims (replicas identical).
    Returns (dtensor, {rank: coords}). Must run inside ``lm``; ``coords`` (the
    ranks' mesh coordinates) may be passed to save recomputing them."""
    ndim = len(shape)
    src_n = [normalize(p, ndim) for p in src]
    with lm.disable():
        g = torch.randint(-8, 9, tuple(shape), generator=torch.Generator().manual_seed(seed)).to(dtype)
    base = [Replicate() if p.is_partial() else p for p in src_n]
    if coords is None:
        coords = rank_coordinates(mesh, lm)
    mesh_shape = tuple(mesh.shape)
    if all(type(p) in (Replicate, Shard) for p in base):
        # default-order nested torch.chunk sharding (the harness's local_slice,
        # itself checked against torch by the harness's oracle-sanity tests)
        with lm.disable():
            base_locals = {r: g[local_slice(shape, base, mesh_shape, coords[r])].clone() for r in lm.ranks}
    else:  # e.g. _StridedShard: let torch lay it out
        d0 = distribute_tensor(lm.rank_map(lambda r: g.clone()), mesh, base, src_data_rank=None)
        base_locals = d0._local_tensor._local_tensors
    partial = any(p.is_partial() for p in src_n)

    def make_local(r):
        t = base_locals[r].clone().contiguous()
        if partial:
            key = tuple(c if not isinstance(p, Replicate) else 0 for c, p in zip(coords[r], src_n))
            gen = torch.Generator().manual_seed(hash((seed,) + key) & 0x7FFFFFFF)
            t = t + torch.randint(-8, 9, tuple(t.shape), generator=gen).to(dtype)
        return t

    dt = DTensor.from_local(
        lm.rank_map(make_local), mesh, list(src), run_check=False,
        shape=torch.Size(shape), stride=g.stride(),
    )
    return dt, coords


@dataclasses.dataclass
class Run:
    out: DTensor | None = None
    error: BaseException | None = None
    total: int = 0
    kinds: dict = dataclasses.field(default_factory=dict)

    def describe_error(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


def _counted(fn) -> Run:
    r = Run()
    with CommDebugMode() as cdm:
        try:
            r.out = fn()
        except Exception as e:  # noqa: BLE001
            r.error = e
    for k, v in cdm.get_comm_counts().items():
        if v:
            kind = collective_kind(k)
            r.kinds[kind] = r.kinds.get(kind, 0) + v
    r.total = cdm.get_total_counts()
    return r


def run_oracle(dt: DTensor, dst) -> Run:
    def fn():
        with disable_redistribute_transform_optimization():
            return dt.redistribute(dt.device_mesh, list(dst))
    return _counted(fn)


def run_torch_merged(dt: DTensor, dst) -> Run:
    """torch 2.13 as shipped: merge pass ON."""
    def fn():
        with disable_redistribute_transform_optimization(False):
            return dt.redistribute(dt.device_mesh, list(dst))
    return _counted(fn)


def run_ours(dt: DTensor, dst, **kwargs) -> Run:
    return _counted(lambda: redist_opt.redistribute(dt, list(dst), **kwargs))


def _tol(dtype) -> dict:
    return {
        torch.float64: {"rtol": 1e-12, "atol": 1e-12},
        torch.float32: {"rtol": 1e-6, "atol": 1e-6},
    }.get(dtype, {"rtol": 1e-2, "atol": 1e-2})


def assert_same_locals(got: DTensor, want: DTensor, *, exact: bool, who: str = "redist_opt") -> None:
    """Same placements, shape, stride, dtype; every rank's local tensor equal
    (bitwise when ``exact``, else torch.testing.assert_close with tight tolerances)."""
    assert isinstance(got, DTensor), f"{who} returned {type(got).__name__}"
    assert tuple(got.placements) == tuple(want.placements), (
        f"placements: {who} {tuple(map(pstr, got.placements))} != {tuple(map(pstr, want.placements))}"
    )
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    lg, lw = local_tensors(got), local_tensors(want)
    assert set(lg) == set(lw), f"ranks {sorted(lg)} != {sorted(lw)}"
    for r in sorted(lw):
        a, b = lg[r], lw[r]
        assert a.shape == b.shape, f"rank {r}: local shape {who} {tuple(a.shape)} != {tuple(b.shape)}"
        if exact:
            assert torch.equal(a, b), f"rank {r}: {who} local\n{a}\n!= expected\n{b}"
        else:
            torch.testing.assert_close(a, b, **_tol(a.dtype), msg=lambda m, r=r: f"rank {r}: {who}: {m}")


def assert_replicas_equal(out: DTensor, coords: dict, mesh_shape) -> None:
    """Ranks that hold replicas (same coordinates on every non-Replicate mesh dim
    of the output) hold bitwise-equal local tensors."""
    locs = local_tensors(out)
    keep = [d for d, p in enumerate(out.placements) if not isinstance(p, Replicate)]
    groups: dict[tuple, list[int]] = {}
    for r, c in coords.items():
        groups.setdefault(tuple(c[d] for d in keep), []).append(r)
    for ranks in groups.values():
        first = locs[ranks[0]]
        for r in ranks[1:]:
            assert locs[r].shape == first.shape and torch.equal(locs[r], first), (
                f"replicas differ: rank {r} != rank {ranks[0]} (output "
                f"{tuple(map(pstr, out.placements))}, replica group {ranks})"
            )


def assert_matches_reference(out: DTensor, dt: DTensor, coords: dict, shape, src, exact: bool) -> None:
    """``out`` against the independent reference (the harness's global_reference)."""
    from harness import Input

    inp = Input(dt, dt.device_mesh, None, coords, tuple(normalize(p, len(shape)) for p in src), {})
    ref = global_reference(inp, shape)
    assert ref is not None
    dst_n = tuple(normalize(p, len(shape)) for p in out.placements)
    for r, c in coords.items():
        got = local_tensors(out)[r]
        want = ref[local_slice(shape, dst_n, tuple(dt.device_mesh.shape), c)].to(got.dtype)
        assert got.shape == want.shape, f"rank {r}: local shape {tuple(got.shape)} != reference {tuple(want.shape)}"
        if exact:
            assert torch.equal(got, want), f"rank {r}: local\n{got}\n!= reference\n{want}"
        else:
            torch.testing.assert_close(got, want, **_tol(got.dtype))


# ----------------------------------------------------------------------------
# Meshes with a chosen set of flattened groups
# ----------------------------------------------------------------------------


class MeshPool:
    """Root meshes by sizes, each created once, and their flattened meshes by
    dim set, each flattened once. ``use(sizes, flattened, lm)`` yields the root with *exactly*
    ``flattened`` in its ``_flatten_mapping`` (what both torch's merge pass and
    redist_opt's ``groups="existing"`` consult) and restores it afterwards;
    groups created meanwhile (``groups="create"``) are kept for later reuse.
    """

    def __init__(self) -> None:
        self.roots: dict[tuple, object] = {}
        self.flats: dict[tuple, dict] = {}  # sizes -> {dims: flattened mesh}
        self.coords: dict[tuple, dict] = {}  # sizes -> {rank: coordinates}

    @staticmethod
    def names(n: int) -> tuple[str, ...]:
        return tuple("abcd"[:n])

    def root(self, sizes: tuple[int, ...], lm: LocalTensorMode):
        if sizes not in self.roots:
            # Built with LocalTensorMode disabled (~100x faster): under the mode
            # DeviceMesh.get_coordinate is patched to compute every simulated
            # rank's coordinate from the layout, whoever built the mesh. (The
            # property test cross-checks the oracle against an independent
            # reference, which would catch a mesh the simulation misreads.)
            with lm.disable():
                self.roots[sizes] = init_device_mesh("cpu", sizes, mesh_dim_names=self.names(len(sizes)))
            self.flats[sizes] = {}
            self.coords[sizes] = rank_coordinates(self.roots[sizes], lm)
        return self.roots[sizes]

    @contextlib.contextmanager
    def use(self, sizes: tuple[int, ...], flattened: Iterable[tuple[int, ...]], lm: LocalTensorMode):
        root = self.root(sizes, lm)
        names = self.names(len(sizes))
        mapping = root._flatten_mapping
        saved = dict(mapping)
        mapping.clear()
        pool = self.flats[sizes]
        for dims in flattened:
            if dims not in pool:
                with lm.disable():
                    pool[dims] = root[tuple(names[d] for d in dims)]._flatten()
            fm = pool[dims]
            mapping[fm.mesh_dim_names[0]] = fm
        wanted = dict(mapping)
        try:
            yield root
        finally:
            for name, fm in mapping.items():
                parts = name.split("_")
                # Created by groups="create" through DeviceMesh._flatten ("a_b"): keep for
                # reuse. Groups redist_opt builds from a layout have other names: not pooled.
                if name not in wanted and all(p in names for p in parts):
                    pool.setdefault(tuple(names.index(x) for x in parts), fm)
            mapping.clear()
            mapping.update(saved)
