"""merge-all-to-alls: IR in, IR out; each legality condition has a not-transformed twin."""

from __future__ import annotations

import expecttest
from support.ir_text import assert_not_transformed, parse_ir, run_pass, run_pass_notes

from redist_opt.passes import MergeAllToAlls

P = MergeAllToAlls

GATHER_THEN_ALL_TO_ALL = """\
redistribute [S(0), S(0)] -> [S(1), S(1)] on mesh (a=2,b=2), shape (8, 8), float32
mesh flattened=[a+b]
%x : (2, 8)
step 0 over b: S(0) -> R, logical=(4, 8)
  %all_gather = all_gather(%x, {b 2:1}, 0) : (4, 8)
step 1 over a: S(0) -> S(1), logical=(8, 8)
  %all_to_all = all_to_all(%all_gather, {a 2:2}, 1, 0) : (8, 4)
step 2 over b: R -> S(1), logical=(4, 8)
  %select_chunk = select_chunk(%all_to_all, 1, 2, c_b) : (8, 2)
return %select_chunk
"""
GATHER_THEN_ALL_TO_ALL_UNEVEN = """\
redistribute [S(0), S(0)] -> [S(1), S(1)] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (chunk(chunk(5,2,c_a),2,c_b), 3)
step 0 over b: S(0) -> R, logical=(chunk(5,2,c_a), 3)
  %pad_to = pad_to(%x, 0, ceildiv(chunk(5,2,c_a),2)) : (ceildiv(chunk(5,2,c_a),2), 3)
  %all_gather = all_gather(%pad_to, {b 2:1}, 0) : (2*ceildiv(chunk(5,2,c_a),2), 3)
  %narrow = narrow(%all_gather, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3)
step 1 over a: S(0) -> S(1), logical=(5, 3)
  %pad_to_1 = pad_to(%narrow, 0, 3) : (3, 3)
  %pad_to_2 = pad_to(%pad_to_1, 1, 4) : (3, 4)
  %all_to_all = all_to_all(%pad_to_2, {a 2:2}, 1, 0) : (6, 2)
  %narrow_1 = narrow(%all_to_all, 0, 0, 5) : (5, 2)
  %narrow_2 = narrow(%narrow_1, 1, 0, chunk(3,2,c_a)) : (5, chunk(3,2,c_a))
step 2 over b: R -> S(1), logical=(chunk(5,2,c_a), 3)
  %select_chunk = select_chunk(%narrow_2, 1, 2, c_b) : (5, chunk(chunk(3,2,c_a),2,c_b))
return %select_chunk
"""
NO_GROUP = """\
redistribute [S(0), S(0)] -> [S(1), S(1)] on mesh (a=2,b=2), shape (8, 8), float32
%x : (2, 8)
step 0 over b: S(0) -> R, logical=(4, 8)
  %all_gather = all_gather(%x, {b 2:1}, 0) : (4, 8)
step 1 over a: S(0) -> S(1), logical=(8, 8)
  %all_to_all = all_to_all(%all_gather, {a 2:2}, 1, 0) : (8, 4)
step 2 over b: R -> S(1), logical=(4, 8)
  %select_chunk = select_chunk(%all_to_all, 1, 2, c_b) : (8, 2)
return %select_chunk
"""
SINGLE_ALL_TO_ALL = """\
redistribute [S(0), R] -> [S(1), R] on mesh (a=2,b=2), shape (8, 8), float32
mesh flattened=[a+b]
%x : (4, 8)
step 0 over a: S(0) -> S(1), logical=(8, 8)
  %all_to_all = all_to_all(%x, {a 2:2}, 1, 0) : (8, 4)
return %all_to_all
"""

