"""merge-adjacent-all-to-alls: IR in, IR out; each legality condition has a not-transformed twin."""

from __future__ import annotations

import expecttest
from support.ir_text import assert_not_transformed, run_pass

from redist_opt.passes import MergeAdjacentAllToAlls

P = MergeAdjacentAllToAlls

TWO_ALL_TO_ALLS = """\
redistribute [S(0), S(0)] -> [S(1), S(2)] on mesh (a=2,b=2), shape (8, 8, 8), float32
mesh flattened=[a+b]
%x : (2, 8, 8)
step 0 over b: S(0) -> S(2), logical=(4, 8, 8)
  %all_to_all = all_to_all(%x, {b 2:1}, 2, 0) : (4, 8, 4)
step 1 over a: S(0) -> S(1), logical=(8, 8, 8)
  %all_to_all_1 = all_to_all(%all_to_all, {a 2:2}, 1, 0) : (8, 4, 4)
return %all_to_all_1
"""
TWO_ALL_TO_ALLS_UNEVEN = """\
redistribute [S(0), S(0)] -> [S(1), S(2)] on mesh (a=2,b=3), shape (5, 3, 7), float32
mesh flattened=[a+b]
%x : (chunk(chunk(5,2,c_a),3,c_b), 3, 7)
step 0 over b: S(0) -> S(2), logical=(chunk(5,2,c_a), 3, 7)
  %pad_to = pad_to(%x, 0, ceildiv(chunk(5,2,c_a),3)) : (ceildiv(chunk(5,2,c_a),3), 3, 7)
  %pad_to_1 = pad_to(%pad_to, 2, 9) : (ceildiv(chunk(5,2,c_a),3), 3, 9)
  %all_to_all = all_to_all(%pad_to_1, {b 3:1}, 2, 0) : (3*ceildiv(chunk(5,2,c_a),3), 3, 3)
  %narrow = narrow(%all_to_all, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3, 3)
  %narrow_1 = narrow(%narrow, 2, 0, chunk(7,3,c_b)) : (chunk(5,2,c_a), 3, chunk(7,3,c_b))
step 1 over a: S(0) -> S(1), logical=(5, 3, 7)
  %pad_to_2 = pad_to(%narrow_1, 0, 3) : (3, 3, chunk(7,3,c_b))
  %pad_to_3 = pad_to(%pad_to_2, 1, 4) : (3, 4, chunk(7,3,c_b))
  %all_to_all_1 = all_to_all(%pad_to_3, {a 2:3}, 1, 0) : (6, 2, chunk(7,3,c_b))
  %narrow_2 = narrow(%all_to_all_1, 0, 0, 5) : (5, 2, chunk(7,3,c_b))
  %narrow_3 = narrow(%narrow_2, 1, 0, chunk(3,2,c_a)) : (5, chunk(3,2,c_a), chunk(7,3,c_b))
return %narrow_3
"""
INNER_DIMS_OF_3D = """\
redistribute [R, S(0), S(0)] -> [R, S(1), S(2)] on mesh (a=2,b=2,c=2), shape (8, 8, 8), float32
mesh flattened=[b+c]
%x : (2, 8, 8)
step 0 over c: S(0) -> S(2), logical=(4, 8, 8)
  %all_to_all = all_to_all(%x, {c 2:1}, 2, 0) : (4, 8, 4)
step 1 over b: S(0) -> S(1), logical=(8, 8, 8)
  %all_to_all_1 = all_to_all(%all_to_all, {b 2:2}, 1, 0) : (8, 4, 4)
return %all_to_all_1
"""
NO_GROUP = """\
redistribute [S(0), S(0)] -> [S(1), S(2)] on mesh (a=2,b=2), shape (8, 8, 8), float32
%x : (2, 8, 8)
step 0 over b: S(0) -> S(2), logical=(4, 8, 8)
  %all_to_all = all_to_all(%x, {b 2:1}, 2, 0) : (4, 8, 4)
step 1 over a: S(0) -> S(1), logical=(8, 8, 8)
  %all_to_all_1 = all_to_all(%all_to_all, {a 2:2}, 1, 0) : (8, 4, 4)
return %all_to_all_1
"""
# all_to_all(b) 1 -> 2, then all_to_all(a) 0 -> 1: the second splits the first's cat dim
CHAINED_DIMS = """\
redistribute [S(0), S(1)] -> [S(1), S(2)] on mesh (a=2,b=2), shape (8, 8, 8), float32
mesh flattened=[a+b]
%x : (4, 4, 8)
step 0 over b: S(1) -> S(2), logical=(4, 8, 8)
  %all_to_all = all_to_all(%x, {b 2:1}, 2, 1) : (4, 8, 4)
step 1 over a: S(0) -> S(1), logical=(8, 8, 8)
  %all_to_all_1 = all_to_all(%all_to_all, {a 2:2}, 1, 0) : (8, 4, 4)
return %all_to_all_1
"""
ONLY_AC_EXISTS = """\
redistribute [S(0), S(0), R] -> [S(1), S(2), R] on mesh (a=2,b=2,c=2), shape (8, 8, 8), float32
mesh flattened=[a+c]
%x : (2, 8, 8)
step 0 over b: S(0) -> S(2), logical=(4, 8, 8)
  %all_to_all = all_to_all(%x, {b 2:2}, 2, 0) : (4, 8, 4)
step 1 over a: S(0) -> S(1), logical=(8, 8, 8)
  %all_to_all_1 = all_to_all(%all_to_all, {a 2:4}, 1, 0) : (8, 4, 4)
return %all_to_all_1
"""
# a 1x1x1 tensor over 2x3: merged, every dim is padded (24 B vs 20 B)
TINY = """\
redistribute [S(0), S(0)] -> [S(1), S(2)] on mesh (a=2,b=3), shape (1, 1, 1), float32
mesh flattened=[a+b]
%x : (chunk(chunk(1,2,c_a),3,c_b), 1, 1)
step 0 over b: S(0) -> S(2), logical=(chunk(1,2,c_a), 1, 1)
  %pad_to = pad_to(%x, 0, ceildiv(chunk(1,2,c_a),3)) : (ceildiv(chunk(1,2,c_a),3), 1, 1)
  %pad_to_1 = pad_to(%pad_to, 2, 3) : (ceildiv(chunk(1,2,c_a),3), 1, 3)
  %all_to_all = all_to_all(%pad_to_1, {b 3:1}, 2, 0) : (3*ceildiv(chunk(1,2,c_a),3), 1, 1)
  %narrow = narrow(%all_to_all, 0, 0, chunk(1,2,c_a)) : (chunk(1,2,c_a), 1, 1)
  %narrow_1 = narrow(%narrow, 2, 0, chunk(1,3,c_b)) : (chunk(1,2,c_a), 1, chunk(1,3,c_b))
step 1 over a: S(0) -> S(1), logical=(1, 1, 1)
  %pad_to_2 = pad_to(%narrow_1, 0, 1) : (1, 1, chunk(1,3,c_b))
  %pad_to_3 = pad_to(%pad_to_2, 1, 2) : (1, 2, chunk(1,3,c_b))
  %all_to_all_1 = all_to_all(%pad_to_3, {a 2:3}, 1, 0) : (2, 1, chunk(1,3,c_b))
  %narrow_2 = narrow(%all_to_all_1, 0, 0, 1) : (1, 1, chunk(1,3,c_b))
  %narrow_3 = narrow(%narrow_2, 1, 0, chunk(1,2,c_a)) : (1, chunk(1,2,c_a), chunk(1,3,c_b))
return %narrow_3
"""


