"""merge-reductions-into-all-reduce: IR in / IR out (each legality condition with a
not-transformed twin), the choice by size under a profile, and execution against torch."""

from __future__ import annotations

import pytest
import torch
from support.harness import check_case
from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.passes import MergeReductionsIntoAllReduce, ReorderCollectives

P = MergeReductionsIntoAllReduce
DEFAULT = CostModel.default()
GLOO = CostModel.profile("gloo")


def _plan(sizes, flattened, src, dst, shape, dtype=torch.float32):
    return redist_opt.plan(mesh(sizes, flattened), src, dst, shape=shape, dtype=dtype)


def _ops(plan):
    return [n.target.ir_name for n in plan.graph.graph.nodes if n.op == "call_function"]


# -- the rewrite ----------------------------------------------------------------------


def test_hsdp_small_is_one_all_reduce():
    p = _plan((2, 4), ["a+b"], "P,P", "R,S(0)", (64, 4))
    assert signature(p) == ["all_reduce[sum](a)", "reduce_scatter[sum](b)"]
    after = run_and_check(p, P, ["all_reduce[sum](a+b)"], cost=DEFAULT)
    assert _ops(after) == ["all_reduce", "select_chunk"]
    assert any("more bytes, fewer launches" in n for n in notes_of(after, P))


def test_after_reorder_too():
    p = _plan((2, 4), ["a+b"], "P,P", "R,S(0)", (64, 4))
    p = run_and_check(p, ReorderCollectives, ["reduce_scatter[sum](b)", "all_reduce[sum](a)"], cost=DEFAULT)
    after = run_and_check(p, P, ["all_reduce[sum](a+b)"], cost=DEFAULT)
    assert _ops(after) == ["all_reduce", "select_chunk"]


@pytest.mark.parametrize("shape", [(5, 3), (0, 4), (3,), (1, 7)])
def test_uneven_and_zero_size_chunks(shape):
    # Condition 4: select_chunk is torch.chunk with trailing empty chunks.
    p = _plan((2, 4), ["a+b"], "P,P", "R,S(0)", shape)
    after = run_and_check(p, P, ["all_reduce[sum](a+b)"], cost=DEFAULT)
    assert _ops(after) == ["all_reduce", "select_chunk"]


def test_two_scatters_keep_shard_order():
    p = _plan((2, 2, 2), [], "P,P,P", "R,S(0),S(1)", (6, 5))
    after = run_and_check(p, P, ["all_reduce[sum](a+b+c)"], groups="create", cost=DEFAULT)
    chunks = [n.args[1:3] for n in after.graph.graph.nodes if getattr(n.target, "ir_name", "") == "select_chunk"]
    assert chunks == [(0, 2), (1, 2)]


@pytest.mark.parametrize("op", ["avg", "max", "min"])
def test_other_reduce_ops(op):
    p = _plan((2, 4), ["a+b"], f"P({op}),P({op})", "R,S(0)", (16,))
    run_and_check(p, P, [f"all_reduce[{op}](a+b)"], cost=DEFAULT)


# -- choice by size (condition 5), through the whole pipeline --------------------------
# (reorder-collectives puts the scatter first, so the separate collectives are the
# cheapest they can be; the naive AR(a) + RS(b) on the full tensor never beats one AR.)

RS_AR = ["reduce_scatter[sum](b)", "all_reduce[sum](a)"]


def _opt(shape, cost, sizes=(2, 8), flattened=("a+b",)):
    return redist_opt.optimize(_plan(sizes, list(flattened), "P,P", "R,S(0)", shape), cost=cost)


def test_default_profile_picks_by_size():
    assert signature(_opt((1024,), DEFAULT)) == ["all_reduce[sum](a+b)"]
    large = _opt((1 << 20,), DEFAULT)
    assert signature(large) == RS_AR
    assert any("cost: one all_reduce" in n for n in notes_of(large, P))


def test_gloo_profile_keeps_rs_and_ar():
    # Ring all_reduce over p ranks: 2(p-1) latency steps; 2(ab-1) > 2(a-1) + 2(b-1) + one
    # launch for every a, b >= 2, and the bytes are no fewer: the fat all_reduce never pays.
    for shape in [(16,), (1024,), (1 << 20,)]:
        assert signature(_opt(shape, GLOO)) == RS_AR


def test_launch_bound_profile_moves_the_crossover():
    # A profile where launches dominate: one all_reduce wins up to far larger sizes.
    # Crossover: 0.875 N / bw = one launch, N = 11.4 MB (default profile: 686 KB).
    launchy = CostModel(name="launchy", launch=1e-2, alpha_intra=0.0, bw_intra=1e9, algorithm="tree")
    assert signature(_opt((1 << 20,), launchy)) == ["all_reduce[sum](a+b)"]
    assert signature(_opt((1 << 22,), launchy)) == RS_AR


