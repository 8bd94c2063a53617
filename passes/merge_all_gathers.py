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
   dims, or creatable under ``groups="create"``);
3. uneven sizes are exact: every rank pads its piece to the largest nested
   piece, and ``unpad_nested`` keeps the valid prefix of *every* slot. (torch
   2.13's merge narrows only the tail, which returns padding in place of data
   when a middle piece is short: the (5,3) case of pytorch PR 194457.)

Only contiguous sub-runs merge; among the splits whose blocks have groups,
``PassContext.best`` picks by the profitability rule (``_merge.choose``).

Not done: gathers of one tensor dim that are not adjacent (reorder-collectives
makes them so where they commute); gathers of different tensor dims
(merge-gathers-across-dims).
"""

from __future__ import annotations

from . import _merge
from redist_opt.ir import steps as S


class MergeAllGathers(_merge.MergeRunPass):
    name = "merge-all-gathers"
    kind = "all_gather"

    def block_dims(self, run, members):
        # Gathered innermost first; the merged group lists dims outermost first.
        return tuple(d for m in reversed(members) for d in run[m].step.mesh_dims)

    def merged(self, run, members, dims, state):
        step = super().merged(run, members, dims, state)
        return S.with_state_logical_shape(step, state, self.ctx.shape, self.ctx.mesh)
