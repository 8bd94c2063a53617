"""merge-reductions: IR in, IR out; each legality condition has a not-transformed twin."""

from __future__ import annotations

import expecttest
import pytest
from support.ir_text import assert_not_transformed, run_pass, run_pass_notes

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.passes import MergeReductions, ReorderCollectives

P = MergeReductions

ALL_PARTIAL_ABC_EXISTS = """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+b+c]
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
step 2 over c: P -> R, logical=(8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
return %all_reduce_2
"""
ALL_PARTIAL_AB_EXISTS = """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
step 2 over c: P -> R, logical=(8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
return %all_reduce_2
"""
ALL_PARTIAL_NO_GROUP = """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
step 2 over c: P -> R, logical=(8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
return %all_reduce_2
"""
SCATTER_BETWEEN = """\
redistribute [P, P, P] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+c]
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%all_reduce, {b 2:2}, 'sum', 0) : (4, 4)
step 2 over c: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%reduce_scatter, {c 2:1}, 'sum') : (4, 4)
return %all_reduce_1
"""
SCATTER_MOVED_FIRST = """\
redistribute [P, P, P] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+c]
%x : (8, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {b 2:2}, 'sum', 0) : (4, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%reduce_scatter, {a 2:4}, 'sum') : (4, 4)
step 2 over c: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {c 2:1}, 'sum') : (4, 4)
return %all_reduce_1
"""
AVG = """\
redistribute [P(avg), P(avg)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'avg') : (8, 4)
step 1 over b: P(avg) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'avg') : (8, 4)
return %all_reduce_1
"""
MAX = """\
redistribute [P(max), P(max)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P(max) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'max') : (8, 4)
step 1 over b: P(max) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'max') : (8, 4)
return %all_reduce_1
"""
MIN = """\
redistribute [P(min), P(min)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P(min) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'min') : (8, 4)
step 1 over b: P(min) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'min') : (8, 4)
return %all_reduce_1
"""
SMALL_ABC_EXISTS = """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4), float32
mesh flattened=[a+b+c]
%x : (4, 4)
step 0 over a: P -> R, logical=(4, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (4, 4)
step 1 over b: P -> R, logical=(4, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (4, 4)
step 2 over c: P -> R, logical=(4, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (4, 4)
return %all_reduce_2
"""
UNEVEN = """\
redistribute [P, P] -> [R, R] on mesh (a=3,b=2), shape (5, 7), float32
mesh flattened=[a+b]
%x : (5, 7)
step 0 over a: P -> R, logical=(5, 7)
  %all_reduce = all_reduce(%x, {a 3:2}, 'sum') : (5, 7)
step 1 over b: P -> R, logical=(5, 7)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'sum') : (5, 7)
return %all_reduce_1
"""
AVG_THEN_SUM = """\
redistribute [P(avg), P] -> [R, R] on mesh (a=2,b=3), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:3}, 'avg') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 3:1}, 'sum') : (8, 4)
return %all_reduce_1
"""
SUM_THEN_AVG = """\
redistribute [P, P(avg)] -> [R, R] on mesh (a=2,b=3), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:3}, 'sum') : (8, 4)
step 1 over b: P(avg) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 3:1}, 'avg') : (8, 4)
return %all_reduce_1
"""
AVG_SUM_AVG_BC_EXISTS = """\
redistribute [P(avg), P, P(avg)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[b+c]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'avg') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
step 2 over c: P(avg) -> R, logical=(8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'avg') : (8, 4)
return %all_reduce_2
"""
INT_AVG_THEN_SUM = """\
redistribute [P(avg), P] -> [R, R] on mesh (a=2,b=2), shape (8, 4), int64
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'avg') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'sum') : (8, 4)
return %all_reduce_1
"""
INT_AVG_AVG = """\
redistribute [P(avg), P(avg)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), int64
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'avg') : (8, 4)
step 1 over b: P(avg) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'avg') : (8, 4)
return %all_reduce_1
"""
INT_SUM_SUM = """\
redistribute [P, P] -> [R, R] on mesh (a=2,b=2), shape (8, 4), int64
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'sum') : (8, 4)
step 1 over b: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'sum') : (8, 4)
return %all_reduce_1
"""
AVG_SCATTER_AVG = """\
redistribute [P(avg), P, P(avg)] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+c]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'avg') : (8, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%all_reduce, {b 2:2}, 'sum', 0) : (4, 4)
step 2 over c: P(avg) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%reduce_scatter, {c 2:1}, 'avg') : (4, 4)
return %all_reduce_1
"""
INT_AVG_SCATTER_AVG = """\
redistribute [P(avg), P, P(avg)] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), int64
mesh flattened=[a+c]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'avg') : (8, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%all_reduce, {b 2:2}, 'sum', 0) : (4, 4)
step 2 over c: P(avg) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%reduce_scatter, {c 2:1}, 'avg') : (4, 4)
return %all_reduce_1
"""

