"""``redist-opt demo``: a 3-D redistribution planned, explained and run over 8 real gloo processes.

Each case is explained (naive and optimized plan, and why), then run on every
rank three ways: torch's redistribute with its merge pass off (the reference),
torch with it on, and redist_opt. The comparison line says whether every rank's
result equals the reference bit for bit.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.debug.explain import format_explain
from redist_opt.ir.cost import CostModel
from redist_opt.runtime.torch_dtensor import reference_semantics
from redist_opt.tools.spawn import SpawnError, run_ranks

__all__ = ["run_demo", "cmd_demo", "DEMO_MESH", "DEMO_FLATTEN", "DEMO_CASES"]

DEMO_MESH = ((2, 2, 2), ("dp", "cp", "tp"))
# Flattened meshes the demo job creates (as a training job would for its loss
# reductions); the whole mesh is also the world group, which exists anyway.
DEMO_FLATTEN = (("dp", "cp"), ("dp", "tp"))
DEMO_CASES = [
    # (src, dst, global shape)
    ("P,P,P", "R,S(0),R", (8, 6)),  # reduce_scatter first, then one all_reduce over dp+tp
    ("P,P,P", "R,R,R", (4, 4)),  # one all_reduce over the world group
    ("S(0),S(0),S(1)", "R,R,R", (5, 3)),  # uneven: one exact all_gather over dp+cp
    ("S(0),S(0),R", "S(1),S(1),R", (6, 8)),  # one all_to_all over dp+cp
]


def _demo_spec():
    sizes, names = DEMO_MESH
    return redist_opt.MeshSpec(
        sizes=sizes, names=names, flattened=["+".join(f) for f in DEMO_FLATTEN] + ["+".join(names)]
    )


def _demo_input(mesh, src_p, shape, rank):
    # Small integers: every summation order gives the same bits, so results can
    # be compared exactly with torch's, however the optimizer regrouped the sums.
    full = (torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) * 7) % 11
    base = [Replicate() if p.is_partial() else p for p in src_p]
    dt = distribute_tensor(full, mesh, base, src_data_rank=None)
    if any(p.is_partial() for p in src_p):
        local = dt.to_local() + rank % 3  # every rank holds a different partial value
        dt = DTensor.from_local(local, mesh, src_p, run_check=False, shape=full.shape, stride=full.stride())
    return dt


def _demo_worker(rank: int, world: int) -> list[dict]:
    """One rank of the demo (run by :func:`redist_opt.tools.spawn.run_ranks`): every case three ways."""
    sizes, names = DEMO_MESH
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
    for dims in DEMO_FLATTEN:
        mesh[dims]._flatten()
    results = []
    for src, dst, shape in DEMO_CASES:
        src_p = redist_opt.parse_placements(src)
        dst_p = redist_opt.parse_placements(dst)
        dt = _demo_input(mesh, src_p, shape, rank)
        with reference_semantics(), CommDebugMode() as ref_mode:
            ref = dt.redistribute(mesh, dst_p).to_local()
        with CommDebugMode() as torch_mode:
            merged = dt.redistribute(mesh, dst_p).to_local()
        with CommDebugMode() as our_mode:
            out = redist_opt.redistribute(dt, dst_p).to_local()
        results.append(
            dict(
                equal=bool(torch.equal(ref, out)),
                torch_merge_equal=bool(torch.equal(ref, merged)),
                ref_colls=ref_mode.get_total_counts(),
                torch_colls=torch_mode.get_total_counts(),
                our_colls=our_mode.get_total_counts(),
                t_ref=_median_time(lambda: dt.redistribute(mesh, dst_p), reference_semantics),
                t_torch=_median_time(lambda: dt.redistribute(mesh, dst_p)),
                t_our=_median_time(lambda: redist_opt.redistribute(dt, dst_p)),
            )
        )
    return results


def _median_time(fn, context=None, repeat: int = 7) -> float:
    """Median wall time of ``fn`` after the first (planning) call, in seconds."""
    times = []
    with context() if context else contextlib.nullcontext():
        fn()
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_demo(timeout: float = 300.0) -> int:
    """Explain every demo case, run it on 8 gloo processes, print the comparison; 0 if all equal."""
    sizes, names = DEMO_MESH
    world = math.prod(sizes)
    spec = _demo_spec()
    flats = ", ".join("+".join(f) for f in DEMO_FLATTEN)
    print(f"redist-opt demo: {world} gloo processes on this CPU, mesh {spec.shape_str}, flattened: {flats}\n")
    for src, dst, shape in DEMO_CASES:
        naive = redist_opt.plan(spec, src, dst, shape=shape)
        print(format_explain(naive, redist_opt.optimize(naive), cost_model=CostModel.default(), show_ir=False))
        print()
    print(f"executing on {world} ranks (gloo, 127.0.0.1) ...", flush=True)
    try:
        reports = run_ranks(_demo_worker, world, timeout=timeout)
    except SpawnError as e:
        print(f"redist-opt demo: {e}", file=sys.stderr)
        return 1
    ok = True
    print()
    print("collectives and wall time per redistribution (median of 7 runs, slowest rank):")
    header = f"{'case':<38} {'equal':>6} {'torch no-merge':>15} {'torch merge':>12} {'redist_opt':>11}"
    print(header)
    for i, (src, dst, shape) in enumerate(DEMO_CASES):
        rows = [reports[r][i] for r in range(world)]
        equal = all(r["equal"] for r in rows)
        ok &= equal
        t = {k: max(r[k] for r in rows) * 1e3 for k in ("t_ref", "t_torch", "t_our")}
        torch_ok = "" if all(r["torch_merge_equal"] for r in rows) else " WRONG"
        case = f"{src} -> {dst} {shape}"
        print(
            f"{case:<38} {str(equal):>6} {rows[0]['ref_colls']:>3} {t['t_ref']:>7.2f} ms "
            f"{rows[0]['torch_colls']:>2} {t['t_torch']:>5.2f} ms{torch_ok} "
            f"{rows[0]['our_colls']:>2} {t['t_our']:>5.2f} ms"
        )
    print()
    if ok:
        print(f"every rank's result equals torch's redistribute (merge pass disabled), bit for bit, on {world} ranks")
    else:
        print("MISMATCH against torch's redistribute")
    return 0 if ok else 1


def cmd_demo(args) -> int:
    """``redist-opt demo``."""
    return run_demo(timeout=args.timeout)
