"""``plan`` and ``optimize``, the cache of plans the eager path looks up, and
``clear_caches`` for every cache redist_opt keeps."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor.placement_types import Placement

from redist_opt import pipeline
from redist_opt.debug import dump
from redist_opt.api.errors import check_groups
from redist_opt.api.specs import as_spec, clear_spec_cache
from redist_opt.ir import cost as cost_module
from redist_opt.ir import plan as plan_module
from redist_opt.ir.torch_merge import MAX_COLLECTIVES
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.plan import Plan, make_plan

__all__ = ["plan", "optimize", "plans_for", "clear_caches"]


def plan(
    mesh,
    src: Sequence[Placement | str] | str,
    dst: Sequence[Placement | str] | str,
    *,
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
) -> Plan:
    """The naive plan DTensor would run for ``src -> dst`` (its merge pass disabled).

    ``mesh`` is a DeviceMesh or a rank-free :class:`MeshSpec`; placements are torch
    ``Placement`` objects or strings (``"R"``, ``"S(0)"``, ``"P(avg)"``; or one
    comma-separated string).
    """
    return make_plan(as_spec(mesh), src, dst, shape, dtype)


def optimize(
    p: Plan,
    *,
    groups: str | Sequence = "existing",
    passes=None,
    cost=None,
    prefer: str = "time",
    dump_dir=None,
    max_collectives: str = "torch",
) -> Plan:
    """Run the pass pipeline (``passes/``) over ``p``; returns a new plan.

    ``groups``: "existing" (only communicators that exist), "create", or a list of
    mesh-dim groups (``["dp+cp"]``) that may be created. ``cost``: a
    :class:`~redist_opt.ir.cost.CostModel` (default: NCCL-like). ``prefer``: "time",
    or "consistency" to merge every reduction a group allows (bitwise-equal
    replicas) whatever the cost. ``max_collectives``: "torch" (default) never
    returns a plan with more collectives than torch 2.13's shipped redistribute
    (merge pass on) issues given the same existing groups, whatever the cost
    profile: the cost model chooses among plans within that count; "any" lets it
    trade launches for bytes (e.g. split a merged all_reduce where the gloo or a
    multi-host profile models two smaller ones as faster). ``passes``: a list of pass classes to run
    instead of the default pipeline. ``dump_dir``: write the IR before the
    pipeline and after every pass that changed it into this directory (default:
    ``$REDIST_OPT_DUMP_DIR``, if set).
    """
    check_groups(groups)
    if not isinstance(groups, str):
        for g in groups:  # names an existing mesh dim set, or raises naming the mesh
            p.mesh.dims_of(g)
    if prefer not in ("time", "consistency"):
        raise RedistributeError(f"prefer={prefer!r}: expected 'time' or 'consistency'")
    if max_collectives not in MAX_COLLECTIVES:
        raise RedistributeError(f"max_collectives={max_collectives!r}: expected one of {MAX_COLLECTIVES}")
    if p.fallback:
        return p
    on_change = dump.pass_dump_writer(dump_dir, p)
    return pipeline.run_pipeline(p, groups=groups, passes=passes, cost=cost, prefer=prefer, on_change=on_change,
                                 max_collectives=max_collectives)


# (spec, src, dst, shape, dtype, options) -> (naive plan, optimized plan)
_hot_plans: dict = {}

# A job with ever-new shapes: past this many entries the hot-plan cache starts over.
HOT_PLANS_LIMIT = 65536


def plans_for(spec, src, dst, shape, dtype, options) -> tuple[Plan, Plan]:
    """(naive, optimized) plan; after the first call one dict lookup (the eager hot path).

    ``options`` is ``(groups, passes, cost, prefer, max_collectives)``, hashable.
    """
    key = (spec, src, dst, shape, dtype, options)
    hit = _hot_plans.get(key)
    if hit is None:
        groups, passes, cost, prefer, max_collectives = options
        naive = make_plan(spec, src, dst, shape, dtype)
        opt = naive if naive.fallback else optimize(
            naive, groups=groups, passes=passes, cost=cost, prefer=prefer, max_collectives=max_collectives)
        if len(_hot_plans) > HOT_PLANS_LIMIT:
            _hot_plans.clear()
        hit = _hot_plans[key] = (naive, opt)
    return hit


def clear_caches() -> None:
    """Forget every cached result: lowered plans, pipeline results, hot plans,
    MeshSpecs of DeviceMeshes and cost profiles read from files."""
    plan_module.clear_cache()
    pipeline.clear_cache()
    cost_module.clear_cache()
    clear_spec_cache()
    _hot_plans.clear()
