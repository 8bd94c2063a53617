"""``redistribute_local_tensor``: redist_opt's version of torch's function of the
same name, which redistributes one rank's local tensor (the eager path).

Plans come from the hot-plan cache (``planning.plans_for``); what redist_opt does
not lower runs through torch's own function (merge pass on, as torch runs it,
unless the input hits its uneven all_gather merge bug), with a warning once per reason.

A plan runs, outside tracing, as a program specialized to this rank, built once
per hot plan, mesh and rank (``runtime.specialize``: integers, resolved groups, a
list of steps), the one executable form of a plan. It runs even where our plan is
torch's own: measured on the fake backend (``benchmarks/eager_overhead.py``), the
program takes 0.79x torch's time per cached call there, where handing the call to
torch's function took 1.06x (torch's per-call planning plus our lookup). A call seen
before (same specs, dtype and options) finds its program with one lookup
(:func:`cached_runner`, what ``enabled()``'s routed function asks first, in the one
call cache: ``api.call_cache``). While tracing, a program is built for the trace and
not kept.

``_MaskPartial`` (the vocab-parallel embedding's partial) is a sum whose rows
outside the rank's vocab shard are zeroed first, from per-rank mask state in the
placement. As torch: Replicate -> _MaskPartial runs the placement's own
partition (no collective); _MaskPartial -> R / S zeroes the masked rows in place
and releases the mask, then the plan reduces it as ``Partial("sum")``.
"""

from __future__ import annotations

import weakref

import torch
from torch.distributed.tensor.placement_types import Partial

from redist_opt.api import call_cache
from redist_opt.api.errors import warn_once
from redist_opt.api.planning import HotPlan, fallback_reason, plans_for
from redist_opt.api.specs import spec_of
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError, placements_str
from redist_opt.runtime import consensus
from redist_opt.runtime.execute import check_local_shape, input_shape
from redist_opt.runtime.groups import GroupUnavailable
from redist_opt.runtime.specialize import specialize
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api import mesh as tm

__all__ = ["redistribute_local_tensor", "cached_runner"]


def redistribute_local_tensor(
    local_tensor: torch.Tensor,
    current_spec,
    target_spec,
    *,
    async_op: bool = False,
    options: PlanOptions | None = None,
    **fields,
) -> torch.Tensor:
    """redist_opt's version of torch's ``redistribute_local_tensor`` (same contract);
    ``options`` / ``fields``: the :class:`~redist_opt.PlanOptions` to plan with."""
    options = PlanOptions.of(options, **fields)
    run = cached_runner(local_tensor, current_spec, target_spec, options)
    if run is not None:
        return run(local_tensor, current_spec, target_spec, async_op)
    device_mesh = current_spec.mesh
    if target_spec.mesh != device_mesh:
        raise RedistributeError(
            f"cannot redistribute between different meshes ({device_mesh} -> {target_spec.mesh})"
        )
    if not tm.rank_in_mesh(device_mesh):
        return local_tensor
    reason = tdt.needs_torch_planner(current_spec, target_spec)
    src, dst, masks = current_spec.placements, target_spec.placements, ()
    if reason is None and any(tdt.is_mask_partial(q) for q in (*src, *dst)):
        reason, src, dst, masks = _mask_partials(current_spec, target_spec)
        if reason is None and masks and tdt.is_mask_partial(target_spec.placements[masks[0]]):
            d = masks[0]  # Replicate -> _MaskPartial: torch's partition, no collective
            return tdt.mask_partition(target_spec.placements[d], local_tensor, device_mesh, d)
    # torch 2.15: whether torch's own call runs a zero-fill its graph-based planner chose
    # (None: it cannot). Read from torch's plan cache, so a cached call checks it again.
    zero_fills = None
    if reason is None and tdt.may_zero_fill(current_spec, target_spec):
        zero_fills = tdt.torch_plan_zero_fills(current_spec, target_spec)
        if zero_fills:
            reason = "torch's graph-based planner (use_min_cost_redistribution_plan()) zero-fills this call"
    shape, dtype = tuple(current_spec.shape), local_tensor.dtype
    if reason is None:
        # Read from the mesh's shape, the placements, the shape and the dtype: the same on
        # every rank, so a hand-back is decided before the store round, which it never needs.
        spec = spec_of(device_mesh)
        reason = fallback_reason(spec, src, dst, shape, dtype)
    if reason is not None:
        return _hand_back(reason, local_tensor, current_spec, target_spec, options, async_op, zero_fills)
    consensus.check_planning_inputs(device_mesh, spec, options.cost)  # the same profile on every rank
    hot = plans_for(spec, src, dst, shape, dtype, options)
    for d in masks:  # _MaskPartial -> R / S: zero the masked rows, then the sum
        tdt.apply_and_release_mask(current_spec.placements[d], local_tensor)
    check_local_shape(input_shape(hot.naive.graph), local_tensor, device_mesh)
    if tdt.are_we_tracing():  # traced once per program: a program for this trace, not kept
        return _specialize_or_unmerged(hot, device_mesh)(local_tensor, async_op)
    run = _runner(hot, current_spec)
    if not masks:
        _remember_call(current_spec, target_spec, local_tensor, options, run, zero_fills)
    return run(local_tensor, current_spec, target_spec, async_op)


