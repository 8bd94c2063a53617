"""``redist_opt.profile_steps``: in-step collective costs, agreed across ranks and fitted
into a cost profile. The pure parts (agreement, fit) on made-up numbers; the whole block on
4 real gloo ranks, one of them late."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from support import step_costs_programs

import redist_opt
from redist_opt.api import step_costs
from redist_opt.ir.c10d_backends import world_backend
from redist_opt.ir.cost import CostModel
from redist_opt.tools.spawn import run_ranks


def test_agreement_takes_the_slowest_rank_and_is_the_same_for_any_rank():
    per_rank = [
        {("all_reduce", 2, 1024): (0.001, 3)},
        {("all_reduce", 2, 1024): (0.004, 3), ("all_gather", 4, 64): (0.002, 1)},
    ]
    agreed = step_costs.agree(per_rank)
    assert [(m["kind"], m["p"], m["nbytes"], m["time"]) for m in agreed] == [
        ("all_gather", 4, 64, 0.002),
        ("all_reduce", 2, 1024, 0.004),
    ]
    assert agreed[1]["rank_medians"] == [0.001, 0.004]
    assert step_costs.agree(list(per_rank)) == agreed


def test_fit_replaces_the_measured_curves_only():
    base = CostModel.profile("gloo")
    measured = [
        {"kind": "all_reduce", "p": 4, "nbytes": 1024, "time": 0.050},
        {"kind": "all_reduce", "p": 4, "nbytes": 4096, "time": 0.060},
        {"kind": "all_gather", "p": 2, "nbytes": 512, "time": 0.020},  # one size: base slope
    ]
    model = step_costs.fit(base, measured)
    assert model.name == "in-step gloo"
    assert model.time_of("all_reduce", 4, "intra", 1024) == pytest.approx(0.050)
    assert model.time_of("all_reduce", 4, "intra", 4096) == pytest.approx(0.060)
    assert model.time_of("all_gather", 2, "intra", 512) == pytest.approx(0.020)
    # an unmeasured (kind, size) keeps the base profile's curve
    assert model.time_of("reduce_scatter", 8, "intra", 4096) == base.time_of(
        "reduce_scatter", 8, "intra", 4096
    )
    # and the model round-trips through a profile file
    assert step_costs.fit(model, measured) == model


def test_each_measured_size_costs_what_was_measured_there():
    # In a step the loss's scalar all_reduce waits for the slowest rank's forward; a 4 KiB
    # gradient all_reduce later in the step does not. Made non-decreasing in size, the
    # gradient's would cost the scalar's wait, and a rewrite that replaces it would look
    # cheaper than it is (the norm weights' fold of SimpleFSDP + TP, docs/step_wall.md).
    measured = [
        {"kind": "all_reduce", "p": 2, "nbytes": 8, "time": 0.0315},
        {"kind": "all_reduce", "p": 2, "nbytes": 4096, "time": 0.0029},
        {"kind": "all_reduce", "p": 2, "nbytes": 65536, "time": 0.0040},
    ]
    model = step_costs.fit(CostModel.profile("gloo"), measured)
    for m in measured:
        assert model.time_of("all_reduce", 2, "intra", m["nbytes"]) == pytest.approx(m["time"])


def test_measurements_of_a_later_block_replace_those_of_an_earlier_one_per_key():
    a = [
        {"kind": "all_reduce", "p": 2, "nbytes": 8, "time": 1.0},
        {"kind": "all_gather", "p": 2, "nbytes": 8, "time": 2.0},
    ]
    b = [{"kind": "all_reduce", "p": 2, "nbytes": 8, "time": 3.0}]
    assert [m["time"] for m in step_costs.merge(a, b)] == [2.0, 3.0]


def test_the_fake_backend_is_refused_at_entry():
    assert dist.get_backend() == "fake"  # the tests' process group (tests/conftest.py)
    with pytest.raises(redist_opt.RedistributeError, match="fake"):
        with redist_opt.profile_steps("unused.json"):
            pass


@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_one_late_rank_leaves_every_rank_with_the_same_profile_and_plan(tmp_path):
    late_s = 0.05
    path = str(tmp_path / "in_step.json")
    results = run_ranks(step_costs_programs.skewed_steps, 4, (path, 3, late_s), timeout=240)
    assert len({r["digest"] for r in results}) == 1
    assert len({r["plan"] for r in results}) == 1
    assert results[0]["measurements"] == results[3]["measurements"]
    # The pair all_reduces carry the wait for rank 3: its partners wait at one of their two
    # 1 KiB pair all_reduces a step, so their median is about half the lateness.
    pair = next(
        m for m in results[0]["measurements"] if (m["kind"], m["p"], m["nbytes"]) == ("all_reduce", 2, 1024)
    )
    assert pair["time"] >= 0.4 * late_s
    assert (
        results[0]["pair_all_reduce_1KiB_s"]
        >= 0.4 * late_s
        > CostModel.profile("gloo").time_of("all_reduce", 2, "intra", 1024)
    )
    with open(path) as f:
        record = json.load(f)["calibration"]["in_step"]
    assert record["backend"] == "gloo"
    assert {(m["kind"], m["p"]) for m in record["measurements"]} == {("all_reduce", 2), ("reduce_scatter", 4)}
    # the c10d all_reduce is other communication: counted (3 steps) and its issue timed
    assert record["other_communication"] == results[0]["other_communication"]
    [(op, other)] = record["other_communication"].items()
    assert op.startswith("allreduce_") and other["calls"] == 3 and other["issue_s"] > 0


@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_ranks_that_start_from_different_files_all_raise(tmp_path):
    paths = [str(tmp_path / f"rank{r}.json") for r in range(4)]
    CostModel.profile("nccl").save(paths[1])  # the others start from the gloo backend's profile
    results = run_ranks(step_costs_programs.differing_files, 4, (paths,), timeout=240)
    assert all("ranks [1] read another profile" in r for r in results), results


def test_a_default_group_with_a_backend_per_device_gets_the_profile_of_this_device(monkeypatch):
    # torchrun + init_process_group() with no backend: get_backend() says "undefined", and
    # the group's config names one backend per device
    monkeypatch.delenv("REDIST_OPT_COST_PROFILE", raising=False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "undefined")
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "cpu:gloo,cuda:nccl")
    assert world_backend() == "gloo"
    assert step_costs.world_profile(world_backend()).name == "gloo"
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    assert world_backend() == "nccl"
    assert step_costs.world_profile("nccl").name == "nccl"
