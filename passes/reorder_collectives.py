"""reorder-collectives: move commuting steps so like kinds meet and bytes shrink.

Rewrite (P,P,P -> R,S(0),R on a 2x2x2 mesh)::

    all_reduce(a); reduce_scatter(b, dim 0); all_reduce(c)
  =>
    reduce_scatter(b, dim 0); all_reduce(a); all_reduce(c)

so merge-reductions can fuse the two all_reduces, and both run on the scattered
(smaller) tensor.

Legality (``redist_opt.steps.commute``), for every pair of steps whose relative
order changes:

1. they span disjoint mesh dims;
2. they change the layout of disjoint tensor dims (so shard order, and every
   size expression, is the same in both orders);
3. their reductions use the same op, or both linear ops (sum, avg);
4. neither is a Replicate -> Partial step.

The new order is the lexicographically smallest topological order of the
"must stay before" DAG (networkx), keyed by kind: local chunking, then
reduce_scatters, all_reduces, all_to_alls, all_gathers. Data shrinks before it
moves and grows only at the end; same-kind steps become adjacent. Ties keep the
original order, so the result is deterministic and identical on every rank.

Not done: reordering that changes floating-point summation order is accepted
(results equal the reference up to rounding); no reordering across steps that
touch the same tensor dim (it would change the shard order).
"""

from __future__ import annotations

import networkx as nx
from torch.fx.passes.infra.pass_base import PassResult

from passes.context import RedistPass
from redist_opt import steps as S

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
                if S.commute(regs[i].step, regs[j].step) is not None:
                    dag.add_edge(i, j)
        order = list(
            nx.lexicographical_topological_sort(
                dag, key=lambda i: (_PRIORITY[regs[i].step.kind], i)
            )
        )
        if order == list(range(len(regs))):
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        before = ", ".join(S.step_label(r.step, mesh) for r in regs)
        after = ", ".join(S.step_label(regs[i].step, mesh) for i in order)
        self.note(True, f"{before} -> {after}", "the moved steps commute (disjoint mesh and tensor dims, compatible reductions)")
        new_steps = [regs[i].step for i in order]
        provenance = [regs[i].inherited for i in order]
        return PassResult(S.relower(graph_module, mesh, new_steps, provenance), True)