# A ring all_reduce over 8 ranks has more latency steps than three over pairs.
SLOW_RING = CostModel(name="ring", launch=0.0, alpha_intra=1e-3, bw_intra=1e12, algorithm="ring")


class TestMergeReductions(expecttest.TestCase):
    def test_all_in_one_when_group_exists(self):
        self.assertExpectedInline(
            run_pass(ALL_PARTIAL_ABC_EXISTS, P),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+b+c]
%x : (8, 4)
step 0 over a+b+c: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b+c 8:1}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1, %all_reduce_2
return %all_reduce""",
        )

    def test_not_all_or_nothing(self):
        # DESIGN case 2: only a+b exists: AR(a+b) + AR(c), where torch keeps 3.
        self.assertExpectedInline(
            run_pass(ALL_PARTIAL_AB_EXISTS, P),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b 4:2}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1
step 2 over c: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {c 2:1}, 'sum') : (8, 4)
return %all_reduce_1""",
        )
        self.assertExpectedInline(
            run_pass_notes(ALL_PARTIAL_AB_EXISTS, P),
            """\
[merge-reductions] all_reduce(a) + all_reduce(b) + all_reduce(c) as one: not merged: no process group has layout 8:1 (groups=existing)
[merge-reductions] all_reduce(a) + all_reduce(b) -> all_reduce(a+b): merged: a process group with layout 4:2 exists""",
        )

    def test_non_contiguous_group(self):
        # DESIGN case 1: a and c of a 2x2x2 mesh, after reorder-collectives: layout (2,2):(4,1).
        self.assertExpectedInline(
            run_pass(SCATTER_MOVED_FIRST, P),
            """\
redistribute [P, P, P] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+c]
%x : (8, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {b 2:2}, 'sum', 0) : (4, 4)
step 0 over a+c: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%reduce_scatter, {a+c (2,2):(4,1)}, 'sum') : (4, 4)  # <- %all_reduce, %all_reduce_1
return %all_reduce""",
        )
        self.assertExpectedInline(
            run_pass_notes(SCATTER_MOVED_FIRST, P),
            """[merge-reductions] all_reduce(a) + all_reduce(c) -> all_reduce(a+c): merged: a process group with layout (2,2):(4,1) exists""",
        )

    def test_avg_max_and_min_merge_with_themselves(self):
        self.assertExpectedInline(
            "\n\n".join(run_pass(t, P) for t in (AVG, MAX, MIN)),
            """\
redistribute [P(avg), P(avg)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b 4:1}, 'avg') : (8, 4)  # <- %all_reduce, %all_reduce_1
return %all_reduce

redistribute [P(max), P(max)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P(max) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b 4:1}, 'max') : (8, 4)  # <- %all_reduce, %all_reduce_1
return %all_reduce

redistribute [P(min), P(min)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P(min) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b 4:1}, 'min') : (8, 4)  # <- %all_reduce, %all_reduce_1
return %all_reduce""",
        )

    def test_no_group_not_transformed(self):
        # A rank-free MeshSpec has no world group: nothing exists for a+b+c.
        self.assertExpectedInline(
            assert_not_transformed(ALL_PARTIAL_NO_GROUP, P),
            """[merge-reductions] all_reduce(a) + all_reduce(b) + all_reduce(c): not merged: no process group has layout 8:1 (groups=existing)""",
        )

    def test_create_policy_merges(self):
        self.assertExpectedInline(
            run_pass(ALL_PARTIAL_NO_GROUP, P, groups="create"),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
%x : (8, 4)
step 0 over a+b+c: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b+c 8:1}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1, %all_reduce_2
return %all_reduce""",
        )

    def test_allow_list_policy(self):
        self.assertExpectedInline(
            run_pass(ALL_PARTIAL_NO_GROUP, P, groups=("b+c",)),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
%x : (8, 4)
step 0 over a: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
step 1 over b+c: P -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b+c 4:1}, 'sum') : (8, 4)  # <- %all_reduce_1, %all_reduce_2
return %all_reduce_1""",
        )

    def test_not_adjacent_not_transformed(self):
        # Without reorder-collectives the scatter separates the two reductions.
        self.assertExpectedInline(assert_not_transformed(SCATTER_BETWEEN, P), """""")

    def test_cost_can_refuse_a_merge_not_transformed(self):
        # With a latency-dominated ring profile, small messages stay unmerged ...
        self.assertExpectedInline(
            assert_not_transformed(SMALL_ABC_EXISTS, P, cost=SLOW_RING),
            """[merge-reductions] all_reduce(a) + all_reduce(b) + all_reduce(c): not merged: separate collectives are cheaper under the cost model""",
        )

    def test_consistency_merges_whatever_the_cost(self):
        # ... unless replicas must be bitwise equal.
        self.assertExpectedInline(
            run_pass(SMALL_ABC_EXISTS, P, cost=SLOW_RING, prefer="consistency"),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4), float32
