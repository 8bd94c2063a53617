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


# -- deep chains (issue 10, item 3) ------------------------------------------------

EP = ("S(1),S(1),S(1),S(1)", "S(1),S(0),S(0),S(0)")  # expert-parallel dispatch layout


def _ep(flattened, shape=(8, 16, 2)):
    return redist_opt.plan(mesh((2, 2, 2, 2), flattened), *EP, shape=shape)


def _ops(plan):
    return [n.target.ir_name for n in plan.graph.graph.nodes if n.op == "call_function"]


def test_deep_chain_becomes_one_all_to_all():
    p = _ep(["b+c+d"])
    assert signature(p) == ["all_gather(d)", "all_gather(c)", "all_to_all(b)"]
    after = run_and_check(p, MergeAllToAlls, ["all_to_all(b+c+d)"])
    assert _ops(after) == ["all_to_all"]
    assert after.bytes_per_rank < p.bytes_per_rank


def test_deep_chain_after_merged_gathers():
    from redist_opt.passes import MergeAllGathers

    p = run_and_check(_ep(["b+c+d", "c+d"]), MergeAllGathers, ["all_gather(c+d)", "all_to_all(b)"])
    run_and_check(p, MergeAllToAlls, ["all_to_all(b+c+d)"])


def test_deep_chain_uneven():
    p = _ep(["b+c+d"], shape=(5, 7, 3))
    after = run_and_check(p, MergeAllToAlls, ["all_to_all(b+c+d)"])
    assert _ops(after) == ["pad_to", "pad_nested", "all_to_all", "unpad_nested", "narrow"]


def test_deep_chain_part_when_only_a_smaller_group_exists():
    # condition 1 (nearest gathers first) + 3: only b+c: all_gather(c) + all_to_all(b) + chunk(c)
    after = run_and_check(_ep(["b+c"]), MergeAllToAlls, ["all_gather(d)", "all_to_all(b+c)"])
    assert _ops(after)[-1] == "select_chunk"  # chunk(d) stays
    assert any("8:1" in n or "b+c+d" in n or "not merged" in n for n in notes_of(after, MergeAllToAlls))


def test_deep_chain_no_group_not_transformed():
    after = run_and_check(_ep([]), MergeAllToAlls, None)
    assert any("no process group" in n for n in notes_of(after, MergeAllToAlls))


def test_deep_chain_chunks_over_other_dims_not_transformed():
    # condition 1: gathers over c, d but only a chunk over d (mesh dim c ends Replicate)
    p = redist_opt.plan(mesh((2, 2, 2, 2), ["b+c+d", "b+c", "b+d"]), "S(1),S(1),S(1),S(1)", "S(1),S(0),R,S(0)",
                        shape=(8, 16, 4))
    after = run_and_check(p, MergeAllToAlls, None)
    assert any("the chunks are over mesh dims (3,), the gathers over (2, 3)" in n
               for n in notes_of(after, MergeAllToAlls))
