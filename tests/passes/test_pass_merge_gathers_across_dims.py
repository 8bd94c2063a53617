"""merge-gathers-across-dims: IR in, IR out (each legality condition with a
not-transformed twin), the unpack_blocks op, and execution against torch."""

from __future__ import annotations

import expecttest
import pytest
import torch
from support.harness import check_case
from support.ir_text import assert_not_transformed, notes_of, run_pass, run_pass_notes, signature

import redist_opt
from redist_opt.ir import steps as S
from redist_opt.ir.cost import CostModel
from redist_opt.ir.local_ops import run_local_op
from redist_opt.passes import MergeGathersAcrossDims, PassContext

P = MergeGathersAcrossDims

# [S(0), S(1)] -> [R, R] on 2 x 8 (FSDP x TP weights gathered for clipping or a checkpoint)
FSDP_TP = """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=8), shape (16, 16), float32
%x : (8, 2)
step 0 over b: S(1) -> R, logical=(8, 16)
  %all_gather = all_gather(%x, {b 8:1}, 1) : (8, 16)
step 1 over a: S(0) -> R, logical=(16, 16)
  %all_gather_1 = all_gather(%all_gather, {a 2:8}, 0) : (16, 16)
return %all_gather_1
"""
FSDP_TP_UNEVEN_AB_EXISTS = """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=8), shape (5, 7), float32
mesh flattened=[a+b]
%x : (chunk(5,2,c_a), chunk(7,8,c_b))
step 0 over b: S(1) -> R, logical=(chunk(5,2,c_a), 7)
  %pad_to = pad_to(%x, 1, 1) : (chunk(5,2,c_a), 1)
  %all_gather = all_gather(%pad_to, {b 8:1}, 1) : (chunk(5,2,c_a), 8)
  %narrow = narrow(%all_gather, 1, 0, 7) : (chunk(5,2,c_a), 7)
step 1 over a: S(0) -> R, logical=(5, 7)
  %pad_to_1 = pad_to(%narrow, 0, 3) : (3, 7)
  %all_gather_1 = all_gather(%pad_to_1, {a 2:8}, 0) : (6, 7)
  %narrow_1 = narrow(%all_gather_1, 0, 0, 5) : (5, 7)
return %narrow_1
"""
# dim 0 nested over a (outer) and c (inner), dim 1 over b
NESTED_DIM_0 = """\
redistribute [S(0), S(1), S(0)] -> [R, R, R] on mesh (a=2,b=4,c=2), shape (9, 7), float32
%x : (chunk(chunk(9,2,c_a),2,c_c), chunk(7,4,c_b))
step 0 over c: S(0) -> R, logical=(chunk(9,2,c_a), chunk(7,4,c_b))
  %pad_to = pad_to(%x, 0, ceildiv(chunk(9,2,c_a),2)) : (ceildiv(chunk(9,2,c_a),2), chunk(7,4,c_b))
  %all_gather = all_gather(%pad_to, {c 2:1}, 0) : (2*ceildiv(chunk(9,2,c_a),2), chunk(7,4,c_b))
  %narrow = narrow(%all_gather, 0, 0, chunk(9,2,c_a)) : (chunk(9,2,c_a), chunk(7,4,c_b))
step 1 over b: S(1) -> R, logical=(chunk(9,2,c_a), 7)
  %pad_to_1 = pad_to(%narrow, 1, 2) : (chunk(9,2,c_a), 2)
  %all_gather_1 = all_gather(%pad_to_1, {b 4:2}, 1) : (chunk(9,2,c_a), 8)
  %narrow_1 = narrow(%all_gather_1, 1, 0, 7) : (chunk(9,2,c_a), 7)
step 2 over a: S(0) -> R, logical=(9, 7)
  %pad_to_2 = pad_to(%narrow_1, 0, 5) : (5, 7)
  %all_gather_2 = all_gather(%pad_to_2, {a 2:8}, 0) : (10, 7)
  %narrow_2 = narrow(%all_gather_2, 0, 0, 9) : (9, 7)
return %narrow_2
"""
THREE_TENSOR_DIMS = """\
redistribute [S(0), S(1), S(2)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4, 4), float32
%x : (2, 2, 2)
step 0 over c: S(2) -> R, logical=(2, 2, 4)
  %all_gather = all_gather(%x, {c 2:1}, 2) : (2, 2, 4)
step 1 over b: S(1) -> R, logical=(2, 4, 4)
  %all_gather_1 = all_gather(%all_gather, {b 2:2}, 1) : (2, 4, 4)
step 2 over a: S(0) -> R, logical=(4, 4, 4)
  %all_gather_2 = all_gather(%all_gather_1, {a 2:4}, 0) : (4, 4, 4)
return %all_gather_2
"""
# merge-all-gathers first fused the nested dim-0 gathers over c and b
GATHERS_OF_DIM_0_MERGED = """\
redistribute [S(1), S(0), S(0)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (6, 5), float32
mesh flattened=[b+c, a+b+c]
%x : (chunk(3,2,c_c), chunk(5,2,c_a))
step 0 over b+c: S(0) -> R, logical=(6, chunk(5,2,c_a))
  %pad_to = pad_to(%x, 0, 2) : (2, chunk(5,2,c_a))  # <- %all_gather, %all_gather_1
  %all_gather = all_gather(%pad_to, {b+c 4:1}, 0) : (8, chunk(5,2,c_a))  # <- %all_gather, %all_gather_1
  %unpad_nested = unpad_nested(%all_gather, 0, 6, (2, 2)) : (6, chunk(5,2,c_a))  # <- %all_gather, %all_gather_1
step 2 over a: S(1) -> R, logical=(6, 5)
  %pad_to_1 = pad_to(%unpad_nested, 1, 3) : (6, 3)
  %all_gather_1 = all_gather(%pad_to_1, {a 2:4}, 1) : (6, 6)
  %narrow = narrow(%all_gather_1, 1, 0, 5) : (6, 5)
return %narrow
"""
THREE_TENSOR_DIMS_BC_EXISTS = """\
redistribute [S(0), S(1), S(2)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4, 4), float32
mesh flattened=[b+c]
%x : (2, 2, 2)
step 0 over c: S(2) -> R, logical=(2, 2, 4)
  %all_gather = all_gather(%x, {c 2:1}, 2) : (2, 2, 4)
step 1 over b: S(1) -> R, logical=(2, 4, 4)
  %all_gather_1 = all_gather(%all_gather, {b 2:2}, 1) : (2, 4, 4)
step 2 over a: S(0) -> R, logical=(4, 4, 4)
  %all_gather_2 = all_gather(%all_gather_1, {a 2:4}, 0) : (4, 4, 4)
return %all_gather_2
"""
ONE_TENSOR_DIM = """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=8), shape (16, 4), float32
mesh flattened=[a+b]
%x : (1, 4)
step 0 over b: S(0) -> R, logical=(8, 4)
  %all_gather = all_gather(%x, {b 8:1}, 0) : (8, 4)
step 1 over a: S(0) -> R, logical=(16, 4)
  %all_gather_1 = all_gather(%all_gather, {a 2:8}, 0) : (16, 4)
return %all_gather_1
"""
# an all_reduce between the gathers (no reorder-collectives here)
REDUCTION_BETWEEN = """\
redistribute [S(0), P, S(1)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4), float32
%x : (2, 2)
step 0 over c: S(1) -> R, logical=(2, 4)
  %all_gather = all_gather(%x, {c 2:1}, 1) : (2, 4)
step 1 over b: P -> R, logical=(2, 4)
  %all_reduce = all_reduce(%all_gather, {b 2:2}, 'sum') : (2, 4)
step 2 over a: S(0) -> R, logical=(4, 4)
  %all_gather_1 = all_gather(%all_reduce, {a 2:4}, 0) : (4, 4)
return %all_gather_1
"""
# a communicator named by the (b, a) layout exists
BA_GROUP_EXISTS = """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=2), shape (4, 6), float32
mesh flattened=[(2,2):(1,2)]
%x : (2, 3)
step 0 over b: S(1) -> R, logical=(2, 6)
  %all_gather = all_gather(%x, {b 2:1}, 1) : (2, 6)
step 1 over a: S(0) -> R, logical=(4, 6)
  %all_gather_1 = all_gather(%all_gather, {a 2:2}, 0) : (4, 6)
return %all_gather_1
"""
# a column-major 2x4 mesh: rank = c_a + 2 c_b
COLUMN_MAJOR = """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=4), shape (4, 8), float32
mesh layouts=[2:1, 4:2]
%x : (2, 2)
step 0 over b: S(1) -> R, logical=(2, 8)
  %all_gather = all_gather(%x, {b 4:2}, 1) : (2, 8)
step 1 over a: S(0) -> R, logical=(4, 8)
  %all_gather_1 = all_gather(%all_gather, {a 2:1}, 0) : (4, 8)
return %all_gather_1
"""
# dim a spans ranks {0,1,4,5} (layout (2,2):(4,1)), dim b steps by 2
INTERLEAVED = """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=4,b=2), shape (4, 8), float32
mesh layouts=[(2,2):(4,1), 2:2]
%x : (1, 4)
step 0 over b: S(1) -> R, logical=(1, 8)
  %all_gather = all_gather(%x, {b 2:2}, 1) : (1, 8)
step 1 over a: S(0) -> R, logical=(4, 8)
  %all_gather_1 = all_gather(%all_gather, {a (2,2):(4,1)}, 0) : (4, 8)
return %all_gather_1
"""


