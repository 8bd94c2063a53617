"""merge-all-to-alls: gather + all_to_all + chunk around one reshard -> one all_to_all.

DTensor reshards a tensor dim nested over several mesh dims one mesh dim at a
time. ``S(0),S(0) -> S(1),S(1)`` on a 2x2 mesh runs::

    all_gather({b}, 0); all_to_all({a}, split 1, cat 0); select_chunk(1, 2, c_b)

Rewrite (a+b exists)::

    all_to_all({a+b (4,):(1,)}, split 1, cat 0)      (+ nested pad/unpad if uneven)

Legality:

1. three adjacent steps: an all_gather of tensor dim ``i`` over mesh dims D2,
   an all_to_all ``S(i) -> S(j)`` over D1, and a Replicate -> ``S(j)`` chunk over
   D2, with D1, D2 disjoint;
2. before them ``i`` is sharded by ... D1, D2 (innermost last); after them
   ``j`` is sharded by ... D1, D2: both shard orders list the merged dims as
   D1 then D2, so one group in that rank order serves as the cat order of ``i``
   and the split order of ``j``;
3. the group with that layout is available under the groups policy;
4. uneven sizes are exact: ``i`` is padded to the largest nested piece and
   unpadded slot by slot, ``j`` is split into nested pieces (``pad_nested``) and
   narrowed to the rank's own size.

The merge is made when the cost model says one all_to_all is cheaper than the
all_gather plus all_to_all it replaces.

Not done: two adjacent all_to_alls (their shard orders disagree, which would
need a local chunk permutation).
"""

from __future__ import annotations

import math


from torch.distributed.tensor.placement_types import Shard
from torch.fx.passes.infra.pass_base import PassResult

from .context import RedistPass
from redist_opt import ir
from redist_opt import steps as S
from redist_opt import symbolic as sym


class MergeAllToAlls(RedistPass):
    name = "merge-all-to-alls"

    def call(self, graph_module):
        regs = S.regions(graph_module)
        if not any(r.step.kind == "all_to_all" for r in regs):
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        states = S.states_before(regs, self.ctx.src, mesh)
        new_steps, provenance, changed = [], [], False
        i = 0
        while i < len(regs):
            merged = self._try(regs, states, i) if i + 2 < len(regs) else None
            if merged is None:
                new_steps.append(regs[i].step)
                provenance.append(regs[i].inherited)
                i += 1
                continue
            new_steps.append(merged)
            provenance.append(tuple(n for r in regs[i : i + 3] for n in r.origin))
            changed = True
            i += 3
        if not changed:
            return PassResult(graph_module, False)
        return PassResult(S.relower(graph_module, mesh, new_steps, provenance), True)

    def _try(self, regs, states, i) -> ir.StepInfo | None:
        gather, a2a, chunk = (r.step for r in regs[i : i + 3])
        if (gather.kind, a2a.kind, chunk.kind) != ("all_gather", "all_to_all", "chunk"):
            return None
        src_dim, dst_dim = a2a.src.dim, a2a.dst.dim
        d1, d2 = a2a.mesh_dims, gather.mesh_dims
        if gather.src.dim != src_dim or chunk.dst.dim != dst_dim or chunk.mesh_dims != d2:
            return None
        if set(d1) & set(d2) or src_dim == dst_dim:
            return None
        mesh = self.ctx.mesh
        order = states[i].order.get(src_dim, [])
        label = f"{S.step_label(gather, mesh)} + {S.step_label(a2a, mesh)} + {S.step_label(chunk, mesh)}"
        if tuple(order[-len(d1) - len(d2):]) != tuple(d1) + tuple(d2):
            self.note(False, label, f"tensor dim {src_dim} is not sharded by {d1 + d2} innermost")
            return None
        dims = tuple(d1) + tuple(d2)
        choice, why = self.ctx.choose_group(dims)
        if choice is None:
            self.note(False, label, why)
            return None
        step = ir.StepInfo(a2a.index, dims, Shard(src_dim), Shard(dst_dim), ())
        step = S.with_state_logical_shape(step, states[i], self.ctx.shape, mesh)
        # Bytes each rank feeds in: separately, the (padded) inputs of the gather and
        # the all_to_all; merged, both dims padded to the largest nested piece.
        sep_gather = self.ctx.bytes_of(regs[i].collective.args[0].meta["shape"])
        sep_a2a = self.ctx.bytes_of(regs[i + 1].collective.args[0].meta["shape"])
        counts = tuple(mesh.sizes[d] for d in dims)
        merged_shape = list(regs[i].nodes[0].args[0].meta["shape"])
        merged_shape[src_dim] = sym.nested_max_chunk(step.logical_shape[src_dim], counts)
        merged_shape[dst_dim] = sym.nested_max_chunk(step.logical_shape[dst_dim], counts) * math.prod(counts)
        merged_bytes = self.ctx.bytes_of(merged_shape)
        if merged_bytes > sep_gather + sep_a2a:
            self.note(False, label, f"padding: one all_to_all moves {merged_bytes} B vs {sep_gather + sep_a2a} B")
            return None
        separate = self.ctx.collective_time(
            "all_gather", self.ctx.choose_group(d2)[0], sep_gather
        ) + self.ctx.collective_time("all_to_all", self.ctx.choose_group(d1)[0], sep_a2a)
        merged_time = self.ctx.collective_time("all_to_all", choice, merged_bytes)
        if merged_time > separate and self.ctx.prefer != "consistency":
            self.note(False, label, f"cost: one all_to_all {merged_time * 1e6:.1f}us vs {separate * 1e6:.1f}us")
            return None
        self.note(True, f"{label} -> {S.step_label(step, mesh)}", why)
        return step
