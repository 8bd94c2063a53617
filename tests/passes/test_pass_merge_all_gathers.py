"""merge-all-gathers: IR in, IR out; each legality condition has a not-transformed twin."""

from __future__ import annotations

import expecttest
from support.ir_text import assert_not_transformed, run_pass

from redist_opt.passes import MergeAllGathers

P = MergeAllGathers

NESTED = """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (2, 4)
step 0 over b: S(0) -> R, logical=(4, 4)
  %all_gather = all_gather(%x, {b 2:1}, 0) : (4, 4)
step 1 over a: S(0) -> R, logical=(8, 4)
  %all_gather_1 = all_gather(%all_gather, {a 2:2}, 0) : (8, 4)
return %all_gather_1
"""
# The torch 2.13 corruption case: (5,3) on 2x2; pieces are 2,1,1,1 rows.
NESTED_UNEVEN = """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (chunk(chunk(5,2,c_a),2,c_b), 3)
step 0 over b: S(0) -> R, logical=(chunk(5,2,c_a), 3)
  %pad_to = pad_to(%x, 0, ceildiv(chunk(5,2,c_a),2)) : (ceildiv(chunk(5,2,c_a),2), 3)
  %all_gather = all_gather(%pad_to, {b 2:1}, 0) : (2*ceildiv(chunk(5,2,c_a),2), 3)
  %narrow = narrow(%all_gather, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3)
step 1 over a: S(0) -> R, logical=(5, 3)
  %pad_to_1 = pad_to(%narrow, 0, 3) : (3, 3)
  %all_gather_1 = all_gather(%pad_to_1, {a 2:2}, 0) : (6, 3)
  %narrow_1 = narrow(%all_gather_1, 0, 0, 5) : (5, 3)
return %narrow_1
"""
# S(0) over a and c: the group lists a slowest, c fastest: layout (2,2):(4,1).
NESTED_OVER_A_AND_C = """\
redistribute [S(0), R, S(0)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 2), float32
mesh flattened=[a+c]
%x : (2, 2)
step 0 over c: S(0) -> R, logical=(4, 2)
  %all_gather = all_gather(%x, {c 2:1}, 0) : (4, 2)
step 1 over a: S(0) -> R, logical=(8, 2)
  %all_gather_1 = all_gather(%all_gather, {a 2:4}, 0) : (8, 2)
return %all_gather_1
"""
DIFFERENT_DIMS = """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (4, 2)
step 0 over b: S(1) -> R, logical=(4, 4)
  %all_gather = all_gather(%x, {b 2:1}, 1) : (4, 4)
step 1 over a: S(0) -> R, logical=(8, 4)
  %all_gather_1 = all_gather(%all_gather, {a 2:2}, 0) : (8, 4)
return %all_gather_1
"""
NO_GROUP = """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
%x : (2, 4)
step 0 over b: S(0) -> R, logical=(4, 4)
  %all_gather = all_gather(%x, {b 2:1}, 0) : (4, 4)
step 1 over a: S(0) -> R, logical=(8, 4)
  %all_gather_1 = all_gather(%all_gather, {a 2:2}, 0) : (8, 4)
return %all_gather_1
"""


class TestMergeAllGathers(expecttest.TestCase):
    def test_nested_gather_merges(self):
        self.assertExpectedInline(
            run_pass(NESTED, P),
            """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
mesh flattened=[a+b]
%x : (2, 4)
step 0 over a+b: S(0) -> R, logical=(8, 4)
  %all_gather = all_gather(%x, {a+b 4:1}, 0) : (8, 4)  # <- %all_gather, %all_gather_1
return %all_gather""",
        )

    def test_uneven_gather_unpads_every_slot(self):
        self.assertExpectedInline(
            run_pass(NESTED_UNEVEN, P),
            """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (chunk(chunk(5,2,c_a),2,c_b), 3)
step 0 over a+b: S(0) -> R, logical=(5, 3)
  %pad_to = pad_to(%x, 0, 2) : (2, 3)  # <- %all_gather, %all_gather_1
  %all_gather = all_gather(%pad_to, {a+b 4:1}, 0) : (8, 3)  # <- %all_gather, %all_gather_1
  %unpad_nested = unpad_nested(%all_gather, 0, 5, (2, 2)) : (5, 3)  # <- %all_gather, %all_gather_1
return %unpad_nested""",
        )

    def test_noncontiguous_group_order(self):
        self.assertExpectedInline(
            run_pass(NESTED_OVER_A_AND_C, P),
            """\
redistribute [S(0), R, S(0)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 2), float32
mesh flattened=[a+c]
%x : (2, 2)
step 0 over a+c: S(0) -> R, logical=(8, 2)
  %all_gather = all_gather(%x, {a+c (2,2):(4,1)}, 0) : (8, 2)  # <- %all_gather, %all_gather_1
return %all_gather""",
        )

    def test_different_dims_not_transformed(self):
        self.assertExpectedInline(assert_not_transformed(DIFFERENT_DIMS, P), """""")

    def test_missing_group_not_transformed(self):
        self.assertExpectedInline(
            assert_not_transformed(NO_GROUP, P),
            """[merge-all-gathers] all_gather(b) + all_gather(a): not merged: no process group has layout 4:1 (groups=existing)""",
        )