class TestMergeAdjacentAllToAlls(expecttest.TestCase):
    def test_two_all_to_alls_become_one(self):
        # dim 1 split by a, dim 2 by b, cat dim 0
        self.assertExpectedInline(
            run_pass(TWO_ALL_TO_ALLS, P),
            """\
redistribute [S(0), S(0)] -> [S(1), S(2)] on mesh (a=2,b=2), shape (8, 8, 8), float32
mesh flattened=[a+b]
%x : (2, 8, 8)
step 1 over a+b: S(0) -> S(1), logical=(8, 8, 8), variant=split_all_to_all(1: a, 2: b)
  %all_to_all = all_to_all(%x, {a+b 4:1}, ((1, 2), (2, 2)), 0) : (8, 4, 4)  # <- %all_to_all, %all_to_all_1
return %all_to_all""",
        )

    def test_uneven_all_three_dims(self):
        self.assertExpectedInline(
            run_pass(TWO_ALL_TO_ALLS_UNEVEN, P),
            """\
redistribute [S(0), S(0)] -> [S(1), S(2)] on mesh (a=2,b=3), shape (5, 3, 7), float32
mesh flattened=[a+b]
%x : (chunk(chunk(5,2,c_a),3,c_b), 3, 7)
step 1 over a+b: S(0) -> S(1), logical=(5, 3, 7), variant=split_all_to_all(1: a, 2: b)
  %pad_to = pad_to(%x, 0, 1) : (1, 3, 7)  # <- %all_to_all, %all_to_all_1
  %pad_nested = pad_nested(%pad_to, 1, (2,)) : (1, 4, 7)  # <- %all_to_all, %all_to_all_1
  %pad_nested_1 = pad_nested(%pad_nested, 2, (3,)) : (1, 4, 9)  # <- %all_to_all, %all_to_all_1
  %all_to_all = all_to_all(%pad_nested_1, {a+b 6:1}, ((1, 2), (2, 3)), 0) : (6, 2, 3)  # <- %all_to_all, %all_to_all_1
  %unpad_nested = unpad_nested(%all_to_all, 0, 5, (2, 3)) : (5, 2, 3)  # <- %all_to_all, %all_to_all_1
  %narrow = narrow(%unpad_nested, 1, 0, chunk(3,2,c_a)) : (5, chunk(3,2,c_a), 3)  # <- %all_to_all, %all_to_all_1
  %narrow_1 = narrow(%narrow, 2, 0, chunk(7,3,c_b)) : (5, chunk(3,2,c_a), chunk(7,3,c_b))  # <- %all_to_all, %all_to_all_1
return %narrow_1""",
        )

    def test_inner_dims_of_a_3d_mesh(self):
        self.assertExpectedInline(
            run_pass(INNER_DIMS_OF_3D, P),
            """\
redistribute [R, S(0), S(0)] -> [R, S(1), S(2)] on mesh (a=2,b=2,c=2), shape (8, 8, 8), float32
mesh flattened=[b+c]
%x : (2, 8, 8)
step 1 over b+c: S(0) -> S(1), logical=(8, 8, 8), variant=split_all_to_all(1: b, 2: c)
  %all_to_all = all_to_all(%x, {b+c 4:1}, ((1, 2), (2, 2)), 0) : (8, 4, 4)  # <- %all_to_all, %all_to_all_1
return %all_to_all""",
        )

    def test_no_group_not_transformed(self):
        self.assertExpectedInline(
            assert_not_transformed(NO_GROUP, P),
            """[merge-adjacent-all-to-alls] all_to_all(b) + all_to_all(a): not merged: no process group has layout 4:1 (groups=existing)""",
        )

    def test_split_dim_is_the_other_cat_dim_not_transformed(self):
        # condition 1
        self.assertExpectedInline(
            assert_not_transformed(CHAINED_DIMS, P),
            """[merge-adjacent-all-to-alls] all_to_all(b) + all_to_all(a): not merged: they do not cat one tensor dim and split two others""",
        )

    def test_only_other_groups_not_transformed(self):
        # condition 3: a+c exists, the a+b group the merge needs does not
        self.assertExpectedInline(
            assert_not_transformed(ONLY_AC_EXISTS, P),
            """[merge-adjacent-all-to-alls] all_to_all(b) + all_to_all(a): not merged: no process group has layout 4:2 (groups=existing)""",
        )

    def test_padding_not_transformed(self):
        # condition 5
        self.assertExpectedInline(
            assert_not_transformed(TINY, P),
            """[merge-adjacent-all-to-alls] all_to_all(b) + all_to_all(a): not merged: padding: one all_to_all is fed 24 B vs 20 B""",
        )

    def test_consistency_ignores_cost_not_padding_not_transformed(self):
        self.assertExpectedInline(
            assert_not_transformed(TINY, P, prefer="consistency"),
            """[merge-adjacent-all-to-alls] all_to_all(b) + all_to_all(a): not merged: padding: one all_to_all is fed 24 B vs 20 B""",
        )
