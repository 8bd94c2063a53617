from pass_util import mesh, notes_of, run_and_check, signature

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.passes import ReduceScatterCreator, ReorderCollectives

EXAMPLE = ("P,P,S(0),S(0)", "S(1),S(1),S(0),S(0)")  # issue 10, example 2


def _mesh(flattened=("i+t",)):
    return redist_opt.MeshSpec(sizes=(2, 2, 2, 2), names=("r", "m", "i", "t"), flattened=list(flattened))


def _reordered(shape, groups="existing", flattened=("i+t",), src=EXAMPLE[0], dst=EXAMPLE[1]):
    p = redist_opt.plan(_mesh(flattened), src, dst, shape=shape)
    assert [(s.kind, s.mesh_dims) for s in p.steps] == [
        ("all_reduce", (1,)), ("reduce_scatter", (0,)), ("chunk", (1,))
    ]
    # reorder-collectives makes all_reduce(m) and chunk(m) adjacent
    return run_and_check(p, ReorderCollectives, signature(p)[::-1], groups=groups)


def _ops(plan):
    return [n.target.ir_name for n in plan.graph.graph.nodes if n.op == "call_function"]


def test_example2_folds_into_one_uneven_reduce_scatter():
    p = _reordered((8, 6, 4), groups="create")
    assert _ops(p) == ["reduce_scatter", "all_reduce", "select_chunk"]
    after = run_and_check(p, ReduceScatterCreator, ["reduce_scatter[sum](r+m)"], groups="create")
    assert _ops(after) == ["pad_nested", "reduce_scatter", "narrow"]
    assert p.bytes_per_rank == 288 and after.bytes_per_rank == 256


def test_standalone_when_even():
    # no r+m group: the all_reduce + chunk alone becomes a reduce_scatter (dim 1: 8 -> 4 -> 2)
    p = _reordered((8, 8, 4))
    after = run_and_check(p, ReduceScatterCreator, ["reduce_scatter[sum](r)", "reduce_scatter[sum](m)"])
    # fed the same bytes, but a reduce_scatter moves half of what an all_reduce does
    assert after.bytes_per_rank == p.bytes_per_rank
    assert CostModel.default().plan_time(after) < CostModel.default().plan_time(p)
    assert any("as one reduce_scatter: not merged: no process group" in n for n in notes_of(after, ReduceScatterCreator))


def test_any_reduce_op():
    p = _reordered((8, 8, 4), groups="create", src="P(max),P(max),S(0),S(0)")
    run_and_check(p, ReduceScatterCreator, ["reduce_scatter[max](r+m)"], groups="create")


def test_fold_uses_existing_group():
    p = _reordered((8, 6, 4), flattened=("i+t", "r+m"))
    run_and_check(p, ReduceScatterCreator, ["reduce_scatter[sum](r+m)"])


def test_padding_not_transformed():
    # condition 3: without r+m, a reduce_scatter of 3 rows over 2 ranks is fed 4 rows,
    # more than the all_reduce it would replace (and the fold has no group: condition 2)
    p = _reordered((8, 6, 4))
    after = run_and_check(p, ReduceScatterCreator, None)
    notes = notes_of(after, ReduceScatterCreator)
    assert any("padding" in n for n in notes) and any("no process group" in n for n in notes)


def test_not_adjacent_not_transformed():
    # condition 1: DTensor's own order, all_reduce(m), reduce_scatter(r), chunk(m)
    p = redist_opt.plan(_mesh(), *EXAMPLE, shape=(8, 8, 4))
    run_and_check(p, ReduceScatterCreator, None, groups="create")


def test_chunk_over_other_mesh_dim_not_transformed():
    # condition 1: all_reduce(b) is followed by a chunk over c
    p = redist_opt.plan(mesh((2, 2, 2), ["b+c"]), "R,P,R", "R,R,S(0)", shape=(8, 8))
    assert [(s.kind, s.mesh_dims) for s in p.steps] == [("all_reduce", (1,)), ("chunk", (2,))]
    after = run_and_check(p, ReduceScatterCreator, None)
    assert any("other mesh dims" in n for n in notes_of(after, ReduceScatterCreator))
