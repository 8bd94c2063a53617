"""``redist-opt demo``: a 3-D redistribution planned, explained and run over 8 real gloo processes.

Each case is explained (naive and optimized plan, and why), then run on every
rank three ways, as ``redist-opt bench --part wall`` runs its cases: torch's
redistribute with its merge pass off (the reference), torch with it on, and
redist_opt. The last line says whether every rank's result equals the reference
bit for bit.
"""

from __future__ import annotations

import os
import sys

import redist_opt
from redist_opt.debug.explain import format_explain
from redist_opt.ir.cost import resolve
from redist_opt.tools.bench import format_wall, wall_bench
from redist_opt.tools.spawn import SpawnError

__all__ = ["run_demo", "cmd_demo", "DEMO_MESH", "DEMO_FLATTEN", "DEMO_CASES", "DEMO_SPEC"]

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
_FLATS = ["+".join(f) for f in DEMO_FLATTEN]
# The mesh as the ranks' planner sees it: the gloo profile, the flattened meshes, and
# the world group, which redist_opt may use and torch's merge pass does not.
DEMO_SPEC = redist_opt.MeshSpec(
    sizes=DEMO_MESH[0],
    names=DEMO_MESH[1],
    flattened=_FLATS + ["+".join(DEMO_MESH[1])],
    torch_flattened=_FLATS,
    backend="gloo",
)


def run_demo(timeout: float = 300.0) -> int:
    """Explain every demo case, run it on 8 gloo processes, print the comparison; 0 if all equal."""
    spec, world = DEMO_SPEC, DEMO_SPEC.num_ranks
    print(
        f"redist-opt demo: {world} gloo processes on this CPU, mesh {spec.shape_str}, "
        f"flattened: {', '.join(_FLATS)}\n"
    )
    for src, dst, shape in DEMO_CASES:
        naive = redist_opt.plan(spec, src, dst, shape=shape)
        print(
            format_explain(naive, redist_opt.optimize(naive), cost_model=resolve(spec)[0], show_ir=False),
            end="\n\n",
        )
    print(f"executing on {world} ranks (gloo, 127.0.0.1) ...", flush=True)
    try:
        res = wall_bench(DEMO_CASES, mesh=DEMO_MESH, flatten=DEMO_FLATTEN, iters=7, warmup=1, timeout=timeout)
    except SpawnError as e:
        print(f"redist-opt demo: {e}", file=sys.stderr)
        return 1
    print(f"\n{format_wall(res)}")
    cpus = os.cpu_count() or 1
    if world > cpus:
        print(
            f"note: {world} ranks share {cpus} cpus, so these times are mostly scheduling; "
            "`redist-opt bench --part wall` times 4 ranks"
        )
    if not all(r["equal"] for r in res["rows"]):
        print("\nMISMATCH against torch's redistribute")
        return 1
    print(
        "\nevery rank's result equals torch's redistribute (merge pass disabled), "
        f"bit for bit, on {world} ranks"
    )
    return 0


def cmd_demo(args) -> int:
    """``redist-opt demo``."""
    return run_demo(timeout=args.timeout)
