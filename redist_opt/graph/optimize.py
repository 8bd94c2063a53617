"""The compiled-graph pass over one graph: raise collective chains, optimize across them, lower back.

:func:`optimize_graph` ``(gm, *, meshes=None, options=None, **fields) -> GraphPassResult``
rewrites a forward or backward ``GraphModule`` in place under one
:class:`~redist_opt.PlanOptions` (``redist_opt.backend`` calls it before its inner
compiler, ``compiler_fn`` before its own, :class:`~redist_opt.graph.inductor_pass.RedistGraphPass`
as Inductor's post-grad pass). It runs, in order:

1. the chains: each chain of collectives is raised into the IR, re-planned and lowered
   back when cheaper (:mod:`redist_opt.graph.chain_decision`);
2. all-reduce reassociation (:mod:`redist_opt.graph.reassociate`):
   ``add(all_reduce(a, G), all_reduce(b, G))`` -> ``all_reduce(add(a, b), G)``; in
   ``GraphPassResult.reassociated``;
3. collective combining (:mod:`redist_opt.graph.combine`): small collectives of one kind
   over one group become one collective of their concatenation; in
   ``GraphPassResult.combined``.

:class:`GraphRewrites` turns steps 2 and 3 off. The result types are in
:mod:`redist_opt.graph.results`, the dump files in :mod:`redist_opt.debug.graph_dump`.

Rewrite, per chain (see :mod:`redist_opt.graph.raise_chains` for what a chain is)::

    chain of collectives + local ops  --raise-->  redistribute(src -> dst) on a root mesh
    plan(src, dst) --passes/ pipeline-->  optimized IR  --lower_chains-->  funcol + wait_tensor

Because a chain is re-planned from its meaning, rewrites across
redistributions fall out of the planner and the pipeline:

* ``all_reduce(G)`` then this rank's block of ``G`` (XLA's ReduceScatterCreator):
  ``P -> S(d)`` is one ``reduce_scatter(G)``;
* ``all_gather(G)`` then this rank's block of ``G``: ``S(d) -> S(d)`` is nothing;
* reductions from different places (hand-written funcol and DTensor) over
  disjoint dims: ``P, P, P -> ...`` merges them over the product group when one
  is available (XLA's AllReduceFolder), and scatters move before reductions so
  these carry fewer bytes.

Legality: those of raising, plus

1. the new chain is used only if it is cheaper: fewer collectives, or as many
   moving fewer bytes per rank (ring volume); otherwise the graph is unchanged;
2. reductions may be regrouped (summation order changes; exact for
   integer-valued data, within rounding otherwise): the same freedom the
   pipeline takes in eager mode; nothing else changes values;
3. the decision uses only shapes, dtypes, layouts and graph structure, so every
   rank rewrites the same chains the same way and creates groups in the same order.

A chain through a value with more than one user keeps that value (and the
collectives before it) for the other users, and is rewritten only when it is
cheaper counting the kept collectives on both sides, and cheaper than the chain
after that value rewritten alone (which is then tried instead).

What it does not do: raise chains through ``all_to_all_single`` or uneven shards
(pad / narrow), though plans using them are lowered; collectives on different
root meshes. Each is left as it was with a one-line reason in the result (and in
the dump).
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from redist_opt.debug.graph_dump import GraphPassDump
from redist_opt.graph.agreement import SliceAgreement
from redist_opt.graph.chain import Chain, NotRaised, after, truncate
from redist_opt.graph.chain_decision import decide_chain, rival_cost
from redist_opt.graph.chain_placements import assign_placements
from redist_opt.graph.combine import collective_time_on, combine_collectives
from redist_opt.graph.mesh_groups import MeshContext, mesh_contexts
from redist_opt.graph.raise_chains import find_chains
from redist_opt.graph.reassociate import reassociate_all_reduces
from redist_opt.graph.results import ChainResult, GraphPassResult, count_collectives
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError
from redist_opt.torch_api.tracing import unset_fake_temporarily

__all__ = ["optimize_graph", "GraphRewrites", "check_allow_list"]


@dataclasses.dataclass(frozen=True)
class GraphRewrites:
    """Which rewrites of the graph pass run after the chains' (graph-only: no plan has them)."""

    # fold adds of all_reduced values into one all_reduce of the sum (graph/reassociate.py)
    reassociate: bool = True
    # combine small collectives of one kind over one group (graph/combine.py)
    combine: bool = True


