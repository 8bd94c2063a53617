"""merge-gathers-across-dims: IR in / IR out (each legality condition with a
not-transformed twin), the unpack_blocks op, and execution against torch."""

from __future__ import annotations

import pytest
import torch
from support.harness import check_case
from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.ir import layout as L
from redist_opt.runtime import execute as runtime
from redist_opt.ir import steps as S
from redist_opt.ir.cost import CostModel
from redist_opt.passes import MergeAllGathers, MergeGathersAcrossDims

P = MergeGathersAcrossDims


def _plan(sizes, flattened, src, dst, shape):
    return redist_opt.plan(mesh(sizes, flattened), src, dst, shape=shape)


# -- the rewrite ----------------------------------------------------------------------


def test_fsdp_tp_weights_one_gather():
    # The acceptance example: [S(0), S(1)] -> [R, R] on 2 x 8 is one all_gather.
    p = _plan((2, 8), [], "S(0),S(1)", "R,R", (16, 16))
    assert signature(p) == ["all_gather(b)", "all_gather(a)"]
    after = run_and_check(p, P, ["all_gather(a+b)"], groups="create")
    ops = [n.target.ir_name for n in after.graph.graph.nodes if n.op == "call_function"]
    assert ops == ["all_gather", "unpack_blocks"]  # even: no padding
    assert any("all_gather(b) + all_gather(a) -> all_gather(a+b)" in n for n in notes_of(after, P))


def test_uneven_blocks_are_padded():
    p = _plan((2, 8), ["a+b"], "S(0),S(1)", "R,R", (5, 7))
    after = run_and_check(p, P, ["all_gather(a+b)"])
    nodes = [n for n in after.graph.graph.nodes if n.op == "call_function"]
    assert [n.target.ir_name for n in nodes] == ["pad_to", "pad_to", "all_gather", "unpack_blocks"]
    assert [(n.args[1], int(n.args[2])) for n in nodes[:2]] == [(0, 3), (1, 1)]  # ceil(5/2), ceil(7/8)
    assert nodes[-1].args[1:] == (0, (2, 8), ((0, (0,)), (1, (1,))), 5, 7)


def test_three_tensor_dims_and_a_nested_one():
    # dim 0 nested over a (outer) and c (inner), dim 1 over b: one gather over a+b+c.
    p = _plan((2, 4, 2), [], "S(0),S(1),S(0)", "R,R,R", (9, 7))
    after = run_and_check(p, P, ["all_gather(a+b+c)"], groups="create")
    unpack = [n for n in after.graph.graph.nodes if n.op == "call_function"][-1]
    assert unpack.args[2:4] == ((2, 4, 2), ((0, (0, 2)), (1, (1,))))
    p = _plan((2, 2, 2), [], "S(0),S(1),S(2)", "R,R,R", (4, 4, 4))
    run_and_check(p, P, ["all_gather(a+b+c)"], groups="create")


def test_after_merge_all_gathers():
    # merge-all-gathers first fuses the nested dim-0 gathers over c and b, then this
    # pass fuses that block with the dim-1 gather over a.
    p = _plan((2, 2, 2), ["b+c", "a+b+c"], "S(1),S(0),S(0)", "R,R,R", (6, 5))
    p = run_and_check(p, MergeAllGathers, ["all_gather(b+c)", "all_gather(a)"])
    after = run_and_check(p, P, ["all_gather(a+b+c)"])
    unpack = [n for n in after.graph.graph.nodes if n.op == "call_function"][-1]
    assert unpack.args[2:4] == ((2, 2, 2), ((0, (1, 2)), (1, (0,))))


def test_partial_run_merges_where_a_group_exists():
    # Only b+c exists: gathers of dims 2 and 1 merge, the gather of dim 0 over a stays.
    p = _plan((2, 2, 2), ["b+c"], "S(0),S(1),S(2)", "R,R,R", (4, 4, 4))
    run_and_check(p, P, ["all_gather(b+c)", "all_gather(a)"])


# -- legality twins ---------------------------------------------------------------------


def test_one_tensor_dim_not_transformed():
    # Condition 1: a single tensor dim is merge-all-gathers' rewrite, not this one.
    p = _plan((2, 8), ["a+b"], "S(0),S(0)", "R,R", (16, 4))
    run_and_check(p, P, None)


def test_not_adjacent_not_transformed():
    # Condition 1: an all_reduce between the gathers (no reorder-collectives here).
    p = _plan((2, 2, 2), [], "S(0),P,S(1)", "R,R,R", (4, 4))
    assert signature(p) == ["all_gather(c)", "all_reduce[sum](b)", "all_gather(a)"]
    run_and_check(p, P, None, groups="create")