# Deep chains: the expert-parallel dispatch layout S(1),S(1),S(1),S(1) -> S(1),S(0),S(0),S(0).
DEEP_CHAIN = """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
mesh flattened=[b+c+d]
%x : (8, 1, 2)
step 0 over d: S(1) -> R, logical=(8, 2, 2)
  %all_gather = all_gather(%x, {d 2:1}, 1) : (8, 2, 2)
step 1 over c: S(1) -> R, logical=(8, 4, 2)
  %all_gather_1 = all_gather(%all_gather, {c 2:2}, 1) : (8, 4, 2)
step 2 over b: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%all_gather_1, {b 2:4}, 0, 1) : (4, 8, 2)
step 3 over c: R -> S(0), logical=(8, 4, 2)
  %select_chunk = select_chunk(%all_to_all, 0, 2, c_c) : (2, 8, 2)
step 4 over d: R -> S(0), logical=(8, 2, 2)
  %select_chunk_1 = select_chunk(%select_chunk, 0, 2, c_d) : (1, 8, 2)
return %select_chunk_1
"""
DEEP_CHAIN_GATHERS_MERGED = """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
mesh flattened=[b+c+d, c+d]
%x : (8, 1, 2)
step 0 over c+d: S(1) -> R, logical=(8, 4, 2)
  %all_gather = all_gather(%x, {c+d 4:1}, 1) : (8, 4, 2)  # <- %all_gather, %all_gather_1
step 2 over b: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%all_gather, {b 2:4}, 0, 1) : (4, 8, 2)
step 3 over c: R -> S(0), logical=(8, 4, 2)
  %select_chunk = select_chunk(%all_to_all, 0, 2, c_c) : (2, 8, 2)
step 4 over d: R -> S(0), logical=(8, 2, 2)
  %select_chunk_1 = select_chunk(%select_chunk, 0, 2, c_d) : (1, 8, 2)
return %select_chunk_1
"""
DEEP_CHAIN_UNEVEN = """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (5, 7, 3), float32
mesh flattened=[b+c+d]
%x : (5, chunk(chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c),2,c_d), 3)
step 0 over d: S(1) -> R, logical=(5, chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c), 3)
  %pad_to = pad_to(%x, 1, ceildiv(chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c),2)) : (5, ceildiv(chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c),2), 3)
  %all_gather = all_gather(%pad_to, {d 2:1}, 1) : (5, 2*ceildiv(chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c),2), 3)
  %narrow = narrow(%all_gather, 1, 0, chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c)) : (5, chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c), 3)
step 1 over c: S(1) -> R, logical=(5, chunk(chunk(7,2,c_a),2,c_b), 3)
  %pad_to_1 = pad_to(%narrow, 1, ceildiv(chunk(chunk(7,2,c_a),2,c_b),2)) : (5, ceildiv(chunk(chunk(7,2,c_a),2,c_b),2), 3)
  %all_gather_1 = all_gather(%pad_to_1, {c 2:2}, 1) : (5, 2*ceildiv(chunk(chunk(7,2,c_a),2,c_b),2), 3)
  %narrow_1 = narrow(%all_gather_1, 1, 0, chunk(chunk(7,2,c_a),2,c_b)) : (5, chunk(chunk(7,2,c_a),2,c_b), 3)
step 2 over b: S(1) -> S(0), logical=(5, chunk(7,2,c_a), 3)
  %pad_to_2 = pad_to(%narrow_1, 1, ceildiv(chunk(7,2,c_a),2)) : (5, ceildiv(chunk(7,2,c_a),2), 3)
  %pad_to_3 = pad_to(%pad_to_2, 0, 6) : (6, ceildiv(chunk(7,2,c_a),2), 3)
  %all_to_all = all_to_all(%pad_to_3, {b 2:4}, 0, 1) : (3, 2*ceildiv(chunk(7,2,c_a),2), 3)
  %narrow_2 = narrow(%all_to_all, 1, 0, chunk(7,2,c_a)) : (3, chunk(7,2,c_a), 3)
  %narrow_3 = narrow(%narrow_2, 0, 0, chunk(5,2,c_b)) : (chunk(5,2,c_b), chunk(7,2,c_a), 3)
step 3 over c: R -> S(0), logical=(5, chunk(chunk(7,2,c_a),2,c_b), 3)
  %select_chunk = select_chunk(%narrow_3, 0, 2, c_c) : (chunk(chunk(5,2,c_b),2,c_c), chunk(7,2,c_a), 3)
step 4 over d: R -> S(0), logical=(5, chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c), 3)
  %select_chunk_1 = select_chunk(%select_chunk, 0, 2, c_d) : (chunk(chunk(chunk(5,2,c_b),2,c_c),2,c_d), chunk(7,2,c_a), 3)
return %select_chunk_1
"""
DEEP_CHAIN_BC_EXISTS = """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
mesh flattened=[b+c]
%x : (8, 1, 2)
step 0 over d: S(1) -> R, logical=(8, 2, 2)
  %all_gather = all_gather(%x, {d 2:1}, 1) : (8, 2, 2)
step 1 over c: S(1) -> R, logical=(8, 4, 2)
  %all_gather_1 = all_gather(%all_gather, {c 2:2}, 1) : (8, 4, 2)
step 2 over b: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%all_gather_1, {b 2:4}, 0, 1) : (4, 8, 2)
step 3 over c: R -> S(0), logical=(8, 4, 2)
  %select_chunk = select_chunk(%all_to_all, 0, 2, c_c) : (2, 8, 2)
step 4 over d: R -> S(0), logical=(8, 2, 2)
  %select_chunk_1 = select_chunk(%select_chunk, 0, 2, c_d) : (1, 8, 2)
return %select_chunk_1
"""
DEEP_CHAIN_NO_GROUP = """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
%x : (8, 1, 2)
step 0 over d: S(1) -> R, logical=(8, 2, 2)
  %all_gather = all_gather(%x, {d 2:1}, 1) : (8, 2, 2)
step 1 over c: S(1) -> R, logical=(8, 4, 2)
  %all_gather_1 = all_gather(%all_gather, {c 2:2}, 1) : (8, 4, 2)
step 2 over b: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%all_gather_1, {b 2:4}, 0, 1) : (4, 8, 2)
step 3 over c: R -> S(0), logical=(8, 4, 2)
  %select_chunk = select_chunk(%all_to_all, 0, 2, c_c) : (2, 8, 2)
step 4 over d: R -> S(0), logical=(8, 2, 2)
  %select_chunk_1 = select_chunk(%select_chunk, 0, 2, c_d) : (1, 8, 2)
return %select_chunk_1
"""
# gathers over c, d but only a chunk over d (mesh dim c ends Replicate)
DEEP_CHAIN_CHUNK_OVER_D_ONLY = """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), R, S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 4), float32
mesh flattened=[b+c+d, b+c, b+d]
%x : (8, 1, 4)
step 0 over d: S(1) -> R, logical=(8, 2, 4)
  %all_gather = all_gather(%x, {d 2:1}, 1) : (8, 2, 4)
step 1 over c: S(1) -> R, logical=(8, 4, 4)
  %all_gather_1 = all_gather(%all_gather, {c 2:2}, 1) : (8, 4, 4)
step 2 over b: S(1) -> S(0), logical=(8, 8, 4)
  %all_to_all = all_to_all(%all_gather_1, {b 2:4}, 0, 1) : (4, 8, 4)
step 3 over d: R -> S(0), logical=(8, 2, 4)
  %select_chunk = select_chunk(%all_to_all, 0, 2, c_d) : (2, 8, 4)
return %select_chunk
"""


