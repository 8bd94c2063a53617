"""merge-gathers-across-dims: all_gathers of *different* tensor dims -> one all_gather + reassembly.

``S(0),S(1) -> R,R`` (FSDP x TP weights gathered for clipping or a checkpoint)
is two all_gathers, one per tensor dim. Each rank's block is
``x[chunk c_a of dim 0, chunk c_b of dim 1]``; one all_gather of the blocks over
a group for both mesh dims, then a local reassembly, gives the same tensor.

Rewrite (2x8 mesh, a (5,7) tensor, a group for a+b available)::

    pad_to(x, 1, 1); all_gather({b}, 1); narrow(1, 0, 7);
    pad_to(_, 0, 3); all_gather({a}, 0); narrow(0, 0, 5)
  =>
    pad_to(x, 0, 3); pad_to(_, 1, 1); all_gather({a+b (16,):(1,)}, 0);
    unpack_blocks(0, (2, 8), ((0, (0,)), (1, (1,))), 5, 7)

Every rank pads its block to the largest block (uneven shards), the gather lays
the blocks along dim 0 in the group's rank order, and ``unpack_blocks`` reads
each slot's mesh coordinates as nested chunk indices (slot k of group (a, b) is
the block at chunk ``k // 8`` of dim 0 and ``k % 8`` of dim 1), narrows it to
its true size and concatenates the pieces in chunk order.

Legality:

1. the all_gathers are adjacent and span pairwise disjoint mesh dims (so they
   commute: ``steps.commute`` holds for gathers of different tensor dims, and
   gathers of one tensor dim compose as a nested gather); the merged block
   gathers at least two tensor dims (one tensor dim alone is merge-all-gathers);
2. for each tensor dim ``t``, the block's mesh dims on ``t`` (outermost first)
   are the innermost sharding dims of ``t`` in the shard order before the block,
   so a rank's piece along ``t`` is the nested chunk of ``t``'s logical size at
   its coordinates over those dims (checked on the shard state; DTensor's greedy
   order always satisfies it);
3. a communicator over the union of the mesh dims is available under the groups
   policy, whatever layout names it: a communicator ranks its members by
   ascending global rank (c10d sorts them), so the gathered slots come in
   ``MeshSpec.rank_order`` of the dims (dims by decreasing stride; the merge is
   not made when their modes interleave), and ``unpack_blocks`` maps that slot
   order to chunk indices;
4. uneven sizes are exact: every gathered dim is padded to its largest nested
   piece (uniform within the group: it depends only on coordinates outside it),
   and each piece is narrowed to the size DTensor defines for it. Data is only
   moved, never combined, so the result is bitwise DTensor's.

The merge is made where the profitability rule (``PassContext.profitable``, via
``_merge.choose`` over the contiguous splits) says one all_gather pays against the
ones it replaces (never more bytes in than separately). Under a ring model (gloo)
one gather over p ranks has p-1
latency steps against (a-1)+(b-1) separately, so it rarely pays there; under the
tree/launch-bound default profile it does.

Not done: gathers interleaved with all_to_alls or local chunks; reassembly by a
pure reshape/permute (the even case also goes through narrow + cat).
"""

from __future__ import annotations

from torch.distributed.tensor.placement_types import Replicate, Shard

from redist_opt import ir
from redist_opt.ir import steps as S
from redist_opt.ir import symbolic as sym

from . import _merge


def _parts(step: ir.StepInfo) -> tuple:
    """((tensor dim, mesh dims outermost first), ...) the step gathers."""
    return step.parts if step.variant == "gather_blocks" else ((step.src.dim, tuple(step.mesh_dims)),)


