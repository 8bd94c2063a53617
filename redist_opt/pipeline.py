"""Runs the pass pipeline over a plan: torch's PassManager, the verifier as its
check, order constraints, and a cache.

* The pass list is ``passes`` (default ``redist_opt.passes.DEFAULT_PIPELINE``).
  Every pass gets one :class:`~redist_opt.passes.PassContext` whose ``pipeline``
  is that list: reorder-collectives scores each candidate order by running the
  passes of this list after itself (and no others).
* ``PassManager.add_checks`` runs ``ir.verify`` on every graph a pass returns
  (each graph once: an unmodified pass returns its input, already checked).
* Where order matters, a ``this_before_that_pass_constraint`` says so; a pass
  list that breaks one is refused.
* ``on_change(pass_name, plan)`` (optional) sees the plan before the first pass
  (``pass_name`` None) and after every pass that changed it: the debug layer's
  per-pass dumps (``redist_opt.debug.dump.pass_dump_writer``) plug in here, so
  this module never imports it.

The collective cap: with ``max_collectives="torch"`` (the default) the result never
issues more collectives than torch 2.13's shipped redistribute (merge pass on) for
the same input and existing groups, counted by the rank-free model
``redist_opt.ir.torch_merge``. The passes choose by modelled time, which under some
profiles (gloo, ``devices_per_host``) would split a merge torch makes; when the
pipeline's result is over the cap, ``_within_cap`` keeps the fastest plan within it:
the pipeline rerun with ``prefer="consistency"`` (every reduction a group allows
merged), or torch's own merges (``torch_merged_plan``, always within the cap).
``max_collectives="any"`` skips the cap: the cost model may trade launches for bytes.
The cap applies to the default pipeline; a pass list the caller chose runs as given.

Results are cached by (plan, :class:`~redist_opt.ir.options.PlanOptions`), so the
eager hot path pays one dictionary lookup per redistribute after the first; a
run with ``on_change`` is not cached (every run reports).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from torch.fx.passes.infra.pass_manager import PassManager, this_before_that_pass_constraint

from redist_opt import gloo_step_decision, ir
from redist_opt.ir.cost import declare_slower_in_steps
from redist_opt.ir.cost import resolve as resolve_cost
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.plan import Note, Plan
from redist_opt.ir.torch_merge import torch_merged_plan
from redist_opt.passes import (
    DEFAULT_PIPELINE,
    MergeAllGathers,
    MergeGathersAcrossDims,
    MergeReduceScatters,
    MergeReductions,
    MergeReductionsIntoAllReduce,
    PassContext,
    ReduceScatterCreator,
    ReorderCollectives,
)

__all__ = ["run_pipeline", "check_pass_names", "clear_cache", "ORDER", "PLAN_OBSERVERS"]

OnChange = Callable[[str | None, Plan], None]


# Callables that see every plan ``run_pipeline`` returns (cached or not), e.g.
# ``redist_opt.tune`` collecting which passes rewrote a step's redistributions. An observer
# must not raise; it runs on the planning path.
PLAN_OBSERVERS: list[Callable[[Plan], None]] = []

# The built-in gloo profile leaves out the passes measured slower inside its training steps
# (a decision about passes: made here, above them, and carried by the IR's cost model).
declare_slower_in_steps("gloo", gloo_step_decision.SLOWER_IN_STEPS)

# (this, that): when both run, this runs first.
ORDER = [
    # reorder-collectives makes like kinds adjacent, and scores orders by the passes after it
    *((ReorderCollectives, cls) for cls in DEFAULT_PIPELINE if cls is not ReorderCollectives),
    # the reduce_scatters reduce-scatter-creator makes can then merge
    (ReduceScatterCreator, MergeReduceScatters),
    # a run of all_reduces alone is merge-reductions' rewrite; one all_reduce for a run
    # with a reduce_scatter comes after both reduction merges
    (MergeReductions, MergeReductionsIntoAllReduce),
    (MergeReduceScatters, MergeReductionsIntoAllReduce),
    # gathers of one tensor dim are merge-all-gathers'; the rest merge across dims
    (MergeAllGathers, MergeGathersAcrossDims),
]


def run_pipeline(
    p: Plan, options: PlanOptions | None = None, *, on_change: OnChange | None = None, **fields
) -> Plan:
    """``p`` optimized under ``options`` (or ``PlanOptions.of(options, **fields)``)."""
    options = PlanOptions.of(options, **fields)
    if options.cost is None:  # $REDIST_OPT_COST_PROFILE, else the mesh backend's profile
        cost, source = resolve_cost(p.mesh)
        options = dataclasses.replace(options, cost=cost)
    else:
        source = "passed as cost="
    check_pass_names(options)
    if on_change is not None:  # reporting: run uncached, so every run reports
        result = _run_cached.__wrapped__(p, options, source, on_change)
    else:
        result = _run_cached(p, options, source)
    if not (options.max_collectives == "any" or p.fallback or options.passes is not None):
        # (a pass list the caller chose runs as given: ``passes=()`` is torch's own steps)
        result = _within_cap(p, result, options, source)
    for observer in tuple(PLAN_OBSERVERS):
        observer(result)
    return result


def check_pass_names(options: PlanOptions) -> None:
    """Raise ``RedistributeError`` when ``options.without`` or the cost profile's
    ``slower_in_steps`` names a pass the default pipeline does not have (a typo there
    would silently leave a rewrite in)."""
    known = {cls.name for cls in DEFAULT_PIPELINE}
    unknown = sorted(set(options.without) - known)
    if unknown:
        raise RedistributeError(
            f"without={list(options.without)!r}: unknown passes {unknown} (known: {sorted(known)})"
        )
    if options.cost is not None:
        unknown = sorted(set(options.cost.slower_in_steps) - known)
        if unknown:
            raise RedistributeError(
                f"cost profile {options.cost.name!r}: slower_in_steps names unknown passes {unknown} "
                f"(known: {sorted(known)})"
            )


@functools.lru_cache(maxsize=4096)
def _within_cap(p: Plan, result: Plan, options: PlanOptions, source) -> Plan:
    """``result``, or when it issues more collectives than torch's plan for ``p``, the
    fastest plan that does not (modelled time, then bytes): the pipeline rerun with
    ``prefer="consistency"``, or torch's own merges."""
    torch_plan = torch_merged_plan(p)
    cap = torch_plan.num_collectives
    if result.num_collectives <= cap:
        return result
    candidates = []
    if options.prefer != "consistency":
        # every reduction a group allows, but still without the passes ``options`` leaves
        # out (``without``, and the profile's ``slower_in_steps``): the cap never re-admits them
        consistent = dataclasses.replace(
            options, prefer="consistency", without=tuple(sorted(_left_out_names(options)))
        )
        merged = _run_cached(p, consistent, source)
        if merged.num_collectives <= cap:
            candidates.append(merged)
    candidates.append(
        torch_plan.replace(
            applied_passes=("torch-merges",), notes=result.notes, cost_profile=result.cost_profile
        )
    )
    best = min(candidates, key=lambda o: (options.cost.plan_time(o), o.bytes_per_rank))
    note = Note(
        "collective-cap",
        True,
        f"kept a plan of {best.num_collectives} collectives",
        f"the passes' plan issues {result.num_collectives} collectives, torch 2.13 issues {cap}; "
        f"max_collectives='torch' keeps the fastest plan within torch's count "
        f"(pass max_collectives='any' to trade launches for bytes)",
    )
    return best.replace(notes=tuple(best.notes) + (note,))


