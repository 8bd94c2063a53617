"""The compiled-graph pass: raise collective chains, optimize across them, lower back.

Entry points:

* :func:`optimize_graph` ``(gm, *, meshes=None, options=None, **fields) ->
  GraphPassResult``: rewrites a forward/backward ``GraphModule`` in place under one
  :class:`~redist_opt.PlanOptions` (what ``redist_opt.backend`` calls before its
  inner compiler);
  Then all-reduce reassociation (:mod:`redist_opt.graph.reassociate`):
  ``add(all_reduce(a, G), all_reduce(b, G))`` -> ``all_reduce(add(a, b), G)``;
  counted in ``GraphPassResult.reassociated``; then collective combining
  (:mod:`redist_opt.graph.combine`): small collectives of one kind over one group
  become one collective of their concatenation; in ``GraphPassResult.combined``;
* :class:`RedistGraphPass`: the same as an Inductor ``CustomGraphPass`` for
  ``torch._inductor.config.post_grad_custom_post_pass``, whose ``uuid`` covers every
  decision (:mod:`redist_opt.graph.cache_key`) so FX graph caching stays correct.

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
import itertools
from pathlib import Path

import torch.fx as fx

from redist_opt.debug.dump import dump_dir_from_env, pass_dump_writer, rank_suffix
from redist_opt.graph.agreement import SliceAgreement
from redist_opt.graph.cache_key import graph_pass_key
from redist_opt.graph.chain import COLLECTIVES, Chain, NotRaised, after, truncate
from redist_opt.graph.chain_placements import assign_placements
from redist_opt.graph.combine import Combination, collective_time_on, combine_collectives
from redist_opt.graph.lower_chains import Unlowerable, lower_into_graph
from redist_opt.graph.mesh_groups import mesh_contexts
from redist_opt.graph.raise_chains import find_chains
from redist_opt.graph.reassociate import Reassociation, reassociate_all_reduces
from redist_opt.ir.cost import steps_and_bytes
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError, placement_str
from redist_opt.ir.plan import make_plan
from redist_opt.pipeline import run_pipeline
from redist_opt.torch_api.inductor import CustomGraphPass
from redist_opt.torch_api.tracing import unset_fake_temporarily

__all__ = [
    "optimize_graph",
    "GraphPassResult",
    "ChainResult",
    "RedistGraphPass",
    "GraphRewrites",
    "SliceAgreement",
    "count_collectives",
]


@dataclasses.dataclass
class ChainResult:
    """One raised chain: what it meant, what it was, and what it became."""

    nodes: tuple[str, ...]
    mesh: str
    src: str
    dst: str
    shape: tuple[int, ...]
    before: list[tuple[str, str, int]]  # (kind, mesh dims, bytes in) of the original collectives
    after: list[tuple[str, str, int]]
    rewritten: bool
    reason: str
    # collectives before a shared value, kept for its other users (counted on both sides)
    kept: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        def fmt(cs):
            return " ; ".join(f"{k}({g})" for k, g, _ in cs) or "nothing"

        verdict = "rewritten" if self.rewritten else "kept"
        shared = f"[{fmt(self.kept)} kept] " if self.kept else ""
        return (
            f"{self.src} -> {self.dst} {self.shape} on {self.mesh}: {shared}{fmt(self.before)} => "
            f"{shared}{fmt(self.after)}: {verdict}: {self.reason}"
        )


@dataclasses.dataclass
class GraphPassResult:
    modified: bool
    chains: list[ChainResult]
    not_raised: list[NotRaised]
    # adds/subs of all_reduced values rewritten by the reassociation pass (after the chains)
    reassociated: list[Reassociation] = dataclasses.field(default_factory=list)
    # collectives combined by the combining pass (last)
    combined: list[Combination] = dataclasses.field(default_factory=list)

    @property
    def all_reduces_reassociated(self) -> int:
        """All_reduces the reassociation pass removed."""
        return sum(r.removed for r in self.reassociated)

    @property
    def collectives_combined(self) -> int:
        """Collectives the combining pass removed."""
        return sum(c.removed for c in self.combined)

    def _counted(self) -> list[ChainResult]:
        # a chain through a shared value that was not rewritten overlaps the chains
        # before and after that value, which are counted themselves
        return [c for c in self.chains if c.rewritten or not c.kept]

    @property
    def collectives_before(self) -> int:
        return sum(len(c.before) for c in self._counted())

    @property
    def collectives_after(self) -> int:
        return sum(len(c.after if c.rewritten else c.before) for c in self._counted())

    def explain(self) -> str:
        lines = [str(c) for c in self.chains] + [str(n) for n in self.not_raised]
        lines += [str(r) for r in self.reassociated] + [str(c) for c in self.combined]
        return "\n".join(lines)


def count_collectives(graph) -> dict[str, int]:
    """``{kind: count}`` of ``_c10d_functional`` collectives in a graph (waits excluded)."""
    g = graph.graph if isinstance(graph, fx.GraphModule) else graph
    out: dict[str, int] = {}
    for n in g.nodes:
        if n.op == "call_function" and n.target in COLLECTIVES:
            k = COLLECTIVES[n.target]
            out[k] = out.get(k, 0) + 1
    return out


def _moved(cs, algorithm="ring") -> float:
    return sum(steps_and_bytes(k, p, b, algorithm)[1] for k, _, b, p in cs)


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
    against; None finds every live root mesh this rank belongs to, and a group name
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
        return _optimize_graph(gm, contexts, options, agreement, rewrites)


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


def _optimize_graph(
    gm, contexts, options: PlanOptions, agreement, rewrites: GraphRewrites
) -> GraphPassResult:
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    dump_dir = dump_dir_from_env()
    tag = _dump_tag(graph) if dump_dir is not None else None
    if dump_dir is not None:
        _write(dump_dir, f"{tag}.before.txt", _graph_text(gm))
    chains, not_raised = find_chains(graph, contexts) if contexts else ([], [])
    if not contexts and count_collectives(graph):
        not_raised.append(NotRaised(("*",), "no DeviceMesh this rank belongs to was found"))
    failed, notes, aborted_ranks = _agree(graph, chains, agreement)
    if contexts and count_collectives(graph):  # chains and combining are priced: the same profile everywhere
        agreement.check_profile(contexts, options.cost, aborted_ranks)
    results: list[ChainResult] = []
    modified = False
    erased: set[fx.Node] = set()
    settled: dict[int, bool] = {}

    def settle(i: int) -> bool:
        if i not in settled:
            settled[i] = _settle(chains[i], failed.get(i), not_raised)
        return settled[i]

    # In find_chains' order: a chain whose nodes a rewritten chain took is skipped.
    for ci, chain in enumerate(chains):
        if erased.intersection(chain.nodes) or not settle(ci):
            continue
        rival = _rival_key(chain, chains, settle, options) if chain.kept else None
        res, new_value, plans = _optimize_chain(graph, chain, options, rival)
        if chain.stop_reason and not res.rewritten:
            res.reason += f"; the chain stops before {chain.stop_reason}"
        if ci in notes:
            res.reason += f"; {notes[ci]}"
        results.append(res)
        if dump_dir is not None:
            _write(dump_dir, f"{tag}.chain{ci:02d}.txt", _chain_dump(chain, res, plans))
        if new_value is not None:
            chain.end.replace_all_uses_with(new_value)
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
    if dump_dir is not None:
        _write(dump_dir, f"{tag}.after.txt", _graph_text(gm))
        _write(dump_dir, f"{tag}.explain.txt", result.explain() + "\n")
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


def _plan_chain(chain: Chain, options: PlanOptions):
    """(naive, optimized) plans of a settled chain, or why it is not planned."""
    try:
        naive = make_plan(chain.ctx.spec, chain.src, chain.dst, chain.shape, chain.dtype)
        if naive.fallback:
            return f"not planned: {naive.fallback_reason}"
        return naive, run_pipeline(naive, options, on_change=pass_dump_writer(None, naive))
    except RedistributeError as e:
        return f"not planned: {e}"


def _key(cs) -> tuple[int, float]:
    return (len(cs), _moved(cs))


def _rival_key(chain: Chain, chains, settle, options: PlanOptions):
    """The cost (kept collectives included) of the other way to rewrite what ``chain``
    (through a shared value) rewrites: the chain after the shared value alone, planned
    from that value. ``chain`` is used only when it beats it."""
    suffix = {op.nodes[-1] for op in chain.collectives[len(chain.kept_collectives) :]}
    for j, other in enumerate(chains):
        if other.kept or other.end is not chain.end or not settle(j):
            continue
        if {op.nodes[-1] for op in other.collectives} != suffix:
            continue
        planned = _plan_chain(other, options)
        if isinstance(planned, str):
            return None
        kept = _original_collectives(chain)[: len(chain.kept_collectives)]
        return _key(kept + min(_plan_collectives(planned[1]), _original_collectives(other), key=_key))
    return None


def _optimize_chain(graph, chain: Chain, options: PlanOptions, rival=None):
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
        return result([], False, planned), None, ()
    naive, plan = planned
    after = _plan_collectives(plan)
    old_key, new_key = _key(kept + before), _key(kept + after)
    if new_key >= old_key:
        return (
            result(
                after,
                False,
                (
                    f"not cheaper ({new_key[0]} collectives moving {new_key[1]:.0f} B vs "
                    f"{old_key[0]} moving {old_key[1]:.0f} B{_kept_note(kept)})"
                ),
            ),
            None,
            (naive, plan),
        )
    if rival is not None and new_key >= rival:
        return (
            result(
                after,
                False,
                (
                    f"the chain after the shared value, rewritten alone, is as cheap ({rival[0]} collectives "
                    f"moving {rival[1]:.0f} B vs {new_key[0]} moving {new_key[1]:.0f} B{_kept_note(kept)})"
                ),
            ),
            None,
            (naive, plan),
        )
    try:
        new_value = lower_into_graph(graph, chain, plan, options.groups)
    except Unlowerable as e:
        return result(after, False, f"not lowered: {e}"), None, (naive, plan)
    reason = (
        f"{old_key[0]} -> {new_key[0]} collectives, {old_key[1]:.0f} -> {new_key[1]:.0f} B "
        f"moved per rank{_kept_note(kept)}; passes: {', '.join(plan.applied_passes) or 'none'}"
    )
    return result(after, True, reason), new_value, (naive, plan)


def _kept_note(kept) -> str:
    return f", counting {len(kept)} kept for other users of a shared value" if kept else ""


# -- Inductor hook --------------------------------------------------------------------------


class RedistGraphPass(CustomGraphPass):
    """``torch._inductor.config.post_grad_custom_post_pass = RedistGraphPass(...)``.

    ``meshes`` and ``options=PlanOptions(...)`` (or its fields as keywords) as for
    :func:`optimize_graph`. ``uuid()`` covers every decision
    (:func:`~redist_opt.graph.cache_key.graph_pass_key`: the package's source, the
    options, the resolved cost profile, the meshes and this rank's place in them), so
    FX graph caching reuses a compiled graph only when this pass would rewrite it the
    same way. The :class:`GraphPassResult` of each graph is appended to ``self.results``.

    Two things are deliberately off in this hook, because with FX graph caching
    one rank may load a cached graph (and not run the pass) while another
    compiles: creating groups (any ``groups`` but "existing" is refused: a cached
    graph would name a group the loading process never created), and agreeing across
    ranks on the mesh dims of constant-index slices (a rank that does not run the
    pass would never answer). Slices whose mesh dims are unambiguous are still
    rewritten. ``redist_opt.backend`` runs the pass before Inductor's cache lookup and
    has neither restriction.
    """

    def __init__(self, *, meshes=None, options: PlanOptions | None = None, **fields) -> None:
        options = PlanOptions.of(options, **fields)
        if options.groups != "existing":
            raise RedistributeError(
                f"groups={options.groups!r}: RedistGraphPass takes groups='existing' only: flatten "
                "the mesh dims you want merged before compiling, or use redist_opt.backend(groups='create')"
            )
        self.meshes, self.options = meshes, options
        self.results: list[GraphPassResult] = []

    def __call__(self, graph: fx.Graph) -> None:
        self.results.append(
            optimize_graph(
                graph, meshes=self.meshes, options=self.options, agreement=SliceAgreement(_no_agreement)
            )
        )

    def uuid(self):
        return graph_pass_key(self.options, self.meshes, "RedistGraphPass")


def _no_agreement(facts):
    return "no agreement across ranks inside Inductor's (cacheable) post-grad pass"


# -- dumps ----------------------------------------------------------------------------------

_seq = itertools.count()


def _dump_tag(graph) -> str:
    return f"{next(_seq):04d}.graph_pass{rank_suffix()}"


def _graph_text(gm) -> str:
    if isinstance(gm, fx.GraphModule):
        return gm.print_readable(print_output=False) if hasattr(gm, "print_readable") else gm.code
    return str(gm)


def _write(directory, name: str, text: str) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)


def _chain_dump(chain: Chain, res: ChainResult, plans) -> str:
    lines = [f"chain: {' -> '.join(res.nodes)}", str(res), ""]
    for title, p in zip(("raised (naive plan)", "optimized"), plans):
        lines += [f"== {title} ==", str(p), ""]
    return "\n".join(lines)
