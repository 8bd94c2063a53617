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
3. never more bytes: a reduce_scatter of an uneven dim is fed the padded
   tensor, which can be larger than the all_reduce's input (3 rows over 2 ranks
   feed 4). The rewrite is made only when the collectives it creates are fed no
   more bytes than the ones they replace, and the cost model finds them no
   slower (``prefer="consistency"`` waives the time test).

Not done: an all_reduce and a chunk that are not adjacent (reorder-collectives
moves commuting steps; its scoring runs this pass); chunks over a subset of the
all_reduce's mesh dims (that would split the all_reduce).
"""

from __future__ import annotations

import math

from torch.fx.passes.infra.pass_base import PassResult

from .context import RedistPass
from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym


class ReduceScatterCreator(RedistPass):
    name = "reduce-scatter-creator"

    def call(self, graph_module):
        regs = S.regions(graph_module)
        kinds = [r.step.kind for r in regs]
        if "all_reduce" not in kinds or "chunk" not in kinds:
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        states = S.states_before(regs, self.ctx.src, mesh)
        new_steps: list[ir.StepInfo] = []
        provenance: list[tuple[str, ...]] = []
        changed, i = False, 0
        while i < len(regs):
            made = self._try(regs, states, i, new_steps) if i + 1 < len(regs) else None
            if made is None:
                new_steps.append(regs[i].step)
                provenance.append(regs[i].inherited)
                i += 1
                continue
            step, folded = made
            origin = tuple(n for r in regs[i : i + 2] for n in r.origin)
            if folded:  # replaces the reduce_scatter just emitted
                new_steps.pop()
                origin = tuple(dict.fromkeys(provenance.pop() + regs[i - 1].origin + origin))
            new_steps.append(step)
            provenance.append(origin)
            changed = True
            i += 2
        if not changed:
            return PassResult(graph_module, False)
        return PassResult(S.relower(graph_module, mesh, new_steps, provenance), True)

    def _try(self, regs, states, i, emitted) -> tuple[ir.StepInfo, bool] | None:
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
        ar_bytes = ctx.bytes_of(in_shape)
        ar_choice = ctx.choose_group(ar.mesh_dims, any_order=True)[0]
        ar_time = ctx.collective_time("all_reduce", ar_choice, ar_bytes)
        # Folded into the reduce_scatter of the same tensor dim right before it.
        prev = regs[i - 1] if i > 0 and emitted and emitted[-1] is regs[i - 1].step else None
        if prev is not None and S.merge_key(prev.step, ctx.dtype) == S.merge_key(rs, ctx.dtype):
            folded = self._fold(prev, rs, states[i - 1], ar_bytes, ar_time, label)
            if folded is not None:
                return folded, True
        choice, why = ctx.choose_group(rs.mesh_dims)
        if choice is None:
            self.note(False, label, why)
            return None
        counts = tuple(mesh.sizes[d] for d in rs.mesh_dims)
        rs_bytes = ctx.bytes_of(_padded(in_shape, j, counts))
        rs_time = ctx.collective_time("reduce_scatter", choice, rs_bytes)
        if rs_bytes > ar_bytes:
            self.note(False, label, f"padding: a reduce_scatter is fed {rs_bytes} B vs {ar_bytes} B")
            return None
        if rs_time > ar_time and ctx.prefer != "consistency":
            self.note(False, label, f"cost: reduce_scatter {rs_time * 1e6:.1f}us vs {ar_time * 1e6:.1f}us")
            return None
        self.note(True, f"{label} -> {S.step_label(rs, mesh)}", "the chunk keeps the rank's reduce_scatter piece")
        return rs, False

    def _fold(self, prev, rs, state, ar_bytes, ar_time, label) -> ir.StepInfo | None:
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
        prev_bytes = ctx.bytes_of(prev.collective.args[0].meta["shape"])
        prev_choice = ctx.choose_group(prev.step.mesh_dims)[0]
        separate = ctx.collective_time("reduce_scatter", prev_choice, prev_bytes) + ar_time
        counts = tuple(mesh.sizes[d] for d in dims)
        merged_bytes = ctx.bytes_of(_padded(prev.nodes[0].args[0].meta["shape"], j, counts))
        merged_time = ctx.collective_time("reduce_scatter", choice, merged_bytes)
        if merged_bytes > prev_bytes + ar_bytes:
            self.note(False, what + " as one reduce_scatter",
                      f"padding: {merged_bytes} B vs {prev_bytes + ar_bytes} B")
            return None
        if merged_time > separate and ctx.prefer != "consistency":
            self.note(False, what + " as one reduce_scatter",
                      f"cost: {merged_time * 1e6:.1f}us vs {separate * 1e6:.1f}us")
            return None
        self.note(True, f"{what} -> {S.step_label(step, mesh)}", why)
        return step


def _padded(shape, dim: int, counts) -> list:
    """``shape`` with ``dim`` split into nested pieces, each padded to the largest."""
    out = list(shape)
    out[dim] = sym.nested_max_chunk(out[dim], counts) * math.prod(counts)
    return out
