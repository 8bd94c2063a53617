"""Programs the fault tests run on gloo ranks through fault_harness.run_program.

Each is ``program(ctx) -> {name: tensor}``; ``ctx.reference`` says whether this is
torch's run (merge pass off) or redist_opt's, and faults are injected in the
latter only. Inputs are integer-valued, so sums are exact in any order. Kept free
of pytest imports (spawned children import this module).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard


def _partial_input(mesh, placements, shape=(4, 6)):
    rank = dist.get_rank()
    local = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) + rank
    return DTensor.from_local(local, mesh, placements, run_check=False)


def reduce_on_2x2x2(ctx):
    """``P,P,R -> R,R,R`` on a 2x2x2 mesh (a merged all_reduce over dims 0 and 1 needs
    a new group under groups="create"), then ``P,R,P -> R,S(0),R``."""
    mesh = init_device_mesh("cpu", (2, 2, 2))
    out = {}
    with ctx.redistribution():
        with ctx.section("redistribute"):
            x = _partial_input(mesh, [Partial(), Partial(), Replicate()])
            out["ppr"] = x.redistribute(mesh, [Replicate(), Replicate(), Replicate()]).to_local()
            y = _partial_input(mesh, [Partial(), Replicate(), Partial()])
            out["prp"] = y.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local()
    return out


def env_value(name: str) -> str | None:
    return os.environ.get(name)


def one_rank_skips_a_collective(ctx):
    """Every rank but 1 runs an all_reduce (optimized run only): the hang the watchdog must catch."""
    t = torch.ones(2)
    if not ctx.reference and ctx.rank != 1:
        dist.all_reduce(t)
    return {"t": t}
