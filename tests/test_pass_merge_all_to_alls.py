from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.passes import MergeAllToAlls


def test_gather_a2a_chunk_becomes_one_all_to_all():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(0)", "S(1),S(1)", shape=(8, 8))
    assert signature(p) == ["all_gather(b)", "all_to_all(a)"]
    run_and_check(p, MergeAllToAlls, ["all_to_all(a+b)"])


def test_uneven_both_dims():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),S(0)", "S(1),S(1)", shape=(5, 3))
    after = run_and_check(p, MergeAllToAlls, ["all_to_all(a+b)"])
    ops = [n.target.ir_name for n in after.graph.graph.nodes if n.op == "call_function"]
    assert ops == ["pad_to", "pad_nested", "all_to_all", "unpad_nested", "narrow"]


def test_no_group_not_transformed():
    p = redist_opt.plan(mesh((2, 2)), "S(0),S(0)", "S(1),S(1)", shape=(8, 8))
    after = run_and_check(p, MergeAllToAlls, None)
    assert notes_of(after, MergeAllToAlls)


def test_single_all_to_all_not_transformed():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "S(0),R", "S(1),R", shape=(8, 8))
    run_and_check(p, MergeAllToAlls, None)
