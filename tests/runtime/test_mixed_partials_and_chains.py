"""Mixed sum/avg partials, all_reduce + chunk chains and deep all_to_all chains,
against torch 2.13 itself.

Each example runs torch (merge pass ON), redist_opt and the oracle (torch, merge
pass OFF) on one integer-valued float64 input under LocalTensorMode
(``support.exact_runs.run_three``: outputs equal the oracle bitwise, replicas are
bitwise equal, the torch-2.13 model predicts torch's count) and asserts the
collective counts of the merged plan.
"""

from __future__ import annotations

import math

import pytest
import torch
from support.exact_runs import assert_replicas_equal, fresh_mesh, int_input, run_oracle, run_ours, run_three
from support.torch_merge_model import signature
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

import redist_opt

# ----------------------------------------------------------------------------
# Mixed sum/avg partials
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(6, 4), (5, 3), (0, 3)], ids=["even", "uneven", "empty"])
def test_mixed_avg_sum_runs_and_merges(shape):
    """[P(avg), P(sum)] -> [R, R] (a loss averaged over dp, summed over tp)."""
    o = run_three((2, 2), "ab", [("a", "b")], "P(avg),P", "R,R", shape)
    assert o.oracle.total == 2
    assert o.torch.total == 1  # torch 2.13 merges a sum/avg run too (a sum, then / avg_scale)
    assert o.ours.total == 1 and signature(o.plan) == ["all_reduce[sum](a+b)"]


def test_mixed_avg_sum_without_a_group_runs_unmerged():
    o = run_three((2, 3), "ab", [], "P,P(avg)", "R,R", (5, 3))
    assert o.ours.total == 2 == o.oracle.total


def test_mixed_avg_sum_reorder_and_merge():
    """P(avg),P,P(avg) -> R,S(0),R with a+c flattened: torch 3, we 2."""
    o = run_three((2, 2, 2), "abc", [("a", "c")], "P(avg),P,P(avg)", "R,S(0),R", (8, 4))
    assert o.torch.total == 3
    assert o.ours.total == 2
    o = run_three((2, 2, 2), "abc", [("a", "c")], "P,P(avg),P", "R,S(0),R", (5, 3))
    assert o.torch.total == 3 and o.ours.total == 2
    assert signature(o.plan) == ["reduce_scatter[avg](b)", "all_reduce[sum](a+c)"]


def test_mixed_avg_sum_reduce_scatter_merges():
    o = run_three((2, 2), "ab", [("a", "b")], "P(avg),P", "S(0),S(0)", (5, 3))
    assert o.oracle.total == 2 and o.ours.total == 1


def _dtensor_from_spec(lm, mesh, placements, shape, dtype, fill):
    spec = DTensorSpec(
        mesh,
        tuple(placements),
        tensor_meta=TensorMeta(torch.Size(shape), tuple(torch.empty(shape).stride()), dtype),
    )
    return DTensor(lm.rank_map(fill), spec, requires_grad=False)


@pytest.mark.parametrize("ops", [("max", "sum"), ("avg", "min"), ("sum", "product")])
def test_non_linear_mix_raises_torchs_exception_type(ops):
    """torch refuses every mix but sum+avg with a ValueError; so do we (a ValueError
    subclass naming the ops), before any collective."""
    with LocalTensorMode(4) as lm:
        mesh = fresh_mesh((2, 2), "ab", [("a", "b")])
        dt = _dtensor_from_spec(
            lm,
            mesh,
            [Partial(ops[0]), Partial(ops[1])],
            (4, 2),
            torch.float32,
            lambda r: torch.full((4, 2), float(r)),
        )
        theirs, ours = run_oracle(dt, [Replicate(), Replicate()]), run_ours(dt, [Replicate(), Replicate()])
    assert theirs.error is not None and ours.error is not None
    assert isinstance(ours.error, type(theirs.error)), (type(ours.error), type(theirs.error))
    assert isinstance(ours.error, redist_opt.RedistributeError)
    assert ops[0] in str(ours.error) and ops[1] in str(ours.error)
    assert ours.total == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("src", ["P(avg),P", "P,P(avg)", "P(avg),P(avg)"])
def test_integer_avg_matches_torch_exactly(dtype, src):
    """On integers torch's avg is sum / n truncated (LocalTensorMode: true division,
    cast back), once per mesh dim: we keep every avg reduction separate and in
    place, so the result is bitwise torch's, although a+b exists."""
    srcp = redist_opt.parse_placements(src)
    dst = [Replicate(), Replicate()]
    with LocalTensorMode(4) as lm:
        mesh = fresh_mesh((2, 2), "ab", [("a", "b")])
        dt, coords = int_input(mesh, lm, srcp, (6, 5), dtype, 11)
        theirs, ours = run_oracle(dt, dst), run_ours(dt, dst)
        locals_in = {r: t.clone() for r, t in dt._local_tensor._local_tensors.items()}
    assert theirs.error is None and ours.error is None, (theirs.error, ours.error)
    got, want = ours.out._local_tensor._local_tensors, theirs.out._local_tensor._local_tensors
    for r in want:
        assert got[r].dtype == dtype and torch.equal(got[r], want[r]), r
    assert_replicas_equal(ours.out, coords, (2, 2))
    # the test can fail: where an avg runs first (DTensor reduces mesh dim a, then
    # b), one merged sum with one truncating scale gives other values. (P,P(avg)
    # truncates once, at the end, either way.)
    if srcp[0].reduce_op == "avg":
        total = sum(locals_in.values())
        scale = math.prod(2 for p in srcp if p.reduce_op == "avg")
        assert not torch.equal((total / scale).to(dtype), want[0])


