from pass_util import mesh, notes_of, run_and_check

import redist_opt
from redist_opt.passes import MergeAllGathers


def test_nested_gather_merges():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(0)", "R,R", shape=(8, 4))
    run_and_check(p, MergeAllGathers, ["all_gather(a+b)"])


def test_uneven_gather_unpads_every_slot():
    # The torch 2.13 corruption case: (5,3) on 2x2; pieces are 2,1,1,1 rows.
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(0)", "R,R", shape=(5, 3))
    after = run_and_check(p, MergeAllGathers, ["all_gather(a+b)"])
    ops = [n.target.ir_name for n in after.graph.graph.nodes if n.op == "call_function"]
    assert ops == ["pad_to", "all_gather", "unpad_nested"]


def test_noncontiguous_group_order():
    # S(0) over a and c: the group lists a slowest, c fastest: layout (2,2):(4,1).
    p = redist_opt.plan(mesh((2, 2, 2), ["a+c"]), "S(0),R,S(0)", "R,R,R", shape=(8, 2))
    run_and_check(p, MergeAllGathers, ["all_gather(a+c)"])


def test_different_dims_not_transformed():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(1)", "R,R", shape=(8, 4))
    run_and_check(p, MergeAllGathers, None)


def test_missing_group_not_transformed():
    p = redist_opt.plan(mesh((2, 2)), "S(0),S(0)", "R,R", shape=(8, 4))
    after = run_and_check(p, MergeAllGathers, None)
    assert notes_of(after, MergeAllGathers)