class MergeGathersAcrossDims(_merge.MergeRunPass):
    name = "merge-gathers-across-dims"
    kind = "all_gather"
    any_order = True

    def made_reason(self, block):
        return block.why + "; blocks reassembled locally (unpack_blocks)"

    # -- legality ---------------------------------------------------------------------

    def find_runs(self, regs):
        """Maximal runs of adjacent all_gathers over disjoint mesh dims touching >= 2 tensor dims."""
        out, i = [], 0
        while i < len(regs):
            if regs[i].step.kind != "all_gather":
                i += 1
                continue
            j, used = i + 1, set(regs[i].step.mesh_dims)
            while (
                j < len(regs)
                and regs[j].step.kind == "all_gather"
                and not used & set(regs[j].step.mesh_dims)
                # gathers of other tensor dims commute (steps.commute); gathers of the
                # same tensor dim (one merge key) compose as one nested gather
                and all(
                    S.commute(r.step, regs[j].step) is None
                    or S.merge_key(r.step) == S.merge_key(regs[j].step)
                    for r in regs[i:j]
                )
            ):
                used |= set(regs[j].step.mesh_dims)
                j += 1
            if len({t for r in regs[i:j] for t, _ in _parts(r.step)}) >= 2:
                out.append((i, j))
            i = j
        return out

    @staticmethod
    def _dims_by_tensor_dim(members) -> dict[int, tuple[int, ...]]:
        """Per tensor dim, the mesh dims the members gather it over, outermost first
        (gathers unshard the innermost dims first, so later members are outer)."""
        out: dict[int, tuple[int, ...]] = {}
        for r in members:
            for t, dims in _parts(r.step):
                out[t] = tuple(dims) + out.get(t, ())
        return out

    def refuse(self, run, state):
        return self._misordered(run, state)

    def _misordered(self, run, state) -> str | None:
        """Condition 2 for the whole run (then it holds for every contiguous block)."""
        mesh = self.ctx.mesh
        for t, dims in self._dims_by_tensor_dim(run).items():
            real = [d for d in dims if mesh.sizes[d] > 1]
            order = state.order.get(t, [])
            if real and order[-len(real) :] != real:
                return (
                    f"tensor dim {t} is not sharded by {tuple(real)} innermost (shard order {tuple(order)})"
                )
        return None

    def partitions(self, run):
        """Contiguous splits whose merged blocks gather >= 2 tensor dims over mesh dims
        whose ranks a communicator lists in an order of whole dims (``rank_order``)."""
        mesh = self.ctx.mesh

        def ok(m):
            if len(m) == 1:
                return True
            dims = [d for k in m for d in run[k].step.mesh_dims]
            return (
                len({t for k in m for t, _ in _parts(run[k].step)}) >= 2 and mesh.rank_order(dims) is not None
            )

        for part in _merge.contiguous_partitions(len(run)):
            if all(ok(m) for m in part):
                yield part

    # -- the merged step ----------------------------------------------------------------

    def block_dims(self, run, members):
        return tuple(sorted(d for m in members for d in run[m].step.mesh_dims))

    def _logical(self, members, state) -> tuple:
        dims = [d for m in members for d in m.step.mesh_dims]
        return state.logical_shape(self.ctx.shape, self.ctx.mesh, dims)

    def block_bytes(self, run, members, state) -> int:
        if len(members) == 1:
            return super().block_bytes(run, members, state)
        state = state.copy()
        for r in run[: members[0]]:
            state.apply(r.step, self.ctx.mesh)
        regs = [run[m] for m in members]
        logical = self._logical(regs, state)
        shape = list(regs[0].nodes[0].args[0].meta["shape"])
        for t, dims in self._dims_by_tensor_dim(regs).items():
            counts = tuple(self.ctx.mesh.sizes[d] for d in dims if self.ctx.mesh.sizes[d] > 1)
            shape[t] = sym.nested_max_chunk(logical[t], counts)
        return self.ctx.bytes_of(shape)

    def merged(self, run, members, dims, state) -> ir.StepInfo:
        regs = [run[m] for m in members]
        parts = tuple(sorted(self._dims_by_tensor_dim(regs).items()))
        return ir.StepInfo(
            regs[0].step.index,
            tuple(dims),
            Shard(parts[0][0]),
            Replicate(),
            self._logical(regs, state),
            variant="gather_blocks",
            parts=parts,
        )
