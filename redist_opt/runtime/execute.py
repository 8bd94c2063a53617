"""Runtime: run an IR plan on the calling rank over a DeviceMesh's process groups.

:func:`execute` builds the plan's rank program (:mod:`redist_opt.runtime.specialize`,
the one executable form of a plan) and runs it once; the eager path keeps the
program of a plan it runs again. :func:`check_local_shape` refuses a local tensor
whose shape its placements do not define.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from redist_opt.ir import symbolic as sym
from redist_opt.ir.placements import RedistributeError
from redist_opt.runtime.specialize import rank_coordinates, specialize
from redist_opt.torch_api.local_tensor import per_rank_tensors

__all__ = ["execute", "check_local_shape", "input_shape"]


def check_local_shape(expected, x: torch.Tensor, device_mesh, what: str = "its placements") -> None:
    """Refuse a local tensor whose shape is not what its placements define.

    A DTensor built with ``from_local(..., run_check=False)`` and a wrong shape
    would otherwise produce a silently wrong result.
    """
    if all(isinstance(e, sym.sympy.Integer) for e in expected):
        want_of = lambda rank: tuple(int(e) for e in expected)  # noqa: E731
    else:
        coords = rank_coordinates(device_mesh)
        want_of = lambda rank: tuple(  # noqa: E731
            sym.evaluate(e, coords if isinstance(coords, tuple) else coords[rank]) for e in expected
        )
    locals_ = per_rank_tensors(x)
    items = locals_.items() if locals_ is not None else [(None, x)]
    for rank, t in items:
        want = want_of(rank)
        if tuple(t.shape) != want:
            who = "this rank" if rank is None else f"rank {rank}"
            raise RedistributeError(
                f"the local tensor on {who} has shape {tuple(t.shape)} but {what} define a "
                f"local shape {want}: the DTensor's spec does not match its data"
            )


def input_shape(gm: fx.GraphModule) -> tuple:
    """The local shape (size expressions) a plan's graph takes as input."""
    return next(iter(gm.graph.nodes)).meta["shape"]


def execute(
    gm: fx.GraphModule,
    local_tensor: torch.Tensor,
    device_mesh,
    *,
    groups: str = "existing",
    async_op: bool = False,
) -> torch.Tensor:
    """Run the IR chain on this rank's local tensor (or every simulated rank's)."""
    check_local_shape(input_shape(gm), local_tensor, device_mesh)
    program = specialize(gm, device_mesh, dtype=local_tensor.dtype, groups=groups)
    return program(local_tensor, async_op)
