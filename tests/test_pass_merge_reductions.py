from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.passes import MergeReductions, ReorderCollectives
from redist_opt.cost import CostModel


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
