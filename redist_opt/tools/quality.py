"""Quality benchmark: redist_opt against torch 2.13's shipped redistribute on a corpus.

For every case of ``fixtures/corpus.json`` (real parallelism layouts: FSDP/HSDP,
TP/SP, CP, 4-D torchtitan meshes, EP, grad-norm clipping, loss reductions,
jagged meshes, uneven shapes) the benchmark reports collectives, bytes per rank
and modelled time of

* **torch**: ``DTensor.redistribute`` as shipped (its transform-merge pass ON),
  run under ``LocalTensorMode`` on the ``fake`` backend over a DeviceMesh that has
  the case's flattened groups (``DeviceMesh._flatten``), every collective recorded
  by a ``CommDebugMode`` subclass (kind, process group -> mesh dims, bytes each
  rank feeds in);
* **existing**: ``redist_opt.optimize(plan, groups="existing")``;
* **create**: ``redist_opt.optimize(plan, groups="create")``.

Comparison rule ("worse"): a policy is worse than torch on a case when it issues
more collectives, OR more bytes per rank, OR more modelled time (the same
:class:`~redist_opt.ir.cost.CostModel` prices both sides: ``collective_time`` summed
over the collectives; the one-off cost of creating a group is left out).

Scaling. LocalTensorMode keeps every rank's tensors in this process, so torch
runs on a *simulation shape*: each tensor dim that no mesh dim shards (in src or
dst) becomes 1, each evenly sharded dim becomes the product M of the mesh sizes
sharding it, and unevenly sharded dims keep their real size. Every local chunk
of every collective then scales by the same integer factor (chunk sizes are L/n
with n | M on scaled dims and identical on kept dims), and torch's decisions
(which depend only on divisibility) are unchanged, so torch's bytes at the real
shape are the recorded bytes times that factor. Our numbers come from plans of
the real shape (planning is rank-free); with ``verify=True`` our plans of the
simulation shape are also executed and must issue exactly the collectives and
bytes they claim, which checks that plan bytes and recorded bytes count alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "CATEGORIES",
    "CorpusCase",
    "DEFAULT_CORPUS",
    "load_corpus",
    "quality_bench",
    "format_quality",
    "find_worse",
    "add_quality_arguments",
    "cmd_quality",
]

DEFAULT_CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "corpus.json")

CATEGORIES = ("fsdp", "hsdp", "tp", "cp", "4d", "ep", "grad_norm", "loss", "jagged", "uneven")
POLICIES = ("existing", "create")
RESULT_FORMAT = "redist_opt.tools.quality/1"
_FIELDS = ("id", "category", "source", "why", "mesh", "flatten", "src", "dst", "shape", "dtype")
# Simulated process-group world: larger than any corpus mesh, so no case's mesh is
# the default (world) group and the groups that exist are exactly the case's
# mesh dims and flattened meshes, for torch and for us alike.
SIM_WORLD = 128


# -- corpus -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CorpusCase:
    id: str
    category: str
    source: str
    why: str
    mesh: str
    flatten: tuple[str, ...]
    src: str
    dst: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def num_ranks(self) -> int:
        return math.prod(self.spec().sizes)

    def spec(self):
        """The rank-free MeshSpec, built as ``redist-opt explain`` builds it."""
        from redist_opt.tools.cli import CliError, _explain_mesh
        from redist_opt.ir.placements import RedistributeError

        try:
            return _explain_mesh(self.mesh, list(self.flatten))
        except (CliError, RedistributeError) as e:
            raise ValueError(f"corpus case {self.id!r}: {e}") from None

    def torch_dtype(self):
        import torch

        dt = getattr(torch, self.dtype, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"corpus case {self.id!r}: unknown dtype {self.dtype!r}")
        return dt

    def placements(self):
        """(src, dst) as normalized torch placements (raises ValueError naming the case)."""
        from redist_opt.ir.placements import RedistributeError, normalize_placements, parse_placements

        spec = self.spec()
        out = []
        try:
            for text, role in ((self.src, "source"), (self.dst, "target")):
                ps = parse_placements(text)
                if len(ps) != spec.ndim:
                    raise RedistributeError(
                        f"{role} placements {text!r} have {len(ps)} entries for a {spec.ndim}-D mesh"
                    )
                # One mesh dim at a time: mixed reduce ops (P(avg) beside P) are valid
                # torch placements even where redist_opt refuses them.
                out.append(tuple(
                    normalize_placements([p], mesh_shape=(n,), tensor_ndim=len(self.shape), role=role)[0]
                    for p, n in zip(ps, spec.sizes)
                ))
        except RedistributeError as e:
            raise ValueError(f"corpus case {self.id!r}: {e}") from None
        return tuple(out)

    def sim_shape(self) -> tuple[tuple[int, ...], int]:
        """(simulation shape, integer factor real bytes / simulated bytes); see the module doc."""
        src, dst = self.placements()
        sizes = self.spec().sizes
        sim = []
        for d, length in enumerate(self.shape):
            m = math.prod(
                n for n, a, b in zip(sizes, src, dst)
                if any(p.is_shard() and p.dim == d for p in (a, b))
            )
            if m == 1:
                sim.append(min(length, 1))
            elif length % m == 0:
                sim.append(m)
            else:
                sim.append(length)
        sim_numel, numel = math.prod(sim), math.prod(self.shape)
        return tuple(sim), (numel // sim_numel if sim_numel else 1)


def _case_from_dict(raw: dict, where: str) -> CorpusCase:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a case must be a JSON object")
    missing = [f for f in _FIELDS if f not in raw]
    if missing:
        raise ValueError(f"{where} ({raw.get('id', '?')}): missing field(s) {missing}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where} ({raw['id']}): unknown field(s) {unknown}")
    for f in ("id", "category", "source", "why", "mesh", "src", "dst", "dtype"):
        if not isinstance(raw[f], str) or not raw[f].strip():
            raise ValueError(f"{where} ({raw.get('id')}): field {f!r} must be a non-empty string")
    if raw["category"] not in CATEGORIES:
        raise ValueError(f"{where} ({raw['id']}): category {raw['category']!r} is not one of {CATEGORIES}")
    if not isinstance(raw["flatten"], list) or not all(isinstance(g, str) and "+" in g for g in raw["flatten"]):
        raise ValueError(f"{where} ({raw['id']}): flatten must be a list of dims joined by '+', e.g. [\"dp+cp\"]")
    shape = raw["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise ValueError(f"{where} ({raw['id']}): shape must be a list of positive integers")
    case = CorpusCase(
        id=raw["id"], category=raw["category"], source=raw["source"], why=raw["why"], mesh=raw["mesh"],
        flatten=tuple(raw["flatten"]), src=raw["src"], dst=raw["dst"], shape=tuple(shape), dtype=raw["dtype"],
    )
    spec = case.spec()  # mesh and flattened groups parse
    for g in case.flatten:
        if len(spec.dims_of(g)) < 2:
            raise ValueError(f"{where} ({case.id}): flattened group {g!r} names fewer than 2 dims")
    case.placements()  # placements parse for this mesh and tensor rank
    case.torch_dtype()
    return case


def load_corpus(path: str | os.PathLike | None = None) -> list[CorpusCase]:
    """Read and validate a corpus file (default ``fixtures/corpus.json``)."""
    path = os.fspath(path or DEFAULT_CORPUS)
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"corpus {path!r} is not valid JSON: {e}") from None
    raw_cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(raw_cases, list):
        raise ValueError(f"corpus {path!r}: expected an object with a 'cases' list")
    cases = [_case_from_dict(raw, f"corpus {os.path.basename(path)} case {i}") for i, raw in enumerate(raw_cases)]
    dup = sorted(i for i, n in Counter(c.id for c in cases).items() if n > 1)
    if dup:
        raise ValueError(f"corpus {path!r}: duplicate case id(s) {dup}")
    return cases


# -- torch's side: run and record -----------------------------------------------------


def _kind(op) -> str | None:
    name = str(op).split(".")[-1].lower()
    for kind, keys in (
        ("all_to_all", ("alltoall", "all_to_all")),
        ("all_gather", ("all_gather", "allgather")),
        ("reduce_scatter", ("reduce_scatter",)),
        ("all_reduce", ("all_reduce", "allreduce")),
    ):
        if any(k in name for k in keys):
            return kind
    return None


def _recorder_class():
    import torch
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

    class Recorder(CommDebugMode):
        """CommDebugMode that also keeps (kind, group name, max input bytes over ranks) per collective."""

        def __init__(self):
            super().__init__()
            self.calls: list[tuple[str, str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
                return out
            packet = func._overloadpacket
            if packet in self.comm_registry or packet in c10d_collective_ops:
                kwargs = kwargs or {}
                group = kwargs.get("group_name")
                if group is None:
                    group = next((a for a in reversed(args) if isinstance(a, str)), None)
                self.calls.append((_kind(packet) or str(packet), group, _max_bytes(args[0])))
            return out

    return Recorder


def _max_bytes(t) -> int:
    from torch.distributed._local_tensor import LocalTensor

    if isinstance(t, LocalTensor):
        tensors = list(t._local_tensors.values())
    else:
        tensors = [t]
    return max(x.numel() * x.element_size() for x in tensors)


def _ensure_fake_pg() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=SIM_WORLD)


def _build_mesh(case: CorpusCase, lm):
    from torch.distributed.device_mesh import init_device_mesh

    spec = case.spec()
    with lm.disable():
        mesh = init_device_mesh("cpu", spec.sizes, mesh_dim_names=spec.names)
        for g in case.flatten:
            mesh[tuple(spec.names[d] for d in sorted(spec.dims_of(g)))]._flatten()
    return mesh


def _coords(rank: int, sizes: Sequence[int]) -> tuple[int, ...]:
    out = []
    for n in reversed(sizes):
        out.append(rank % n)
        rank //= n
    return tuple(reversed(out))


def _local_slice(shape, placements, sizes, coord) -> tuple[slice, ...]:
    """DTensor's default-order layout: mesh dims left to right, torch.chunk pieces."""
    start, size = [0] * len(shape), list(shape)
    for i, p in enumerate(placements):
        if p.is_shard():
            d, n = p.dim, sizes[i]
            full = -(-size[d] // n) if size[d] else 0
            lo, hi = min(coord[i] * full, size[d]), min((coord[i] + 1) * full, size[d])
            start[d] += lo
            size[d] = hi - lo
    return tuple(slice(s, s + z) for s, z in zip(start, size))


def _input(mesh, lm, src, shape, dtype):
    """A valid DTensor with placements ``src`` holding small integers (exact in any dtype)."""
    import torch
    from torch.distributed.tensor import DTensor

    sizes = tuple(mesh.shape)
    with lm.disable():
        g = (torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) % 7).to(dtype)
    has_partial = any(p.is_partial() for p in src)

    def local(r: int):
        c = _coords(r, sizes)
        t = g[_local_slice(shape, src, sizes, c)].clone().contiguous()
        if has_partial:  # differs across partial ranks, equal across replicas
            key = sum(x for x, p in zip(c, src) if not p.is_replicate())
            t = t + (key % 3)
        return t

    return DTensor.from_local(lm.rank_map(local), mesh, list(src), run_check=False,
                              shape=torch.Size(shape), stride=g.stride())


