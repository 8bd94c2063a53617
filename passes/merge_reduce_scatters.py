"""merge-reduce-scatters: nested reduce_scatters of one tensor dim -> one over the product group.

Rewrite (P,P -> S(0),S(0); a+b exists)::

    reduce_scatter(x, {a}, sum, 0); reduce_scatter(_, {b}, sum, 0)
  =>
    reduce_scatter(x, {a+b (4,):(1,)}, sum, 0)

Legality:

1. the reduce_scatters are adjacent, have one ``steps.merge_key`` (the same
   reduce op, or sum and avg mixed on a floating dtype: one sum, then one local
   ``divide`` by the avg dims' sizes, as in merge-reductions) and scatter the
   same tensor dim, over disjoint mesh dims;
2. the product group's rank order is the *shard order*: the chunk a rank keeps
   is the row-major coordinate over the merged dims, outermost first, so the
   group must have exactly that layout (a flattened mesh of those dims in that
   order, or one ``groups="create"`` may create);
3. uneven sizes are handled exactly: ``pad_nested`` splits the dim as DTensor's
   nested ``torch.chunk`` would, pads every piece to the largest, and the rank
   narrows its result to the size DTensor defines for it. torch 2.13 refuses
   this merge for uneven shapes.

Only contiguous sub-runs merge (the nesting order is fixed); among the splits
whose blocks have groups, ``PassContext.best`` picks by the profitability rule
(``_merge.choose``).

Not done: permuting chunks locally to use a group whose rank order differs
from the shard order.
"""

from __future__ import annotations

import math

from redist_opt.ir import symbolic as sym

from . import _merge


class MergeReduceScatters(_merge.MergeRunPass):
    name = "merge-reduce-scatters"
    kind = "reduce_scatter"

    def block_bytes(self, run, members, state):
        if len(members) == 1:
            return super().block_bytes(run, members, state)
        # The merged scatter's input: every nested piece padded to the largest.
        shape = list(run[members[0]].nodes[0].args[0].meta["shape"])
        dim = run[members[0]].step.dst.dim
        counts = tuple(self.ctx.mesh.sizes[d] for d in self.block_dims(run, members))
        shape[dim] = sym.nested_max_chunk(shape[dim], counts) * math.prod(counts)
        return self.ctx.bytes_of(shape)
