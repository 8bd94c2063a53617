from pass_util import mesh, notes_of, run_and_check

import redist_opt
from redist_opt.passes import MergeReduceScatters


def test_nested_scatter_merges():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "P,P", "S(0),S(0)", shape=(8, 4))
    run_and_check(p, MergeReduceScatters, ["reduce_scatter[sum](a+b)"])


def test_uneven_merges_with_nested_padding():
    # torch 2.13 refuses this (5 rows over 4 ranks); we pad every nested piece.
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "P,P", "S(0),S(0)", shape=(5, 3))
    after = run_and_check(p, MergeReduceScatters, ["reduce_scatter[sum](a+b)"])
    ops = [n.target.ir_name for n in after.graph.graph.nodes if n.op == "call_function"]
    assert ops == ["pad_nested", "reduce_scatter", "narrow"]


def test_three_dims_partial_group():
    p = redist_opt.plan(mesh((2, 2, 2), ["b+c"]), "P,P,P", "S(0),S(0),S(0)", shape=(16, 2))
    run_and_check(p, MergeReduceScatters, ["reduce_scatter[sum](a)", "reduce_scatter[sum](b+c)"])


def test_different_tensor_dims_not_transformed():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "P,P", "S(0),S(1)", shape=(8, 4))
    run_and_check(p, MergeReduceScatters, None)


def test_no_group_in_shard_order_not_transformed():
    p = redist_opt.plan(mesh((2, 2)), "P,P", "S(0),S(0)", shape=(8, 4))
    after = run_and_check(p, MergeReduceScatters, None)
    assert any("4:1" in n for n in notes_of(after, MergeReduceScatters))


def test_mixed_sum_avg_scatter_merges_with_one_scale():
    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "P,P(avg)", "S(0),S(0)", shape=(5, 3))
    after = run_and_check(p, MergeReduceScatters, ["reduce_scatter[sum](a+b)"])
    ops = [(n.target.ir_name, *n.args[1:]) for n in after.graph.graph.nodes if n.op == "call_function"]
    assert [o[0] for o in ops] == ["pad_nested", "reduce_scatter", "narrow", "divide"]
    assert ops[-1][1] == 2


def test_mixed_sum_avg_integer_not_transformed():
    import torch

    p = redist_opt.plan(mesh((2, 2), ["a+b"]), "P,P(avg)", "S(0),S(0)", shape=(8, 3), dtype=torch.int32)
    run_and_check(p, MergeReduceScatters, None)