class TestMergeGathersAcrossDims(expecttest.TestCase):
    # -- the rewrite --------------------------------------------------------------------

    def test_fsdp_tp_weights_one_gather(self):
        # even: no padding
        self.assertExpectedInline(
            run_pass(FSDP_TP, P, groups="create"),
            """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=8), shape (16, 16), float32
%x : (8, 2)
step 0 over a+b: S(0) -> R, logical=(16, 16), variant=gather_blocks(0: a, 1: b)
  %all_gather = all_gather(%x, {a+b 16:1}, 0) : (128, 2)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 8), ((0, (0,)), (1, (1,))), 16, 16) : (16, 16)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )
        self.assertExpectedInline(
            run_pass_notes(FSDP_TP, P, groups="create"),
            """[merge-gathers-across-dims] all_gather(b) + all_gather(a) -> all_gather(a+b): merged: groups=create creates 16:1; blocks reassembled locally (unpack_blocks)""",
        )

    def test_uneven_blocks_are_padded(self):
        # pad to ceil(5/2) rows and ceil(7/8) columns; unpack_blocks narrows every block
        self.assertExpectedInline(
            run_pass(FSDP_TP_UNEVEN_AB_EXISTS, P),
            """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=8), shape (5, 7), float32
mesh flattened=[a+b]
%x : (chunk(5,2,c_a), chunk(7,8,c_b))
step 0 over a+b: S(0) -> R, logical=(5, 7), variant=gather_blocks(0: a, 1: b)
  %pad_to = pad_to(%x, 0, 3) : (3, chunk(7,8,c_b))  # <- %all_gather, %all_gather_1
  %pad_to_1 = pad_to(%pad_to, 1, 1) : (3, 1)  # <- %all_gather, %all_gather_1
  %all_gather = all_gather(%pad_to_1, {a+b 16:1}, 0) : (48, 1)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 8), ((0, (0,)), (1, (1,))), 5, 7) : (5, 7)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )

    def test_three_tensor_dims_and_a_nested_one(self):
        self.assertExpectedInline(
            run_pass(NESTED_DIM_0, P, groups="create"),
            """\
redistribute [S(0), S(1), S(0)] -> [R, R, R] on mesh (a=2,b=4,c=2), shape (9, 7), float32
%x : (chunk(chunk(9,2,c_a),2,c_c), chunk(7,4,c_b))
step 0 over a+b+c: S(0) -> R, logical=(9, 7), variant=gather_blocks(0: a+c, 1: b)
  %pad_to = pad_to(%x, 0, 3) : (3, chunk(7,4,c_b))  # <- %all_gather, %all_gather_1, %all_gather_2
  %pad_to_1 = pad_to(%pad_to, 1, 2) : (3, 2)  # <- %all_gather, %all_gather_1, %all_gather_2
  %all_gather = all_gather(%pad_to_1, {a+b+c 16:1}, 0) : (48, 2)  # <- %all_gather, %all_gather_1, %all_gather_2
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 4, 2), ((0, (0, 2)), (1, (1,))), 9, 7) : (9, 7)  # <- %all_gather, %all_gather_1, %all_gather_2
return %unpack_blocks""",
        )
        self.assertExpectedInline(
            run_pass(THREE_TENSOR_DIMS, P, groups="create"),
            """\
redistribute [S(0), S(1), S(2)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4, 4), float32
%x : (2, 2, 2)
step 0 over a+b+c: S(0) -> R, logical=(4, 4, 4), variant=gather_blocks(0: a, 1: b, 2: c)
  %all_gather = all_gather(%x, {a+b+c 8:1}, 0) : (16, 2, 2)  # <- %all_gather, %all_gather_1, %all_gather_2
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 2, 2), ((0, (0,)), (1, (1,)), (2, (2,))), 4, 4, 4) : (4, 4, 4)  # <- %all_gather, %all_gather_1, %all_gather_2
return %unpack_blocks""",
        )

    def test_after_merge_all_gathers(self):
        # this pass fuses the merged dim-0 block with the dim-1 gather over a
        self.assertExpectedInline(
            run_pass(GATHERS_OF_DIM_0_MERGED, P),
            """\
redistribute [S(1), S(0), S(0)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (6, 5), float32
mesh flattened=[b+c, a+b+c]
%x : (chunk(3,2,c_c), chunk(5,2,c_a))
step 0 over a+b+c: S(0) -> R, logical=(6, 5), variant=gather_blocks(0: b+c, 1: a)
  %pad_to = pad_to(%x, 0, 2) : (2, chunk(5,2,c_a))  # <- %all_gather, %all_gather_1
  %pad_to_1 = pad_to(%pad_to, 1, 3) : (2, 3)  # <- %all_gather, %all_gather_1
  %all_gather = all_gather(%pad_to_1, {a+b+c 8:1}, 0) : (16, 3)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 2, 2), ((0, (1, 2)), (1, (0,))), 6, 5) : (6, 5)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )

    def test_partial_run_merges_where_a_group_exists(self):
        # Only b+c exists: gathers of dims 2 and 1 merge, the gather of dim 0 over a stays.
        self.assertExpectedInline(
            run_pass(THREE_TENSOR_DIMS_BC_EXISTS, P),
            """\
redistribute [S(0), S(1), S(2)] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (4, 4, 4), float32
mesh flattened=[b+c]
%x : (2, 2, 2)
step 0 over b+c: S(1) -> R, logical=(2, 4, 4), variant=gather_blocks(1: b, 2: c)
  %all_gather = all_gather(%x, {b+c 4:1}, 1) : (2, 8, 2)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 1, (2, 2), ((1, (0,)), (2, (1,))), 4, 4) : (2, 4, 4)  # <- %all_gather, %all_gather_1