# -- legality twins ---------------------------------------------------------------------


def test_only_all_reduces_not_transformed():
    # Condition 1: no reduce_scatter in the run (merge-reductions' rewrite).
    run_and_check(_plan((2, 4), ["a+b"], "P,P", "R,R", (16,)), P, None, cost=DEFAULT)


def test_integer_avg_not_transformed():
    # Condition 1: on integers each avg truncates; the float twin is transformed.
    run_and_check(_plan((2, 4), ["a+b"], "P(avg),P(avg)", "R,S(0)", (64, 4)), P, ["all_reduce[avg](a+b)"], cost=DEFAULT)
    p = _plan((2, 4), ["a+b"], "P(avg),P(avg)", "R,S(0)", (64, 4), dtype=torch.int64)
    run_and_check(p, P, None, cost=DEFAULT)


def test_single_reduce_scatter_not_transformed():
    # Condition 1: one collective alone is never replaced by a fatter one.
    run_and_check(_plan((2, 4), ["a+b"], "R,P", "R,S(0)", (16,)), P, None, cost=DEFAULT)


def test_not_adjacent_not_transformed():
    # Condition 1: an all_gather between the reductions (no reorder-collectives here).
    p = _plan((2, 2, 2), [], "P,S(1),P", "R,R,S(0)", (8, 8))
    assert signature(p) == ["reduce_scatter[sum](c)", "all_gather(b)", "all_reduce[sum](a)"]
    run_and_check(p, P, None, groups="create", cost=DEFAULT)


def test_no_group_not_transformed():
    # Condition 3: groups="existing" and no communicator over a+b.
    after = run_and_check(_plan((2, 4), [], "P,P", "R,S(0)", (16,)), P, None, cost=DEFAULT)
    assert any("no process group has layout" in n for n in notes_of(after, P))


def test_cheapest_split():
    # Only a+b exists on 2x2x2: of AR(a), RS(b), RS(c) the block AR(a) + RS(b) becomes
    # one all_reduce, RS(c) stays (no group for a block with c).
    p = _plan((2, 2, 2), ["a+b"], "P,P,P", "R,S(0),S(1)", (16, 4))
    assert signature(p) == ["all_reduce[sum](a)", "reduce_scatter[sum](b)", "reduce_scatter[sum](c)"]
    after = run_and_check(p, P, ["all_reduce[sum](a+b)", "reduce_scatter[sum](c)"], cost=DEFAULT)
    assert _ops(after)[:2] == ["all_reduce", "select_chunk"]


# -- execution against torch ------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(64, 4), (5, 3), (0, 4), (7,), (3, 1)])
def test_small_is_fat_and_equal(shape, dtype):
    ref = check_case("2x8", ("P", "P"), ("R", "S(0)"), shape, dtype, groups="create", cost=DEFAULT)
    assert ref.total == 2
    assert dict(ref.optimized.counts) == {"all_reduce": 1}


def test_large_is_rs_plus_ar_and_equal():
    ref = check_case("2x8", ("P", "P"), ("R", "S(0)"), (1024, 256), torch.float32, groups="create", cost=DEFAULT)
    assert dict(ref.optimized.counts) == {"reduce_scatter": 1, "all_reduce": 1}


def test_same_large_case_fat_under_a_launch_bound_profile():
    launchy = CostModel(name="launchy", launch=1e-3, alpha_intra=0.0, bw_intra=1e9, algorithm="tree")
    ref = check_case("2x8", ("P", "P"), ("R", "S(0)"), (1024, 256), torch.float32, groups="create", cost=launchy)
    assert dict(ref.optimized.counts) == {"all_reduce": 1}


@pytest.mark.parametrize(
    "src, dst, shape",
    [
        (("P", "P", "P"), ("R", "S(0)", "S(1)"), (6, 5)),
        (("P(max)", "P(max)", "P(max)"), ("S(0)", "R", "S(0)"), (7, 3)),
        (("P(avg)", "P(avg)", "R"), ("R", "S(1)", "R"), (3, 9)),
        (("P", "P", "S(1)"), ("S(0)", "R", "S(1)"), (5, 4)),
    ],
)
def test_3d_against_torch(src, dst, shape):
    ref = check_case("2x4x2", src, dst, shape, torch.float64, groups="create", cost=DEFAULT)
    assert ref.optimized.total < ref.total
