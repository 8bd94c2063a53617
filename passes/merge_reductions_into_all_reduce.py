"""merge-reductions-into-all-reduce: reduce_scatters + all_reduces -> one all_reduce + local chunks.

For small tensors one fatter collective beats two thin ones: the launch and
latency steps saved outweigh the bytes added. HSDP's ``P,P -> R,S(0)`` is a
reduce_scatter over the shard dim plus an all_reduce over the replicate dim;
as one all_reduce over both dims and a local chunk it moves more bytes in one
launch.

Rewrite (``P,P -> R,S(0)`` on a 2x4 mesh, a group for a+b available)::

    reduce_scatter(x, {b}, sum, 0); all_reduce(_, {a}, sum)
  =>
    all_reduce(x, {a+b (8,):(1,)}, sum); select_chunk(_, 0, 4, c_b)

Legality:

1. the steps are adjacent reductions (all_reduce or reduce_scatter) with the
   same reduce op, over pairwise disjoint mesh dims, and at least one is a
   reduce_scatter (a block of all_reduces alone is merge-reductions' rewrite);
   a sum that merge-reductions made of sum and avg (a sum and a division by the
   avg dims' sizes, ``avg_scale``) is a sum here, and the one all_reduce keeps
   the product of the block's divisions;
   avg only on floating dtypes: on integers every avg reduction truncates
   (``steps.avg_is_linear``), so one avg over the union is not the nested ones;
2. every mesh dim in the block is Partial before it, so none of them shards a
   tensor dim: the size a reduce_scatter splits is the same on every rank of the
   union group, and chunking commutes with the other reductions
   (``chunk(AR_G2(RS_G1(x))) = chunk_G1(AR_{G1 x G2}(x))`` for sum, avg over
   equal-size groups, max, min);
3. a communicator over the union of the mesh dims is available under the groups
   policy, in any rank order (an all_reduce's result does not depend on it);
4. the local chunks reproduce DTensor's sizes exactly, uneven and zero-size
   included: ``select_chunk`` is ``torch.chunk`` with trailing empty chunks, per
   mesh dim in the reduce_scatter's shard order (outermost first);
5. the profitability rule (``PassContext.profitable``, a byte-trading rewrite:
   no ``prefer="consistency"`` waiver) says the one all_reduce (plus the
   amortized creation of its group) pays against the collectives it replaces.

This trades bytes for launches: where it is chosen, the optimized plan may move
more bytes than torch's, but never takes more modelled time (under the model in
use) and never issues more collectives. Summation order changes (results equal
torch's within rounding for sum/avg; exactly for max/min), as for
merge-reductions.

Among the contiguous splits of a run into blocks, ``PassContext.best`` picks
(``_merge.choose``). Not done: blocks without a reduce_scatter; all_gathers after
the reduction (an all_reduce + all_gather would need a broadcast-shaped model).
"""

from __future__ import annotations

import dataclasses

from torch.distributed.tensor.placement_types import Replicate

from redist_opt import ir
from redist_opt.ir import steps as S

from . import _merge
from ._rewriter import StepRewriter
from .context import GroupChoice, RedistPass

_KINDS = ("all_reduce", "reduce_scatter")


