"""enabled() routes every way torch 2.13 redistributes a DTensor (under LocalTensorMode):
op-dispatch reshards, backward, from_local / to_local gradients; restores torch's
function exactly; nests; errors are instances of torch's exception types; what we
do not lower (Partial("prod")) runs through torch; groups="create" works on a mesh
without dim names.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import warnings

import pytest
import torch
from support.dtensor_values import assert_same_locals as _assert_same
from support.dtensor_values import partial_input as _partial_input
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry
from torch.distributed.tensor._redistribute import Redistribute, use_min_cost_redistribution_plan
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api import routing
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api.version import at_least


def _patched_names():
    return {
        name: importlib.import_module(name).redistribute_local_tensor
        for name in tdt.REDISTRIBUTE_LOCAL_PATCH_POINTS
    }


def _ppp_on_a_c_flattened(lm):
    mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("a", "b", "c"))
    mesh["a", "c"]._flatten("a_c")
    return mesh, _partial_input(lm, mesh, [Partial()] * 3, (4, 6))


def test_op_dispatch_reshard_issues_fewer_collectives():
    # relu needs its Partial input reduced: DTensor's op dispatch reshards
    # P,P,P -> R,R,R itself (no redistribute call in user code). torch: 3
    # all_reduces (its merge needs all three dims flattened); ours: AR(b) + AR(a+c).
    with LocalTensorMode(8) as lm:
        mesh, dt = _ppp_on_a_c_flattened(lm)
        with CommDebugMode() as plain:
            expected = torch.relu(dt)
        with redist_opt.enabled(), CommDebugMode() as routed:
            out = torch.relu(dt)
        assert plain.get_total_counts() == 3
        assert routed.get_total_counts() == 2
        assert out.placements == expected.placements
        _assert_same(out, expected)


def test_backward_and_from_local_gradients_are_routed():
    # d(sum(relu(x)))/dx flows through op-dispatch reshards in backward and the
    # gradient of from_local (grad_placements); results equal torch's.
    def run(lm, mesh):
        local = lm.rank_map(lambda r: torch.arange(24, dtype=torch.float64).reshape(4, 6) % 5 - 2 + r)
        local.requires_grad_()
        dt = DTensor.from_local(local, mesh, [Partial()] * 3, run_check=False)
        y = torch.relu(dt).redistribute(mesh, [Shard(0), Replicate(), Shard(1)])
        y.to_local(grad_placements=[Shard(0), Partial(), Shard(1)]).sum().backward()
        return y, local.grad

    with LocalTensorMode(8) as lm:
        mesh, _ = _ppp_on_a_c_flattened(lm)
        calls = []
        real = redist_opt.api.eager.redistribute_local_tensor

        def spy(*a, **k):
            calls.append((a[1].placements, a[2].placements))
            return real(*a, **k)

        y_ref, g_ref = run(lm, mesh)
        redist_opt.api.eager.redistribute_local_tensor = spy
        try:
            with redist_opt.enabled():
                y, g = run(lm, mesh)
        finally:
            redist_opt.api.eager.redistribute_local_tensor = real
        _assert_same(y, y_ref)
        for r, t in _locals_of(g).items():
            assert torch.equal(t, _locals_of(g_ref)[r]), r
        # forward reshard (dispatch), explicit redistribute, and backward reshards all came through
        assert len(calls) >= 3, calls
        assert any(src == (Partial(),) * 3 for src, _ in calls)


def _locals_of(t):
    return dict(t._local_tensors) if hasattr(t, "_local_tensors") else {0: t}


def test_enabled_restores_patch_points_exactly_and_nests():
    before = _patched_names()
    with redist_opt.enabled():
        inner_names = _patched_names()
        assert all(v is redist_opt.api.routing.routed_redistribute_local_tensor for v in inner_names.values())
        with redist_opt.enabled(groups="create"):
            assert redist_opt.api.routing.active_options().groups == "create"
        assert redist_opt.api.routing.active_options().groups == "existing"
        assert _patched_names() == inner_names
    assert _patched_names() == before
    assert before["torch.distributed.tensor._dispatch"] is tdt.TORCH_REDISTRIBUTE_LOCAL


def test_options_are_per_thread_with_a_process_wide_default():
    seen = {}
    entered, release = threading.Event(), threading.Event()

    def other_thread():
        with redist_opt.enabled(groups="create"):
            entered.set()
            release.wait(10)
            seen["other"] = redist_opt.api.routing.active_options().groups

    t = threading.Thread(target=other_thread)
    with redist_opt.enabled(groups="existing"):
        t.start()
        entered.wait(10)
        seen["main"] = redist_opt.api.routing.active_options().groups
        release.set()
        t.join(10)
    assert seen == {"main": "existing", "other": "create"}
    assert redist_opt.api.routing.active_options() is None


def test_errors_are_instances_of_torchs_exception_types():
    with LocalTensorMode(4) as lm:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        dt = _partial_input(lm, mesh, [Shard(0), Replicate()], (4, 4))
        # explicit redistribute to Partial: torch raises RuntimeError("Can not redistribute ...")
        with redist_opt.enabled(), pytest.raises(RuntimeError, match="Can not redistribute"):
            dt.redistribute(mesh, [Shard(0), Partial()])
        with pytest.raises(RuntimeError, match="Can not redistribute") as ei:
            redist_opt.redistribute(dt, [Shard(0), Partial()])
        assert isinstance(ei.value, redist_opt.RedistributeError)
        # Partial(sum) -> Partial(avg) below DTensor.redistribute: torch raises AssertionError
        src = tdt.make_spec(mesh, (Partial("sum"), Replicate()), dt._spec.tensor_meta)
        dst = tdt.make_spec(mesh, (Partial("avg"), Replicate()), dt._spec.tensor_meta)
        with redist_opt.enabled(), pytest.raises(AssertionError) as ei:
            from torch.distributed.tensor import _redistribute

            _redistribute.redistribute_local_tensor(dt._local_tensor, src, dst)
        assert isinstance(ei.value, redist_opt.RedistributeError)
        assert "mesh dim 0" in str(ei.value)
        assert "Redistribution from one partial type" in str(ei.value)  # torch's wording kept


def test_partial_prod_runs_through_torch_with_a_warning():
    with LocalTensorMode(4) as lm:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        local = lm.rank_map(lambda r: torch.full((4, 2), float(r + 1)))
        dt = DTensor.from_local(local, mesh, [Shard(0), Partial("prod")], run_check=False)
        expected = dt.redistribute(mesh, [Replicate(), Partial("prod")])
        redist_opt.api.errors._warned.clear()
        with warnings.catch_warnings(record=True) as caught, redist_opt.enabled():
            warnings.simplefilter("always")
            out = dt.redistribute(mesh, [Replicate(), Partial("prod")])
        assert out.placements == (Replicate(), Partial("prod"))
        _assert_same(out, expected)
        assert any("prod" in str(w.message) for w in caught)


def test_create_policy_on_a_mesh_without_dim_names():
    # init_device_mesh(..., (2, 2, 2)) has no dim names; the merged group is
    # created from its layout (dims a and c: not adjacent, still one group).
    with LocalTensorMode(8) as lm:
        mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2))
        assert mesh.mesh_dim_names is None
        dt = _partial_input(lm, mesh, [Partial(), Replicate(), Partial()], (4, 3))
        with redist_opt.enabled(groups="create"), CommDebugMode() as cdm:
            out = dt.redistribute(mesh, [Replicate()] * 3)
        assert cdm.get_total_counts() == 1
        assert len(mesh._flatten_mapping) == 1
        with tdt.reference_semantics():
            ref = dt.redistribute(mesh, [Replicate()] * 3)
        _assert_same(out, ref)


def test_redistribute_apply_to_partial_is_routed_like_torch():
    # torch allows Replicate -> Partial internally (Redistribute.apply); routed, the
    # result is the same partition of the value.
    with LocalTensorMode(4) as lm:
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("w",))
        dt = _partial_input(lm, mesh, [Replicate()], (6, 2))
        ref = Redistribute.apply(dt, mesh, (Partial(),), False, *_dtype_args(dt))
        with redist_opt.enabled():
            out = Redistribute.apply(dt, mesh, (Partial(),), False, *_dtype_args(dt))
        _assert_same(out, ref)


def _dtype_args(dt):
    """``Redistribute.forward``'s dtype arguments, keeping the input's dtype both ways:
    torch 2.13 takes one ``dtype_config`` dict, 2.11 and 2.12 ``forward_dtype, backward_dtype``."""
    d = dt._local_tensor.dtype
    if at_least(2, 13):
        return ({"op_dtype": d, "out_dtype": d, "backward_options": {"op_dtype": d, "out_dtype": d}},)
    return (d, d)


def test_reductions_around_a_gather_merge_through_enabled():
    # From pytorch's test_redistribute.py ("non-consecutive allreduces with shard in
    # between", test_merging_reductions): P, S(0), P -> R, R, R on 2x2x2 with a+c
    # flattened. torch: AR(a), AG(b), AR(c) = 3 (its merge needs adjacent steps);
    # ours: AR(a+c) and AG(b) = 2, same values (the torch test stops at its count
    # assertion, so the values are checked here).
    with LocalTensorMode(8) as lm:
        mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("A", "B", "C"))
        mesh["A", "C"]._flatten("A_C")
        dt = _partial_input(lm, mesh, [Partial(), Shard(0), Partial()], (16, 16))
        with CommDebugMode() as plain:
            expected = dt.redistribute(mesh, [Replicate()] * 3)
        with redist_opt.enabled(), CommDebugMode() as routed:
            out = dt.redistribute(mesh, [Replicate()] * 3)
            full = out.full_tensor()
        assert plain.get_total_counts() == 3 and routed.get_total_counts() == 2
        _assert_same(out, expected)
        assert torch.equal(full, expected.full_tensor())


@contextlib.contextmanager
def _observed_reasons():
    """The hand-back reason (None: planned by redist_opt) of every routed call in the block."""
    reasons = []

    def observe(local_tensor, current_spec, target_spec, reason):
        reasons.append(reason)

    routing.OBSERVERS.append(observe)
    try:
        yield reasons
    finally:
        routing.OBSERVERS.remove(observe)


def test_calls_under_torchs_min_cost_flag_are_planned_by_redist_opt(monkeypatch):
    # use_min_cost_redistribution_plan() (autoparallel lowers its graph under it) only
    # picks torch's graph-based planner over its greedy one; for default shard orders
    # both compute the same redistribution, so redist_opt plans the call.
    monkeypatch.setattr(redist_opt.api.errors, "_warned", set())
    with LocalTensorMode(4) as lm:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        mesh["a", "b"]._flatten("a_b")
        dt = _partial_input(lm, mesh, [Partial(), Partial()], (4, 6))
        with use_min_cost_redistribution_plan(), CommDebugMode() as plain:
            expected = dt.redistribute(mesh, [Replicate()] * 2)
        with warnings.catch_warnings(record=True) as caught, use_min_cost_redistribution_plan():
            warnings.simplefilter("always")
            with redist_opt.enabled(), _observed_reasons() as reasons, CommDebugMode() as routed:
                out = dt.redistribute(mesh, [Replicate()] * 2)
        assert reasons == [None]
        assert not any("using torch's redistribute" in str(w.message) for w in caught)
        assert routed.get_total_counts() == 1 and plain.get_total_counts() == 1
        _assert_same(out, expected)


def test_non_default_shard_order_under_the_min_cost_flag_is_handed_back(monkeypatch):
    # S(0),S(0) sharded by mesh dim b first, then a: torch's graph-based planner's
    # territory, which redist_opt does not lower.
    monkeypatch.setattr(redist_opt.api.errors, "_warned", set())
    with LocalTensorMode(4) as lm:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        meta = tdt.tensor_meta((8, 3), (3, 1), torch.float64)
        current = DTensorSpec(mesh, (Shard(0), Shard(0)), meta, shard_order=(ShardOrderEntry(0, (1, 0)),))
        target = DTensorSpec(mesh, (Replicate(), Replicate()), meta)
        local = lm.rank_map(lambda r: torch.full((2, 3), float(r), dtype=torch.float64))
        with use_min_cost_redistribution_plan():
            expected = tdt.TORCH_REDISTRIBUTE_LOCAL(local, current, target)
            with redist_opt.enabled(), _observed_reasons() as reasons:
                with pytest.warns(UserWarning, match="non-default shard order"):
                    torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
                    out = torch_module.redistribute_local_tensor(local, current, target)
        assert len(reasons) == 1 and "non-default shard order" in reasons[0]
        for r in range(4):
            assert torch.equal(out._local_tensors[r], expected._local_tensors[r]), r


@pytest.mark.parametrize("size", [3, 9])
def test_hand_back_with_rank_dependent_sizes_is_decided_once(monkeypatch, size):
    # The graph-based planner requested (torch's make_full_tensor test helper does):
    # handed back. S(1),S(1),S(1) -> S(1),R,R on 2x2x2 with b+c flattened: torch
    # gathers over c, then b, and its merge pass joins the two over b_c, padding by
    # dim 1's size after mesh dim a's split. Under LocalTensorMode that size is one
    # value per rank: 2 or 1 for size 3 (and c's size, 1 or 0, does not order against
    # it the same way on every rank), 5 or 4 for size 9 (uneven on the a=0 ranks
    # only). Uneven on some rank: the merge pass is off for the call, decided once (for
    # torch's cached plan: tests/api/test_hand_back.py clears it in between).
    decisions = []
    real_check = tdt.uneven_all_gather_merge_in

    def counted(*args):
        decisions.append(real_check(*args))
        return decisions[-1]

    monkeypatch.setattr(tdt, "uneven_all_gather_merge_in", counted)
    with LocalTensorMode(8) as lm:
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
        mesh["b", "c"]._flatten("b_c")
        full = torch.arange(4 * size, dtype=torch.float32).reshape(4, size)
        dt = distribute_tensor(full, mesh, [Shard(1)] * 3)
        current = dt._spec
        target = DTensorSpec(mesh, (Shard(1), Replicate(), Replicate()), current.tensor_meta)
        with tdt.reference_semantics():
            expected = tdt.TORCH_REDISTRIBUTE_LOCAL(
                dt._local_tensor, current, target, use_graph_based_transform=True
            )
        torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
        with redist_opt.enabled(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = [
                torch_module.redistribute_local_tensor(
                    dt._local_tensor, current, target, use_graph_based_transform=True
                )
                for _ in range(3)
            ]
        assert decisions == [True]
        for out in outs:
            for r in lm.ranks:
                assert torch.equal(out._local_tensors[r], expected._local_tensors[r]), r
