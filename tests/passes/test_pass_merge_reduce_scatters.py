"""merge-reduce-scatters: IR in, IR out; each legality condition has a not-transformed twin."""

from __future__ import annotations

import expecttest
from support.ir_text import assert_not_transformed, run_pass

from redist_opt.passes import MergeReduceScatters

P = MergeReduceScatters

NESTED = """\
redistribute [P, P] -> [S(0), S(0)] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {a 2:2}, 'sum', 0) : (4, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {b 2:1}, 'sum', 0) : (2, 4)
return %reduce_scatter_1
"""
# torch 2.13 refuses this (5 rows over 4 ranks); we pad every nested piece.
NESTED_UNEVEN = """\
redistribute [P, P] -> [S(0), S(0)] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (5, 3)
step 0 over a: P -> S(0), logical=(5, 3)
  %pad_nested = pad_nested(%x, 0, (2,)) : (6, 3)
  %reduce_scatter = reduce_scatter(%pad_nested, {a 2:2}, 'sum', 0) : (3, 3)
  %narrow = narrow(%reduce_scatter, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3)
step 1 over b: P -> S(0), logical=(5, 3)
  %pad_nested_1 = pad_nested(%narrow, 0, (2,)) : (2*ceildiv(chunk(5,2,c_a),2), 3)
  %reduce_scatter_1 = reduce_scatter(%pad_nested_1, {b 2:1}, 'sum', 0) : (ceildiv(2*ceildiv(chunk(5,2,c_a),2),2), 3)
  %narrow_1 = narrow(%reduce_scatter_1, 0, 0, chunk(chunk(5,2,c_a),2,c_b)) : (chunk(chunk(5,2,c_a),2,c_b), 3)
return %narrow_1
"""
THREE_DIMS_BC_EXISTS = """\
redistribute [P, P, P] -> [S(0), S(0), S(0)] on mesh (a=2,b=2,c=2), shape (16, 2), float32
mesh flattened=[b+c]
%x : (16, 2)
step 0 over a: P -> S(0), logical=(16, 2)
  %reduce_scatter = reduce_scatter(%x, {a 2:4}, 'sum', 0) : (8, 2)
step 1 over b: P -> S(0), logical=(16, 2)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {b 2:2}, 'sum', 0) : (4, 2)
step 2 over c: P -> S(0), logical=(16, 2)
  %reduce_scatter_2 = reduce_scatter(%reduce_scatter_1, {c 2:1}, 'sum', 0) : (2, 2)
return %reduce_scatter_2
"""
DIFFERENT_TENSOR_DIMS = """\
redistribute [P, P] -> [S(0), S(1)] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {a 2:2}, 'sum', 0) : (4, 4)
step 1 over b: P -> S(1), logical=(8, 4)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {b 2:1}, 'sum', 1) : (4, 2)
return %reduce_scatter_1
"""
NO_GROUP = """\
redistribute [P, P] -> [S(0), S(0)] on mesh (a=2,b=2), shape (8, 4), float32
%x : (8, 4)
step 0 over a: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {a 2:2}, 'sum', 0) : (4, 4)
step 1 over b: P -> S(0), logical=(8, 4)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {b 2:1}, 'sum', 0) : (2, 4)
return %reduce_scatter_1
"""
SUM_AND_AVG = """\
redistribute [P, P(avg)] -> [S(0), S(0)] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (5, 3)
step 0 over a: P -> S(0), logical=(5, 3)
  %pad_nested = pad_nested(%x, 0, (2,)) : (6, 3)
  %reduce_scatter = reduce_scatter(%pad_nested, {a 2:2}, 'sum', 0) : (3, 3)
  %narrow = narrow(%reduce_scatter, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3)
step 1 over b: P(avg) -> S(0), logical=(5, 3)
  %pad_nested_1 = pad_nested(%narrow, 0, (2,)) : (2*ceildiv(chunk(5,2,c_a),2), 3)
  %reduce_scatter_1 = reduce_scatter(%pad_nested_1, {b 2:1}, 'avg', 0) : (ceildiv(2*ceildiv(chunk(5,2,c_a),2),2), 3)
  %narrow_1 = narrow(%reduce_scatter_1, 0, 0, chunk(chunk(5,2,c_a),2,c_b)) : (chunk(chunk(5,2,c_a),2,c_b), 3)
return %narrow_1
"""
INT_SUM_AND_AVG = """\
redistribute [P, P(avg)] -> [S(0), S(0)] on mesh (a=2,b=2), shape (8, 3), int32
mesh flattened=[a+b]
%x : (8, 3)
step 0 over a: P -> S(0), logical=(8, 3)
  %reduce_scatter = reduce_scatter(%x, {a 2:2}, 'sum', 0) : (4, 3)
step 1 over b: P(avg) -> S(0), logical=(8, 3)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {b 2:1}, 'avg', 0) : (2, 3)
return %reduce_scatter_1
"""


