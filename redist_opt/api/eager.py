"""``redistribute_local_tensor``: redist_opt's version of torch's function of the
same name, which redistributes one rank's local tensor (the eager path).

Plans come from the hot-plan cache (``planning.plans_for``); what redist_opt does
not lower runs through torch's own function (merge pass on, as torch runs it,
unless the input hits its uneven all_gather merge bug), with a warning once per reason.

``_MaskPartial`` (the vocab-parallel embedding's partial) is a sum whose rows
outside the rank's vocab shard are zeroed first, from per-rank mask state in the
placement. As torch: Replicate -> _MaskPartial runs the placement's own
partition (no collective); _MaskPartial -> R / S zeroes the masked rows in place
and releases the mask, then the plan reduces it as ``Partial("sum")``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from redist_opt.api.errors import warn_once
from redist_opt.api.planning import plans_for
from redist_opt.api.specs import spec_of
from redist_opt.ir import layout as L
from torch.distributed.tensor.placement_types import Partial

from redist_opt.ir.placements import RedistributeError, placements_str
from redist_opt.runtime import consensus
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
    src, dst, masks = current_spec.placements, target_spec.placements, ()
    if reason is None and any(tdt.is_mask_partial(q) for q in (*src, *dst)):
        reason, src, dst, masks = _mask_partials(current_spec, target_spec)
        if reason is None and masks and tdt.is_mask_partial(target_spec.placements[masks[0]]):
            d = masks[0]  # Replicate -> _MaskPartial: torch's partition, no collective
            return tdt.mask_partition(target_spec.placements[d], local_tensor, device_mesh, d)
    if reason is None:
        spec = spec_of(device_mesh)
        consensus.check_planning_inputs(device_mesh, spec, cost)  # the same profile on every rank
        p, opt = plans_for(
            spec,
            src,
            dst,
            tuple(current_spec.shape),
            local_tensor.dtype,
            (groups if isinstance(groups, str) else tuple(groups), passes, cost, prefer, max_collectives),
        )
        reason = p.fallback_reason
    if reason is not None:
        warn_once(("fallback", reason), f"redist_opt: using torch's redistribute: {reason}")
        return tdt.torch_redistribute_handback(local_tensor, current_spec, target_spec, async_op=async_op)
    for d in masks:  # _MaskPartial -> R / S: zero the masked rows, then the sum
        tdt.apply_and_release_mask(current_spec.placements[d], local_tensor)
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


def _mask_partials(current_spec, target_spec):
    """``(reason, src, dst, mask dims)`` for a call with ``_MaskPartial`` placements:
    ``reason`` to hand it back, else the placements to plan (each mask dim as
    ``Partial("sum")``) and the mesh dim whose mask changes (at most one)."""
    src, dst = list(current_spec.placements), list(target_spec.placements)
    changed = [d for d, (s, t) in enumerate(zip(src, dst)) if s != t]
    masked = tuple(d for d in changed if tdt.is_mask_partial(src[d]) or tdt.is_mask_partial(dst[d]))
    if len(masked) > 1 or (masked and len(changed) > 1):
        # torch applies each mask right before its own step's reduction; with other
        # steps in between, zeroing up front would not be the same computation.
        return "a _MaskPartial changes together with other mesh dims (its mask applies mid-plan)", src, dst, ()
    if masked and tdt.is_mask_partial(dst[masked[0]]) and not src[masked[0]].is_replicate():
        return "only Replicate becomes _MaskPartial (torch's mask partition)", src, dst, ()
    src = tuple(Partial("sum") if tdt.is_mask_partial(q) else q for q in src)
    dst = tuple(Partial("sum") if tdt.is_mask_partial(q) else q for q in dst)
    return None, src, dst, masked
