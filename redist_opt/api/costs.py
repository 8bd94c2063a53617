"""``redistribute_cost``: what a redistribution costs when redist_opt runs it, for planners.

torch's ``torch.distributed.tensor._collective_utils.redistribute_cost(current_spec,
target_spec)`` prices torch's own plan, one collective per mesh dim, in
microseconds; DTensor's sharding propagation chooses among op strategies by it,
and planners such as autoparallel carry a copy. :func:`redistribute_cost` has
the same signature and units and returns the modelled time of *our* optimized
plan (``plan`` + ``optimize`` under the groups policy, on the mesh's groups as
they exist, with the cost profile ``optimize`` would use): a merged group, a
reorder or one block gather make transitions cheaper than torch's estimate.

What redist_opt does not plan is priced by torch's own function, so the answer
is always the cost of what would run: transitions to a Partial placement (torch
gives 0 for Replicate -> Partial and bans Shard -> Partial and Partial changes
with an infinite cost), ``_StridedShard`` and non-default shard orders,
symbolic shapes, specs without tensor metadata, reduce ops we do not lower.

:func:`routed_redistribute_cost` is what ``enabled(costs=True)`` puts where
torch's sharding propagation looks ``redistribute_cost`` up: inside such a block
DTensor chooses op strategies by our costs (and redistributes through our plans).
"""

from __future__ import annotations

from torch.distributed.tensor.placement_types import Partial

from redist_opt.api.planning import plans_for
from redist_opt.api.specs import spec_of
from redist_opt.ir import cost as cost_module
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import REDUCE_OPS
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api import mesh as tm

__all__ = ["redistribute_cost", "plan_cost", "torch_cost_reason"]

INF = float("inf")


def torch_cost_reason(current_spec, target_spec) -> str | None:
    """Why this transition is priced by torch's own function (None: by our plan)."""
    if current_spec.tensor_meta is None:
        return "the spec has no tensor metadata"
    if tdt.shape_is_symbolic(current_spec):
        return "the global shape is symbolic"
    reason = tdt.needs_torch_planner(current_spec, target_spec)
    if reason is not None:
        return reason
    for cur, tgt in zip(current_spec.placements, target_spec.placements):
        if isinstance(tgt, Partial) and cur != tgt:
            return "the target has a Partial placement the source does not have"
    for spec in (current_spec, target_spec):
        for p in spec.placements:
            if isinstance(p, Partial) and p.reduce_op not in REDUCE_OPS:
                return f"Partial({p.reduce_op!r}) is not lowered by redist_opt"
    return None


def plan_cost(current_spec, target_spec, options: PlanOptions):
    """(naive plan, optimized plan, modelled seconds of the optimized plan), or None
    where :func:`torch_cost_reason` gives a reason or the plan falls back to torch."""
    if torch_cost_reason(current_spec, target_spec) is not None:
        return None
    naive, opt = plans_for(
        spec_of(current_spec.mesh),
        current_spec.placements,
        target_spec.placements,
        tuple(current_spec.shape),
        current_spec.tensor_meta.dtype,
        options,
    )
    if naive.fallback:
        return None
    model = options.cost if options.cost is not None else cost_module.resolve(opt.mesh)[0]
    return naive, opt, model.plan_time(opt)


def redistribute_cost(current_spec, target_spec, *, options: PlanOptions | None = None, **fields) -> float:
    """torch's ``redistribute_cost`` (same arguments, same units: microseconds), priced
    by redist_opt's optimized plan: ``plan`` + ``optimize`` with these options (a
    :class:`~redist_opt.PlanOptions`, or its fields as keywords), on the mesh's groups.

    Like torch's: infinite between different meshes, 0 on a rank outside the mesh
    and for equal placements. What redist_opt does not plan is priced by torch's
    function (see :func:`torch_cost_reason`).
    """
    options = PlanOptions.of(options, **fields)
    if current_spec.mesh != target_spec.mesh:
        return INF
    if not tm.rank_in_mesh(current_spec.mesh):
        return 0.0
    if (
        current_spec.placements == target_spec.placements
        and current_spec.shard_order == target_spec.shard_order
    ):
        return 0.0
    priced = plan_cost(current_spec, target_spec, options)
    if priced is None:
        return tdt.TORCH_REDISTRIBUTE_COST(current_spec, target_spec)
    return priced[2] * tdt.TORCH_COST_UNITS_PER_SECOND
