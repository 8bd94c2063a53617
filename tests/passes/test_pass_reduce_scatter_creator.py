"""reduce-scatter-creator: IR in, IR out; each legality condition has a not-transformed twin.

The inputs are P,P,S(0),S(0) -> S(1),S(1),S(0),S(0) on a 2x2x2x2 (r, m, i, t) mesh after
reorder-collectives, which makes all_reduce(m) and chunk(m) adjacent.
"""

from __future__ import annotations

import expecttest
from support.ir_text import assert_not_transformed, parse_ir, run_pass, run_pass_notes

from redist_opt.ir.cost import CostModel
from redist_opt.passes import ReduceScatterCreator

P = ReduceScatterCreator

UNEVEN = """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 6, 4), float32
mesh flattened=[i+t]
%x : (2, 6, 4)
step 1 over r: P -> S(1), logical=(8, 6, 4)
  %reduce_scatter = reduce_scatter(%x, {r 2:8}, 'sum', 1) : (2, 3, 4)
step 0 over m: P -> R, logical=(8, 6, 4)
  %all_reduce = all_reduce(%reduce_scatter, {m 2:4}, 'sum') : (2, 3, 4)
step 2 over m: R -> S(1), logical=(8, 6, 4)
  %select_chunk = select_chunk(%all_reduce, 1, 2, c_m) : (2, chunk(3,2,c_m), 4)
return %select_chunk
"""
EVEN = """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 8, 4), float32
mesh flattened=[i+t]
%x : (2, 8, 4)
step 1 over r: P -> S(1), logical=(8, 8, 4)
  %reduce_scatter = reduce_scatter(%x, {r 2:8}, 'sum', 1) : (2, 4, 4)
step 0 over m: P -> R, logical=(8, 8, 4)
  %all_reduce = all_reduce(%reduce_scatter, {m 2:4}, 'sum') : (2, 4, 4)
step 2 over m: R -> S(1), logical=(8, 8, 4)
  %select_chunk = select_chunk(%all_reduce, 1, 2, c_m) : (2, 2, 4)
return %select_chunk
"""
MAX_CREATE = """\
redistribute [P(max), P(max), S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 8, 4), float32
mesh flattened=[i+t]
%x : (2, 8, 4)
step 1 over r: P(max) -> S(1), logical=(8, 8, 4)
  %reduce_scatter = reduce_scatter(%x, {r 2:8}, 'max', 1) : (2, 4, 4)
step 0 over m: P(max) -> R, logical=(8, 8, 4)
  %all_reduce = all_reduce(%reduce_scatter, {m 2:4}, 'max') : (2, 4, 4)
step 2 over m: R -> S(1), logical=(8, 8, 4)
  %select_chunk = select_chunk(%all_reduce, 1, 2, c_m) : (2, 2, 4)
return %select_chunk
"""
UNEVEN_RM_EXISTS = """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 6, 4), float32
mesh flattened=[i+t, r+m]
%x : (2, 6, 4)
step 1 over r: P -> S(1), logical=(8, 6, 4)
  %reduce_scatter = reduce_scatter(%x, {r 2:8}, 'sum', 1) : (2, 3, 4)
step 0 over m: P -> R, logical=(8, 6, 4)
  %all_reduce = all_reduce(%reduce_scatter, {m 2:4}, 'sum') : (2, 3, 4)
step 2 over m: R -> S(1), logical=(8, 6, 4)
  %select_chunk = select_chunk(%all_reduce, 1, 2, c_m) : (2, chunk(3,2,c_m), 4)
return %select_chunk
"""
# DTensor's own order: all_reduce(m), reduce_scatter(r), chunk(m)
NOT_REORDERED = """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 8, 4), float32
mesh flattened=[i+t]
%x : (2, 8, 4)
step 0 over m: P -> R, logical=(8, 8, 4)
  %all_reduce = all_reduce(%x, {m 2:4}, 'sum') : (2, 8, 4)
step 1 over r: P -> S(1), logical=(8, 8, 4)
  %reduce_scatter = reduce_scatter(%all_reduce, {r 2:8}, 'sum', 1) : (2, 4, 4)
step 2 over m: R -> S(1), logical=(8, 8, 4)
  %select_chunk = select_chunk(%reduce_scatter, 1, 2, c_m) : (2, 2, 4)
return %select_chunk
"""
# all_reduce(b) is followed by a chunk over c
CHUNK_OVER_OTHER_DIM = """\
redistribute [R, P, R] -> [R, R, S(0)] on mesh (a=2,b=2,c=2), shape (8, 8), float32
mesh flattened=[b+c]
%x : (8, 8)
step 0 over b: P -> R, logical=(8, 8)
  %all_reduce = all_reduce(%x, {b 2:2}, 'sum') : (8, 8)
step 1 over c: R -> S(0), logical=(8, 8)
  %select_chunk = select_chunk(%all_reduce, 0, 2, c_c) : (4, 8)
return %select_chunk
"""


