"""``redist-opt demo``: a 3-D redistribution planned, explained and run over 8 real gloo processes.

Each case is explained (naive and optimized plan, and why), then run on every
rank three ways: torch's redistribute with its merge pass off (the reference),
torch with it on, and redist_opt. The comparison line says whether every rank's
result equals the reference bit for bit.
"""

from __future__ import annotations

import math
import os
import sys

from torch.distributed.device_mesh import init_device_mesh

import redist_opt
from redist_opt.debug.explain import format_explain
from redist_opt.ir.cost import resolve
from redist_opt.tools.bench import VARIANTS, run_variants
from redist_opt.tools.spawn import SpawnError, run_ranks
from redist_opt.tools.timing import Stat

__all__ = ["run_demo", "cmd_demo", "DEMO_MESH", "DEMO_FLATTEN", "DEMO_CASES"]

DEMO_MESH = ((2, 2, 2), ("dp", "cp", "tp"))
# Flattened meshes the demo job creates (as a training job would for its loss
# reductions); the whole mesh is also the world group, which exists anyway.
DEMO_FLATTEN = (("dp", "cp"), ("dp", "tp"))
DEMO_CASES = [
    # (src, dst, global shape)
    ("P,P,P", "R,S(0),R", (8, 6)),  # three reductions -> an all_reduce over dp+cp, then one over tp
    ("P,P,P", "R,R,R", (4, 4)),  # two all_reduces: under gloo one over the world costs more
    ("S(0),S(0),S(1)", "R,R,R", (5, 3)),  # uneven: an exact all_gather over dp+cp (torch's merge is wrong)
    ("S(0),S(0),R", "S(1),S(1),R", (6, 8)),  # one all_to_all over dp+cp
]


def _demo_spec():
    """The mesh as the ranks' planner sees it: the gloo profile, the flattened meshes,
    and the world group, which redist_opt may use and torch's merge pass does not."""
    sizes, names = DEMO_MESH
    flats = ["+".join(f) for f in DEMO_FLATTEN]
    return redist_opt.MeshSpec(sizes=sizes, names=names, flattened=flats + ["+".join(names)], torch_flattened=flats,
                               backend="gloo")


def _demo_worker(rank: int, world: int) -> list[dict]:
    """One rank of the demo (run by :func:`redist_opt.tools.spawn.run_ranks`): every case three ways."""
    sizes, names = DEMO_MESH
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
    for dims in DEMO_FLATTEN:
        mesh[dims]._flatten()
    return [run_variants(mesh, src, dst, shape, rank, iters=7, warmup=1) for src, dst, shape in DEMO_CASES]


def run_demo(timeout: float = 300.0) -> int:
    """Explain every demo case, run it on 8 gloo processes, print the comparison; 0 if all equal."""
    sizes, names = DEMO_MESH
    world = math.prod(sizes)
    spec = _demo_spec()
    flats = ", ".join("+".join(f) for f in DEMO_FLATTEN)
    print(f"redist-opt demo: {world} gloo processes on this CPU, mesh {spec.shape_str}, flattened: {flats}\n")
    for src, dst, shape in DEMO_CASES:
        naive = redist_opt.plan(spec, src, dst, shape=shape)
        print(format_explain(naive, redist_opt.optimize(naive), cost_model=resolve(spec)[0], show_ir=False))
        print()
    print(f"executing on {world} ranks (gloo, 127.0.0.1) ...", flush=True)
    try:
        reports = run_ranks(_demo_worker, world, timeout=timeout)
    except SpawnError as e:
        print(f"redist-opt demo: {e}", file=sys.stderr)
        return 1
    ok = True
    print()
    print("collectives and wall time per redistribution (median of 7 samples of the slowest rank):")
    print(f"{'case':<38} {'equal':>6} {'torch no-merge':>15} {'torch merge':>12} {'redist_opt':>11}")
    for i, (src, dst, shape) in enumerate(DEMO_CASES):
        rows = [reports[r][i] for r in range(world)]
        equal = all(r["equal"]["ours"] for r in rows)
        ok &= equal
        ms = {v: Stat.of([r["samples"][k] for r in rows]).median * 1e3 for k, v in enumerate(VARIANTS)}
        n = rows[0]["collectives"]
        torch_ok = "" if all(r["equal"]["torch"] for r in rows) else " WRONG"
        print(
            f"{f'{src} -> {dst} {shape}':<38} {str(equal):>6} {n['torch_nomerge']:>3} {ms['torch_nomerge']:>7.2f} ms "
            f"{n['torch']:>2} {ms['torch']:>5.2f} ms{torch_ok} {n['ours']:>2} {ms['ours']:>5.2f} ms"
        )
    cpus = os.cpu_count() or 1
    if world > cpus:
        print(f"note: {world} ranks share {cpus} cpus, so these times are mostly scheduling; "
              "`redist-opt bench --part wall` times 4 ranks")
    print()
    if ok:
        print(f"every rank's result equals torch's redistribute (merge pass disabled), bit for bit, on {world} ranks")
    else:
        print("MISMATCH against torch's redistribute")
    return 0 if ok else 1


def cmd_demo(args) -> int:
    """``redist-opt demo``."""
    return run_demo(timeout=args.timeout)
