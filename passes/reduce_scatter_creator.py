"""reduce-scatter-creator: all_reduce + chunk of its result -> reduce_scatter.

XLA's ReduceScatterCreator rewrites all-reduce + dynamic-slice into a
reduce-scatter. DTensor's greedy planner emits the same pattern: a
``P -> S(j)`` step on mesh dim ``g`` whose shard order would not be kept (an
outer mesh dim shards ``j`` later) becomes ``P -> R`` (all_reduce) now and
``R -> S(j)`` (a local chunk) at the end. Once reorder-collectives has made the
two adjacent::

    all_reduce(x, {g}, op); select_chunk(_, j, |g|, c_g)
  =>
    reduce_scatter(x, {g}, op, j)          (+ pad_nested / narrow if uneven)

and, when a reduce_scatter of the same tensor dim over ``h`` comes right
before (mesh ``(r, m, i, t)``, ``P,P,S(0),S(0) -> S(1),S(1),S(0),S(0)``,
shape (8, 6, 4))::

    reduce_scatter(x, {r}, sum, 1); all_reduce(_, {m}, sum); select_chunk(_, 1, 2, c_m)
  =>
    pad_nested(x, 1, (2, 2)); reduce_scatter(_, {r+m}, sum, 1); narrow(_, 1, 0, <nested size>)

Legality:

1. the all_reduce over mesh dims G is immediately followed by a
   ``Replicate -> Shard(j)`` chunk over the same mesh dims G, so the chunk keeps
   exactly the piece ``torch.chunk`` gives the rank's coordinate on G, which is
   the piece a reduce_scatter over G (in G's order, padded to equal pieces as
   DTensor pads) leaves it: any reduce op (sum, avg, max, min), any dtype, since
   the reduction is elementwise;
2. the folded form needs, in addition: the preceding step is a reduce_scatter
   of tensor dim ``j`` over H with the same ``steps.merge_key``; it makes H the
   innermost sharding mesh dims of ``j``, so after both ``j`` is sharded by
   ``..., H, G`` and one reduce_scatter over the group H+G in that (shard)
   order, with nested padding, gives every rank its piece; that group must be
   available under the groups policy;
3. the profitability rule (``PassContext.profitable``) says the new collective
   pays against the ones it replaces: never more bytes (a reduce_scatter of an
   uneven dim is fed the padded tensor, which can be larger than the
   all_reduce's input: 3 rows over 2 ranks feed 4), and no slower (the folded
   form, one collective fewer, within the margin; ``prefer="consistency"``
   waives the time test).

Not done: an all_reduce and a chunk that are not adjacent (reorder-collectives
moves commuting steps; its scoring runs this pass); chunks over a subset of the
all_reduce's mesh dims (that would split the all_reduce).
"""

from __future__ import annotations

import math

from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym

from ._rewriter import StepRewriter
from .context import RedistPass


class ReduceScatterCreator(RedistPass):
    name = "reduce-scatter-creator"

    def call(self, graph_module):
        rw = StepRewriter(graph_module, self.ctx)
        kinds = [r.step.kind for r in rw.regions]
        if "all_reduce" not in kinds or "chunk" not in kinds:
            return rw.finish()

        def match(i):
            made = self._try(rw, i) if i + 1 < len(rw.regions) else None
            if made is None:
                return 0
            step, folded = made  # folded: replaces the reduce_scatter kept just before
            rw.emit([step], rw.regions[i : i + 2], replace=1 if folded else 0)
            return 2

        return rw.scan(match)

    def _try(self, rw: StepRewriter, i: int) -> tuple[ir.StepInfo, bool] | None:
        regs = rw.regions
        ar, chunk = regs[i].step, regs[i + 1].step
        if ar.kind != "all_reduce" or chunk.kind != "chunk":
            return None
        mesh, ctx = self.ctx.mesh, self.ctx
        label = f"{S.step_label(ar, mesh)} + {S.step_label(chunk, mesh)}"
        if tuple(chunk.mesh_dims) != tuple(ar.mesh_dims):
            self.note(False, label, "the chunk is over other mesh dims than the all_reduce")
            return None
        j = chunk.dst.dim
        rs = ir.StepInfo(ar.index, ar.mesh_dims, ar.src, chunk.dst, ar.logical_shape, ar.avg_scale)
        in_shape = regs[i].collective.args[0].meta["shape"]
        # Folded into the reduce_scatter of the same tensor dim kept right before it.
        tail = rw.kept_tail()
        prev = regs[i - 1] if tail and i > 0 and tail[-1] is regs[i - 1] else None
        if prev is not None and S.merge_key(prev.step, ctx.dtype) == S.merge_key(rs, ctx.dtype):
            folded = self._fold(prev, regs[i], rs, rw.states[i - 1], label)
            if folded is not None:
                return folded, True
        choice, why = ctx.choose_group(rs.mesh_dims)
        if choice is None:
            self.note(False, label, why)
            return None
        counts = tuple(mesh.sizes[d] for d in rs.mesh_dims)
        new = ctx.new_cost("reduce_scatter", choice, ctx.bytes_of(_padded(in_shape, j, counts)))
        ok, reason = ctx.profitable(ctx.cost_of([regs[i]]), new, what="a reduce_scatter")
        if not ok:
            self.note(False, label, reason)
            return None
        self.note(
            True, f"{label} -> {S.step_label(rs, mesh)}", "the chunk keeps the rank's reduce_scatter piece"
        )
        return rs, False

    def _fold(self, prev, ar, rs, state, label) -> ir.StepInfo | None:
        ctx, mesh = self.ctx, self.ctx.mesh
        j = rs.dst.dim
        dims = tuple(prev.step.mesh_dims) + tuple(rs.mesh_dims)
        what = f"{S.step_label(prev.step, mesh)} + {label}"
        choice, why = ctx.choose_group(dims)
        if choice is None:
            self.note(False, what + " as one reduce_scatter", why)
            return None
        step = S.merged_step([prev.step, rs], dims, prev.step.index, mesh.sizes)
        step = S.with_state_logical_shape(step, state, ctx.shape, mesh)
        counts = tuple(mesh.sizes[d] for d in dims)
        merged_bytes = ctx.bytes_of(_padded(prev.nodes[0].args[0].meta["shape"], j, counts))
        merged = ctx.new_cost("reduce_scatter", choice, merged_bytes)
        ok, reason = ctx.profitable(ctx.cost_of([prev, ar]), merged, what="one reduce_scatter")
        if not ok:
            self.note(False, what + " as one reduce_scatter", reason)
            return None
        self.note(True, f"{what} -> {S.step_label(step, mesh)}", why)
        return step


def _padded(shape, dim: int, counts) -> list:
    """``shape`` with ``dim`` split into nested pieces, each padded to the largest."""
    out = list(shape)
    out[dim] = sym.nested_max_chunk(out[dim], counts) * math.prod(counts)
    return out