def _group_table(spec) -> dict:
    """Sorted rank tuple of the group through rank 0 -> MeshGroup (ascending dims)."""
    real = [d for d, n in enumerate(spec.sizes) if n > 1]
    table = {}
    for k in range(1, len(real) + 1):
        for dims in itertools.combinations(real, k):
            ranks = tuple(
                r for r in range(spec.num_ranks)
                if all(c == 0 for d, c in enumerate(_coords(r, spec.sizes)) if d not in dims)
            )
            table[ranks] = spec.group(dims)
    return table


def _ranks_of(name) -> tuple[int, ...]:
    """Sorted ranks of the process group ``name`` (under the fake backend: rank 0's group)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    return tuple(sorted(dist.get_process_group_ranks(_resolve_process_group(name))))


def _group_of(name, table):
    ranks = _ranks_of(name)
    if ranks not in table:
        raise RuntimeError(f"torch used a process group over ranks {ranks} that is no group of the mesh")
    return table[ranks]


def _disable_torch_warnings():
    # torch warns on each unmerged run ("N sequential all_reduce ... flatten mesh dims").
    for name in ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._collective_utils"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _run_torch(case: CorpusCase, model, verify: bool) -> tuple[dict, dict]:
    """torch's shipped redistribute at the simulation shape; and (if verify) our sim plans run."""
    from torch.distributed._local_tensor import LocalTensorMode

    spec = case.spec()
    src, dst = case.placements()
    sim, scale = case.sim_shape()
    dtype = case.torch_dtype()
    recorder = _recorder_class()
    checks: dict = {}
    with LocalTensorMode(spec.num_ranks) as lm:
        mesh = _build_mesh(case, lm)
        table = _group_table(spec)
        dt = _input(mesh, lm, src, sim, dtype)
        try:
            with recorder() as rec:
                dt.redistribute(mesh, list(dst))
            row = dict(status="ok")
        except Exception as e:  # noqa: BLE001 - torch refusing is a result
            row = dict(status="error", reason=f"{type(e).__name__}: {e}".splitlines()[0])
        if row["status"] == "ok":
            ops = []
            for kind, group_name, nbytes in rec.calls:
                group = _group_of(group_name, table)
                real_bytes = nbytes * scale
                ops.append((kind, group, real_bytes))
            if rec.get_total_counts() != len(rec.calls):
                raise RuntimeError(
                    f"{case.id}: CommDebugMode counted {rec.get_total_counts()} collectives, "
                    f"the recorder {len(rec.calls)}"
                )
            row.update(
                collectives=rec.get_total_counts(),
                bytes=sum(b for _, _, b in ops),
                time=sum(model.collective_time(k, g, b, spec) for k, g, b in ops),
                ops=[_op_str(k, g, b, spec) for k, g, b in ops],
            )
        if verify:
            # Our plans of the simulation shape, executed: they must issue what they claim.
            checks = _verify_ours(spec, src, dst, sim, dtype, model, dt, mesh, recorder)
    return row, checks


