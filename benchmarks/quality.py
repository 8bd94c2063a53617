"""``python -m benchmarks.quality``: the quality bench with torch's side run, not modelled.

``redist-opt bench --part quality`` (:mod:`redist_opt.tools.quality`) prices torch's
shipped plan as ``torch_merged_plan`` models it. This harness runs
``DTensor.redistribute`` as shipped (its transform-merge pass on) under
``LocalTensorMode`` on the ``fake`` backend, over a DeviceMesh that has the case's
flattened groups, at the case's simulation shape; a ``CommDebugMode`` subclass
records every collective (kind, process group -> mesh dims, bytes each rank feeds
in). The report is the shipped command's (:mod:`redist_opt.tools.quality_report`);
its totals equal the shipped command's when the model is exact. With verification
(the default), our plans of the simulation shape run the same way and must issue
exactly the collectives and bytes they claim; the report then ends with a
verification section.

Scaling. LocalTensorMode keeps every rank's tensors in this process, so torch
runs on a *simulation shape*: each tensor dim that no mesh dim shards (in src or
dst) becomes 1, each evenly sharded dim becomes the product M of the mesh sizes
sharding it, and unevenly sharded dims keep their real size. Every local chunk
of every collective then scales by the same integer factor (chunk sizes are L/n
with n | M on scaled dims and identical on kept dims), and torch's decisions
(which depend only on divisibility) are unchanged, so torch's bytes at the real
shape are the recorded bytes times that factor.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.ir.layout import rank_lists
from redist_opt.ir.placements import RedistributeError
from redist_opt.tools import quality
from redist_opt.tools.args import CliError
from redist_opt.tools.corpus import CATEGORIES, CorpusCase
from redist_opt.tools.quality import op_str, run_ours
from redist_opt.tools.quality_report import POLICIES, format_quality
from redist_opt.tools.spawn import quiet_torch_logs
from redist_opt.torch_api import dtensor as torch_dtensor

__all__ = ["SIM_WORLD", "sim_shape", "ensure_fake_pg", "run_torch", "quality_bench", "format_report", "main"]

# Simulated process-group world: larger than any corpus mesh, so no case's mesh is
# the default (world) group and the groups that exist are exactly the case's
# mesh dims and flattened meshes, for torch and for us alike.
SIM_WORLD = 128


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


def _max_bytes(t) -> int:
    if isinstance(t, LocalTensor):
        tensors = list(t._local_tensors.values())
    else:
        tensors = [t]
    return max(x.numel() * x.element_size() for x in tensors)


def sim_shape(case: CorpusCase) -> tuple[tuple[int, ...], int]:
    """(simulation shape, integer factor real bytes / simulated bytes); see the module doc."""
    src, dst = case.placements()
    sizes = case.spec().sizes
    sim = []
    for d, length in enumerate(case.shape):
        m = math.prod(
            n for n, a, b in zip(sizes, src, dst) if any(p.is_shard() and p.dim == d for p in (a, b))
        )
        if m == 1:
            sim.append(min(length, 1))
        elif length % m == 0:
            sim.append(m)
        else:
            sim.append(length)
    sim_numel, numel = math.prod(sim), math.prod(case.shape)
    return tuple(sim), (numel // sim_numel if sim_numel else 1)


def ensure_fake_pg() -> None:
    """A ``fake`` process group of :data:`SIM_WORLD` ranks in this process (once)."""
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=SIM_WORLD)


def _build_mesh(case: CorpusCase, lm):
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

    return DTensor.from_local(
        lm.rank_map(local), mesh, list(src), run_check=False, shape=torch.Size(shape), stride=g.stride()
    )


def _group_table(spec) -> dict:
    """Sorted rank tuple of the group through rank 0 -> MeshGroup (ascending dims)."""
    real = [d for d, n in enumerate(spec.sizes) if n > 1]
    table = {}
    for k in range(1, len(real) + 1):
        for dims in itertools.combinations(real, k):
            ranks = tuple(
                r
                for r in range(spec.num_ranks)
                if all(c == 0 for d, c in enumerate(_coords(r, spec.sizes)) if d not in dims)
            )
            table[ranks] = spec.group(dims)
    return table


def _ranks_of(name) -> tuple[int, ...]:
    """Sorted ranks of the process group ``name`` (under the fake backend: rank 0's group)."""
    return tuple(sorted(torch_dtensor.process_group_ranks(name)))


def _group_of(name, table):
    ranks = _ranks_of(name)
    if ranks not in table:
        raise RuntimeError(f"torch used a process group over ranks {ranks} that is no group of the mesh")
    return table[ranks]


def torch_side(case: CorpusCase, model, verify: bool) -> tuple[dict, dict]:
    """torch's row, run; and the case row's simulation shape, scale and (if ``verify``)
    our simulation-shape plans' checks."""
    sim, scale = sim_shape(case)
    extra = dict(sim_shape=list(sim), scale=scale)
    world, ranks = dist.get_world_size(), case.spec().num_ranks
    if ranks == world:
        extra["note"] = "the mesh is the whole (fake) world: the world group also exists for ours"
    if ranks > world:
        return dict(status="skipped", reason=f"mesh has {ranks} ranks > process group world {world}"), extra
    row, checks = run_torch(case, model, verify)
    if checks:
        extra["verify"] = checks
    return row, extra


def run_torch(case: CorpusCase, model, verify: bool) -> tuple[dict, dict]:
    """torch's shipped redistribute at the simulation shape; and (if verify) our sim plans run."""
    spec = case.spec()
    src, dst = case.placements()
    sim, scale = sim_shape(case)
    dtype = case.torch_dtype()
    checks: dict = {}
    with LocalTensorMode(spec.num_ranks) as lm:
        mesh = _build_mesh(case, lm)
        table = _group_table(spec)
        dt = _input(mesh, lm, src, sim, dtype)
        try:
            with Recorder() as rec:
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
                ops=[op_str(k, g, b, spec) for k, g, b in ops],
            )
        if verify:
            # Our plans of the simulation shape, executed: they must issue what they claim.
            checks = _verify_ours(spec, src, dst, sim, dtype, model, dt, mesh)
    return row, checks


