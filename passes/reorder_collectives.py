"""reorder-collectives: move commuting steps so like kinds meet and bytes shrink.

Rewrite (P,P,P -> R,S(0),R on a 2x2x2 mesh)::

    all_reduce(a); reduce_scatter(b, dim 0); all_reduce(c)
  =>
    reduce_scatter(b, dim 0); all_reduce(a); all_reduce(c)

so merge-reductions can fuse the two all_reduces, and both run on the scattered
(smaller) tensor.

Legality (``redist_opt.ir.steps.commute``), for every pair of steps whose relative
order changes:

1. they span disjoint mesh dims;
2. they change the layout of disjoint tensor dims (so shard order, and every
   size expression, is the same in both orders);
3. their reductions use the same op, or both linear ops (sum, avg);
4. neither is a Replicate -> Partial step.

Candidate orders are topological orders of the "must stay before" DAG
(networkx): the lexicographically smallest one keyed by kind (local chunking,
then reduce_scatters, all_reduces, all_to_alls, all_gathers: data shrinks
before it moves and grows only at the end) and the same keyed by merge group
first (so steps that can merge are not separated by a local step). Each
candidate, and the original order, is run through the other passes of the
pipeline being run (``PassContext.pipeline``: the passes are given, never
looked up; without them an order is scored by itself); the one
with the least modelled time wins, among those that issue no more collectives
and move no more bytes than the original order does after the merges that never
add bytes (a candidate that a byte-trading pass such as
merge-reductions-into-all-reduce rewrote may move as many bytes as the original
order after all passes). So a byte-trading rewrite of the original order cannot
hide a faster order, and a reorder never adds collectives or bytes by itself.
Ties keep the original order, so the result is deterministic and identical on
every rank. (Every merge inside a score was decided by the profitability rule,
``PassContext.profitable``; a reorder changes no collective by itself, so it is
taken only when its merges make it strictly faster.)

Not done: reordering that changes floating-point summation order is accepted
(results equal the reference up to rounding); no reordering across steps that
touch the same tensor dim (it would change the shard order).
"""

from __future__ import annotations

import dataclasses

import networkx as nx
from torch.fx.passes.infra.pass_base import PassResult

from redist_opt import ir
from redist_opt.ir import steps as S

from .context import RedistPass

_PRIORITY = {
    "chunk": 0,
    "reduce_scatter": 1,
    "all_reduce": 2,
    "all_to_all": 3,
    "all_gather": 4,
    "partition": 5,
}


class ReorderCollectives(RedistPass):
    name = "reorder-collectives"

    def call(self, graph_module):
        regs = S.regions(graph_module)
        if len(regs) < 2:
            return PassResult(graph_module, False)
        dag = nx.DiGraph()
        dag.add_nodes_from(range(len(regs)))
        for i in range(len(regs)):
            for j in range(i + 1, len(regs)):
                if S.commute(regs[i].step, regs[j].step, self.ctx.dtype) is not None:
                    dag.add_edge(i, j)
        dtype = self.ctx.dtype
        first_of_key: dict = {}
        for i, r in enumerate(regs):
            first_of_key.setdefault(S.merge_key(r.step, dtype) or ("local", i), i)
        keys = [
            lambda i: (_PRIORITY[regs[i].step.kind], i),
            lambda i: (
                _PRIORITY[regs[i].step.kind],
                first_of_key[S.merge_key(regs[i].step, dtype) or ("local", i)],
                i,
            ),
        ]
        identity = list(range(len(regs)))
        candidates = [identity]
        for key in keys:
            order = list(nx.lexicographical_topological_sort(dag, key=key))
            if order not in candidates:
                candidates.append(order)
        if len(candidates) == 1:
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        self._relowered: dict[tuple[int, ...], object] = {}
        # Merges need two steps with one merge key, or an all_to_all (its merge
        # spans a gather and a chunk): otherwise scoring can skip the merge passes.
        keys_seen = [S.merge_key(r.step, dtype) for r in regs if S.merge_key(r.step, dtype) is not None]
        kinds = {r.step.kind for r in regs}
        self._merges_possible = (
            len(set(keys_seen)) < len(keys_seen)
            or "all_to_all" in kinds
            or {"all_reduce", "chunk"} <= kinds  # reduce-scatter-creator
        )
        scored = [(self._score(graph_module, regs, order), order) for order in candidates]
        base = scored[0][0]
        # Budgets: the original order after the merges that never add bytes. A byte-trading
        # rewrite of the original order (one fat all_reduce) must not hide an order that is
        # faster with as many collectives as the original would have without it.
        budget = self._score(graph_module, regs, identity, byte_safe=True) if base[3] else base
        eligible = [
            (sc, o)
            for sc, o in scored
            if sc[1] <= budget[1] and (sc[2] <= budget[2] or (sc[3] and sc[2] <= base[2]))
        ]
        best_score, best = min(eligible, key=lambda so: (so[0][0], so[0][1], so[0][2]))
        if best == identity or best_score[0] >= base[0]:
            return PassResult(graph_module, False)
        before = ", ".join(S.step_label(r.step, mesh) for r in regs)
        after = ", ".join(S.step_label(regs[i].step, mesh) for i in best)
        self.note(
            True,
            f"{before} -> {after}",
            "the moved steps commute (disjoint mesh and tensor dims, compatible reductions); "
            f"after merging: {best_score[1]} collectives, {best_score[2]} B per rank "
            f"(in order: {base[1]}, {base[2]} B), less modelled time",
        )
        return PassResult(self._relower(graph_module, regs, best), True)

    def _relower(self, graph_module, regs, order):
        key = tuple(order)
        if key not in self._relowered:  # scoring already lowered it: reuse
            new_steps = [regs[i].step for i in order]
            provenance = [regs[i].inherited for i in order]
            self._relowered[key] = S.relower(graph_module, self.ctx.mesh, new_steps, provenance)
        return self._relowered[key]

    def _score(self, graph_module, regs, order, *, byte_safe: bool = False) -> tuple[float, int, int, bool]:
        """(modelled time, collectives, bytes, bytes traded) of ``order`` after the other
        passes of this pipeline (``PassContext.pipeline``, which run_pipeline sets).

        ``byte_safe``: run only the passes that never add bytes. The last item says
        whether a pass that may add bytes changed the plan.
        """
        gm = graph_module if order == list(range(len(regs))) else self._relower(graph_module, regs, order)
        traded = False
        if self._merges_possible:
            scratch = dataclasses.replace(self.ctx, notes=[])  # trial merges leave no notes
            for cls in self.ctx.pipeline:
                if cls is type(self) or (byte_safe and cls.may_add_bytes):
                    continue
                result = cls(scratch)(gm)
                gm = result.graph_module
                traded |= result.modified and cls.may_add_bytes
        time = nbytes = count = 0
        for node in ir.collective_nodes(gm):
            b = self.ctx.bytes_of(node.args[0].meta["shape"])
            time += self.ctx.cost.collective_time(ir.ir_name(node), node.args[1], b, self.ctx.mesh)
            nbytes += b
            count += 1
        return (time, count, nbytes, traded)