def optimize_graph(
    gm: fx.GraphModule | fx.Graph,
    *,
    meshes=None,
    options: PlanOptions | None = None,
    rewrites: GraphRewrites = GraphRewrites(),
    agreement: SliceAgreement | None = None,
    all_gather=None,
    **fields,
) -> GraphPassResult:
    """Raise, optimize and lower back every collective chain of ``gm``, in place; then
    the :class:`GraphRewrites` ``rewrites`` names (by default both): all-reduce
    reassociation and collective combining.

    ``meshes``: DeviceMeshes (or one) whose root meshes groups are matched
    against (or a :class:`~redist_opt.graph.mesh_groups.GivenMeshes`, ``compiler_fn``'s:
    their contexts, built once); None finds every live root mesh this rank belongs to, and a group name
    resolves to the first root whose dims give its ranks (most dims first, then most
    flattened groups): exact either way, but pass the program's meshes to be sure
    the root with its flattened groups is used (``redist_opt.backend`` passes the
    meshes it traced on).
    ``options=PlanOptions(...)`` or its fields as keywords, as for
    :func:`redist_opt.optimize`, every one honoured: ``groups`` "existing" (only
    process groups that exist), "create" or an allow-list (flattened groups created at
    compile time, in graph order; an allow-list names dims of the given meshes);
    ``passes`` re-plans each chain with that pass list; ``cost``, ``prefer`` and
    ``max_collectives`` price and cap the plans (the cost model also prices combining).
    ``agreement``: how ranks agree on the mesh dims of constant-index slices, one
    round per graph (:class:`~redist_opt.graph.agreement.SliceAgreement`: through the
    default group's store, among the ranks compiling the same program, bounded in
    time). It counts the rounds of each graph, so a compiler passes the same one for
    every graph it compiles (``redist_opt.backend`` does); None: a new one.
    ``all_gather``: ``all_gather(facts) -> every rank's facts, or a reason string``,
    called once per graph instead of the store (with ``agreement=None``).
    """
    options = PlanOptions.of(options, **fields)
    if not isinstance(rewrites, GraphRewrites):
        raise RedistributeError(f"rewrites={rewrites!r}: expected a redist_opt.graph_pass.GraphRewrites")
    if agreement is None:
        agreement = SliceAgreement(all_gather)
    # Compiler callbacks run under the tracing fake mode; mesh rank maps are real tensors.
    with unset_fake_temporarily():
        contexts = mesh_contexts(meshes)
        check_allow_list(options, [c.spec for c in contexts])
        return _optimize_over(gm, contexts, options, agreement, rewrites)


def check_allow_list(options: PlanOptions, specs) -> None:
    """Refuse ``groups=[...]`` naming dims that none of ``specs`` (the meshes) has."""
    if isinstance(options.groups, str) or not specs:
        return
    for name in options.groups:
        errors = []
        for spec in specs:
            try:
                spec.dims_of(name)
                break
            except RedistributeError as e:
                errors.append(str(e))
        else:
            raise RedistributeError(f"groups={list(options.groups)!r}: {errors[0]}")


