from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.passes import MergeAdjacentAllToAlls


def _ops(plan):
    return [(n.target.ir_name, *n.args[2:]) for n in plan.graph.graph.nodes if n.op == "call_function"]


def test_two_all_to_alls_become_one():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(0)", "S(1),S(2)", shape=(8, 8, 8))
    assert signature(p) == ["all_to_all(b)", "all_to_all(a)"]
    after = run_and_check(p, MergeAdjacentAllToAlls, ["all_to_all(a+b)"])
    assert _ops(after) == [("all_to_all", ((1, 2), (2, 2)), 0)]  # dim 1 by a, dim 2 by b, cat dim 0


def test_uneven_all_three_dims():
    p = redist_opt.plan(mesh((2, 3), ["a+b"]), "S(0),S(0)", "S(1),S(2)", shape=(5, 3, 7))
    after = run_and_check(p, MergeAdjacentAllToAlls, ["all_to_all(a+b)"])
    assert [o[0] for o in _ops(after)] == [
        "pad_to", "pad_nested", "pad_nested", "all_to_all", "unpad_nested", "narrow", "narrow"
    ]


def test_inner_dims_of_a_3d_mesh():
    p = redist_opt.plan(mesh((2, 2, 2), ["b+c"]), "R,S(0),S(0)", "R,S(1),S(2)", shape=(8, 8, 8))
    run_and_check(p, MergeAdjacentAllToAlls, ["all_to_all(b+c)"])


def test_no_group_not_transformed():
    p = redist_opt.plan(mesh((2, 2)), "S(0),S(0)", "S(1),S(2)", shape=(8, 8, 8))
    after = run_and_check(p, MergeAdjacentAllToAlls, None)
    assert any("no process group" in n for n in notes_of(after, MergeAdjacentAllToAlls))


def test_split_dim_is_the_other_cat_dim_not_transformed():
    # condition 1: all_to_all(b) 1 -> 2, then all_to_all(a) 0 -> 1
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(1)", "S(1),S(2)", shape=(8, 8, 8))
    assert [(s.src.dim, s.dst.dim) for s in p.steps] == [(1, 2), (0, 1)]
    after = run_and_check(p, MergeAdjacentAllToAlls, None)
    assert any("do not cat one tensor dim" in n for n in notes_of(after, MergeAdjacentAllToAlls))


def test_only_other_groups_not_transformed():
    # condition 3: a+c exists, the a+b group the merge needs does not
    p = redist_opt.plan(mesh((2, 2, 2), ["a+c"]), "S(0),S(0),R", "S(1),S(2),R", shape=(8, 8, 8))
    after = run_and_check(p, MergeAdjacentAllToAlls, None)
    assert any("no process group" in n for n in notes_of(after, MergeAdjacentAllToAlls))


def test_padding_not_transformed():
    # condition 5: a 1x1x1 tensor over 2x3: merged, every dim is padded (24 B vs 20 B)
    p = redist_opt.plan(mesh((2, 3), ["a+b"]), "S(0),S(0)", "S(1),S(2)", shape=(1, 1, 1))
    after = run_and_check(p, MergeAdjacentAllToAlls, None)
    assert any("padding" in n for n in notes_of(after, MergeAdjacentAllToAlls))


def test_consistency_ignores_cost_not_padding():
    p = redist_opt.plan(mesh((2, 3), ["a+b"]), "S(0),S(0)", "S(1),S(2)", shape=(1, 1, 1))
    run_and_check(p, MergeAdjacentAllToAlls, None, prefer="consistency")
