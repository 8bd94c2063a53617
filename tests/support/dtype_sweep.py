"""The dtype sweep: the gloo differential programs in every dtype torch's redistribute accepts.

Each program of ``PROGRAMS`` (a mesh, ``src -> dst`` and a global shape) runs in each dtype of
``DTYPES`` on real gloo ranks, through ``gloo_worker.run_case``: torch's ``DTensor.redistribute``
with its merge pass off against redist_opt's unoptimized plan (bitwise, collective for
collective) and its optimized plan (equal values; within rounding where sums were regrouped),
directly and through ``enabled()``. Where torch raises, redist_opt must raise too. A partial's
reduce op is swept over sum, avg, max and min in every dtype.

    python tests/support/dtype_sweep.py [--world 4|8] [--dtype NAME ...]

prints one line per dtype (cases run, where torch raised, crashes, wrong values) and exits 1
on any crash or wrong value. Kept free of pytest so spawned ranks import it cheaply; the
quick twin of this run is the dtype cases of ``gloo_worker.CASES`` (``tests/multiproc/test_gloo.py``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # run as a script, this file's folder is on sys.path, not the tests folder
    sys.path.insert(0, TESTS)

from support import gloo_worker  # noqa: E402

DTYPES = {
    "c64": torch.complex64,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "i64": torch.int64,
    "bool": torch.bool,
}
COLLECTIVE_TIMEOUT_S = 120

# (mesh, src, dst, global shape): every collective kind, even and uneven, merged and not
PROGRAMS = {
    4: [
        ("2x2", ["S(0)", "R"], ["S(1)", "R"], (4, 6)),  # all_to_all
        ("2x2", ["S(0)", "R"], ["S(1)", "R"], (5, 3)),  # all_to_all, uneven
        ("2x2", ["R", "S(1)"], ["R", "S(0)"], (3, 7)),
        ("2x2", ["P", "R"], ["R", "R"], (4, 4)),  # all_reduce
        ("2x2", ["P", "P"], ["S(0)", "S(1)"], (5, 3)),  # reduce_scatter, uneven
        ("2x2", ["P", "R"], ["S(1)", "R"], (4, 6)),  # reduce_scatter off dim 0
        ("2x2", ["S(0)", "S(1)"], ["R", "R"], (7, 5)),  # all_gather, uneven
        ("2x2", ["S(0)", "S(0)"], ["R", "S(0)"], (7, 5)),  # nested shard
        ("2x2", ["S(1)", "P"], ["S(0)", "R"], (5, 3)),
        ("2x2", ["P", "S(0)"], ["S(1)", "S(1)"], (6, 4)),
        ("2x2", ["S(0)", "S(0)"], ["S(1)", "S(2)"], (5, 3, 7)),  # two all_to_alls -> one
        ("b", ["S(0)"], ["S(1)"], (5, 3)),  # 1-D submesh
        ("b", ["P"], ["S(0)"], (3, 2)),
    ],
    8: [
        ("2x2x2", ["S(0)", "R", "R"], ["S(1)", "R", "R"], (8, 6)),
        ("2x2x2", ["S(0)", "S(0)", "S(0)"], ["S(1)", "S(1)", "S(1)"], (8, 8)),  # three all_to_alls
        ("2x2x2", ["S(0)", "S(0)", "S(0)"], ["S(1)", "S(1)", "S(1)"], (5, 7)),
        ("2x2x2", ["P", "P", "P"], ["R", "S(0)", "R"], (4, 6)),
        ("2x2x2", ["P", "P", "P"], ["R", "R", "R"], (3, 5)),
        ("2x2x2", ["S(0)", "S(1)", "S(0)"], ["R", "R", "R"], (5, 3)),  # gathers, uneven
        ("2x2x2", ["P", "S(0)", "R"], ["S(1)", "S(1)", "S(0)"], (6, 4)),
        ("2x2x2", ["R", "S(1)", "P"], ["S(0)", "R", "S(1)"], (7, 5)),
        ("ac", ["S(0)"], ["S(1)"], (5, 3)),  # a flattened mesh
        ("ac", ["P"], ["S(0)"], (4, 2)),
    ],
}


# The Partial reduce ops swept, for every dtype (complex max / min: c10d's all_reduce refuses
# them, a reduce_scatter does not check; redist_opt hands them to torch's planner)
REDUCE_OPS = ("sum", "avg", "max", "min")


def cases(world: int, dtype_name: str) -> list[tuple]:
    """(mesh, src, dst, shape, dtype name): each program once per reduce op its partials may take."""
    out = []
    for mesh, src, dst, shape in PROGRAMS[world]:
        ops = REDUCE_OPS if any(p == "P" for p in src + dst) else ("sum",)
        for op in ops:
            tag = "P" if op == "sum" else f"P({op})"
            out.append(
                (
                    mesh,
                    [tag if p == "P" else p for p in src],
                    [tag if p == "P" else p for p in dst],
                    shape,
                    dtype_name,
                )
            )
    return out


def _meshes(world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    if world == 4:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        return {"2x2": mesh, "b": mesh["b"]}
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    return {"2x2x2": mesh, "ac": mesh["a", "c"]._flatten("ac")}


def _torch_raises(outcome: str) -> bool:
    return outcome.startswith("torch raises")


def sweep_rank(rank: int, world: int, port: int, dtype_names: list[str], results) -> None:
    """This rank's part of the sweep: {dtype: [(case, outcome)]} into ``results`` on rank 0,
    outcome "ok", "torch raises ...", or the failure."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    try:
        meshes = _meshes(world)
        mine = {}
        for name in dtype_names:
            mine[name] = []
            for case in cases(world, name):
                for routed in (False, True):
                    mine[name].append(((*case, routed), _outcome(rank, meshes, case, routed)))
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            results.put(gathered)
    finally:
        dist.destroy_process_group()


def _outcome(rank: int, meshes, case, routed: bool) -> str:
    try:
        raised = gloo_worker.run_case(rank, meshes, case, routed=routed)
    except AssertionError as e:  # run_case's verdict: a raise where torch succeeds is a crash
        return f"{'crash' if 'but redist_opt raised' in str(e) else 'wrong'}: {e}"
    except Exception:  # noqa: BLE001 - a crash: keep where it came from
        return f"crash: {traceback.format_exc(limit=-3)}"
    return f"torch raises {raised}" if raised else "ok"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, choices=sorted(PROGRAMS), default=4)
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="default: all")
    args = parser.parse_args(argv)
    from torch.distributed.elastic.utils.distributed import get_free_port

    names = args.dtype or list(DTYPES)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    ranks = mp.start_processes(
        sweep_rank,
        args=(args.world, get_free_port(), names, results),
        nprocs=args.world,
        join=False,
        start_method="spawn",
    )
    per_rank = results.get()  # before joining: rank 0 blocks on a full pipe until this reads it
    ranks.join()
    bad = 0
    print(f"dtype sweep, {args.world} gloo ranks, torch {torch.__version__}")
    for name in names:
        rows = [row for rank_rows in per_rank for row in rank_rows[name]]
        crashes = [r for r in rows if r[1].startswith("crash")]
        wrong = [r for r in rows if r[1].startswith("wrong")]
        raised = {repr(r[0]) for r in rows if _torch_raises(r[1])}
        bad += len(crashes) + len(wrong)
        print(
            f"{name}: {len(rows) // args.world} runs per rank, torch raised on {len(raised)}, "
            f"crashes {len(crashes)}, wrong values {len(wrong)}"
        )
        for case, outcome in (crashes + wrong)[:5]:
            print(f"  {case}: {outcome}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
