"""``plan`` and ``optimize``, the cache of plans the eager path looks up, and
``clear_caches`` for every cache redist_opt keeps."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor.placement_types import Placement

from redist_opt import pipeline
from redist_opt.api.specs import as_spec, clear_spec_cache
from redist_opt.debug import dump
from redist_opt.ir import cost as cost_module
from redist_opt.ir import plan as plan_module
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.plan import Plan, make_plan
from redist_opt.runtime import store_round

__all__ = ["plan", "optimize", "plans_for", "fallback_reason", "HotPlan", "clear_caches"]


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


def optimize(p: Plan, *, options: PlanOptions | None = None, dump_dir=None, **fields) -> Plan:
    """Run the pass pipeline (``passes/``) over ``p``; returns a new plan.

    The options are a :class:`~redist_opt.PlanOptions`, given as ``options=`` or as
    its fields (``groups=``, ``passes=``, ``cost=``, ``prefer=``, the collective cap).
    ``groups``: "existing" (only communicators that exist), "create", or a list of
    mesh-dim groups (``["dp+cp"]``) that may be created. ``cost``: a
    :class:`~redist_opt.ir.cost.CostModel`, a profile name ("nccl", "gloo",
    "gloo-ring") or a profile file (default: ``$REDIST_OPT_COST_PROFILE``, else the
    mesh backend's). ``prefer``: "time", or "consistency" to merge every reduction
    a group allows (bitwise-equal replicas) whatever the cost. The cap: "torch"
    (default) never returns a plan with more collectives than torch 2.13's shipped
    redistribute (merge pass on) issues given the same existing groups, whatever
    the cost profile; "any" lets the cost model trade launches for bytes (e.g.
    split a merged all_reduce where the gloo or a multi-host profile models two
    smaller ones as faster). ``passes``: a list of pass classes to run instead of
    the default pipeline. ``dump_dir``: write the IR before the pipeline and after
    every pass that changed it into this directory (default:
    ``$REDIST_OPT_DUMP_DIR``, if set).
    """
    options = PlanOptions.of(options, **fields)
    if not isinstance(options.groups, str):
        for g in options.groups:  # names an existing mesh dim set, or raises naming the mesh
            p.mesh.dims_of(g)
    if p.fallback:
        return p
    return pipeline.run_pipeline(p, options, on_change=dump.pass_dump_writer(dump_dir, p))


class HotPlan:
    """A cached ``(naive, optimized)`` plan pair (unpacks as that pair), and what runs
    it on a cached eager call (``api.eager`` fills ``runners``)."""

    __slots__ = ("naive", "opt", "options", "runners")

    def __init__(self, naive: Plan, opt: Plan, options: PlanOptions) -> None:
        self.naive, self.opt, self.options = naive, opt, options
        self.runners: dict = {}

    def __iter__(self):
        return iter((self.naive, self.opt))


# (spec, src, dst, shape, dtype, options) -> HotPlan
_hot_plans: dict = {}

# A job with ever-new shapes: past this many entries the hot-plan cache starts over.
HOT_PLANS_LIMIT = 65536


def fallback_reason(spec, src, dst, shape, dtype) -> str | None:
    """Why the plan of this call runs through torch (placements or a dtype the IR does not
    lower), or None. Read from the mesh's shape, the placements, the shape and the dtype
    only (the lowering, cached), never from a store round or the options: the same on
    every rank, so the eager path decides a hand-back before it agrees on anything."""
    return make_plan(spec, src, dst, shape, dtype).fallback_reason


def plans_for(spec, src, dst, shape, dtype, options: PlanOptions) -> HotPlan:
    """The (naive, optimized) plans; after the first call one dict lookup."""
    key = (spec, src, dst, shape, dtype, options)
    hit = _hot_plans.get(key)
    if hit is None:
        naive = make_plan(spec, src, dst, shape, dtype)
        opt = naive if naive.fallback else optimize(naive, options=options)
        if len(_hot_plans) > HOT_PLANS_LIMIT:
            _hot_plans.clear()
        hit = _hot_plans[key] = HotPlan(naive, opt, options)
    return hit


def clear_caches() -> None:
    """Forget every cached result: lowered plans, pipeline results, hot plans (and the
    programs specialized from them), MeshSpecs of DeviceMeshes and cost profiles read
    from files; and agreement rounds start a new generation (call it on every rank alike,
    as a collective: see ``redist_opt.runtime.store_round``)."""
    plan_module.clear_cache()
    pipeline.clear_cache()
    cost_module.clear_cache()
    clear_spec_cache()
    store_round.clear_caches()
    _hot_plans.clear()
    for clear in CLEAR_HOOKS:
        clear()


# What else clear_caches() clears (api.eager registers its cache of cached calls,
# api.routing its cache of hand-back decisions).
CLEAR_HOOKS: list = []
