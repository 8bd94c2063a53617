"""``redist_opt.redistribute_cost``: torch's signature and units (microseconds), priced
by our optimized plan; ``enabled(costs=True)`` puts it where DTensor's sharding
propagation looks it up, and restores torch's on exit.

Meshes are 2x4 (dp, tp) on ranks 0-7 of the session's 16-rank fake process group
(so the mesh is not the whole world: no dp+tp group exists unless flattened).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api import routing
from redist_opt.ir.cost import CostModel
from redist_opt.torch_api import dtensor as tdt

R, P, S0, S1 = Replicate(), Partial(), Shard(0), Shard(1)


def _mesh(flatten: bool):
    mesh = DeviceMesh("cpu", torch.arange(8).view(2, 4), mesh_dim_names=("dp", "tp"))
    if flatten:
        mesh["dp", "tp"]._flatten("dp_tp")
    return mesh


@pytest.fixture(scope="module")
def mesh24():
    return _mesh(False)


@pytest.fixture(scope="module")
def mesh24_flat():
    return _mesh(True)


def _specs(mesh, src, dst, shape=(64, 64), dtype=torch.float32):
    meta = tdt.tensor_meta(shape, (shape[1], 1), dtype)
    return tdt.make_spec(mesh, src, meta), tdt.make_spec(mesh, dst, meta)


def test_partial_to_replicate_is_cheaper_with_the_dp_tp_group(mesh24, mesh24_flat):
    without = redist_opt.redistribute_cost(*_specs(mesh24, (P, P), (R, R)))
    with_group = redist_opt.redistribute_cost(*_specs(mesh24_flat, (P, P), (R, R)))
    assert 0 < with_group < without
    # torch's estimate does not see the group: one all_reduce per mesh dim either way
    assert tdt.TORCH_REDISTRIBUTE_COST(*_specs(mesh24, (P, P), (R, R))) == tdt.TORCH_REDISTRIBUTE_COST(
        *_specs(mesh24_flat, (P, P), (R, R))
    )


@pytest.mark.parametrize(
    "src,dst", [((P, P), (R, R)), ((S0, S1), (R, R)), ((P, R), (S0, S0)), ((S0, R), (S1, R))]
)
def test_microseconds_of_the_optimized_plan(mesh24_flat, src, dst):
    current, target = _specs(mesh24_flat, src, dst, shape=(256, 128))
    opt = redist_opt.optimize(redist_opt.plan(mesh24_flat, src, dst, shape=(256, 128)))
    expected = CostModel.default().plan_time(opt) * 1e6  # fake backend: the default (NCCL-like) profile
    assert redist_opt.redistribute_cost(current, target) == pytest.approx(expected)
    # an explicit profile is used as given
    gloo = CostModel.profile("gloo")
    opt = redist_opt.optimize(redist_opt.plan(mesh24_flat, src, dst, shape=(256, 128)), cost=gloo)
    assert redist_opt.redistribute_cost(current, target, cost=gloo) == pytest.approx(
        gloo.plan_time(opt) * 1e6
    )


def test_torch_conventions(mesh24, mesh24_flat):
    assert redist_opt.redistribute_cost(*_specs(mesh24, (S0, R), (S0, R))) == 0.0
    assert redist_opt.redistribute_cost(*_specs(mesh24, (R, R), (S0, S1))) == 0.0  # local slicing only
    other = DeviceMesh("cpu", torch.arange(8).view(4, 2), mesh_dim_names=("x", "y"))
    a, _ = _specs(mesh24, (S0, R), (R, R))
    _, b = _specs(other, (S0, R), (R, R))
    assert redist_opt.redistribute_cost(a, b) == float("inf")  # different meshes
    # transitions to Partial are torch's: banned from Shard (inf), free from Replicate
    assert redist_opt.redistribute_cost(*_specs(mesh24, (S0, R), (P, R))) == float("inf")
    assert redist_opt.redistribute_cost(*_specs(mesh24, (R, R), (P, R))) == tdt.TORCH_REDISTRIBUTE_COST(
        *_specs(mesh24, (R, R), (P, R))
    )


def _cost_name():
    return {n: importlib.import_module(n).redistribute_cost for n in tdt.REDISTRIBUTE_COST_PATCH_POINTS}


def test_costs_routing_is_opt_in_and_restored():
    before = _cost_name()
    assert all(v is tdt.TORCH_REDISTRIBUTE_COST for v in before.values())
    with redist_opt.enabled():
        assert _cost_name() == before  # routing redistributions does not change costs
    with redist_opt.enabled(costs=True):
        assert all(v is routing.routed_redistribute_cost for v in _cost_name().values())
        assert routing.active_cost_options() is not None
        with redist_opt.enabled():  # a nested block without costs: torch's estimate again
            assert routing.active_cost_options() is None
        with redist_opt.enabled(groups="create", costs=True):
            assert routing.active_cost_options().groups == "create"
        assert all(v is routing.routed_redistribute_cost for v in _cost_name().values())
    assert _cost_name() == before
    assert routing.active_cost_options() is None


# -- a strategy DTensor chooses differently by our costs ----------------------------------


def _sharded(mesh, g, placements):
    return distribute_tensor(g, mesh, placements, src_data_rank=None)


def _step(op, args, *, costs: bool):
    """Run ``op`` inside enabled(costs=...): (output, collectives, modelled us, reshards)."""
    calls = []
    real = redist_opt.api.eager.redistribute_local_tensor

    def spy(local, current, target, **kwargs):
        calls.append((current, target))
        return real(local, current, target, **kwargs)

    redist_opt.api.eager.redistribute_local_tensor = spy
    try:
        with redist_opt.enabled(costs=costs), CommDebugMode() as comm:
            out = op(*args)
    finally:
        redist_opt.api.eager.redistribute_local_tensor = real
    modelled = sum(redist_opt.redistribute_cost(c, t) for c, t in calls)
    return out, comm.get_total_counts(), modelled, [(c.placements, t.placements) for c, t in calls]


def test_mm_strategy_changes_and_the_step_gets_cheaper():
    # mm(a, b) on 2x4 (dp, tp) with a dp+tp group; a = [S(1), S(0)], b = [S(1), S(1)].
    # torch's estimate (one collective per mesh dim, no merged group) picks the
    # strategy that keeps a's placements and reshards both inputs: 2 collectives.
    # Ours prices a: [S(1), S(0)] -> [R, R] at one all_gather over dp+tp (block
    # order restored locally), so DTensor picks that strategy instead: 1 collective.
    with LocalTensorMode(8):
        mesh = _mesh(True)
        g1 = (torch.arange(64 * 64).view(64, 64) % 7).float()
        g2 = (torch.arange(64 * 64).view(64, 64) % 5).float()
        a, b = _sharded(mesh, g1, [S1, S0]), _sharded(mesh, g2, [S1, S1])
        out_t, n_t, us_t, reshards_t = _step(torch.mm, (a, b), costs=False)
        out_o, n_o, us_o, reshards_o = _step(torch.mm, (a, b), costs=True)
        assert out_t.placements == (S1, S0) and out_o.placements == (S1, S1)
        assert reshards_o == [((S1, S0), (R, R))]
        assert n_t == 2 and n_o == 1
        assert us_o < us_t
        full_t, full_o = out_t.full_tensor(), out_o.full_tensor()
        expected = g1 @ g2
        for r in range(8):
            assert torch.equal(full_t._local_tensors[r], expected)
            assert torch.equal(full_o._local_tensors[r], expected)
        # outside the block: torch's choice again (its cached strategies were cleared)
        assert torch.mm(a, b).placements == (S1, S0)
