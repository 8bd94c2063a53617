"""``redistribute_local_tensor``: redist_opt's version of torch's function of the
same name, which redistributes one rank's local tensor (the eager path).

Plans come from the hot-plan cache (``planning.plans_for``); what redist_opt does
not lower runs through torch's own function, with a warning once per reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from redist_opt.api.errors import warn_once
from redist_opt.api.planning import plans_for
from redist_opt.api.specs import spec_of
from redist_opt.ir import layout as L
from redist_opt.ir.placements import RedistributeError, placements_str
from redist_opt.runtime import torch_dtensor as tdt
from redist_opt.runtime.execute import execute
from redist_opt.runtime.groups import GroupUnavailable

__all__ = ["redistribute_local_tensor"]


def redistribute_local_tensor(
    local_tensor: torch.Tensor,
    current_spec,
    target_spec,
    *,
    async_op: bool = False,
    groups: str | Sequence = "existing",
    passes=None,
    cost=None,
    prefer: str = "time",
    max_collectives: str = "torch",
) -> torch.Tensor:
    """redist_opt's version of torch's ``redistribute_local_tensor`` (same contract)."""
    device_mesh = current_spec.mesh
    if target_spec.mesh != device_mesh:
        raise RedistributeError(
            f"cannot redistribute between different meshes ({device_mesh} -> {target_spec.mesh})"
        )
    if not L.rank_in_mesh(device_mesh):
        return local_tensor
    reason = tdt.needs_torch_planner(current_spec, target_spec)
    if reason is None:
        p, opt = plans_for(
            spec_of(device_mesh),
            current_spec.placements,
            target_spec.placements,
            tuple(current_spec.shape),
            local_tensor.dtype,
            (groups if isinstance(groups, str) else tuple(groups), passes, cost, prefer, max_collectives),
        )
        reason = p.fallback_reason
    if reason is not None:
        warn_once(("fallback", reason), f"redist_opt: using torch's redistribute: {reason}")
        return tdt.torch_redistribute_local(local_tensor, current_spec, target_spec, async_op=async_op)
    try:
        return execute(opt.graph, local_tensor, device_mesh, groups=groups, async_op=async_op)
    except GroupUnavailable as e:
        if opt is p:
            raise
        warn_once(
            ("group", str(e)),
            f"redist_opt: {e}; running the unmerged plan for {placements_str(p.src)} -> "
            f"{placements_str(p.dst)}",
        )
        return execute(p.graph, local_tensor, device_mesh, async_op=async_op)