step 2 over a: S(0) -> R, logical=(4, 4, 4)
  %all_gather_1 = all_gather(%unpack_blocks, {a 2:4}, 0) : (4, 4, 4)
return %all_gather_1""",
        )

    # -- legality twins -------------------------------------------------------------------

    def test_one_tensor_dim_not_transformed(self):
        # Condition 1: a single tensor dim is merge-all-gathers' rewrite, not this one.
        self.assertExpectedInline(assert_not_transformed(ONE_TENSOR_DIM, P), """""")

    def test_not_adjacent_not_transformed(self):
        # Condition 1
        self.assertExpectedInline(assert_not_transformed(REDUCTION_BETWEEN, P, groups="create"), """""")

    def test_no_group_not_transformed(self):
        # Condition 3: groups="existing" and no communicator over a+b.
        self.assertExpectedInline(
            assert_not_transformed(FSDP_TP, P),
            """[merge-gathers-across-dims] all_gather(b) + all_gather(a): not merged: no process group has layout 16:1 (groups=existing)""",
        )

    def test_any_rank_order_serves(self):
        # Condition 3: a communicator named by the (b, a) layout serves as well; it ranks
        # its members by ascending global rank, i.e. a slowest, and unpack_blocks reads
        # the slots in that order.
        self.assertExpectedInline(
            run_pass(BA_GROUP_EXISTS, P),
            """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=2), shape (4, 6), float32
