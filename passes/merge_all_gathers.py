"""merge-all-gathers: nested all_gathers of one tensor dim -> one over the product group.

Rewrite (S(0),S(0) -> R,R; a+b exists; a (5,3) tensor)::

    pad_to(x, 0, 1); all_gather({b}, 0); narrow(0, 0, chunk(5,2,c_a));
    pad_to(_, 0, 3); all_gather({a}, 0); narrow(0, 0, 5)
  =>
    pad_to(x, 0, 2); all_gather({a+b (4,):(1,)}, 0); unpad_nested(0, 5, (2, 2))

DTensor gathers the innermost shard first; merged, the group lists ranks in
shard order (outermost dim slowest), so member k holds nested piece k.

Legality:

1. the all_gathers are adjacent, gather the same tensor dim, over disjoint mesh
   dims, innermost first (each unshards the innermost sharding mesh dims);
2. the product group has exactly the shard-order layout (flattened mesh of those
   dims, or creatable under ``groups="create"``), or else condition 4 holds;
3. uneven sizes are exact: every rank pads its piece to the largest nested
   piece, and ``unpad_nested`` keeps the valid prefix of *every* slot. (torch
   2.13's merge narrows only the tail, which returns padding in place of data
   when a middle piece is short: the (5,3) case of pytorch PR 194457.)

Only contiguous sub-runs merge; among the splits whose blocks have groups,
``PassContext.best`` picks by the profitability rule (``_merge.choose``).

Block permutation. A communicator lists its members by ascending global rank
(``MeshSpec.rank_order``), which need not be the shard order. FSDP2 + TP's
``[_S(0, 2), S(0)] -> [R, R]`` (``redist_opt.ir.strided``) shards tensor dim 0 by
tp, then dp; the dp+tp communicator lists ranks dp-major. Then the gather runs over
the communicator in its rank order and ``unpack_blocks`` puts the blocks back in
shard order (a ``gather_blocks`` step of one tensor dim; 2x2 mesh, (16, 3)
tensor)::

    all_gather(x, {dp 2:2}, 0); all_gather(_, {tp 2:1}, 0)
  =>
    all_gather(x, {dp+tp 4:1}, 0); unpack_blocks(_, 0, (2, 2), ((0, (1, 0)),), 16)

4. (block permutation) the dims' rank order is an order of whole dims
   (``rank_order`` is not None) and a communicator in that order is available; the
   blocks are padded to the largest nested piece, as in 3.

Not done: the even-size permutation as one reshape + permute (it goes through
``unpack_blocks``' narrow + cat); gathers of one tensor dim that are not adjacent (reorder-collectives
makes them so where they commute); gathers of different tensor dims
(merge-gathers-across-dims).
"""

from __future__ import annotations

import dataclasses

from redist_opt.ir import steps as S

from . import _merge


class MergeAllGathers(_merge.MergeRunPass):
    name = "merge-all-gathers"
    kind = "all_gather"

    def block_dims(self, run, members):
        # Gathered innermost first; the merged group lists dims outermost first.
        return tuple(d for m in reversed(members) for d in run[m].step.mesh_dims)

    def _block(self, run, members, state):
        block = super()._block(run, members, state)
        if block.choice is not None or len(members) < 2:
            return block
        mesh = self.ctx.mesh
        shard_dims = tuple(d for d in self.block_dims(run, members) if mesh.sizes[d] > 1)
        order = mesh.rank_order(shard_dims)
        if order is None or order == shard_dims:
            return block
        choice, why = self.ctx.choose_group(order)  # condition 4: gather in rank order, permute
        if choice is None:
            return block
        cost = _merge.Cost(
            self.ctx.collective_time(self.kind, choice, block.cost.nbytes), 1, block.cost.nbytes
        )
        return _merge.Block(
            members, choice.group.dims, choice, why + "; blocks permuted to shard order", cost
        )

    def merged(self, run, members, dims, state):
        step = super().merged(run, members, dims, state)
        step = S.with_state_logical_shape(step, state, self.ctx.shape, self.ctx.mesh)
        shard_dims = self.block_dims(run, members)
        real = [d for d in shard_dims if self.ctx.mesh.sizes[d] > 1]
        if [d for d in dims if self.ctx.mesh.sizes[d] > 1] == real:
            return step
        # the group's rank order is not the shard order: gather, then unpack_blocks
        return dataclasses.replace(step, variant="gather_blocks", parts=((step.src.dim, shard_dims),))