def _verify_ours(spec, src, dst, sim, dtype, model, dt, mesh, recorder) -> dict:
    """Execute our plans of the simulation shape: they must issue exactly the collectives
    (kind and ranks, in order) and the bytes they claim."""
    from redist_opt.api import planning as api
    from redist_opt.ir.layout import rank_lists
    from redist_opt.ir.placements import RedistributeError
    from redist_opt.runtime.execute import execute

    try:
        naive = api.plan(spec, src, dst, shape=sim, dtype=dtype)
    except RedistributeError:  # reported by the plan side
        return {}
    if naive.fallback:
        return {}
    checks = {}
    for policy in POLICIES:
        p = api.optimize(naive, groups=policy, cost=model)
        with recorder() as rec:
            execute(p.graph, dt._local_tensor, mesh, groups=policy)
        got = dict(
            collectives=[(k, list(_ranks_of(g))) for k, g, _ in rec.calls],
            bytes=sum(b for _, _, b in rec.calls),
        )
        want = dict(
            collectives=[
                (c.kind, sorted(rank_lists(c.group.layout, spec.index_space, limit=1)[0]))
                for c in p.collectives()
            ],
            bytes=p.bytes_per_rank,
        )
        checks[policy] = dict(ok=got == want and rec.get_total_counts() == len(rec.calls),
                              executed=got, planned=want)
    return checks


