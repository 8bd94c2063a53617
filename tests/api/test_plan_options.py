"""``PlanOptions``: one frozen, hashable value, checked where options enter the API."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_api import _assert_same, _partial_input
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate

import redist_opt
from redist_opt import PlanOptions, RedistributeError
from redist_opt.api import routing
from redist_opt.ir.cost import CostModel

PLAN = dict(mesh=redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b")), src="P,P", dst="R,R", shape=(4, 4))


def _plan():
    return redist_opt.plan(PLAN["mesh"], PLAN["src"], PLAN["dst"], shape=PLAN["shape"])


def test_equal_options_are_one_value_and_a_cache_key():
    a = PlanOptions.of(groups=["a+b"], cost="gloo")
    b = PlanOptions(groups=("a+b",), cost=CostModel.profile("gloo"))
    assert a == b and hash(a) == hash(b) and PlanOptions.of(groups=["a+b"], cost="gloo") is a
    assert {a: 1}[b] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.prefer = "consistency"
    assert PlanOptions.of(a, prefer="consistency").prefer == "consistency" and a.prefer == "time"


@pytest.mark.parametrize("name", ["nccl", "gloo", "gloo-ring"])
def test_optimize_takes_a_cost_profile_name(name):
    by_name = redist_opt.optimize(_plan(), cost=name, groups="create")
    by_model = redist_opt.optimize(_plan(), cost=CostModel.profile(name), groups="create")
    assert by_name.cost_profile == by_model.cost_profile and name in by_name.cost_profile
    assert str(by_name.graph.graph) == str(by_model.graph.graph)


def test_a_profile_file_is_a_cost(tmp_path):
    path = tmp_path / "measured.json"
    CostModel.profile("gloo-ring").save(path)
    assert PlanOptions.of(cost=str(path)).cost == CostModel.profile("gloo-ring")


@pytest.mark.parametrize("cost", ["ncl", 3, object(), "/no/such/profile.json"])
def test_optimize_refuses_another_cost_at_entry(cost):
    with pytest.raises(RedistributeError, match="cost="):
        redist_opt.optimize(_plan(), cost=cost)


@pytest.mark.parametrize(
    "bad,named",
    [
        (dict(cost="ncl"), "cost="),
        (dict(prefer="fast"), "prefer="),
        (dict(groups="some"), "groups="),
        (dict(max_collectives="few"), "max_collectives="),
        (dict(passes="merge"), "passes="),
        (dict(passes=("merge-reductions",)), "'merge-reductions' is not a pass class"),
        (dict(colour="blue"), "colour"),
    ],
)
def test_enabled_refuses_bad_options_at_entry_before_any_call(bad, named):
    with pytest.raises(RedistributeError, match=named):
        with redist_opt.enabled(**bad):
            pytest.fail("the block must not be entered")
    assert routing.active_options() is None


def test_enabled_with_a_profile_name_plans_calls_with_that_profile():
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
        dt = _partial_input(lm, mesh, [Partial(), Partial()], (6, 3))
        expected = dt.redistribute(mesh, [Replicate(), Replicate()])
        with redist_opt.enabled(cost="nccl"):
            assert routing.active_options().cost == CostModel.profile("nccl")
            out = dt.redistribute(mesh, [Replicate(), Replicate()])
        _assert_same(out, expected)


def test_every_entry_point_takes_options_or_its_fields():
    options = PlanOptions(groups="create", prefer="consistency")
    assert redist_opt.optimize(_plan(), options=options).num_collectives == 1
    with redist_opt.enabled(options=options):
        assert routing.active_options() == options
    with redist_opt.enabled("existing", options=options):  # the default groups leave options' groups
        assert routing.active_options().groups == "create"
    assert redist_opt.backend("aot_eager", options=options).options == options
    with pytest.raises(RedistributeError, match="options="):
        redist_opt.optimize(_plan(), options={"groups": "create"})


@pytest.mark.parametrize(
    "entry",
    [
        lambda **o: redist_opt.redistribute(None, "R", **o),
        lambda **o: redist_opt.redistribute_cost(None, None, **o),
        lambda **o: redist_opt.backend("aot_eager", **o),
        lambda **o: redist_opt.optimize(_plan(), **o),
    ],
    ids=["redistribute", "redistribute_cost", "backend", "optimize"],
)
def test_each_entry_point_checks_the_options_first(entry):
    with pytest.raises(RedistributeError, match="cost=3"):
        entry(cost=3)