class TestMergeReduceScatters(expecttest.TestCase):
    def test_nested_scatter_merges(self):
        self.assertExpectedInline(
            run_pass(NESTED, P),
            """\
redistribute [P, P] -> [S(0), S(0)] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (8, 4)
step 0 over a+b: P -> S(0), logical=(8, 4)
  %reduce_scatter = reduce_scatter(%x, {a+b 4:1}, 'sum', 0) : (2, 4)  # <- %reduce_scatter, %reduce_scatter_1
return %reduce_scatter""",
        )

    def test_uneven_merges_with_nested_padding(self):
        self.assertExpectedInline(
            run_pass(NESTED_UNEVEN, P),
            """\
redistribute [P, P] -> [S(0), S(0)] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (5, 3)
step 0 over a+b: P -> S(0), logical=(5, 3)
  %pad_nested = pad_nested(%x, 0, (2, 2)) : (8, 3)  # <- %reduce_scatter, %reduce_scatter_1
  %reduce_scatter = reduce_scatter(%pad_nested, {a+b 4:1}, 'sum', 0) : (2, 3)  # <- %reduce_scatter, %reduce_scatter_1
  %narrow = narrow(%reduce_scatter, 0, 0, chunk(chunk(5,2,c_a),2,c_b)) : (chunk(chunk(5,2,c_a),2,c_b), 3)  # <- %reduce_scatter, %reduce_scatter_1
return %narrow""",
        )

    def test_three_dims_partial_group(self):
        self.assertExpectedInline(
            run_pass(THREE_DIMS_BC_EXISTS, P),
            """\
redistribute [P, P, P] -> [S(0), S(0), S(0)] on mesh (a=2,b=2,c=2), shape (16, 2), float32
mesh flattened=[b+c]
%x : (16, 2)
step 0 over a: P -> S(0), logical=(16, 2)
  %reduce_scatter = reduce_scatter(%x, {a 2:4}, 'sum', 0) : (8, 2)
step 1 over b+c: P -> S(0), logical=(16, 2)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {b+c 4:1}, 'sum', 0) : (2, 2)  # <- %reduce_scatter_1, %reduce_scatter_2
return %reduce_scatter_1""",
        )

    def test_different_tensor_dims_not_transformed(self):
        self.assertExpectedInline(assert_not_transformed(DIFFERENT_TENSOR_DIMS, P), """""")

    def test_no_group_in_shard_order_not_transformed(self):
        self.assertExpectedInline(
            assert_not_transformed(NO_GROUP, P),
            """[merge-reduce-scatters] reduce_scatter(a) + reduce_scatter(b): not merged: no process group has layout 4:1 (groups=existing)""",
        )

    def test_mixed_sum_avg_scatter_merges_with_one_scale(self):
        self.assertExpectedInline(
            run_pass(SUM_AND_AVG, P),
            """\
redistribute [P, P(avg)] -> [S(0), S(0)] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (5, 3)
step 0 over a+b: P -> S(0), logical=(5, 3), avg_scale=2
  %pad_nested = pad_nested(%x, 0, (2, 2)) : (8, 3)  # <- %reduce_scatter, %reduce_scatter_1
  %reduce_scatter = reduce_scatter(%pad_nested, {a+b 4:1}, 'sum', 0) : (2, 3)  # <- %reduce_scatter, %reduce_scatter_1
  %narrow = narrow(%reduce_scatter, 0, 0, chunk(chunk(5,2,c_a),2,c_b)) : (chunk(chunk(5,2,c_a),2,c_b), 3)  # <- %reduce_scatter, %reduce_scatter_1
  %divide = divide(%narrow, 2) : (chunk(chunk(5,2,c_a),2,c_b), 3)  # <- %reduce_scatter, %reduce_scatter_1
return %divide""",
        )

    def test_mixed_sum_avg_integer_not_transformed(self):
        self.assertExpectedInline(assert_not_transformed(INT_SUM_AND_AVG, P), """""")