class MergeReductionsIntoAllReduce(RedistPass):
    name = "merge-reductions-into-all-reduce"
    may_add_bytes = True

    def call(self, graph_module):
        rw = StepRewriter(graph_module, self.ctx)
        found = dict(self._runs(rw.regions, self.ctx.dtype))
        if not found:
            return rw.finish()
        return rw.scan(lambda i: self._rewrite(rw, i, found[i]) if i in found else 0)

    def _rewrite(self, rw: StepRewriter, start: int, end: int) -> int:
        mesh = self.ctx.mesh
        run = rw.regions[start:end]
        best, why_not = self._choose(run)
        labels = " + ".join(S.step_label(r.step, mesh) for r in run)
        if best is None:
            self.note(False, f"{labels} as one all_reduce", why_not)
            return 0
        for b in sorted(best, key=lambda b: b.members):
            regions = [run[m] for m in b.members]
            if len(regions) == 1:
                rw.keep(regions[0])
                continue
            new = self._rewritten(regions, tuple(b.choice.group.dims))
            self.note(
                True,
                " + ".join(S.step_label(r.step, mesh) for r in regions)
                + " -> "
                + ", ".join(S.step_label(s, mesh) for s in new),
                f"{b.why} (more bytes, fewer launches); {b.choice.how} group",
            )
            rw.emit(new, regions)
        return end - start

    # -- legality (conditions 1 and 2) ----------------------------------------------------

    @staticmethod
    def _runs(regs, dtype):
        """Maximal runs of adjacent reductions with one reduce op over disjoint mesh dims,
        holding at least two collectives and a reduce_scatter. avg counts only where it
        is linear in ``dtype`` (on integers every avg truncates: one avg over the product
        group would not equal the nested ones)."""
        out, i = [], 0
        while i < len(regs):
            step = regs[i].step
            if (
                step.kind not in _KINDS
                or regs[i].collective is None
                or (step.reduce_op == "avg" and not S.avg_is_linear(dtype))
            ):
                i += 1
                continue
            j = i + 1
            while (
                j < len(regs)
                and regs[j].step.kind in _KINDS
                and regs[j].collective is not None
                and regs[j].step.reduce_op == step.reduce_op
                # disjoint mesh dims, and (steps.commute) the order of the block's
                # reductions does not matter, so one all_reduce may stand for all
                and all(S.commute(r.step, regs[j].step, dtype) is None for r in regs[i:j])
            ):
                j += 1
            if j - i >= 2 and any(r.step.kind == "reduce_scatter" for r in regs[i:j]):
                out.append((i, j))
            i = j
        return out

    # -- choice by cost (conditions 3 and 5) --------------------------------------------

    def _block(self, run, members) -> _merge.Block:
        """One all_reduce for ``members`` (choice None: it cannot be formed), or the
        region itself, as it is, for a single member."""
        ctx = self.ctx
        regions = [run[m] for m in members]
        separate = ctx.cost_of(regions)
        if len(members) == 1:
            kept = GroupChoice(regions[0].collective.args[1], "existing")
            return _merge.Block(members, regions[0].step.mesh_dims, kept, "as it is", separate)
        dims = tuple(sorted(d for r in regions for d in r.step.mesh_dims))
        if not any(r.step.kind == "reduce_scatter" for r in regions):
            return _merge.Block(members, dims, None, "no block with a reduce_scatter", separate)
        choice, why = ctx.choose_group(dims, any_order=True)
        if choice is None:
            return _merge.Block(members, dims, None, why, separate)
        fat = ctx.new_cost("all_reduce", choice, ctx.bytes_of(regions[0].nodes[0].args[0].meta["shape"]))
        ok, why = ctx.profitable(separate, fat, what="one all_reduce", trades_bytes=True)
        if not ok:  # condition 5, per block
            return _merge.Block(members, dims, None, why, separate)
        return _merge.Block(members, choice.group.dims, choice, why, fat)

    def _choose(self, run):
        """The blocks ``_merge.choose`` picks; None (and why) when that keeps the run as it is."""
        best, tried = _merge.choose(
            self,
            _merge.contiguous_partitions(len(run)),
            lambda members: self._block(run, members),
            trades_bytes=True,
        )
        if all(len(b.members) == 1 for b in best):
            return None, tried[tuple(range(len(run)))].why
        return best, ""

    # -- the rewrite (condition 4) ----------------------------------------------------------

    def _rewritten(self, regions, group_dims) -> list[ir.StepInfo]:
        # One all_reduce doing what the block's reductions did (``steps.merged_step``, the one
        # rule for merged reductions: a sum merge-reductions made of sum and avg keeps its
        # division by the avg dims' sizes), replicated where the scatters sharded.
        steps = [r.step for r in regions]
        merged = S.merged_step(steps, group_dims, steps[0].index, self.ctx.mesh.sizes)
        out = [dataclasses.replace(merged, dst=Replicate())]
        for r in regions:
            if r.step.kind == "reduce_scatter":  # the scatter becomes a local chunk, in shard order
                s = r.step
                out.append(ir.StepInfo(s.index, s.mesh_dims, Replicate(), s.dst, s.logical_shape))
        return out
