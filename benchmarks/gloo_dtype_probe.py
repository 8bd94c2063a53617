"""Which collective kind x dtype x reduce op a gloo process group runs, probed on real ranks.

Every rank issues the same functional collectives (what redist_opt's plans issue) over the
world group and reports whether each ran, or the error it raised; rank 0 prints a markdown
table (docs/dtypes.md records it). All ranks fail or succeed together on a dtype gloo
rejects (the check is local, before any byte moves), so a rejected case never hangs.

    python -m benchmarks.gloo_dtype_probe [--world 4]
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
from torch.distributed.elastic.utils.distributed import get_free_port

DTYPES = {
    "complex64": torch.complex64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int64": torch.int64,
    "bool": torch.bool,
}
REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def _cases():
    for dtype in DTYPES:
        yield dtype, "all_gather", "-"
        yield dtype, "all_to_all", "-"
        for op in REDUCE_OPS:
            yield dtype, "all_reduce", op
            yield dtype, "reduce_scatter", op


def _issue(kind: str, x: torch.Tensor, op: str, group) -> torch.Tensor:
    if kind == "all_gather":
        return funcol.all_gather_single(x, 0, group)
    if kind == "all_to_all":
        return funcol.all_to_all_single(x, None, None, group)
    if kind == "all_reduce":
        return funcol.all_reduce(x, op, group)
    return funcol.reduce_scatter_tensor(x, op, 0, group)


def _outcome(kind: str, dtype: torch.dtype, op: str, world: int) -> str:
    x = torch.ones(world * 2, 3).to(dtype)
    try:
        y = _issue(kind, x, op, dist.group.WORLD)
        y = y.wait() if isinstance(y, funcol.AsyncCollectiveTensor) else y
        return "ok"
    except Exception as e:  # the table records what each case raises
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first[:70]}"


def _rank(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    try:
        rows = [(d, k, op, _outcome(k, DTYPES[d], op, world)) for d, k, op in _cases()]
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            same = all(g == rows for g in gathered)
            print(f"gloo, {world} ranks, torch {torch.__version__}; every rank saw the same: {same}")
            print("| dtype | collective | reduce op | outcome |")
            print("| --- | --- | --- | --- |")
            for d, k, op, outcome in rows:
                print(f"| {d} | {k} | {op} | {outcome} |")
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args(argv)
    mp.start_processes(_rank, args=(args.world, get_free_port()), nprocs=args.world, start_method="spawn")


if __name__ == "__main__":
    main()