class _Tracked:
    """Wraps a pass for the PassManager: records whether it changed the IR and reports it."""

    def __init__(self, inner, changed: list, on_change=None) -> None:
        self.inner, self.changed, self.on_change = inner, changed, on_change
        self.__name__ = inner.name

    def __repr__(self) -> str:  # names the pass in PassManager's constraint errors
        return self.inner.name

    def __call__(self, gm):
        result = self.inner(gm)
        if result.modified:
            self.changed.append(self.inner.name)
            if self.on_change is not None:
                self.on_change(self.inner.name, result.graph_module)
        return result


def _constraints(instances: list[_Tracked]) -> list:
    by_class = {type(t.inner): t for t in instances}
    return [
        this_before_that_pass_constraint(by_class[this], by_class[that])
        for this, that in ORDER
        if this in by_class and that in by_class
    ]


@functools.lru_cache(maxsize=4096)
def _run_cached(p: Plan, options: PlanOptions, source, on_change=None) -> Plan:
    pass_classes = DEFAULT_PIPELINE if options.passes is None else list(options.passes)
    left_out = _left_out(pass_classes, options)
    pass_classes = [c for c in pass_classes if c not in left_out]
    if not pass_classes:
        return p
    ctx = PassContext(
        mesh=p.mesh,
        shape=p.shape,
        src=p.src,
        dtype=p.dtype,
        options=options,
        pipeline=tuple(pass_classes),
    )
    profile = f"{options.cost.name} ({source})"
    changed: list[str] = []

    def snapshot(gm) -> Plan:
        return p.replace(
            graph=gm, applied_passes=tuple(changed), notes=tuple(ctx.notes), cost_profile=profile
        )

    report = None
    if on_change is not None:
        on_change(None, snapshot(p.graph))

        def report(pass_name, gm):
            on_change(pass_name, snapshot(gm))

    instances = [_Tracked(cls(ctx), changed, report) for cls in pass_classes]
    manager = PassManager(
        passes=instances, constraints=_constraints(instances), run_checks_after_each_pass=True
    )
    try:
        manager.validate_constraints()  # refuse a list that breaks ORDER; never re-sort it
    except RuntimeError:
        names = [cls.name for cls in pass_classes]
        broken = [
            f"{a.name} before {b.name}"
            for a, b in ORDER
            if a.name in names and b.name in names and names.index(a.name) > names.index(b.name)
        ]
        raise ValueError(f"pass order {names} breaks the pipeline's order: {', '.join(broken)}") from None
    manager.add_checks(_verifier(p))
    # Passes build new graphs (steps.relower) and never mutate their input.
    try:
        result = manager(p.graph)
    except Exception as e:
        # PassManager wraps pass errors; a RedistributeError is the user's, surface it.
        if isinstance(e.__cause__, RedistributeError):
            raise e.__cause__ from None
        raise
    return snapshot(result.graph_module)


