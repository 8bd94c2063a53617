"""Programs for the in-step cost tests: 4 gloo ranks (``redist_opt.tools.spawn.run_ranks``)
run a small step of funcol collectives inside ``redist_opt.profile_steps``. Kept free of
pytest imports."""

from __future__ import annotations

import hashlib
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

import redist_opt
from redist_opt.ir.placements import RedistributeError


def _step(mesh, rank: int, late_rank: int, late_s: float) -> None:
    """Two pair all_reduces of 1 KiB and 4 KiB, then a reduce_scatter over the world (funcol),
    and an all_reduce through c10d;
    ``late_rank`` arrives ``late_s`` late (the skew a real step has)."""
    if rank == late_rank:
        time.sleep(late_s)
    for n in (256, 1024):
        x = funcol.all_reduce(torch.ones(n), "sum", (mesh, 0))
        x = funcol.all_reduce(x, "sum", (mesh, 1))
        torch.ops._c10d_functional.wait_tensor(x)
    y = funcol.reduce_scatter_tensor(torch.ones(1024), "sum", 0, dist.group.WORLD)
    torch.ops._c10d_functional.wait_tensor(y)
    dist.all_reduce(torch.ones(8))  # through c10d, as FSDP2 issues its collectives


def skewed_steps(rank: int, world: int, path: str, late_rank: int, late_s: float) -> dict:
    """3 profiled steps (after a warm-up one) with one rank late; what this rank wrote
    and the plan it makes from the profile."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    _step(mesh, rank, late_rank, late_s)
    with redist_opt.profile_steps(path) as costs:
        for _ in range(3):
            _step(mesh, rank, late_rank, late_s)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    spec = redist_opt.MeshSpec((2, 2), ("a", "b"), backend="gloo")
    planned = redist_opt.optimize(redist_opt.plan(spec, "P,P", "R,S(0)", shape=(16, 16)), cost=path)
    return {
        "digest": digest,
        "measurements": costs.measurements,
        "other_communication": costs.other_communication,
        "pair_all_reduce_1KiB_s": costs.model.time_of("all_reduce", 2, "intra", 1024),
        "plan": str(planned),
    }


def differing_files(rank: int, world: int, paths: list) -> str:
    """Each rank profiles into ``paths[rank]`` (rank 1's already holds a profile, the
    others' do not): every rank must raise the same error."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    try:
        with redist_opt.profile_steps(paths[rank]):
            _step(mesh, rank, -1, 0.0)
    except RedistributeError as e:
        return str(e)
    return "no error"
