"""The drop-in API: autograd, dtype options, enabled(), groups policies at run time."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.dtensor_values import assert_same_locals as _assert_same
from support.dtensor_values import locals_of as _locals
from support.dtensor_values import partial_input as _partial_input
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api import planning, specs
from redist_opt.ir import cost
from redist_opt.ir.cost import CostModel
from redist_opt.torch_api.dtensor import reference_semantics


def test_backward_matches_torch():
    with LocalTensorMode(4):
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        for src, dst in [
            ([Shard(0), Shard(1)], [Replicate(), Replicate()]),
            ([Shard(0), Replicate()], [Shard(1), Shard(0)]),
        ]:
            # Even shape: torch's own backward hashes per-rank sizes and fails on uneven
            # shards under LocalTensorMode.
            g = torch.arange(48, dtype=torch.float64).reshape(8, 6)
            x1 = distribute_tensor(g, mesh, src, src_data_rank=None).requires_grad_()
            x2 = distribute_tensor(g, mesh, src, src_data_rank=None).requires_grad_()
            y1 = redist_opt.redistribute(x1, dst)
            with reference_semantics():
                y2 = x2.redistribute(mesh, dst)
                (y2.to_local() * 3).sum().backward()
            (y1.to_local() * 3).sum().backward()
            assert x1.grad.placements == x2.grad.placements
            _assert_same(x1.grad, x2.grad)


def test_forward_dtype_and_backward_dtype():
    with LocalTensorMode(4):
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        g = torch.arange(32, dtype=torch.float32).reshape(8, 4)
        x = distribute_tensor(g, mesh, [Shard(0), Shard(1)], src_data_rank=None).requires_grad_()
        y = redist_opt.redistribute(
            x, [Replicate(), Replicate()], forward_dtype=torch.bfloat16, backward_dtype=torch.float64
        )
        assert y.dtype == torch.bfloat16 and y.to_local().dtype == torch.bfloat16
        y.to_local().float().sum().backward()
        assert x.grad.dtype == torch.float32


def test_enabled_routes_dtensor_redistribute():
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        dt = _partial_input(lm, mesh, [Partial(), Partial()], (6, 3))
        original = DTensor.redistribute
        calls = []
        real = redist_opt.api.eager.redistribute_local_tensor

        def spy(*a, **k):
            calls.append(k["options"].groups)
            return real(*a, **k)

        redist_opt.api.eager.redistribute_local_tensor = spy
        try:
            with redist_opt.enabled(groups="existing"):
                out = dt.redistribute(mesh, [Replicate(), Shard(0)])
        finally:
            redist_opt.api.eager.redistribute_local_tensor = real
        assert DTensor.redistribute is original
        assert calls == ["existing"]
        with reference_semantics():
            ref = dt.redistribute(mesh, [Replicate(), Shard(0)])
        _assert_same(out, ref)


def test_world_group_merges_without_flattening():
    with LocalTensorMode(16) as lm:
        mesh = init_device_mesh("cpu", (2, 2, 2, 2), mesh_dim_names=("a", "b", "c", "d"))
        dt = _partial_input(lm, mesh, [Partial()] * 4, (4, 3))
        with CommDebugMode() as cdm:
            out = redist_opt.redistribute(dt, [Replicate()] * 4)
        assert cdm.get_total_counts() == 1
        with reference_semantics():
            ref = dt.redistribute(mesh, [Replicate()] * 4)
        _assert_same(out, ref)


def test_unflatten_view_uses_the_root_dim_group():
    with LocalTensorMode(16) as lm:
        world = init_device_mesh("cpu", (16,), mesh_dim_names=("w",))
        mesh = world._unflatten(0, (4, 2, 2), ("dp", "cp", "tp"))
        dt = _partial_input(lm, mesh, [Partial(), Partial(), Replicate()], (8, 3))
        # dp+cp is not a dim of any mesh we hold, but P,P,P -> R,R,R over all three
        # is exactly the root's "w" group.
        dt3 = _partial_input(lm, mesh, [Partial()] * 3, (8, 3))
        with CommDebugMode() as cdm:
            out = redist_opt.redistribute(dt3, [Replicate()] * 3)
        assert cdm.get_total_counts() == 1
        with reference_semantics():
            _assert_same(out, dt3.redistribute(mesh, [Replicate()] * 3))
        with CommDebugMode() as cdm:
            redist_opt.redistribute(dt, [Replicate()] * 3)
        assert cdm.get_total_counts() == 2


def test_create_policy_creates_and_caches_a_flattened_group():
    with LocalTensorMode(8) as lm:
        root = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("a", "b", "c"))
        dt = _partial_input(lm, root, [Partial(), Replicate(), Partial()], (8, 3))
        with CommDebugMode() as cdm:
            out = redist_opt.redistribute(dt, [Replicate()] * 3, groups="create")
        assert cdm.get_total_counts() == 1
        assert len(root._flatten_mapping) == 1
        flat = next(iter(root._flatten_mapping.values()))
        redist_opt.redistribute(dt, [Replicate()] * 3, groups="create")
        assert len(root._flatten_mapping) == 1 and next(iter(root._flatten_mapping.values())) is flat
        with reference_semantics():
            _assert_same(out, dt.redistribute(root, [Replicate()] * 3))


def test_unavailable_group_falls_back_and_warns_once(monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("backend cannot create communicators")

    with LocalTensorMode(8) as lm:
        root = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("x", "y", "z"))
        dt = _partial_input(lm, root, [Partial(), Partial(), Replicate()], (6, 3))
        monkeypatch.setattr(redist_opt.runtime.flattened_meshes, "create_flattened_mesh", refuse)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with CommDebugMode() as cdm:
                out = redist_opt.redistribute(dt, [Replicate()] * 3, groups="create")
                out2 = redist_opt.redistribute(dt, [Replicate()] * 3, groups="create")
        assert cdm.get_total_counts() == 4  # two unmerged plans of two all_reduces
        fallbacks = [x for x in w if "unmerged plan" in str(x.message)]
        assert len(fallbacks) == 1, [str(x.message) for x in w]
        with reference_semantics():
            ref = dt.redistribute(root, [Replicate()] * 3)
        _assert_same(out, ref)
        _assert_same(out2, ref)


def test_a_moved_private_torch_name_is_never_an_unavailable_group(monkeypatch):
    from redist_opt.torch_api.version import TorchAPIError

    def moved(*a, **k):
        raise TorchAPIError("redist_opt needs torch's private name torch.x._y")

    with LocalTensorMode(8) as lm:
        root = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2), mesh_dim_names=("x", "y", "z"))
        dt = _partial_input(lm, root, [Partial(), Partial(), Replicate()], (6, 3))
        monkeypatch.setattr(redist_opt.runtime.flattened_meshes, "create_flattened_mesh", moved)
        with pytest.raises(TorchAPIError, match="torch.x._y"):
            redist_opt.redistribute(dt, [Replicate()] * 3, groups="create")


def test_bad_groups_policy():
    with pytest.raises(redist_opt.RedistributeError, match="groups='sometimes'"):
        redist_opt.optimize(
            redist_opt.plan(redist_opt.MeshSpec((2,)), "P", "R", shape=(2,)), groups="sometimes"
        )


def test_replicas_bitwise_equal_across_hosts_with_consistency():
    # Two dims straddling hosts (devices_per_host=2: dim a crosses hosts). With a
    # ring profile whose inter-host latency makes the merged all_reduce slower,
    # prefer="time" with max_collectives="any" keeps two reductions; prefer="consistency" merges anyway so
    # every replica comes from one reduction.
    ring = CostModel(
        name="ring",
        launch=0.0,
        alpha_intra=1e-6,
        alpha_inter=1e-3,
        bw_intra=1e12,
        bw_inter=1e12,
        devices_per_host=2,
        algorithm="ring",
    )
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        mesh["a", "b"]._flatten()
        g = torch.randn(6, 5, dtype=torch.float32)
        dt = DTensor.from_local(
            lm.rank_map(lambda r: g * (r + 1) / 3), mesh, [Partial(), Partial()], run_check=False
        )
        with CommDebugMode() as cdm:
            timed = redist_opt.redistribute(dt, [Replicate(), Replicate()], cost=ring, max_collectives="any")
        assert cdm.get_total_counts() == 2
        with CommDebugMode() as cdm:  # by default: never more collectives than torch's 1
            redist_opt.redistribute(dt, [Replicate(), Replicate()], cost=ring)
        assert cdm.get_total_counts() == 1
        with CommDebugMode() as cdm:
            out = redist_opt.redistribute(dt, [Replicate(), Replicate()], cost=ring, prefer="consistency")
        assert cdm.get_total_counts() == 1
        replicas = list(_locals(out).values())
        assert all(torch.equal(replicas[0], x) for x in replicas[1:])
        torch.testing.assert_close(replicas[0], _locals(timed)[0])


def test_clear_caches_forgets_all_five_caches(tmp_path, monkeypatch):
    # Each cache hands back the same object until clear_caches(); then it is rebuilt.
    path = tmp_path / "profile.json"
    cost.CostModel.default().save(path)
    monkeypatch.setenv(cost.PROFILE_ENV, str(path))
    with LocalTensorMode(4):
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))

        def build():
            spec = specs.spec_of(mesh)
            naive = redist_opt.plan(mesh, "P,P", "R,S(0)", shape=(8, 4))
            options = redist_opt.PlanOptions()
            return dict(
                spec=spec,
                plan=naive,
                pipeline=redist_opt.optimize(naive),
                hot=planning.plans_for(spec, naive.src, naive.dst, naive.shape, naive.dtype, options),
                profile=cost.resolve(spec)[0],
            )

        first, again = build(), build()
        assert all(again[k] is first[k] for k in first)
        redist_opt.clear_caches()
        rebuilt = build()
    for k in first:
        assert rebuilt[k] is not first[k], k
    assert rebuilt["spec"] == first["spec"] and rebuilt["profile"] == first["profile"]
    assert rebuilt["plan"].steps == first["plan"].steps