def _left_out(pass_classes, options: PlanOptions) -> set:
    """The passes of ``pass_classes`` that ``options`` leaves out (:func:`_left_out_names`)."""
    names = _left_out_names(options)
    return {c for c in pass_classes if c.name in names}


def _left_out_names(options: PlanOptions) -> set:
    """Names of the default pipeline's passes that ``options`` leaves out: those named in
    ``without``, and those the cost profile lists as making measured training steps slower
    (``CostModel.slower_in_steps``). The profile's list is not applied under
    ``prefer="consistency"`` asked by the caller, which asks for the fewest collectives
    whatever the time, nor to a pass list the caller chose, which runs as given."""
    if options.passes is not None:
        return set()
    names = set(options.without)
    if options.prefer != "consistency":
        names |= set(options.cost.slower_in_steps)
    return names


def _verifier(p: Plan):
    """``ir.verify`` for the PassManager: each graph once (the input was verified when
    it was lowered; an unmodified pass returns the graph it was given)."""
    expected = ir.local_shape(p.shape, p.dst, p.mesh.sizes)
    last = [p.graph]

    def check(gm):
        if gm is not last[0]:
            ir.verify(gm, p.mesh.sizes, expected)
            last[0] = gm

    return check


def clear_cache() -> None:
    """Forget every pipeline result (``redist_opt.clear_caches``)."""
    _run_cached.cache_clear()
    _within_cap.cache_clear()