# -- our side: plans of the real shape --------------------------------------------------


def _op_str(kind, group, nbytes, spec) -> str:
    short = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A"}[kind]
    return f"{short}({group.name(spec)}) {_fmt_bytes(nbytes)}"


def _run_ours(case: CorpusCase, model) -> dict:
    from redist_opt.api import planning as api
    from redist_opt.ir.placements import RedistributeError

    spec = case.spec()
    src, dst = case.placements()
    try:
        naive = api.plan(spec, src, dst, shape=case.shape, dtype=case.torch_dtype())
    except RedistributeError as e:
        reason = str(e)
        return {p: dict(status="unsupported", reason=reason) for p in POLICIES}
    if naive.fallback:
        return {p: dict(status="fallback", reason=naive.fallback_reason) for p in POLICIES}
    out = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        p = api.optimize(naive, groups=policy, cost=model)
        plan_s = time.perf_counter() - t0
        cols = p.collectives()
        out[policy] = dict(
            status="ok",
            collectives=len(cols),
            bytes=p.bytes_per_rank,
            time=model.plan_time(p),
            ops=[_op_str(c.kind, c.group, c.bytes_in, spec) for c in cols],
            plan_ms=plan_s * 1e3,
        )
    return out


# -- the benchmark ------------------------------------------------------------------------

_REL = 1e-9  # modelled times closer than this (relative) are equal


