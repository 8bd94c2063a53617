"""merge-adjacent-all-to-alls: two all_to_alls that gather one tensor dim -> one.

DTensor moves a tensor dim nested over two mesh dims to two other tensor dims
one mesh dim at a time. ``S(0),S(0) -> S(1),S(2)`` on a 2x2 mesh runs::

    all_to_all(x, {b}, split 2, cat 0); all_to_all(_, {a}, split 1, cat 0)

Rewrite (a+b exists)::

    all_to_all(x, {a+b (4,):(1,)}, split ((1, 2), (2, 2)), cat 0)

(+ nested pad/unpad if uneven): member (y_a, y_b) of the group (a outer) gets
piece y_a of dim 1 and piece y_b of dim 2 of every rank's block, and the
blocks arrive in the nested order of dim 0.

Legality:

1. two adjacent all_to_alls, ``S(i) -> S(k)`` over mesh dims Db, then
   ``S(i) -> S(j)`` over Da: the same cat dim ``i``, ``i``, ``j``, ``k``
   distinct, Da and Db disjoint;
2. before them ``i`` is sharded by ... Da, Db (innermost last), so one group
   over Da then Db lists ranks in the cat order of ``i``; ``j`` and ``k`` are
   cut by Da and Db only, each in its own rank order (row-major blocks);
3. the group with that layout is available under the groups policy;
4. uneven sizes are exact: ``i`` is padded to the largest nested piece and
   unpadded slot by slot, ``j`` and ``k`` are split into nested pieces
   (``pad_nested``) and narrowed to the rank's own sizes;
5. the profitability rule (``PassContext.profitable``) says the merged
   all_to_all pays against the two it replaces: never more bytes fed, and no
   slower (within its margin; ``prefer="consistency"``: always).

Not done: all_to_alls that move the same tensor dim pair (DTensor's planner does
not emit them adjacent; they would need a local chunk permutation), or whose
split dim is the other's cat dim; chains of three or more.
"""

from __future__ import annotations

import math

from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym

from ._rewriter import StepRewriter
from .context import RedistPass


class MergeAdjacentAllToAlls(RedistPass):
    name = "merge-adjacent-all-to-alls"

    def call(self, graph_module):
        rw = StepRewriter(graph_module, self.ctx)
        if sum(r.step.kind == "all_to_all" for r in rw.regions) < 2:
            return rw.finish()

        def match(t):
            step = self._try(rw.regions, rw.states, t) if t + 1 < len(rw.regions) else None
            if step is None:
                return 0
            rw.emit([step], rw.regions[t : t + 2])
            return 2

        return rw.scan(match)

    def _try(self, regs, states, t) -> ir.StepInfo | None:
        first, second = regs[t].step, regs[t + 1].step
        if first.kind != "all_to_all" or second.kind != "all_to_all" or first.variant or second.variant:
            return None
        ctx, mesh = self.ctx, self.ctx.mesh
        i, k, j = first.src.dim, first.dst.dim, second.dst.dim
        label = f"{S.step_label(first, mesh)} + {S.step_label(second, mesh)}"
        if second.src.dim != i or len({i, j, k}) < 3:
            self.note(False, label, "they do not cat one tensor dim and split two others")
            return None
        db, da = tuple(first.mesh_dims), tuple(second.mesh_dims)
        if set(da) & set(db):
            return None
        dims = da + db
        real = tuple(d for d in dims if mesh.sizes[d] > 1)
        if not all(any(mesh.sizes[d] > 1 for d in ds) for ds in (da, db)):
            return None
        order = states[t].order.get(i, [])
        if tuple(order[-len(real) :]) != real:
            self.note(False, label, f"tensor dim {i} is not sharded by {real} innermost")
            return None
        choice, why = ctx.choose_group(dims)
        if choice is None:
            self.note(False, label, why)
            return None
        parts = ((second.dst.dim, da), (first.dst.dim, db))
        step = ir.StepInfo(
            second.index, dims, first.src, second.dst, (), variant="split_all_to_all", parts=parts
        )
        step = S.with_state_logical_shape(step, states[t], ctx.shape, mesh)
        shape = list(regs[t].nodes[0].args[0].meta["shape"])
        counts = tuple(mesh.sizes[d] for d in real)
        shape[i] = sym.nested_max_chunk(step.logical_shape[i], counts)
        for dim, ds in ((j, da), (k, db)):
            c = tuple(mesh.sizes[d] for d in ds if mesh.sizes[d] > 1)
            shape[dim] = sym.nested_max_chunk(step.logical_shape[dim], c) * math.prod(c)
        merged = ctx.new_cost("all_to_all", choice, ctx.bytes_of(shape))
        ok, reason = ctx.profitable(ctx.cost_of(regs[t : t + 2]), merged, what="one all_to_all")
        if not ok:
            self.note(False, label, reason)
            return None
        self.note(True, f"{label} -> {S.step_label(step, mesh)}", why)
        return step
