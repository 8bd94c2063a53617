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
5. the merged all_to_all is fed no more bytes than the two it replaces, and the
   cost model finds it no slower (``prefer="consistency"``: always).

Not done: all_to_alls that move the same tensor dim pair (DTensor's planner does
not emit them adjacent; they would need a local chunk permutation), or whose
split dim is the other's cat dim; chains of three or more.
"""

from __future__ import annotations

import math

from torch.fx.passes.infra.pass_base import PassResult

from . import _merge
from .context import RedistPass
from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym


class MergeAdjacentAllToAlls(RedistPass):
    name = "merge-adjacent-all-to-alls"

    def call(self, graph_module):
        regs = S.regions(graph_module)
        if sum(r.step.kind == "all_to_all" for r in regs) < 2:
            return PassResult(graph_module, False)
        mesh = self.ctx.mesh
        states = S.states_before(regs, self.ctx.src, mesh)
        new_steps: list[ir.StepInfo] = []
        provenance: list[tuple[str, ...]] = []
        changed, t = False, 0
        while t < len(regs):
            step = self._try(regs, states, t) if t + 1 < len(regs) else None
            if step is None:
                new_steps.append(regs[t].step)
                provenance.append(regs[t].inherited)
                t += 1
                continue
            new_steps.append(step)
            provenance.append(tuple(n for r in regs[t : t + 2] for n in r.origin))
            changed = True
            t += 2
        if not changed:
            return PassResult(graph_module, False)
        return PassResult(S.relower(graph_module, mesh, new_steps, provenance), True)

    def _try(self, regs, states, t) -> ir.StepInfo | None:
        first, second = regs[t].step, regs[t + 1].step
        if first.kind != "all_to_all" or second.kind != "all_to_all" or first.also or second.also:
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
        if tuple(order[-len(real):]) != real:
            self.note(False, label, f"tensor dim {i} is not sharded by {real} innermost")
            return None
        choice, why = ctx.choose_group(dims)
        if choice is None:
            self.note(False, label, why)
            return None
        step = ir.StepInfo(second.index, dims, first.src, second.dst, (), also=((db, first.dst),))
        step = S.with_state_logical_shape(step, states[t], ctx.shape, mesh)
        shape = list(regs[t].nodes[0].args[0].meta["shape"])
        counts = tuple(mesh.sizes[d] for d in real)
        shape[i] = sym.nested_max_chunk(step.logical_shape[i], counts)
        for dim, ds in ((j, da), (k, db)):
            c = tuple(mesh.sizes[d] for d in ds if mesh.sizes[d] > 1)
            shape[dim] = sym.nested_max_chunk(step.logical_shape[dim], c) * math.prod(c)
        merged_bytes = ctx.bytes_of(shape)
        if not _merge.accept_one(self, label, regs[t : t + 2], choice, "all_to_all", merged_bytes):
            return None
        self.note(True, f"{label} -> {S.step_label(step, mesh)}", why)
        return step