def _worse_reasons(ours: dict, torch_row: dict) -> list[str]:
    reasons = []
    if ours["collectives"] > torch_row["collectives"]:
        reasons.append(f"collectives {ours['collectives']} > {torch_row['collectives']}")
    if ours["bytes"] > torch_row["bytes"]:
        reasons.append(f"bytes/rank {_fmt_bytes(ours['bytes'])} > {_fmt_bytes(torch_row['bytes'])}")
    if ours["time"] > torch_row["time"] * (1 + _REL):
        reasons.append(f"modelled time {_fmt_us(ours['time'])} > {_fmt_us(torch_row['time'])}")
    return reasons


def _verdict(ours: dict, torch_row: dict) -> str:
    """"worse" (see _worse_reasons), "equal" (same count, bytes and time) or "better"."""
    if _worse_reasons(ours, torch_row):
        return "worse"
    same = (ours["collectives"], ours["bytes"]) == (torch_row["collectives"], torch_row["bytes"])
    if same and math.isclose(ours["time"], torch_row["time"], rel_tol=_REL):
        return "equal"
    return "better"


def find_worse(result: dict) -> list[dict]:
    """Every (case, policy) where ours is worse than torch; re-derived from the rows."""
    worse = []
    for row in result["cases"]:
        t = row["torch"]
        if t.get("status") != "ok":
            continue
        for policy in POLICIES:
            ours = row[policy]
            if ours.get("status") != "ok":
                continue
            reasons = _worse_reasons(ours, t)
            if reasons:
                worse.append(dict(id=row["id"], policy=policy, reasons=reasons))
    return worse


def _totals(rows: list[dict]) -> dict:
    comparable = [
        r for r in rows if r["torch"]["status"] == "ok" and all(r[p]["status"] == "ok" for p in POLICIES)
    ]
    tot = {"cases": len(rows), "compared": len(comparable)}
    for side in ("torch",) + POLICIES:
        tot[side] = {
            k: sum(r[side][k] for r in comparable) for k in ("collectives", "bytes", "time")
        }
    for policy in POLICIES:
        verdicts = Counter(_verdict(r[policy], r["torch"]) for r in comparable)
        tot[policy]["better_cases"] = verdicts["better"]
        tot[policy]["equal_cases"] = verdicts["equal"]
        tot[policy]["worse_cases"] = verdicts["worse"]
    return tot


def quality_bench(
    cases: Sequence[CorpusCase],
    *,
    cost_model=None,
    verify: bool = True,
    progress=None,
) -> dict:
    """Run torch and both of our policies on ``cases``; returns a JSON-able dict.

    ``cost_model``: a :class:`~redist_opt.ir.cost.CostModel` (default: NCCL-like).
    ``verify``: also execute our plans of the simulation shape and check they issue
    the collectives and bytes they claim. ``progress``: called with each finished row.
    """
    import torch

    from redist_opt.ir.cost import CostModel

    model = cost_model or CostModel.default()
    _ensure_fake_pg()
    _disable_torch_warnings()
    import torch.distributed as dist

    world = dist.get_world_size()
    rows = []
    t_start = time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        sim, scale = case.sim_shape()
        row = dict(
            id=case.id, category=case.category, mesh=case.mesh, flatten=list(case.flatten),
            src=case.src, dst=case.dst, shape=list(case.shape), dtype=case.dtype,
            sim_shape=list(sim), scale=scale,
        )
        row.update(_run_ours(case, model))
        if case.num_ranks > world:
            reason = f"mesh has {case.num_ranks} ranks > process group world {world}"
            row["torch"] = dict(status="skipped", reason=reason)
            checks = {}
        else:
            row["torch"], checks = _run_torch(case, model, verify)
        if case.num_ranks == world:
            row["note"] = "the mesh is the whole (fake) world: the world group also exists for ours"
        if checks:
            row["verify"] = checks
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        if progress is not None:
            progress(row)
    result = dict(
        format=RESULT_FORMAT,
        torch_version=torch.__version__,
        cost_model=model.to_dict(),
        rule=COMPARISON_RULE,
        cases=rows,
        seconds=time.perf_counter() - t_start,
    )
    result["totals"] = _totals(rows)
    result["worse"] = find_worse(result)
    result["unsupported"] = [
        dict(id=r["id"], side=side, status=r[side]["status"], reason=r[side].get("reason", ""))
        for r in rows for side in ("torch",) + POLICIES if r[side]["status"] != "ok"
    ]
    result["verify_failures"] = [
        dict(id=r["id"], policy=p, **c) for r in rows for p, c in r.get("verify", {}).items() if not c["ok"]
    ]
    return result


