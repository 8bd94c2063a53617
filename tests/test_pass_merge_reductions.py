from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.passes import MergeReductions, ReorderCollectives
from redist_opt.ir.cost import CostModel


def _plan(sizes, flattened, src, dst, shape=(8, 4)):
    return redist_opt.plan(mesh(sizes, flattened), src, dst, shape=shape)


def test_all_in_one_when_group_exists():
    p = _plan((2, 2, 2), ["a+b+c"], "P,P,P", "R,R,R")
    run_and_check(p, MergeReductions, ["all_reduce[sum](a+b+c)"])


def test_not_all_or_nothing():
    # DESIGN case 2: only a+b exists: AR(a+b) + AR(c), where torch keeps 3.
    p = _plan((2, 2, 2), ["a+b"], "P,P,P", "R,R,R")
    after = run_and_check(p, MergeReductions, ["all_reduce[sum](a+b)", "all_reduce[sum](c)"])
    assert any("a+b+c" in n or "as one" in n for n in notes_of(after, MergeReductions))


def test_non_contiguous_group():
    # DESIGN case 1: a and c of a 2x2x2 mesh, after reorder-collectives.
    p = _plan((2, 2, 2), ["a+c"], "P,P,P", "R,S(0),R")
    p = run_and_check(p, ReorderCollectives, ["reduce_scatter[sum](b)", "all_reduce[sum](a)", "all_reduce[sum](c)"])
    after = run_and_check(p, MergeReductions, ["reduce_scatter[sum](b)", "all_reduce[sum](a+c)"])
    assert "(2,2):(4,1)" in " ".join(notes_of(after, MergeReductions))


def test_avg_and_max_merge_with_themselves():
    for op in ("avg", "max", "min"):
        p = _plan((2, 2), ["a+b"], f"P({op}),P({op})", "R,R")
        run_and_check(p, MergeReductions, [f"all_reduce[{op}](a+b)"])


def test_no_group_not_transformed():
    p = _plan((2, 2, 2), [], "P,P,P", "R,R,R")
    # A rank-free MeshSpec has no world group: nothing exists for a+b+c.
    after = run_and_check(p, MergeReductions, None)
    assert any("no process group has layout" in n for n in notes_of(after, MergeReductions))


def test_create_policy_merges():
    p = _plan((2, 2, 2), [], "P,P,P", "R,R,R")
    run_and_check(p, MergeReductions, ["all_reduce[sum](a+b+c)"], groups="create")


def test_allow_list_policy():
    p = _plan((2, 2, 2), [], "P,P,P", "R,R,R")
    run_and_check(p, MergeReductions, ["all_reduce[sum](a)", "all_reduce[sum](b+c)"], groups=("b+c",))


def test_not_adjacent_not_transformed():
    # Without reorder-collectives the scatter separates the two reductions.
    p = _plan((2, 2, 2), ["a+c"], "P,P,P", "R,S(0),R")
    run_and_check(p, MergeReductions, None)


def test_cost_can_refuse_a_merge():
    # A ring all_reduce over 8 ranks has more latency steps than three over pairs:
    # with a latency-dominated ring profile, small messages stay unmerged.
    slow_ring = CostModel(name="ring", launch=0.0, alpha_intra=1e-3, bw_intra=1e12, algorithm="ring")
    p = _plan((2, 2, 2), ["a+b+c"], "P,P,P", "R,R,R", shape=(4, 4))
    after = run_and_check(p, MergeReductions, None, cost=slow_ring)
    assert any("cost" in n for n in notes_of(after, MergeReductions))
    # ... unless replicas must be bitwise equal.
    run_and_check(p, MergeReductions, ["all_reduce[sum](a+b+c)"], cost=slow_ring, prefer="consistency")


def test_uneven_shapes_do_not_matter_for_reductions():
    p = _plan((3, 2), ["a+b"], "P,P", "R,R", shape=(5, 7))
    run_and_check(p, MergeReductions, ["all_reduce[sum](a+b)"])
    assert signature(p) == ["all_reduce[sum](a)", "all_reduce[sum](b)"]


def _ops(plan):
    return [(n.target.ir_name, *n.args[1:]) for n in plan.graph.graph.nodes if n.op == "call_function"]


def test_mixed_sum_avg_merge_into_one_sum_and_one_scale():
    # Issue 10 item 1: AR_avg(a) . AR_sum(b) = AR_sum(a+b) / |a|.
    p = _plan((2, 3), ["a+b"], "P(avg),P", "R,R")
    assert signature(p) == ["all_reduce[avg](a)", "all_reduce[sum](b)"]
    after = run_and_check(p, MergeReductions, ["all_reduce[sum](a+b)"])
    assert [o[0] for o in _ops(after)] == ["all_reduce", "divide"]
    assert _ops(after)[1][1] == 2  # |a|
    # the other way round: the scale is |b|
    after = run_and_check(_plan((2, 3), ["a+b"], "P,P(avg)", "R,R"), MergeReductions, ["all_reduce[sum](a+b)"])
    assert _ops(after)[1][1] == 3


def test_mixed_partial_merge_not_all_or_nothing():
    # avg over a and c, sum over b; only b+c exists: AR_avg(a) + AR_sum(b+c) / |c|
    p = _plan((2, 2, 2), ["b+c"], "P(avg),P,P(avg)", "R,R,R")
    after = run_and_check(p, MergeReductions, ["all_reduce[avg](a)", "all_reduce[sum](b+c)"])
    assert [o[0] for o in _ops(after)] == ["all_reduce", "all_reduce", "divide"]
    assert _ops(after)[2][1] == 2


def test_mixed_partial_integer_dtype_not_transformed():
    # On integer dtypes every avg truncates (torch: sum / n, then cast back), so
    # avg(a) then sum(b) is not sum(a+b) / |a|: nothing with avg merges.
    import torch

    for src in ("P(avg),P", "P(avg),P(avg)"):
        p = redist_opt.plan(mesh((2, 2), ["a+b"]), src, "R,R", shape=(8, 4), dtype=torch.int64)
        run_and_check(p, MergeReductions, None)
    # sum with sum still merges on integers
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "P,P", "R,R", shape=(8, 4), dtype=torch.int64)
    run_and_check(p, MergeReductions, ["all_reduce[sum](a+b)"])


def test_integer_avg_not_reordered():
    # P(avg),P,P(avg) -> R,S(0),R: on floats the scatter moves first and the two
    # avgs merge; on integers the avg reductions stay in DTensor's order.
    import torch

    p = redist_opt.plan(mesh((2, 2, 2), ["a+c"]), "P(avg),P,P(avg)", "R,S(0),R", shape=(8, 4))
    run_and_check(p, ReorderCollectives, ["reduce_scatter[sum](b)", "all_reduce[avg](a)", "all_reduce[avg](c)"])
    p = redist_opt.plan(
        mesh((2, 2, 2), ["a+c"]), "P(avg),P,P(avg)", "R,S(0),R", shape=(8, 4), dtype=torch.int64
    )
    run_and_check(p, ReorderCollectives, None)


def test_max_and_sum_mix_is_refused():
    import pytest

    with pytest.raises(ValueError, match="mix partial reduce ops"):
        _plan((2, 2), ["a+b"], "P(max),P", "R,R")