def test_misordered_shards_not_transformed():
    # Condition 2, on a hand-made shard state (DTensor's greedy plans always satisfy it):
    # tensor dim 0 sharded by (b, a) but the gather unshards a then b outer-first.
    p = _plan((2, 2), [], "S(0),S(1)", "R,R", (4, 4))
    ctx_pass = P.__new__(P)
    from passes.context import PassContext

    ctx_pass.ctx = PassContext(mesh=p.mesh, shape=p.shape, src=p.src)
    regs = S.regions(p.graph)
    good = S.ShardState({0: [0], 1: [1]})
    bad = S.ShardState({0: [0, 1], 1: []})
    assert ctx_pass._misordered(regs, good) is None
    assert "not sharded by" in ctx_pass._misordered(regs, bad)


def test_no_group_not_transformed():
    # Condition 3: groups="existing" and no communicator over a+b.
    p = _plan((2, 8), [], "S(0),S(1)", "R,R", (16, 16))
    after = run_and_check(p, P, None)
    assert any("no process group has layout" in n for n in notes_of(after, P))


def test_any_rank_order_serves():
    # Condition 3: a communicator named by the (b, a) layout serves as well; it ranks
    # its members by ascending global rank, i.e. a slowest, and unpack_blocks reads
    # the slots in that order.
    spec = mesh((2, 2))
    ba = L.collapse([spec.dim_layouts[1], spec.dim_layouts[0]])
    p = redist_opt.plan(spec.with_flattened([ba]), "S(0),S(1)", "R,R", shape=(4, 6))
    after = run_and_check(p, P, ["all_gather(b+a)"])
    unpack = [n for n in after.graph.graph.nodes if n.op == "call_function"][-1]
    assert unpack.args[2:4] == ((2, 2), ((0, (0,)), (1, (1,))))


def test_column_major_slots():
    # A column-major 2x4 mesh: rank = c_a + 2 c_b, so a communicator over a+b lists
    # b slowest; the slots follow that order whatever the group's layout.
    spec = redist_opt.MeshSpec((2, 4), ("a", "b"), dim_layouts=(L.FlatLayout((2,), (1,)), L.FlatLayout((4,), (2,))))
    assert spec.rank_order((0, 1)) == (1, 0)
    p = redist_opt.plan(spec, "S(0),S(1)", "R,R", shape=(4, 8))
    after = run_and_check(p, P, ["all_gather(a+b)"], groups="create")
    unpack = [n for n in after.graph.graph.nodes if n.op == "call_function"][-1]
    assert unpack.args[2:4] == ((4, 2), ((0, (1,)), (1, (0,))))


def test_interleaved_modes_not_transformed():
    # Condition 3: dim a spans ranks {0,1,4,5} (layout (2,2):(4,1)), dim b steps by 2:
    # a communicator over both lists ranks 0..7, which no order of whole dims gives.
    spec = redist_opt.MeshSpec(
        (4, 2), ("a", "b"), dim_layouts=(L.FlatLayout((2, 2), (4, 1)), L.FlatLayout((2,), (2,))), index_space=8
    )
    assert spec.rank_order((0, 1)) is None
    p = redist_opt.plan(spec, "S(0),S(1)", "R,R", shape=(4, 8))
    run_and_check(p, P, None, groups="create")


def test_cost_can_refuse():
    # Condition 4: under the gloo profile (ring: 15 latency steps over 16 ranks against
    # 7 + 1) small gathers stay separate; the default (tree) profile merges them.
    p = _plan((2, 8), [], "S(0),S(1)", "R,R", (16, 16))
    gloo = CostModel.profile("gloo")
    after = run_and_check(p, P, None, groups="create", cost=gloo)
    assert any("cheaper under the cost model" in n for n in notes_of(after, P))
    run_and_check(p, P, ["all_gather(a+b)"], groups="create", cost=CostModel.default())


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
    out = runtime._unpack_blocks(gathered, 0, counts, blocks, list(shape))
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
    p = _plan((2, 8), [], "S(0),S(1)", "R,R", (5, 7))
    opt = redist_opt.optimize(p, groups="create")
    assert signature(opt) == ["all_gather(a+b)"]
    assert any("creates" in n for n in notes_of(opt, P))
    assert len(redist_opt.optimize(p).collectives()) == 2


@pytest.mark.parametrize("src, dst", [(("S(0)", "S(1)"), ("R", "R")), (("S(0)", "S(0)"), ("R", "R")),
                                      (("P", "P"), ("S(0)", "S(0)"))])
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
