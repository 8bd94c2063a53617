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
5. the merged all_to_all is fed no more bytes than the collectives it replaces.

The merge is made when the cost model says one all_to_all is cheaper than the
all_gathers plus all_to_all it replaces (``prefer="consistency"``: always).

Not done here: two adjacent all_to_alls (merge-adjacent-all-to-alls merges
those that cat one tensor dim and split two others, the pairs DTensor emits;
it never emits adjacent ones that move the same tensor dim pair: every
placement pair on 2x2 and 2x2x2 meshes, 3,000 sampled on 2x2x2x2).
"""

from __future__ import annotations

import math


from torch.distributed.tensor.placement_types import Shard
from torch.fx.passes.infra.pass_base import PassResult

from . import _merge
from .context import RedistPass
from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym


class MergeAllToAlls(RedistPass):
    name = "merge-all-to-alls"

    def call(self, graph_module):
        regs = S.regions(graph_module)
        if not any(r.step.kind == "all_to_all" for r in regs):
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        states = S.states_before(regs, self.ctx.src, mesh)
        new_steps: list[ir.StepInfo] = []
        provenance: list[tuple[str, ...]] = []
        changed, t = False, 0
        while t < len(regs):
            made = self._try(regs, states, t, new_steps) if regs[t].step.kind == "all_to_all" else None
            if made is None:
                new_steps.append(regs[t].step)
                provenance.append(regs[t].inherited)
                t += 1
                continue
            step, k, m = made
            del new_steps[len(new_steps) - k :], provenance[len(provenance) - k :]
            new_steps.append(step)
            provenance.append(tuple(n for r in regs[t - k : t + 1 + m] for n in r.origin))
            changed = True
            t += 1 + m
        if not changed:
            return PassResult(graph_module, False)
        return PassResult(S.relower(graph_module, mesh, new_steps, provenance), True)

    def _try(self, regs, states, t, emitted) -> tuple[ir.StepInfo, int, int] | None:
        """(merged step, gathers before, chunks after) for the all_to_all at ``t``."""
        a2a = regs[t].step
        src_dim, dst_dim = a2a.src.dim, a2a.dst.dim
        if src_dim == dst_dim:
            return None
        gathers: list[int] = []  # regions just before t, unchanged by this pass
        g = t - 1
        while (
            g >= 0
            and regs[g].step.kind == "all_gather"
            and regs[g].step.src.dim == src_dim
            and len(emitted) >= t - g
            and emitted[g - t] is regs[g].step
        ):
            gathers.insert(0, g)
            g -= 1
        chunks: list[int] = []
        c = t + 1
        while c < len(regs) and regs[c].step.kind == "chunk" and regs[c].step.dst.dim == dst_dim:
            chunks.append(c)
            c += 1
        if not gathers or not chunks:
            return None
        for k in range(len(gathers), 0, -1):
            made = self._try_k(regs, states, t, gathers[-k:], chunks)
            if made is not None:
                return made[0], k, made[1]
        return None

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
        if tuple(order[-len(dims):]) != dims:
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
        merged_bytes = ctx.bytes_of(merged_shape)
        if not _merge.accept_one(self, label, [regs[x] for x in [*used, t]], choice, "all_to_all", merged_bytes):
            return None
        self.note(True, f"{label} -> {S.step_label(step, mesh)}", why)
        return step, m