COMPARISON_RULE = (
    "ours is worse than torch on a case when it issues more collectives, or feeds more bytes per rank "
    "into collectives (the largest input any rank sends, summed over the collectives), or has a larger "
    "modelled time (the same cost model's collective_time summed over the collectives, group creation "
    "not counted); cases where a side is unsupported are listed and left out of the totals"
)


# -- formatting -------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"


def _fmt_us(t: float) -> str:
    return f"{t * 1e6:.1f} us"


def _cell(side: dict) -> str:
    if side.get("status") != "ok":
        return side.get("status", "?")
    return f"{side['collectives']} / {_fmt_bytes(side['bytes'])} / {_fmt_us(side['time'])}"


def format_quality(result: dict, *, details: bool = True) -> str:
    """A markdown report: the table, totals, worse cases, unsupported cases, details."""
    worse = find_worse(result)
    worse_ids = {(w["id"], w["policy"]) for w in worse}
    model = result["cost_model"]
    lines = [
        f"torch {result['torch_version']}; cost model {model['name']!r} "
        f"(algorithm {model['algorithm']}, devices_per_host {model['devices_per_host']}); "
        f"{len(result['cases'])} cases in {result['seconds']:.0f} s",
        "",
        f"Comparison rule: {result['rule']}.",
        "",
        "Each cell: collectives / bytes per rank / modelled time.",
        "",
        "| case | category | mesh (flattened) | src -> dst | shape dtype | torch (merge on) | ours existing "
        "| ours create |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["cases"]:
        mesh = r["mesh"] + (f" ({', '.join(r['flatten'])})" if r["flatten"] else "")
        shape = "x".join(map(str, r["shape"])) or "scalar"
        cells = []
        for side in ("torch",) + POLICIES:
            text = _cell(r[side])
            if (r["id"], side) in worse_ids:
                text = f"**{text} WORSE**"
            cells.append(text)
        lines.append(
            f"| {r['id']} | {r['category']} | {mesh} | {r['src']} -> {r['dst']} | {shape} {r['dtype']} | "
            + " | ".join(cells) + " |"
        )
    tot = result["totals"]
    lines += ["", f"## Totals ({tot['compared']} of {tot['cases']} cases where all three sides ran)", ""]
    lines.append(
        "| | collectives | bytes per rank | modelled time | vs torch (collectives, bytes, time) "
        "| cases better / equal |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- |")
    base = tot["torch"]
    for side in ("torch",) + POLICIES:
        t = tot[side]
        if side == "torch":
            label, rel, cases = "torch (merge on)", "1, 1, 1", "-"
        else:
            label = f"ours groups={side}"
            rel = ", ".join(_ratio(t[k], base[k]) for k in ("collectives", "bytes", "time"))
            cases = f"{t['better_cases']} / {t['equal_cases']}"
        lines.append(
            f"| {label} | {t['collectives']} | {_fmt_bytes(t['bytes'])} | {_fmt_us(t['time'])} | {rel} | {cases} |"
        )
    lines += ["", "## Cases where ours is worse than torch", ""]
    if worse:
        for w in worse:
            lines.append(f"- {w['id']} (groups={w['policy']}): {'; '.join(w['reasons'])}")
    else:
        lines.append("None: on every case both policies issue at most torch's collectives, bytes and modelled time.")
    lines += ["", "## Unsupported / not run", ""]
    if result["unsupported"]:
        for u in result["unsupported"]:
            side = "torch" if u["side"] == "torch" else f"ours groups={u['side']}"
            lines.append(f"- {u['id']} ({side}): {u['status']}: {u['reason']}")
    else:
        lines.append("None.")
    n_verified = sum(len(r.get("verify", {})) for r in result["cases"])
    if n_verified:
        lines += ["", "## Verification", ""]
        failures = result.get("verify_failures", [])
        lines.append(
            f"{n_verified - len(failures)} of {n_verified} of our plans of the simulation shapes, executed on "
            "the simulated meshes, issued exactly the collectives (kind and ranks, in order) and bytes they claim."
        )
        for v in failures:
            lines.append(f"- {v['id']} groups={v['policy']}: executed {v['executed']}, planned {v['planned']}")
    if details:
        lines += ["", "## Collectives per case", ""]
        for r in result["cases"]:
            lines.append(f"- **{r['id']}** (sim shape {r['sim_shape']}, x{r['scale']})")
            for side in ("torch",) + POLICIES:
                s = r[side]
                body = "; ".join(s["ops"]) if s["status"] == "ok" else f"{s['status']}: {s.get('reason', '')}"
                lines.append(f"  - {side}: {body or '(none)'}")
    return "\n".join(lines) + "\n"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"


# -- CLI ------------------------------------------------------------------------------


def add_quality_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``redist-opt bench --part quality``.

    Added beside the bench's own options: ``--profile`` (cost profile) and
    ``--json`` are shared with them and only added when the parser lacks them;
    the quality-only options have names of their own (``--corpus-case``, since the
    bench's ``--case`` takes SRC->DST).
    """
    have = set(parser._option_string_actions)

    def add(flag, **kw):
        if flag not in have:
            parser.add_argument(flag, **kw)

    add("--corpus", default=DEFAULT_CORPUS, metavar="FILE",
        help="quality: the corpus JSON (default fixtures/corpus.json)")
    add("--corpus-case", action="append", metavar="ID", help="quality: only this corpus case (repeatable)")
    add("--category", action="append", metavar="NAME", choices=CATEGORIES,
        help="quality: only this corpus category (repeatable)")
    add("--profile", metavar="PROFILE",
        help="cost profile: nccl (default), gloo, or a JSON file from `redist-opt calibrate`")
    add("--devices-per-host", type=int, metavar="N",
        help="quality: ranks per host for the cost model (consecutive ranks share a host)")
    add("--no-verify", action="store_true",
        help="quality: skip executing our simulation-shape plans (faster)")
    add("--json", metavar="FILE", help="also write the results to this JSON file")
    add("--report", metavar="FILE", help="quality: write the markdown report here (default stdout)")


def _cost_model(profile: str, devices_per_host: int | None):
    """The CLI's cost profile (``--profile``: nccl, gloo or a calibrate JSON file)."""
    from redist_opt.tools.cli import CliError, _load_profile

    model = _load_profile("--profile", profile)
    if devices_per_host is not None:
        if devices_per_host < 1:
            raise CliError(f"--devices-per-host: {devices_per_host} must be >= 1")
        model = dataclasses.replace(model, devices_per_host=devices_per_host)
    return model


def cmd_quality(args) -> int:
    """``redist-opt bench --part quality``: exit 0, 1 when ours is worse on some case, 2 on bad input."""
    from redist_opt.tools.cli import CliError

    try:
        cases = load_corpus(args.corpus)
        model = _cost_model(getattr(args, "profile", None) or "nccl", args.devices_per_host)
    except (OSError, ValueError, CliError) as e:
        print(f"redist-opt bench: error: {e}", file=sys.stderr)
        return 2
    if args.corpus_case:
        unknown = sorted(set(args.corpus_case) - {c.id for c in cases})
        if unknown:
            print(f"redist-opt bench: error: --corpus-case: unknown case id(s) {unknown}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.id in args.corpus_case]
    if args.category:
        cases = [c for c in cases if c.category in args.category]

    def progress(row):
        cells = "  ".join(f"{s}={_cell(row[s])}" for s in ("torch",) + POLICIES)
        print(f"[{row['seconds']:5.1f}s] {row['id']}: {cells}", file=sys.stderr, flush=True)

    result = quality_bench(cases, cost_model=model, verify=not args.no_verify, progress=progress)
    text = format_quality(result)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
        print(f"redist-opt bench: wrote {args.report}", file=sys.stderr)
    else:
        print(text, end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 1 if result["worse"] or result["verify_failures"] else 0


def main(argv=None) -> int:
    """``python -m redist_opt.tools.quality`` (the same as ``redist-opt bench --part quality``)."""
    parser = argparse.ArgumentParser(prog="redist-opt bench --part quality", description=__doc__.splitlines()[0])
    add_quality_arguments(parser)
    return cmd_quality(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