class TestReduceScatterCreator(expecttest.TestCase):
    def test_all_reduce_and_chunk_fold_into_one_uneven_reduce_scatter(self):
        after = run_pass(UNEVEN, P, groups="create")
        self.assertExpectedInline(
            after,
            """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 6, 4), float32
mesh flattened=[i+t]
%x : (2, 6, 4)
step 1 over r+m: P -> S(1), logical=(2, 6, 4)
  %pad_nested = pad_nested(%x, 1, (2, 2)) : (2, 8, 4)  # <- %reduce_scatter, %all_reduce
  %reduce_scatter = reduce_scatter(%pad_nested, {r+m 4:4}, 'sum', 1) : (2, 2, 4)  # <- %reduce_scatter, %all_reduce
  %narrow = narrow(%reduce_scatter, 1, 0, chunk(3,2,c_m)) : (2, chunk(3,2,c_m), 4)  # <- %reduce_scatter, %all_reduce
return %narrow""",
        )
        assert parse_ir(UNEVEN).bytes_per_rank == 288 and parse_ir(after).bytes_per_rank == 256

    def test_standalone_when_even(self):
        # no r+m group: the all_reduce + chunk alone becomes a reduce_scatter (dim 1: 8 -> 4 -> 2)
        after = run_pass(EVEN, P)
        self.assertExpectedInline(
            after,
            """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 8, 4), float32
mesh flattened=[i+t]
%x : (2, 8, 4)
step 1 over r: P -> S(1), logical=(8, 8, 4)
  %reduce_scatter = reduce_scatter(%x, {r 2:8}, 'sum', 1) : (2, 4, 4)
step 0 over m: P -> S(1), logical=(8, 8, 4)
  %reduce_scatter_1 = reduce_scatter(%reduce_scatter, {m 2:4}, 'sum', 1) : (2, 2, 4)  # <- %all_reduce
return %reduce_scatter_1""",
        )
        # fed the same bytes, but a reduce_scatter moves half of what an all_reduce does
        before, after = parse_ir(EVEN), parse_ir(after)
        assert after.bytes_per_rank == before.bytes_per_rank
        assert CostModel.default().plan_time(after) < CostModel.default().plan_time(before)
        self.assertExpectedInline(
            run_pass_notes(EVEN, P),
            """\
[reduce-scatter-creator] reduce_scatter(r) + all_reduce(m) + chunk(m) as one reduce_scatter: not merged: no process group has layout 4:4 (groups=existing)
[reduce-scatter-creator] all_reduce(m) + chunk(m) -> reduce_scatter(m): merged: the chunk keeps the rank's reduce_scatter piece""",
        )

    def test_any_reduce_op(self):
        self.assertExpectedInline(
            run_pass(MAX_CREATE, P, groups="create"),
            """\
redistribute [P(max), P(max), S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 8, 4), float32
mesh flattened=[i+t]
%x : (2, 8, 4)
step 1 over r+m: P(max) -> S(1), logical=(2, 8, 4)
  %reduce_scatter = reduce_scatter(%x, {r+m 4:4}, 'max', 1) : (2, 2, 4)  # <- %reduce_scatter, %all_reduce
return %reduce_scatter""",
        )

    def test_fold_uses_existing_group(self):
        self.assertExpectedInline(
            run_pass(UNEVEN_RM_EXISTS, P),
            """\
redistribute [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)] on mesh (r=2,m=2,i=2,t=2), shape (8, 6, 4), float32
mesh flattened=[i+t, r+m]
%x : (2, 6, 4)
step 1 over r+m: P -> S(1), logical=(2, 6, 4)
  %pad_nested = pad_nested(%x, 1, (2, 2)) : (2, 8, 4)  # <- %reduce_scatter, %all_reduce
  %reduce_scatter = reduce_scatter(%pad_nested, {r+m 4:4}, 'sum', 1) : (2, 2, 4)  # <- %reduce_scatter, %all_reduce
  %narrow = narrow(%reduce_scatter, 1, 0, chunk(3,2,c_m)) : (2, chunk(3,2,c_m), 4)  # <- %reduce_scatter, %all_reduce
return %narrow""",
        )

    def test_padding_not_transformed(self):
        # condition 3: without r+m, a reduce_scatter of 3 rows over 2 ranks is fed 4 rows,
        # more than the all_reduce it would replace (and the fold has no group: condition 2)
        self.assertExpectedInline(
            assert_not_transformed(UNEVEN, P),
            """\
[reduce-scatter-creator] reduce_scatter(r) + all_reduce(m) + chunk(m) as one reduce_scatter: not merged: no process group has layout 4:4 (groups=existing)
[reduce-scatter-creator] all_reduce(m) + chunk(m): not merged: padding: a reduce_scatter is fed 128 B vs 96 B""",
        )

    def test_not_adjacent_not_transformed(self):
        # condition 1
        self.assertExpectedInline(assert_not_transformed(NOT_REORDERED, P, groups="create"), """""")

    def test_chunk_over_other_mesh_dim_not_transformed(self):
        # condition 1
        self.assertExpectedInline(
            assert_not_transformed(CHUNK_OVER_OTHER_DIM, P),
            """[reduce-scatter-creator] all_reduce(b) + chunk(c): not merged: the chunk is over other mesh dims than the all_reduce""",
        )