# -- cached calls: (current spec, target spec, local dtype, options) in api.call_cache ---


def cached_runner(local_tensor, current_spec, target_spec, options: PlanOptions):
    """How a call seen before runs (``run(local, current_spec, target_spec, async_op,
    is_explicit=False)``: a rank program's runner or a ``TorchHandBack``), or None: not
    seen, the mesh's groups changed since (``call_cache.lookup``), torch's own plan for it
    changed whether it zero-fills (torch 2.15's graph-based planner, read from torch's plan
    cache: see ``tdt.may_zero_fill``), or traced or under a DebugMode, which the first path
    handles."""
    hit = call_cache.lookup((current_spec, target_spec, local_tensor.dtype, options), current_spec.mesh)
    if hit is None:
        return None
    if tdt.are_we_tracing() or tdt.debug_mode_active():
        return None
    if (
        hit.zero_fills is not None
        and tdt.torch_plan_zero_fills(current_spec, target_spec) is not hit.zero_fills
    ):
        return None
    return hit.run


def _remember_call(current_spec, target_spec, local_tensor, options, run, zero_fills=None) -> None:
    call_cache.remember(
        (current_spec, target_spec, local_tensor.dtype, options), current_spec.mesh, run, zero_fills
    )


def _hand_back(reason: str, local_tensor, current_spec, target_spec, options, async_op, zero_fills=None):
    """torch's own call for what redist_opt does not lower (``reason``), remembered like a
    planned call: the next one with the same specs, dtype and options runs torch's
    function from :func:`cached_runner`, after one lookup."""
    warn_once(("fallback", reason), f"redist_opt: using torch's redistribute: {reason}")
    run = call_cache.hand_back(current_spec.mesh)
    if not tdt.are_we_tracing():
        _remember_call(current_spec, target_spec, local_tensor, options, run, zero_fills)
    return run(local_tensor, current_spec, target_spec, async_op)


def _runner(hot: HotPlan, current_spec):
    """The program that runs ``hot`` on this mesh and rank, built once per hot plan,
    mesh and LocalTensorMode."""
    device_mesh = current_spec.mesh
    key = (id(device_mesh), tm.flattened_count(tm.root_mesh(device_mesh)), id(tdt.local_tensor_mode()))
    hit = hot.runners.get(key)
    if hit is not None and hit[0]() is device_mesh:
        return hit[1]
    run = _program_runner(_specialize_or_unmerged(hot, device_mesh))
    hot.runners[key] = (weakref.ref(device_mesh), run)
    return run


def _program_runner(program):
    def run(local_tensor, current_spec, target_spec, async_op, is_explicit=False):
        return program(local_tensor, async_op)

    run.program = program
    return run


def _specialize_or_unmerged(hot: HotPlan, device_mesh):
    dtype = hot.naive.dtype
    try:
        return specialize(hot.opt.graph, device_mesh, dtype=dtype, groups=hot.options.groups)
    except GroupUnavailable as e:
        if hot.opt is hot.naive:
            raise
        _warn_unmerged(hot, e)
        return specialize(hot.naive.graph, device_mesh, dtype=dtype)


def _warn_unmerged(hot: HotPlan, e: Exception) -> None:
    warn_once(
        ("group", str(e)),
        f"redist_opt: {e}; running the unmerged plan for {placements_str(hot.naive.src)} -> "
        f"{placements_str(hot.naive.dst)}",
    )


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
        return (
            "a _MaskPartial changes together with other mesh dims (its mask applies mid-plan)",
            src,
            dst,
            (),
        )
    if masked and tdt.is_mask_partial(dst[masked[0]]) and not src[masked[0]].is_replicate():
        return "only Replicate becomes _MaskPartial (torch's mask partition)", src, dst, ()
    src = tuple(Partial("sum") if tdt.is_mask_partial(q) else q for q in src)
    dst = tuple(Partial("sum") if tdt.is_mask_partial(q) else q for q in dst)
    return None, src, dst, masked