# ----------------------------------------------------------------------------
# all_reduce + chunk is a reduce_scatter
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 6, 4), (8, 8, 4), (5, 3, 2)], ids=["example", "even", "uneven"])
def test_all_reduce_and_chunk_become_one_reduce_scatter(shape):
    """(r, m, i, t) with i+t flattened, [P, P, S(0), S(0)] -> [S(1), S(1), S(0), S(0)],
    groups="create": DTensor issues all_reduce(m) + reduce_scatter(r) + chunk; we
    issue one reduce_scatter over r+m with nested uneven padding."""
    o = run_three(
        (2, 2, 2, 2), "rmit", [("i", "t")], "P,P,S(0),S(0)", "S(1),S(1),S(0),S(0)", shape, groups="create"
    )
    assert o.torch.total == 2 and o.oracle.total == 2
    assert o.ours.total == 1 and o.ours.kinds == {"reduce_scatter": 1}
    assert signature(o.plan) == ["reduce_scatter[sum](r+m)"]
    if shape == (8, 6, 4):  # float64 here: the float32 numbers below times 2
        assert o.model.bytes_per_rank == 2 * 384  # torch: all_reduce(m) first, then reduce_scatter(r)
        assert o.plan.bytes_per_rank == 2 * 256
        spec = redist_opt.MeshSpec(sizes=(2, 2, 2, 2), names=tuple("rmit"), flattened=["i+t"])
        f32 = redist_opt.plan(spec, "P,P,S(0),S(0)", "S(1),S(1),S(0),S(0)", shape=shape)
        reordered = redist_opt.optimize(f32, groups="existing")  # no r+m: today's best
        assert signature(reordered) == ["reduce_scatter[sum](r)", "all_reduce[sum](m)"]
        assert reordered.bytes_per_rank == 288
        assert redist_opt.optimize(f32, groups="create").bytes_per_rank == 256


def test_reduce_scatter_moves_first_without_the_r_m_group():
    """No r+m group, groups="existing": the reduce_scatter moves first (288 B per
    rank) and the uneven all_reduce + chunk stays (a reduce_scatter of 3 rows over
    2 ranks would be fed 4)."""
    o = run_three((2, 2, 2, 2), "rmit", [("i", "t")], "P,P,S(0),S(0)", "S(1),S(1),S(0),S(0)", (8, 6, 4))
    assert o.ours.total == 2 and o.plan.bytes_per_rank == 2 * 288  # float64


# ----------------------------------------------------------------------------
# Deep all_to_all merges
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("flatten", [[("b", "c", "d")], [("b", "c", "d"), ("c", "d")]], ids=["bcd", "bcd+cd"])
@pytest.mark.parametrize("shape", [(8, 16, 2), (5, 24, 3), (8, 0, 2)], ids=["example", "uneven", "empty"])
def test_gathers_and_all_to_all_become_one_all_to_all(flatten, shape):
    """(a, b, c, d) of size 2, b+c+d flattened, [S(1)] * 4 -> [S(1), S(0), S(0), S(0)]:
    DTensor all_gather(d) + all_gather(c) + all_to_all(b) + chunks (3 collectives;
    torch 2 when c+d exists); we issue one all_to_all over b+c+d."""
    o = run_three((2, 2, 2, 2), "abcd", flatten, "S(1),S(1),S(1),S(1)", "S(1),S(0),S(0),S(0)", shape)
    assert o.oracle.total == 3
    assert o.torch.total == (3 if len(flatten) == 1 else 2)
    if shape[1]:
        assert o.ours.total == 1 and o.ours.kinds == {"all_to_all": 1}
        assert signature(o.plan) == ["all_to_all(b+c+d)"]
    else:
        assert o.ours.total <= 1


@pytest.mark.parametrize("shape", [(8, 8, 8), (5, 3, 7)], ids=["even", "uneven"])
def test_two_adjacent_all_to_alls_one(shape):
    """S(0),S(0) -> S(1),S(2) on 2x2 with a+b flattened: DTensor all_to_all(b) +
    all_to_all(a) (torch never merges all_to_alls); we issue one over a+b."""
    o = run_three((2, 2), "ab", [("a", "b")], "S(0),S(0)", "S(1),S(2)", shape)
    assert o.torch.total == 2 and o.oracle.total == 2
    assert o.ours.total == 1 and o.ours.kinds == {"all_to_all": 1}