def _verify_ours(spec, src, dst, sim, dtype, model, dt, mesh) -> dict:
    """Execute our plans of the simulation shape: they must issue exactly the collectives
    (kind and ranks, in order) and the bytes they claim."""
    try:
        naive = redist_opt.plan(spec, src, dst, shape=sim, dtype=dtype)
    except RedistributeError:  # reported by the plan side
        return {}
    if naive.fallback:
        return {}
    checks = {}
    for policy in POLICIES:
        p = redist_opt.optimize(naive, groups=policy, cost=model)
        with Recorder() as rec:
            redist_opt.execute(p.graph, dt._local_tensor, mesh, groups=policy)
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
        checks[policy] = dict(
            ok=got == want and rec.get_total_counts() == len(rec.calls), executed=got, planned=want
        )
    return checks


RUN = "DTensor.redistribute run under LocalTensorMode on the fake backend at the simulation shape, recorded"


def quality_bench(
    cases: Sequence[CorpusCase], *, cost_model=None, verify: bool = True, progress=None
) -> dict:
    """:func:`redist_opt.tools.quality.quality_bench` with torch's side run (see the module
    doc); with ``verify``, the result's ``verify_failures`` lists our plans that did not
    issue what they claim."""
    ensure_fake_pg()
    model = cost_model or CostModel.default()
    t_start = time.perf_counter()
    rows = []
    with quiet_torch_logs():
        for case in cases:
            t0 = time.perf_counter()
            row = quality.case_fields(case) | run_ours(case, model)
            row["torch"], extra = torch_side(case, model, verify)
            row.update(extra)
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            if progress is not None:
                progress(row)
    result = quality.quality_result(rows, model, RUN, time.perf_counter() - t_start)
    result["verify_failures"] = [
        dict(id=r["id"], policy=p, **c) for r in rows for p, c in r.get("verify", {}).items() if not c["ok"]
    ]
    return result


def _verification_section(result: dict) -> list[str]:
    n_verified = sum(len(r.get("verify", {})) for r in result["cases"])
    if not n_verified:
        return []
    failures = result["verify_failures"]
    lines = ["", "## Verification", ""]
    lines.append(
        f"{n_verified - len(failures)} of {n_verified} of our plans of the simulation shapes, executed on "
        "the simulated meshes, issued exactly the collectives (kind and ranks, in order) "
        "and bytes they claim."
    )
    for v in failures:
        lines.append(f"- {v['id']} groups={v['policy']}: executed {v['executed']}, planned {v['planned']}")
    return lines


def format_report(result: dict) -> str:
    """The shipped command's markdown report, then the verification section (if verified)."""
    return format_quality(result) + "".join(line + "\n" for line in _verification_section(result))


def main(argv=None) -> int:
    """Exit 0, 1 when ours is worse on some case or a verification failed, 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", default=None, metavar="FILE", help="a corpus JSON (default: the shipped one)"
    )
    parser.add_argument("--corpus-case", action="append", metavar="ID", help="only this case (repeatable)")
    parser.add_argument(
        "--category",
        action="append",
        metavar="NAME",
        choices=CATEGORIES,
        help="only this category (repeatable)",
    )
    parser.add_argument(
        "--profile",
        metavar="PROFILE",
        help="cost profile: nccl (default), gloo, gloo-ring or a JSON file from `redist-opt calibrate`",
    )
    parser.add_argument("--devices-per-host", type=int, metavar="N", help="ranks per host for the cost model")
    parser.add_argument("--no-verify", action="store_true", help="skip executing our simulation-shape plans")
    parser.add_argument("--json", metavar="FILE", help="also write the results to this JSON file")
    parser.add_argument("--report", metavar="FILE", help="write the markdown report here (default stdout)")
    args = parser.parse_args(argv)
    try:
        cases, model = quality.quality_request(args)
    except CliError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    result = quality_bench(
        cases, cost_model=model, verify=not args.no_verify, progress=quality.print_progress
    )
    quality.write_report(args, result, format_report(result))
    return 1 if result["worse"] or result["verify_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