mesh flattened=[a+b+c]
%x : (4, 4)
step 0 over a+b+c: P -> R, logical=(4, 4)
  %all_reduce = all_reduce(%x, {a+b+c 8:1}, 'sum') : (4, 4)  # <- %all_reduce, %all_reduce_1, %all_reduce_2
return %all_reduce""",
        )

    def test_uneven_shapes_do_not_matter_for_reductions(self):
        self.assertExpectedInline(
            run_pass(UNEVEN, P),
            """\
redistribute [P, P] -> [R, R] on mesh (a=3,b=2), shape (5, 7), float32
mesh flattened=[a+b]
%x : (5, 7)
step 0 over a+b: P -> R, logical=(5, 7)
  %all_reduce = all_reduce(%x, {a+b 6:1}, 'sum') : (5, 7)  # <- %all_reduce, %all_reduce_1
return %all_reduce""",
        )

    def test_mixed_sum_avg_merge_into_one_sum_and_one_scale(self):
        # AR_avg(a) . AR_sum(b) = AR_sum(a+b) / |a|
        self.assertExpectedInline(
            run_pass(AVG_THEN_SUM, P),
            """\
redistribute [P(avg), P] -> [R, R] on mesh (a=2,b=3), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P -> R, logical=(8, 4), avg_scale=2
  %all_reduce = all_reduce(%x, {a+b 6:1}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1
  %divide = divide(%all_reduce, 2) : (8, 4)  # <- %all_reduce, %all_reduce_1
return %divide""",
        )
        # the other way round: the scale is |b|
        self.assertExpectedInline(
            run_pass(SUM_THEN_AVG, P),
            """\
redistribute [P, P(avg)] -> [R, R] on mesh (a=2,b=3), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P -> R, logical=(8, 4), avg_scale=3
  %all_reduce = all_reduce(%x, {a+b 6:1}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1
  %divide = divide(%all_reduce, 3) : (8, 4)  # <- %all_reduce, %all_reduce_1
return %divide""",
        )

    def test_mixed_partial_merge_not_all_or_nothing(self):
        # avg over a and c, sum over b; only b+c exists: AR_avg(a) + AR_sum(b+c) / |c|
        self.assertExpectedInline(
            run_pass(AVG_SUM_AVG_BC_EXISTS, P),
            """\
redistribute [P(avg), P, P(avg)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[b+c]
%x : (8, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'avg') : (8, 4)
step 1 over b+c: P -> R, logical=(8, 4), avg_scale=2
  %all_reduce_1 = all_reduce(%all_reduce, {b+c 4:1}, 'sum') : (8, 4)  # <- %all_reduce_1, %all_reduce_2
  %divide = divide(%all_reduce_1, 2) : (8, 4)  # <- %all_reduce_1, %all_reduce_2
return %divide""",
        )

    def test_mixed_partial_integer_dtype_not_transformed(self):
        # On integer dtypes every avg truncates (torch: sum / n, then cast back), so
        # avg(a) then sum(b) is not sum(a+b) / |a|: nothing with avg merges.
        assert_not_transformed(INT_AVG_THEN_SUM, P)
        assert_not_transformed(INT_AVG_AVG, P)

    def test_integer_sum_merges(self):
        self.assertExpectedInline(
            run_pass(INT_SUM_SUM, P),
            """\
redistribute [P, P] -> [R, R] on mesh (a=2,b=2), shape (8, 4), int64
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {a+b 4:1}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1
return %all_reduce""",
        )

    def test_float_avg_reordered(self):
        # P(avg),P,P(avg) -> R,S(0),R: on floats the scatter moves first ...
        self.assertExpectedInline(
            run_pass(AVG_SCATTER_AVG, ReorderCollectives),
            """\
redistribute [P(avg), P, P(avg)] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
mesh flattened=[a+c]
%x : (8, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {b 2:2}, 'sum', 0) : (4, 4)
step 0 over a: P(avg) -> R, logical=(8, 4)
  %all_reduce = all_reduce(%reduce_scatter, {a 2:4}, 'avg') : (4, 4)
step 2 over c: P(avg) -> R, logical=(8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {c 2:1}, 'avg') : (4, 4)
return %all_reduce_1""",
        )

    def test_integer_avg_not_reordered_not_transformed(self):
        # ... on integers the avg reductions stay in DTensor's order.
        assert_not_transformed(INT_AVG_SCATTER_AVG, ReorderCollectives)


def test_max_and_sum_mix_is_refused():
    spec = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"), flattened=["a+b"])
    with pytest.raises(ValueError, match="mix partial reduce ops"):
        redist_opt.plan(spec, "P(max),P", "R,R", shape=(8, 4))