# FSDP2 + TP: tensor dim 0 sharded by tp, then dp (shard order tp, dp); the dp+tp
# communicator lists its ranks dp-major, so the merged gather permutes its blocks.
STRIDED = """\
redistribute [_S(0, 2), S(0)] -> [R, R] on mesh (dp=2,tp=2), shape (16, 3), float32
mesh flattened=[dp+tp]
%x : (4, 3)
step 0 over dp: S(0) -> R, logical=(8, 3)
  %all_gather = all_gather(%x, {dp 2:2}, 0) : (8, 3)
step 1 over tp: S(0) -> R, logical=(16, 3)
  %all_gather_1 = all_gather(%all_gather, {tp 2:1}, 0) : (16, 3)
return %all_gather_1
"""
STRIDED_UNEVEN = """\
redistribute [_S(0, 2), S(0)] -> [R, R] on mesh (dp=2,tp=2), shape (7, 3), float32
mesh flattened=[dp+tp]
%x : (chunk(chunk(7,2,c_tp),2,c_dp), 3)
step 0 over dp: S(0) -> R, logical=(chunk(7,2,c_tp), 3)
  %pad_to = pad_to(%x, 0, ceildiv(chunk(7,2,c_tp),2)) : (ceildiv(chunk(7,2,c_tp),2), 3)
  %all_gather = all_gather(%pad_to, {dp 2:2}, 0) : (2*ceildiv(chunk(7,2,c_tp),2), 3)
  %narrow = narrow(%all_gather, 0, 0, chunk(7,2,c_tp)) : (chunk(7,2,c_tp), 3)
step 1 over tp: S(0) -> R, logical=(7, 3)
  %pad_to_1 = pad_to(%narrow, 0, 4) : (4, 3)
  %all_gather_1 = all_gather(%pad_to_1, {tp 2:1}, 0) : (8, 3)
  %narrow_1 = narrow(%all_gather_1, 0, 0, 7) : (7, 3)
return %narrow_1
"""


class TestMergeAllGathersBlockPermutation(expecttest.TestCase):
    def test_strided_gather_merges_and_permutes_blocks(self):
        self.assertExpectedInline(
            run_pass(STRIDED, P),
            """\
redistribute [_S(0, 2), S(0)] -> [R, R] on mesh (dp=2,tp=2), shape (16, 3), float32
mesh flattened=[dp+tp]
%x : (4, 3)
step 0 over dp+tp: S(0) -> R, logical=(16, 3), variant=gather_blocks(0: tp+dp)
  %all_gather = all_gather(%x, {dp+tp 4:1}, 0) : (16, 3)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 2), ((0, (1, 0)),), 16) : (16, 3)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )

    def test_uneven_strided_gather_pads_every_block(self):
        self.assertExpectedInline(
            run_pass(STRIDED_UNEVEN, P),
            """\
redistribute [_S(0, 2), S(0)] -> [R, R] on mesh (dp=2,tp=2), shape (7, 3), float32
mesh flattened=[dp+tp]
%x : (chunk(chunk(7,2,c_tp),2,c_dp), 3)
step 0 over dp+tp: S(0) -> R, logical=(7, 3), variant=gather_blocks(0: tp+dp)
  %pad_to = pad_to(%x, 0, 2) : (2, 3)  # <- %all_gather, %all_gather_1
  %all_gather = all_gather(%pad_to, {dp+tp 4:1}, 0) : (8, 3)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 2), ((0, (1, 0)),), 7) : (7, 3)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )

    def test_strided_without_group_not_transformed(self):
        text = STRIDED.replace("mesh flattened=[dp+tp]\n", "")
        self.assertExpectedInline(
            assert_not_transformed(text, P),
            """[merge-all-gathers] all_gather(dp) + all_gather(tp): not merged: a communicator over (2,2):(1,2) ranks its members in another order (groups=existing)""",
        )
