"""merge-reductions: adjacent all_reduces over disjoint mesh dims -> one per chosen group.

Rewrite (groups a+c exists)::

    all_reduce(x, {a}, sum); all_reduce(_, {c}, sum)
  =>
    all_reduce(x, {a+c (2,2):(4,1)}, sum)

Legality:

1. the all_reduces are adjacent (reorder-collectives makes them so) and have
   one ``steps.merge_key``: the same reduce op (sum, avg, max or min:
   AR_op(G2) . AR_op(G1) = AR_op(G1 x G2); avg over equal-size groups composes
   to avg over the product), or sum and avg mixed (both linear:
   AR_avg(G1) . AR_sum(G2) = AR_sum(G1 x G2) / |G1|, lowered as one sum and one
   local ``divide`` by the product of the avg dims' sizes, so every replica
   computes the same bits). On integer dtypes avg truncates each quotient (as
   torch's avg does), so there avg merges with nothing::

       all_reduce(x, {a}, avg); all_reduce(_, {b}, sum)
     =>
       all_reduce(x, {a+b}, sum); divide(_, 2)

2. they span disjoint mesh dims, so the product group has no rank twice
   (``check_orthogonal`` on the collapsed layout);
3. a communicator with the product's layout is available under the groups
   policy: one that exists (a flattened mesh, a root-mesh dim an ``_unflatten``
   view came from, the world group), or one ``groups="create"`` may create.
   Any rank order serves: an all_reduce's result does not depend on it.

Not all-or-nothing: a run over {a,b,c} with only a+b available becomes
AR(a+b) + AR(c). Among all set partitions of the run whose blocks have groups,
``PassContext.best`` picks by the profitability rule: the fastest, or fewer
collectives within its margin (ring all_reduces can be *slower* merged at small
sizes); ``prefer="consistency"`` takes the fewest collectives instead,
so replicas come from one reduction and are bitwise equal.

Not done: mixing non-linear reduce ops (DTensor refuses max/min/product mixed
with anything else in one placement); integer avg.
"""

from __future__ import annotations

from . import _merge


class MergeReductions(_merge.MergeRunPass):
    name = "merge-reductions"
    kind = "all_reduce"
    any_order = True

    def partitions(self, run):
        return _merge.set_partitions(range(len(run)))

    def block_dims(self, run, members):
        return tuple(sorted(d for m in members for d in run[m].step.mesh_dims))
