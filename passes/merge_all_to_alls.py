"""merge-all-to-alls: gathers + all_to_all + chunks around one reshard -> one all_to_all.

DTensor reshards a tensor dim nested over several mesh dims one mesh dim at a
time. ``S(0),S(0) -> S(1),S(1)`` on a 2x2 mesh runs::

    all_gather({b}, 0); all_to_all({a}, split 1, cat 0); select_chunk(1, 2, c_b)

Rewrite (a+b exists)::

    all_to_all({a+b (4,):(1,)}, split 1, cat 0)      (+ nested pad/unpad if uneven)

Chains of any depth merge the same way. Mesh (a, b, c, d), all of size 2,
``S(1),S(1),S(1),S(1) -> S(1),S(0),S(0),S(0)`` (an expert-parallel dispatch)::

    all_gather({d}, 1); all_gather({c}, 1); all_to_all({b}, split 0, cat 1);
    select_chunk(0, 2, c_c); select_chunk(0, 2, c_d)
  =>
    all_to_all({b+c+d (8,):(1,)}, split 0, cat 1)

(the gathers may already be one, ``all_gather({c+d}, 1)``, after merge-all-gathers).

Legality:

1. adjacent steps: k >= 1 all_gathers of tensor dim ``i`` whose mesh dims, in
   shard order (the last gather is the outermost), are D2; an all_to_all
   ``S(i) -> S(j)`` over D1; then Replicate -> ``S(j)`` chunks whose mesh dims,
   in order, are again D2; D1 and D2 disjoint, ``i != j``. When the whole
   chain does not qualify, the k gathers nearest the all_to_all are tried
   (largest k first);
2. before them ``i`` is sharded by ... D1, D2 (innermost last); after them
   ``j`` is sharded by ... D1, D2: both shard orders list the merged dims as
   D1 then D2, so one group in that rank order serves as the cat order of ``i``
   and the split order of ``j``;
3. the group with that layout is available under the groups policy;
4. uneven sizes are exact: ``i`` is padded to the largest nested piece and
   unpadded slot by slot, ``j`` is split into nested pieces (``pad_nested``) and
   narrowed to the rank's own size;
5. the profitability rule (``PassContext.profitable``) says one all_to_all pays
   against the all_gathers plus all_to_all it replaces: never more bytes fed,
   and no slower (within its margin; ``prefer="consistency"``: always).

Not done here: two adjacent all_to_alls (merge-adjacent-all-to-alls merges
those that cat one tensor dim and split two others, the pairs DTensor emits;
it never emits adjacent ones that move the same tensor dim pair: every
placement pair on 2x2 and 2x2x2 meshes, 3,000 sampled on 2x2x2x2).
"""

from __future__ import annotations

import math

from torch.distributed.tensor.placement_types import Shard

from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym

from ._rewriter import StepRewriter
from .context import RedistPass


class MergeAllToAlls(RedistPass):
    name = "merge-all-to-alls"

    def call(self, graph_module):
        rw = StepRewriter(graph_module, self.ctx)
        if not any(r.step.kind == "all_to_all" for r in rw.regions):
            return rw.finish()
        return rw.scan(lambda t: self._try(rw, t) if rw.regions[t].step.kind == "all_to_all" else 0)

    def _try(self, rw: StepRewriter, t: int) -> int:
        """Merge the all_to_all at ``t`` with gathers kept just before it and chunks after
        it; how many regions from ``t`` on it consumed (0: none merged)."""
        regs = rw.regions
        a2a = regs[t].step
        src_dim, dst_dim = a2a.src.dim, a2a.dst.dim
        if src_dim == dst_dim:
            return 0
        gathers: list[int] = []  # regions just before t, kept as they were by this pass
        tail = rw.kept_tail()
        while (
            len(gathers) < len(tail)
            and tail[-1 - len(gathers)] is regs[t - 1 - len(gathers)]
            and regs[t - 1 - len(gathers)].step.kind == "all_gather"
            and regs[t - 1 - len(gathers)].step.src.dim == src_dim
        ):
            gathers.insert(0, t - 1 - len(gathers))
        chunks: list[int] = []
        c = t + 1
        while c < len(regs) and regs[c].step.kind == "chunk" and regs[c].step.dst.dim == dst_dim:
            chunks.append(c)
            c += 1
        if not gathers or not chunks:
            return 0
        for k in range(len(gathers), 0, -1):
            made = self._try_k(regs, rw.states, t, gathers[-k:], chunks)
            if made is not None:
                step, m = made
                rw.emit([step], [regs[x] for x in range(t, t + 1 + m)], replace=k)
                return 1 + m
        return 0

    def _try_k(self, regs, states, t, used, chunks) -> tuple[ir.StepInfo, int] | None:
        """The merged step for gathers ``used`` and the chunks it absorbs, and how many."""
        ctx, mesh = self.ctx, self.ctx.mesh
        a2a = regs[t].step
        src_dim, dst_dim, d1 = a2a.src.dim, a2a.dst.dim, tuple(a2a.mesh_dims)
        # gathered innermost first: shard order (outermost first) is the reverse
        d2 = tuple(d for g in reversed(used) for d in regs[g].step.mesh_dims)
        taken: tuple[int, ...] = ()
        m = 0
        while m < len(chunks) and len(taken) < len(d2):
            taken += tuple(regs[chunks[m]].step.mesh_dims)
            m += 1
        label = " + ".join(S.step_label(regs[x].step, mesh) for x in [*used, t, *chunks[:m]])
        if taken != d2:
            self.note(False, label, f"the chunks are over mesh dims {taken}, the gathers over {d2}")
            return None
        if set(d1) & set(d2):
            return None
        order = states[used[0]].order.get(src_dim, [])
        dims = d1 + d2
        if tuple(order[-len(dims) :]) != dims:
            self.note(False, label, f"tensor dim {src_dim} is not sharded by {dims} innermost")
            return None
        choice, why = ctx.choose_group(dims)
        if choice is None:
            self.note(False, label, why)
            return None
        step = ir.StepInfo(a2a.index, dims, Shard(src_dim), Shard(dst_dim), ())
        step = S.with_state_logical_shape(step, states[used[0]], ctx.shape, mesh)
        # Bytes each rank feeds in: separately, the (padded) inputs of the gathers and
        # the all_to_all; merged, both dims padded to the largest nested piece.
        counts = tuple(mesh.sizes[d] for d in dims)
        merged_shape = list(regs[used[0]].nodes[0].args[0].meta["shape"])
        merged_shape[src_dim] = sym.nested_max_chunk(step.logical_shape[src_dim], counts)
        merged_shape[dst_dim] = sym.nested_max_chunk(step.logical_shape[dst_dim], counts) * math.prod(counts)
        merged = ctx.new_cost("all_to_all", choice, ctx.bytes_of(merged_shape))
        ok, reason = ctx.profitable(ctx.cost_of([regs[x] for x in [*used, t]]), merged, what="one all_to_all")
        if not ok:
            self.note(False, label, reason)
            return None
        self.note(True, f"{label} -> {S.step_label(step, mesh)}", why)
        return step, m
