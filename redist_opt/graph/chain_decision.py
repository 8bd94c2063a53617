"""The decision on one raised chain: re-plan it, keep it or rewrite it.

A settled chain (its slices' mesh dims agreed, its placements assigned) is planned
from its meaning, ``make_plan(src -> dst)`` then the pass pipeline, and the optimized
plan is priced against the collectives the chain has: the count of collectives,
then the bytes each rank moves (ring volume). :func:`decide_chain` rewrites only a
cheaper chain, and for a chain through a shared value (whose kept collectives count
on both sides) only one cheaper than the chain after that value rewritten alone
(:func:`rival_cost`). It returns a :class:`ChainDecision`: the chain's
:class:`~redist_opt.graph.results.ChainResult`, the new value lowered into the graph
(not yet used) when it was rewritten, and the plans (for the dumps).
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from redist_opt.debug.dump import pass_dump_writer
from redist_opt.graph.chain import Chain
from redist_opt.graph.lower_chains import Unlowerable, lower_into_graph
from redist_opt.graph.results import ChainResult
from redist_opt.ir.cost import steps_and_bytes
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError, placement_str
from redist_opt.ir.plan import make_plan
from redist_opt.pipeline import run_pipeline

__all__ = ["ChainDecision", "decide_chain", "rival_cost"]


@dataclasses.dataclass(frozen=True)
class ChainDecision:
    """What became of one chain."""

    result: ChainResult
    # the chain's new end, lowered into the graph and not yet used; None: the chain is kept
    new_value: fx.Node | None = None
    # (naive, optimized) plans, or () where the chain was not planned
    plans: tuple = ()


def _moved(cs, algorithm="ring") -> float:
    return sum(steps_and_bytes(k, p, b, algorithm)[1] for k, _, b, p in cs)


def _key(cs) -> tuple[int, float]:
    """The cost a chain is compared by: (collectives, bytes moved per rank)."""
    return (len(cs), _moved(cs))


def _original_collectives(chain: Chain):
    out = []
    spec = chain.ctx.spec
    for op in chain.collectives:
        v = op.nodes[0].args[0].meta["val"]
        nbytes = v.numel() * v.element_size()
        p = 1
        for d in op.dims:
            p *= spec.sizes[d]
        out.append((op.kind, "+".join(spec.dim_name(d) for d in op.dims), nbytes, p))
    return out


def _plan_collectives(plan):
    return [(c.kind, c.group.name(plan.mesh), c.bytes_in, c.group.size) for c in plan.collectives()]


def _plan_chain(chain: Chain, options: PlanOptions):
    """(naive, optimized) plans of a settled chain, or why it is not planned."""
    try:
        naive = make_plan(chain.ctx.spec, chain.src, chain.dst, chain.shape, chain.dtype)
        if naive.fallback:
            return f"not planned: {naive.fallback_reason}"
        return naive, run_pipeline(naive, options, on_change=pass_dump_writer(None, naive))
    except RedistributeError as e:
        return f"not planned: {e}"


def rival_cost(chain: Chain, chains: list[Chain], settled, options: PlanOptions):
    """The cost (kept collectives included) of the other way to rewrite what ``chain``
    (through a shared value) rewrites: the chain after the shared value alone, planned
    from that value. ``chain`` is used only when it beats it. ``settled(j)``: whether
    ``chains[j]`` is settled (cut and given placements), settling it on first ask."""
    suffix = {op.nodes[-1] for op in chain.collectives[len(chain.kept_collectives) :]}
    for j, other in enumerate(chains):
        if other.kept or other.end is not chain.end or not settled(j):
            continue
        if {op.nodes[-1] for op in other.collectives} != suffix:
            continue
        planned = _plan_chain(other, options)
        if isinstance(planned, str):
            return None
        kept = _original_collectives(chain)[: len(chain.kept_collectives)]
        return _key(kept + min(_plan_collectives(planned[1]), _original_collectives(other), key=_key))
    return None


def decide_chain(graph: fx.Graph, chain: Chain, options: PlanOptions, rival=None) -> ChainDecision:
    """Plan the settled ``chain`` and, when the plan is cheaper (and cheaper than
    ``rival``, the :func:`rival_cost` of a chain through a shared value), lower it into
    ``graph``; the graph's uses of the chain's end are the caller's to replace."""
    spec = chain.ctx.spec
    src = ",".join(placement_str(p) for p in chain.src)
    dst = ",".join(placement_str(p) for p in chain.dst)
    before = _original_collectives(chain)
    # collectives kept for other users of a shared value: paid before and after
    kept, before = before[: len(chain.kept_collectives)], before[len(chain.kept_collectives) :]

    def result(after, rewritten, reason):
        strip = lambda cs: [c[:3] for c in cs]  # noqa: E731
        return ChainResult(
            chain.names,
            spec.shape_str,
            src,
            dst,
            chain.shape,
            strip(before),
            strip(after),
            rewritten,
            reason,
            strip(kept),
        )

    planned = _plan_chain(chain, options)
    if isinstance(planned, str):
        return ChainDecision(result([], False, planned))
    naive, plan = planned
    after = _plan_collectives(plan)
    old_key, new_key = _key(kept + before), _key(kept + after)
    if new_key >= old_key:
        reason = (
            f"not cheaper ({new_key[0]} collectives moving {new_key[1]:.0f} B vs "
            f"{old_key[0]} moving {old_key[1]:.0f} B{_kept_note(kept)})"
        )
        return ChainDecision(result(after, False, reason), plans=(naive, plan))
    if rival is not None and new_key >= rival:
        reason = (
            f"the chain after the shared value, rewritten alone, is as cheap ({rival[0]} collectives "
            f"moving {rival[1]:.0f} B vs {new_key[0]} moving {new_key[1]:.0f} B{_kept_note(kept)})"
        )
        return ChainDecision(result(after, False, reason), plans=(naive, plan))
    try:
        new_value = lower_into_graph(graph, chain, plan, options.groups)
    except Unlowerable as e:
        return ChainDecision(result(after, False, f"not lowered: {e}"), plans=(naive, plan))
    reason = (
        f"{old_key[0]} -> {new_key[0]} collectives, {old_key[1]:.0f} -> {new_key[1]:.0f} B "
        f"moved per rank{_kept_note(kept)}; passes: {', '.join(plan.applied_passes) or 'none'}"
    )
    return ChainDecision(result(after, True, reason), new_value, (naive, plan))


def _kept_note(kept) -> str:
    return f", counting {len(kept)} kept for other users of a shared value" if kept else ""