mesh flattened=[(2,2):(1,2)]
%x : (2, 3)
step 0 over b+a: S(0) -> R, logical=(4, 6), variant=gather_blocks(0: a, 1: b)
  %all_gather = all_gather(%x, {b+a (2,2):(1,2)}, 0) : (8, 3)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 2), ((0, (0,)), (1, (1,))), 4, 6) : (4, 6)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )

    def test_column_major_slots(self):
        # A communicator over a+b lists b slowest; the slots follow that order whatever
        # the group's layout.
        self.assertExpectedInline(
            run_pass(COLUMN_MAJOR, P, groups="create"),
            """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=4), shape (4, 8), float32
mesh layouts=[2:1, 4:2]
%x : (2, 2)
step 0 over a+b: S(0) -> R, logical=(4, 8), variant=gather_blocks(0: a, 1: b)
  %all_gather = all_gather(%x, {a+b (2,4):(1,2)}, 0) : (16, 2)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (4, 2), ((0, (1,)), (1, (0,))), 4, 8) : (4, 8)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )

    def test_interleaved_modes_not_transformed(self):
        # Condition 3: a communicator over both dims lists ranks 0..7, which no order of
        # whole dims gives.
        self.assertExpectedInline(
            assert_not_transformed(INTERLEAVED, P, groups="create"),
            """[merge-gathers-across-dims] all_gather(b) + all_gather(a): not merged: separate collectives are cheaper under the cost model""",
        )

    def test_cost_can_refuse_not_transformed(self):
        # Condition 4: under the gloo profile (ring: 15 latency steps over 16 ranks against
        # 7 + 1) small gathers stay separate ...
        gloo = CostModel.profile("gloo")
        self.assertExpectedInline(
            assert_not_transformed(FSDP_TP, P, groups="create", cost=gloo),
            """[merge-gathers-across-dims] all_gather(b) + all_gather(a): not merged: separate collectives are cheaper under the cost model""",
        )

    def test_default_profile_merges(self):
        # ... the default (tree) profile merges them.
        self.assertExpectedInline(
            run_pass(FSDP_TP, P, groups="create", cost=CostModel.default()),
            """\
redistribute [S(0), S(1)] -> [R, R] on mesh (a=2,b=8), shape (16, 16), float32
%x : (8, 2)
step 0 over a+b: S(0) -> R, logical=(16, 16), variant=gather_blocks(0: a, 1: b)
  %all_gather = all_gather(%x, {a+b 16:1}, 0) : (128, 2)  # <- %all_gather, %all_gather_1
  %unpack_blocks = unpack_blocks(%all_gather, 0, (2, 8), ((0, (0,)), (1, (1,))), 16, 16) : (16, 16)  # <- %all_gather, %all_gather_1
return %unpack_blocks""",
        )


def test_misordered_shards_are_refused():
    # Condition 2, on a hand-made shard state (DTensor's greedy plans always satisfy it):
    # tensor dim 0 sharded by (b, a) but the gather unshards a then b outer-first.
    spec = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"))
    p = redist_opt.plan(spec, "S(0),S(1)", "R,R", shape=(4, 4))
    ctx_pass = P(PassContext(mesh=p.mesh, shape=p.shape, src=p.src))
    regs = S.regions(p.graph)
    good = S.ShardState({0: [0], 1: [1]})
    bad = S.ShardState({0: [0, 1], 1: []})
    assert ctx_pass._misordered(regs, good) is None
    assert "not sharded by" in ctx_pass._misordered(regs, bad)


# -- the local reassembly op -------------------------------------------------------------


@pytest.mark.parametrize("order", ["ab", "ba"])
@pytest.mark.parametrize("shape", [(5, 7), (4, 6), (0, 3), (3, 1)])
def test_unpack_blocks_op(order, shape):
    """Gather padded blocks by hand in the group's slot order and reassemble."""
    counts_ab = (2, 3)  # mesh a=2 shards dim 0, b=3 shards dim 1
    g = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)
    rows = list(torch.chunk(g, 2, 0)) if shape[0] else [g[:0]] * 2
    rows += [g[:0]] * (2 - len(rows))
    m0 = -(-shape[0] // 2)
    m1 = -(-shape[1] // 3)

    def block(ca, cb):
        r = rows[ca]
        cols = list(torch.chunk(r, 3, 1)) if r.size(1) else [r[:, :0]] * 3
        cols += [r[:, :0]] * (3 - len(cols))
        b = cols[cb]
        return torch.nn.functional.pad(b, (0, m1 - b.size(1), 0, m0 - b.size(0)))

    if order == "ab":
        slots = [(ca, cb) for ca in range(2) for cb in range(3)]
        counts, blocks = counts_ab, ((0, (0,)), (1, (1,)))
    else:
        slots = [(ca, cb) for cb in range(3) for ca in range(2)]
        counts, blocks = (3, 2), ((0, (1,)), (1, (0,)))
    gathered = torch.cat([block(*s) for s in slots], 0)
    out = run_local_op("unpack_blocks", gathered, (0, counts, blocks, *shape))
    assert torch.equal(out, g)


# -- execution against torch (LocalTensorMode, merge pass of torch disabled) --------------

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(16, 16), (5, 7), (17, 9), (0, 4), (3, 0), (1, 1)])
def test_acceptance_2x8_one_collective(shape, dtype):
    ref = check_case("2x8", ("S(0)", "S(1)"), ("R", "R"), shape, dtype, groups="create")
    assert ref.total == 2 and ref.optimized.total == 1
    assert dict(ref.optimized.counts) == {"all_gather": 1}


