"""A cached eager call runs a program specialized to the rank (integers, resolved
groups, no sympy, no FX interpretation), where our plan is torch's too; collectives
are left pending where torch leaves them."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from test_api import _assert_same, _partial_input
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api import eager
from redist_opt.runtime.specialize import RankProgram
from redist_opt.torch_api import dtensor as tdt

R, S0 = Replicate(), Shard(0)
P = Partial()


def _mesh():
    mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("a", "b", "c"))
    mesh["a", "c"]._flatten("a_c")
    return mesh


def _input(lm, mesh, src, shape):
    if any(p.is_partial() for p in src):
        return _partial_input(lm, mesh, list(src), shape)
    full = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    return DTensor.from_local(full, mesh, [R, R, R]).redistribute(mesh, list(src))


def _runner(dt, dst):
    target = tdt.respec(tdt.spec_of_dtensor(dt), placements=dst)
    return eager.cached_runner(
        tdt.local_tensor_of(dt), tdt.spec_of_dtensor(dt), target, redist_opt.PlanOptions()
    )


# (src, dst, shape) on a 2x2x2 mesh with a+c flattened: ours issues fewer collectives
# than torch (1 of 3: one all_reduce over the world, then this rank's chunk), or
# runs what torch's merge pass gets wrong (an uneven gather over a+c: padded blocks)
DIFFERENT = [
    ((P, P, P), (R, R, R), (4, 6)),
    ((P, P, P), (R, S0, R), (5, 3)),
    ((S0, R, S0), (R, R, R), (5, 3)),
]
EQUAL = [((R, S0, R), (R, R, R), (5, 3)), ((S0, R, R), (R, R, R), (8, 3))]


class _SympyCalls:
    """Counts Python calls into sympy (and into functions sympy's lambdify made)."""

    def __init__(self) -> None:
        self.calls = 0

    def _profile(self, frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if "/sympy/" in name or name.startswith("<lambdifygenerated"):
                self.calls += 1

    def __enter__(self):
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def test_cached_routed_calls_make_no_sympy_calls():
    with LocalTensorMode(8) as lm:
        mesh = _mesh()
        inputs = [(_input(lm, mesh, src, shape), list(dst)) for src, dst, shape in DIFFERENT + EQUAL]
        with redist_opt.enabled():
            firsts = [dt.redistribute(mesh, dst) for dt, dst in inputs]  # plans and programs built here
            with _SympyCalls() as counter:
                for _ in range(200 // len(inputs) + 1):
                    outs = [dt.redistribute(mesh, dst) for dt, dst in inputs]
        assert counter.calls == 0
        for out, first in zip(outs, firsts):
            _assert_same(out, first)


@pytest.mark.parametrize("src,dst,shape", DIFFERENT)
def test_where_our_plan_differs_a_cached_call_runs_the_rank_program(src, dst, shape):
    with LocalTensorMode(8) as lm:
        mesh = _mesh()
        dt = _input(lm, mesh, src, shape)
        with CommDebugMode() as torch_counts, tdt.reference_semantics():
            expected = dt.redistribute(mesh, list(dst))
        with redist_opt.enabled():
            first = dt.redistribute(mesh, list(dst))
            run = _runner(dt, list(dst))
            with CommDebugMode() as ours:
                again = dt.redistribute(mesh, list(dst))
        assert isinstance(run.program, RankProgram)
        assert "sympy" not in repr(run.program) and "c0" not in repr(run.program)
        assert ours.get_total_counts() < torch_counts.get_total_counts()  # torch's merge pass off here
        _assert_same(again, expected)
        _assert_same(first, expected)


@pytest.mark.parametrize("src,dst,shape", EQUAL)
def test_where_our_plan_is_torchs_a_cached_call_runs_our_program_not_torchs_function(
    src, dst, shape, monkeypatch
):
    with LocalTensorMode(8) as lm:
        mesh = _mesh()
        dt = _input(lm, mesh, src, shape)
        with CommDebugMode() as theirs:
            expected = dt.redistribute(mesh, list(dst))
        with redist_opt.enabled():
            dt.redistribute(mesh, list(dst))
            run = _runner(dt, list(dst))
            calls = []
            real = tdt.TORCH_REDISTRIBUTE_LOCAL
            monkeypatch.setattr(
                tdt, "TORCH_REDISTRIBUTE_LOCAL", lambda *a, **k: calls.append(1) or real(*a, **k)
            )
            with CommDebugMode() as ours:
                again = dt.redistribute(mesh, list(dst))
        assert isinstance(run.program, RankProgram)
        assert calls == []  # torch's function is not called on a cached call
        assert ours.get_comm_counts() == theirs.get_comm_counts()  # the same collectives as torch's
        _assert_same(again, expected)


def test_a_collective_ending_the_plan_stays_pending_with_async_op():
    with LocalTensorMode(8) as lm:
        mesh = _mesh()
        dt = _input(lm, mesh, (P, P, P), (4, 6))
        with redist_opt.enabled():
            dt.redistribute(mesh, [R, R, R])
            assert _runner(dt, [R, R, R]) is not None
            pending = dt.redistribute(mesh, [R, R, R], async_op=True)
            waited = dt.redistribute(mesh, [R, R, R])
        assert isinstance(tdt.local_tensor_of(pending), funcol.AsyncCollectiveTensor)
        assert not isinstance(tdt.local_tensor_of(waited), funcol.AsyncCollectiveTensor)
        got, want = tdt.local_tensor_of(pending).wait(), tdt.local_tensor_of(waited)
        assert all(torch.equal(got._local_tensors[r], want._local_tensors[r]) for r in range(8))


def test_a_new_flattened_group_replans_a_cached_call():
    with LocalTensorMode(8) as lm:
        mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("a", "b", "c"))
        dt = _input(lm, mesh, (P, P, P), (4, 6))
        with redist_opt.enabled():
            with CommDebugMode() as before:
                dt.redistribute(mesh, [R, R, R])
                dt.redistribute(mesh, [R, R, R])
            mesh["a", "c"]._flatten("a_c")
            with CommDebugMode() as after:
                dt.redistribute(mesh, [R, R, R])
        assert before.get_total_counts() == 6 and after.get_total_counts() == 2
