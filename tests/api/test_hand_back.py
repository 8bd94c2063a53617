"""A call handed back to torch runs nothing of redist_opt's that can fail, and is cached
like a planned call.

* A planner-level hand-back (what the IR does not lower, decided from the placements,
  shape and dtype: the same on every rank) is decided before any store round and never
  plans; the next call with the same specs finds it with one lookup.
* Whether torch's merge pass is off for a hand-back (its uneven all_gather merge bug)
  is read from the plan torch's own call runs: torch's plan cache ignores
  ``use_min_cost_redistribution_plan()``, so after ``_gen_transform_infos.cache_clear()``
  the same specs may get other steps; the check reruns then, and only then.
* Where torch's planner raises, nothing is decided silently: torch's own call raises
  its own error.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from support.meshes import ensure_fake_pg
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor import _redistribute as torch_redistribute
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

import redist_opt
from redist_opt.api import eager
from redist_opt.torch_api import dtensor as tdt

R = Replicate()


def _no_store_round(*args, **kwargs):
    raise AssertionError("a hand-back ran a store round")


def _no_planning(*args, **kwargs):
    raise AssertionError("a hand-back planned")


def test_a_planner_hand_back_runs_no_store_round_and_is_cached(monkeypatch):
    # Complex partials reduced by max: handed back (c10d reduces complex numbers by sum
    # and avg only). torch raises its own error for it; so does the hand-back, each time.
    ensure_fake_pg()
    redist_opt.clear_caches()
    reasons = []
    real_reason = eager.fallback_reason

    def counted(*args):
        reasons.append(real_reason(*args))
        return reasons[-1]

    monkeypatch.setattr(eager.consensus, "check_planning_inputs", _no_store_round)
    monkeypatch.setattr(eager, "plans_for", _no_planning)
    monkeypatch.setattr(eager, "fallback_reason", counted)
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        local = lm.rank_map(lambda r: torch.full((4, 3), float(r + 1), dtype=torch.complex64))
        dt = DTensor.from_local(local, mesh, [Partial("max"), R], run_check=False)
        with pytest.raises(Exception) as torch_error:
            dt.redistribute(mesh, [R, R])
        target = tdt.respec(dt._spec, placements=(R, R))
        assert eager.cached_runner(dt._local_tensor, dt._spec, target, redist_opt.PlanOptions()) is None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(3):
                with pytest.raises(type(torch_error.value)) as ours:
                    redist_opt.redistribute(dt, [R, R])
                assert str(ours.value) == str(torch_error.value)
        run = eager.cached_runner(dt._local_tensor, dt._spec, target, redist_opt.PlanOptions())
        assert isinstance(run, tdt.TorchHandBack)
    assert reasons == ["complex partials reduced by max: c10d reduces complex numbers by sum and avg only"]


def test_a_shard_to_partial_call_is_handed_back_and_cached(monkeypatch):
    # torch 2.15 zero-fills Shard -> Partial("sum"); torch 2.13 refuses it in
    # DTensor.redistribute. redist_opt.redistribute accepts and refuses alike, hands an
    # accepted one to torch before any store round, and remembers it.
    ensure_fake_pg()
    redist_opt.clear_caches()
    monkeypatch.setattr(eager.consensus, "check_planning_inputs", _no_store_round)
    monkeypatch.setattr(eager, "plans_for", _no_planning)
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        full = torch.arange(30.0).reshape(6, 5)
        dt = distribute_tensor(full, mesh, [Shard(0), R])
        dst = [Partial(), R]
        if not tdt.ZERO_FILLS_SHARD_TO_PARTIAL:
            with pytest.raises(RuntimeError, match="Can not redistribute from") as torch_error:
                dt.redistribute(mesh, dst)
            with pytest.raises(RuntimeError, match="Can not redistribute from") as ours:
                redist_opt.redistribute(dt, dst)
            assert str(ours.value).startswith(str(torch_error.value))
            return
        want = dt.redistribute(mesh, dst)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = [redist_opt.redistribute(dt, dst) for _ in range(2)]
        target = tdt.respec(dt._spec, placements=tuple(dst))
        assert eager.cached_runner(dt._local_tensor, dt._spec, target, redist_opt.PlanOptions()) is not None
        for out in outs:
            assert tuple(out.placements) == tuple(want.placements)
            for r in lm.ranks:
                assert torch.equal(
                    out._local_tensor._local_tensors[r], want._local_tensor._local_tensors[r]
                ), r
        assert torch.equal(outs[0].full_tensor()._local_tensors[0], full)
        # Partial(avg) and Partial(max) targets: refused as torch refuses them
        for p in (Partial("avg"), Partial("max")):
            with pytest.raises(RuntimeError, match="only Shard to Partial\\(sum\\)"):
                dt.redistribute(mesh, [p, R])
            with pytest.raises(RuntimeError, match="only Shard to Partial\\(sum\\)"):
                redist_opt.redistribute(dt, [p, R])


def _uneven_gathers(lm):
    # S(1),S(1),S(1) -> S(1),R,R on 2x2x2 with b+c flattened, size 9: torch gathers over c
    # then b, and its merge pass joins them over b_c with an uneven size (5 or 4): a hit.
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    mesh["b", "c"]._flatten("b_c")
    full = torch.arange(36, dtype=torch.float32).reshape(4, 9)
    dt = distribute_tensor(full, mesh, [Shard(1)] * 3)
    target = DTensorSpec(mesh, (Shard(1), R, R), dt._spec.tensor_meta)
    return dt, target


def test_the_merge_bug_check_follows_the_plan_torchs_call_runs(monkeypatch):
    ensure_fake_pg()
    redist_opt.clear_caches()
    checks = []
    real_check = tdt.uneven_all_gather_merge_in

    def counted(*args):
        checks.append(real_check(*args))
        return checks[-1]

    monkeypatch.setattr(tdt, "uneven_all_gather_merge_in", counted)
    torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
    with LocalTensorMode(8) as lm:
        dt, target = _uneven_gathers(lm)
        with tdt.reference_semantics():
            expected = tdt.TORCH_REDISTRIBUTE_LOCAL(dt._local_tensor, dt._spec, target)

        def routed():  # the graph-based planner requested: handed back
            return torch_module.redistribute_local_tensor(
                dt._local_tensor, dt._spec, target, use_graph_based_transform=True
            )

        with redist_opt.enabled(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = [routed(), routed()]
            assert checks == [True]  # decided once for torch's cached plan
            torch_redistribute._gen_transform_infos.cache_clear()  # torch plans the call afresh
            outs.append(routed())
            assert checks == [True, True]  # a new plan object: checked again
            with torch_redistribute.use_min_cost_redistribution_plan():
                outs.append(routed())  # the same cached plan: not checked again
            assert checks == [True, True]
        for out in outs:
            for r in lm.ranks:
                assert torch.equal(out._local_tensors[r], expected._local_tensors[r]), r


def test_without_a_flattened_mesh_a_hand_back_reads_no_plan(monkeypatch):
    # torch's merge pass merges only over a flattened mesh: without one, a hand-back calls
    # torch's function directly, whichever plan torch runs.
    ensure_fake_pg()
    redist_opt.clear_caches()
    monkeypatch.setattr(tdt, "torch_transform_infos", _no_planning)
    torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        dt = distribute_tensor(torch.arange(15.0).reshape(5, 3), mesh, [Shard(0), Shard(0)])
        target = DTensorSpec(mesh, (R, R), dt._spec.tensor_meta)
        expected = tdt.TORCH_REDISTRIBUTE_LOCAL(dt._local_tensor, dt._spec, target)
        with redist_opt.enabled(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(2):
                out = torch_module.redistribute_local_tensor(
                    dt._local_tensor, dt._spec, target, use_graph_based_transform=True
                )
                for r in lm.ranks:
                    assert torch.equal(out._local_tensors[r], expected._local_tensors[r]), r


def test_where_torchs_planner_raises_torch_raises_its_own_error():
    # Shard(3) of a 2-D tensor: torch's greedy planner raises IndexError. The merge bug
    # check decides nothing (None, not False), and a handed-back call (Partial("prod") is
    # not lowered) raises torch's own error, on a mesh where the merge pass could run.
    ensure_fake_pg()
    redist_opt.clear_caches()
    torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        mesh["a", "b"]._flatten("a_b")
        meta = TensorMeta(torch.Size((4, 4)), (4, 1), torch.float32)
        current = DTensorSpec(mesh, (Shard(3), Partial("prod")), tensor_meta=meta)
        target = DTensorSpec(mesh, (R, R), tensor_meta=meta)
        assert tdt.hits_uneven_all_gather_merge(current, target) is None
        # undecided is never "no bug": the merge pass is off, right for every input
        assert tdt.TorchHandBack(mergeable=True).merges_off(current, target) is True
        local = lm.rank_map(lambda r: torch.ones(4, 4))
        with pytest.raises(Exception) as torch_error:
            tdt.TORCH_REDISTRIBUTE_LOCAL(local, current, target)
        with redist_opt.enabled(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(2):
                with pytest.raises(type(torch_error.value)) as ours:
                    torch_module.redistribute_local_tensor(local, current, target)
                assert str(ours.value) == str(torch_error.value)


def test_only_the_planners_own_errors_count_as_undecided(monkeypatch):
    # An error that is not torch's planner's (a private name or signature that moved)
    # propagates from the merge bug check, the hand-back and the zero-fill check alike.
    ensure_fake_pg()

    def moved(*args, **kwargs):
        raise AttributeError("module 'torch.distributed.tensor._redistribute' has no attribute 'x'")

    monkeypatch.setattr(tdt, "torch_transform_infos", moved)
    with LocalTensorMode(4):
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        meta = TensorMeta(torch.Size((4, 4)), (4, 1), torch.float32)
        current = DTensorSpec(mesh, (Shard(0), R), tensor_meta=meta)
        target = DTensorSpec(mesh, (Partial(), R), tensor_meta=meta)
        with pytest.raises(AttributeError):
            tdt.hits_uneven_all_gather_merge(current, target)
        with pytest.raises(AttributeError):
            tdt.TorchHandBack(mergeable=True).merges_off(current, target)
        if tdt.ZERO_FILLS_SHARD_TO_PARTIAL:
            with pytest.raises(AttributeError):
                tdt.torch_plan_zero_fills(DTensorSpec(mesh, (R, Shard(0)), tensor_meta=meta), target)


def test_a_zero_fill_torchs_graph_planner_chose_follows_torchs_plan_cache():
    # R,S(0) -> P,R through torch's redistribute_local_tensor (an implicit reshard's
    # target): torch's greedy planner gathers and divides by 2, as redist_opt's plan does;
    # torch 2.15's graph-based planner chunks and zero-fills (other values on the ranks).
    # Which one torch's call runs is whatever its plan cache holds (the cache ignores
    # use_min_cost_redistribution_plan()): redist_opt runs its plan exactly while torch's
    # call would run the greedy one, and hands the call back otherwise, call by call.
    ensure_fake_pg()
    redist_opt.clear_caches()
    torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        dt = distribute_tensor(torch.arange(64.0).reshape(8, 8), mesh, [R, Shard(0)])
        current = dt._spec
        target = DTensorSpec(mesh, (Partial(), R), tensor_meta=current.tensor_meta)

        def torch_call():
            return tdt.TORCH_REDISTRIBUTE_LOCAL(dt._local_tensor, current, target)

        def routed():
            with redist_opt.enabled(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch_module.redistribute_local_tensor(dt._local_tensor, current, target)

        def assert_same(out, want):
            for r in lm.ranks:
                assert torch.equal(out._local_tensors[r], want._local_tensors[r]), r

        torch_redistribute._gen_transform_infos.cache_clear()
        greedy = torch_call()  # torch's cache: the greedy plan
        assert_same(routed(), greedy)
        assert_same(routed(), greedy)  # cached
        with torch_redistribute.use_min_cost_redistribution_plan():
            assert_same(routed(), greedy)  # torch's cached plan is still the greedy one
            torch_redistribute._gen_transform_infos.cache_clear()
            min_cost = torch_call()  # now the graph-based plan
            assert_same(routed(), min_cost)
        assert_same(torch_call(), min_cost)  # the flag off, torch's cache still holds it
        assert_same(routed(), min_cost)
        if tdt.ZERO_FILLS_SHARD_TO_PARTIAL:
            assert not torch.equal(min_cost._local_tensors[0], greedy._local_tensors[0])
        torch_redistribute._gen_transform_infos.cache_clear()
        assert_same(routed(), greedy)