def test_acceptance_2x8_group_is_created():
    # On the harness's 2x8 mesh a+b is the (fake) world group. On a rank-free 2 x 8
    # spec nothing exists: groups="create" creates a+b, "existing" keeps two gathers.
    p = redist_opt.plan(redist_opt.MeshSpec(sizes=(2, 8), names=("a", "b")), "S(0),S(1)", "R,R", shape=(5, 7))
    opt = redist_opt.optimize(p, groups="create")
    assert signature(opt) == ["all_gather(a+b)"]
    assert any("creates" in n for n in notes_of(opt, P))
    assert len(redist_opt.optimize(p).collectives()) == 2


@pytest.mark.parametrize(
    "src, dst",
    [(("S(0)", "S(1)"), ("R", "R")), (("S(0)", "S(0)"), ("R", "R")), (("P", "P"), ("S(0)", "S(0)"))],
)
def test_permuted_rank_map_not_merged(src, dst):
    # A column-major rank tensor: a created a+b group ranks its members by global rank,
    # which is not the mesh's index order; shard-ordered merges are not made (they
    # returned wrong data before) and the result equals torch's.
    ref = check_case("colmajor2x8", src, dst, (16, 4), groups="create")
    assert ref.optimized.total == ref.total


@pytest.mark.parametrize(
    "src, dst, shape",
    [
        (("S(0)", "S(1)", "S(0)"), ("R", "R", "R"), (9, 7)),
        (("S(0)", "S(1)", "S(2)"), ("R", "R", "R"), (3, 5, 2)),
        (("S(1)", "S(0)", "S(1)"), ("R", "R", "R"), (4, 8)),
        (("S(0)", "S(1)", "S(1)"), ("S(0)", "R", "R"), (5, 9)),
        (("S(0)", "S(1)", "R"), ("R", "R", "S(0)"), (8, 3)),
        (("S(0)", "P", "S(1)"), ("R", "R", "R"), (5, 3)),
        (("S(0)", "S(1)", "S(0)"), ("R", "R", "R"), (0, 5)),
    ],
)
def test_3d_against_torch(src, dst, shape):
    ref = check_case("2x4x2", src, dst, shape, torch.float32, groups="create")
    assert ref.optimized.total < ref.total


@pytest.mark.parametrize("shape", [(8, 8), (5, 3), (3, 7), (0, 2)])
def test_existing_group_of_unflatten_view(shape):
    # The view's root is the flat 8-rank mesh: its group serves x+y+z, groups="existing".
    ref = check_case("unflat8_2x2x2", ("S(0)", "S(1)", "S(0)"), ("R", "R", "R"), shape)
    assert ref.optimized.total == 1