class TestMergeAllToAlls(expecttest.TestCase):
    def test_gather_a2a_chunk_becomes_one_all_to_all(self):
        self.assertExpectedInline(
            run_pass(GATHER_THEN_ALL_TO_ALL, P),
            """\
redistribute [S(0), S(0)] -> [S(1), S(1)] on mesh (a=2,b=2), shape (8, 8), float32
mesh flattened=[a+b]
%x : (2, 8)
step 1 over a+b: S(0) -> S(1), logical=(8, 8)
  %all_to_all = all_to_all(%x, {a+b 4:1}, 1, 0) : (8, 2)  # <- %all_gather, %all_to_all
return %all_to_all""",
        )

    def test_uneven_both_dims(self):
        self.assertExpectedInline(
            run_pass(GATHER_THEN_ALL_TO_ALL_UNEVEN, P),
            """\
redistribute [S(0), S(0)] -> [S(1), S(1)] on mesh (a=2,b=2), shape (5, 3), float32
mesh flattened=[a+b]
%x : (chunk(chunk(5,2,c_a),2,c_b), 3)
step 1 over a+b: S(0) -> S(1), logical=(5, 3)
  %pad_to = pad_to(%x, 0, 2) : (2, 3)  # <- %all_gather, %all_to_all
  %pad_nested = pad_nested(%pad_to, 1, (2, 2)) : (2, 4)  # <- %all_gather, %all_to_all
  %all_to_all = all_to_all(%pad_nested, {a+b 4:1}, 1, 0) : (8, 1)  # <- %all_gather, %all_to_all
  %unpad_nested = unpad_nested(%all_to_all, 0, 5, (2, 2)) : (5, 1)  # <- %all_gather, %all_to_all
  %narrow = narrow(%unpad_nested, 1, 0, chunk(chunk(3,2,c_a),2,c_b)) : (5, chunk(chunk(3,2,c_a),2,c_b))  # <- %all_gather, %all_to_all
return %narrow""",
        )

    def test_no_group_not_transformed(self):
        self.assertExpectedInline(
            assert_not_transformed(NO_GROUP, P),
            """[merge-all-to-alls] all_gather(b) + all_to_all(a) + chunk(b): not merged: no process group has layout 4:1 (groups=existing)""",
        )

    def test_single_all_to_all_not_transformed(self):
        self.assertExpectedInline(assert_not_transformed(SINGLE_ALL_TO_ALL, P), """""")

    def test_deep_chain_becomes_one_all_to_all(self):
        after = run_pass(DEEP_CHAIN, P)
        self.assertExpectedInline(
            after,
            """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
mesh flattened=[b+c+d]
%x : (8, 1, 2)
step 2 over b+c+d: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%x, {b+c+d 8:1}, 0, 1) : (1, 8, 2)  # <- %all_gather, %all_gather_1, %all_to_all
return %all_to_all""",
        )
        assert parse_ir(after).bytes_per_rank < parse_ir(DEEP_CHAIN).bytes_per_rank

    def test_deep_chain_after_merged_gathers(self):
        self.assertExpectedInline(
            run_pass(DEEP_CHAIN_GATHERS_MERGED, P),
            """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
mesh flattened=[b+c+d, c+d]
%x : (8, 1, 2)
step 2 over b+c+d: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%x, {b+c+d 8:1}, 0, 1) : (1, 8, 2)  # <- %all_gather, %all_gather_1, %all_to_all
return %all_to_all""",
        )

    def test_deep_chain_uneven(self):
        self.assertExpectedInline(
            run_pass(DEEP_CHAIN_UNEVEN, P),
            """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (5, 7, 3), float32
mesh flattened=[b+c+d]
%x : (5, chunk(chunk(chunk(chunk(7,2,c_a),2,c_b),2,c_c),2,c_d), 3)
step 2 over b+c+d: S(1) -> S(0), logical=(5, chunk(7,2,c_a), 3)
  %pad_to = pad_to(%x, 1, ceildiv(ceildiv(ceildiv(chunk(7,2,c_a),2),2),2)) : (5, ceildiv(ceildiv(ceildiv(chunk(7,2,c_a),2),2),2), 3)  # <- %all_gather, %all_gather_1, %all_to_all
  %pad_nested = pad_nested(%pad_to, 0, (2, 2, 2)) : (8, ceildiv(ceildiv(ceildiv(chunk(7,2,c_a),2),2),2), 3)  # <- %all_gather, %all_gather_1, %all_to_all
  %all_to_all = all_to_all(%pad_nested, {b+c+d 8:1}, 0, 1) : (1, 8*ceildiv(ceildiv(ceildiv(chunk(7,2,c_a),2),2),2), 3)  # <- %all_gather, %all_gather_1, %all_to_all
  %unpad_nested = unpad_nested(%all_to_all, 1, chunk(7,2,c_a), (2, 2, 2)) : (1, chunk(7,2,c_a), 3)  # <- %all_gather, %all_gather_1, %all_to_all
  %narrow = narrow(%unpad_nested, 0, 0, chunk(chunk(chunk(5,2,c_b),2,c_c),2,c_d)) : (chunk(chunk(chunk(5,2,c_b),2,c_c),2,c_d), chunk(7,2,c_a), 3)  # <- %all_gather, %all_gather_1, %all_to_all
return %narrow""",
        )

    def test_deep_chain_part_when_only_a_smaller_group_exists(self):
        # condition 1 (nearest gathers first) + 3: only b+c: all_gather(d) + all_to_all(b+c); chunk(d) stays
        self.assertExpectedInline(
            run_pass(DEEP_CHAIN_BC_EXISTS, P),
            """\
redistribute [S(1), S(1), S(1), S(1)] -> [S(1), S(0), S(0), S(0)] on mesh (a=2,b=2,c=2,d=2), shape (8, 16, 2), float32
mesh flattened=[b+c]
%x : (8, 1, 2)
step 0 over d: S(1) -> R, logical=(8, 2, 2)
  %all_gather = all_gather(%x, {d 2:1}, 1) : (8, 2, 2)
step 2 over b+c: S(1) -> S(0), logical=(8, 8, 2)
  %all_to_all = all_to_all(%all_gather, {b+c 4:2}, 0, 1) : (2, 8, 2)  # <- %all_gather_1, %all_to_all
step 4 over d: R -> S(0), logical=(8, 2, 2)
  %select_chunk = select_chunk(%all_to_all, 0, 2, c_d) : (1, 8, 2)
return %select_chunk""",
        )
        self.assertExpectedInline(
            run_pass_notes(DEEP_CHAIN_BC_EXISTS, P),
            """\
[merge-all-to-alls] all_gather(d) + all_gather(c) + all_to_all(b) + chunk(c) + chunk(d): not merged: no process group has layout 8:1 (groups=existing)
[merge-all-to-alls] all_gather(c) + all_to_all(b) + chunk(c) -> all_to_all(b+c): merged: a process group with layout 4:2 exists""",
        )

    def test_deep_chain_no_group_not_transformed(self):
        self.assertExpectedInline(
            assert_not_transformed(DEEP_CHAIN_NO_GROUP, P),
            """\
[merge-all-to-alls] all_gather(d) + all_gather(c) + all_to_all(b) + chunk(c) + chunk(d): not merged: no process group has layout 8:1 (groups=existing)
[merge-all-to-alls] all_gather(c) + all_to_all(b) + chunk(c): not merged: no process group has layout 4:2 (groups=existing)""",
        )

    def test_deep_chain_chunks_over_other_dims_not_transformed(self):
        # condition 1
        self.assertExpectedInline(
            assert_not_transformed(DEEP_CHAIN_CHUNK_OVER_D_ONLY, P),
            """\
[merge-all-to-alls] all_gather(d) + all_gather(c) + all_to_all(b) + chunk(d): not merged: the chunks are over mesh dims (3,), the gathers over (2, 3)
[merge-all-to-alls] all_gather(c) + all_to_all(b) + chunk(d): not merged: the chunks are over mesh dims (3,), the gathers over (2,)""",
        )