def _optimize_over(
    gm, contexts: list[MeshContext], options: PlanOptions, agreement: SliceAgreement, rewrites: GraphRewrites
) -> GraphPassResult:
    """:func:`optimize_graph` over the meshes' ``contexts``, ``options`` checked against them."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    dump = GraphPassDump.from_env()
    if dump is not None:
        dump.graph("before", gm)
    chains, not_raised = find_chains(graph, contexts) if contexts else ([], [])
    if not contexts and count_collectives(graph):
        not_raised.append(NotRaised(("*",), "no DeviceMesh this rank belongs to was found"))
    failed, notes, aborted_ranks = _agree(graph, chains, agreement)
    if contexts and count_collectives(graph):  # chains and combining are priced: the same profile everywhere
        agreement.check_profile(contexts, options.cost, aborted_ranks)
    results: list[ChainResult] = []
    modified = False
    erased: set[fx.Node] = set()
    settled = _Settled(chains, failed, not_raised)
    # In find_chains' order: a chain whose nodes a rewritten chain took is skipped.
    for ci, chain in enumerate(chains):
        if erased.intersection(chain.nodes) or not settled(ci):
            continue
        rival = rival_cost(chain, chains, settled, options) if chain.kept else None
        decision = decide_chain(graph, chain, options, rival)
        res = decision.result
        if chain.stop_reason and not res.rewritten:
            res.reason += f"; the chain stops before {chain.stop_reason}"
        if ci in notes:
            res.reason += f"; {notes[ci]}"
        results.append(res)
        if dump is not None:
            dump.chain(ci, res.nodes, res, decision.plans)
        if decision.new_value is not None:
            chain.end.replace_all_uses_with(decision.new_value)
            for n in reversed(chain.nodes):
                if not n.users and n not in erased:
                    graph.erase_node(n)
                    erased.add(n)
            modified = True
    reassociated = reassociate_all_reduces(graph) if rewrites.reassociate else []
    combined = (
        combine_collectives(graph, collective_time_on(contexts, options.cost))
        if rewrites.combine and contexts
        else []
    )
    modified = modified or bool(reassociated) or bool(combined)
    if modified:
        graph.lint()
        if isinstance(gm, fx.GraphModule):
            gm.recompile()
    result = GraphPassResult(modified, results, not_raised, reassociated, combined)
    if dump is not None:
        dump.graph("after", gm)
        dump.explain(result.explain())
    return result


def _agree(graph, chains: list[Chain], agreement: SliceAgreement):
    """Give every chain's slices their mesh dims, agreed in one round for the graph;
    the part of a chain after a slice that could not be agreed is appended to
    ``chains`` as a chain of its own (its collectives can still be rewritten).
    Returns ({chain index: (position of the first unagreed slice, why)},
    {chain index: a note on where its slice dims came from}, the round's ranks if it aborted)."""
    agreed = agreement.agree(graph, chains)
    failed: dict[int, tuple[int, str]] = {}
    notes: dict[int, str] = {}
    ci = 0
    while ci < len(chains):
        chain = chains[ci]
        for pos, op in enumerate(chain.ops):
            if op.kind != "slice":
                continue
            first = op.nodes[0]
            if first in agreed.failed:
                failed[ci] = (pos, agreed.failed[first])
                rest = after(chain, pos)
                if rest is not None:
                    chains.append(rest)
                break
            chain.ops[pos] = dataclasses.replace(op, dims=agreed.dims[first])
            if first in agreed.notes:
                notes[ci] = agreed.notes[first]
        ci += 1
    return failed, notes, agreed.aborted_ranks


class _Settled:
    """``settled(i)``: whether ``chains[i]`` is left with something to rewrite once cut
    where its slices' agreement failed and given placements; each chain is settled once,
    on first ask (by the driver, or by the rival of a chain through a shared value)."""

    def __init__(self, chains: list[Chain], failed: dict, not_raised: list) -> None:
        self.chains, self.failed, self.not_raised = chains, failed, not_raised
        self.done: dict[int, bool] = {}

    def __call__(self, i: int) -> bool:
        if i not in self.done:
            self.done[i] = _settle(self.chains[i], self.failed.get(i), self.not_raised)
        return self.done[i]


def _settle(chain: Chain, failure, not_raised: list) -> bool:
    """Cut ``chain`` where its slices' agreement failed and give it placements; False
    (with the reason recorded) when nothing is left to rewrite."""
    whole = chain.names
    if failure is not None:
        pos, why = failure
        if chain.kept and pos <= chain.kept:
            not_raised.append(NotRaised(whole, f"not continued through a shared value: {why}"))
            return False
        if not truncate(chain, pos, why) or len(chain.collectives) == len(chain.kept_collectives):
            not_raised.append(NotRaised(whole, why))
            return False
    why = assign_placements(chain)
    if why is not None:
        not_raised.append(NotRaised(chain.names, why))
        return False
    return True
