"""``redist_opt.tune`` on 4 gloo ranks: a step's rewrite decided by the step's times, the
same decisions, profile bytes and collectives on every rank, and a skewed rank that
changes nothing of that (programs: ``tests/support/tune_programs.py``). The three
tunings run one after the other on one start of the 4 ranks (``tune_each``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from support import tune_programs

from redist_opt.tools.spawn import run_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo"),
    pytest.mark.xdist_group("tune_gloo"),  # the tunings fixture: 4 gloo ranks, started once
]


@pytest.fixture(scope="module")
def tunings(tmp_path_factory):
    """Every rank's result of each tuning, and the folder of the profiles they wrote."""
    folder = tmp_path_factory.mktemp("tune_gloo")
    results = run_ranks(tune_programs.tune_each, 4, (str(folder),), timeout=900)
    return {name: [r[name] for r in results] for name in results[0]}, folder


def _same_on_every_rank(results, *keys):
    for key in keys:
        assert all(r[key] == results[0][key] for r in results), key


def test_tuning_the_eager_step_writes_one_profile_every_rank_follows(tunings):
    by_name, folder = tunings
    results, path = by_name["eager"], folder / "eager.json"
    _same_on_every_rank(results, "decisions", "digest", "slower_in_steps", "after", "times")
    (decision,) = results[0]["decisions"]
    rewrite, keep, ratio, interval = decision
    assert rewrite == tune_programs.MERGE and interval[0] <= ratio <= interval[1]
    # the restarted step runs the decision: one all_reduce over both dims, or torch's two
    assert results[0]["after"]["counts"] == {"c10d_functional.all_reduce": 1 if keep else 2}
    assert results[0]["after"]["out"] == [[10.0] * 8] * 16  # 1 + 2 + 3 + 4 on every element
    # (2 variants + 1 candidate) * (1 warm-up + 8 rounds + 2 steps in each of 3 memory rounds)
    assert results[0]["steps"] == 45
    with open(path) as f:
        profile = json.load(f)
    record = profile["calibration"]["tune"]
    assert record["torch"] == torch.__version__
    assert (record["backend"], record["world_size"], record["compiler"], record["groups"]) == (
        "gloo",
        4,
        None,
        "create",
    )
    assert record["meshes"] and all(m.startswith("(a=2,b=2)") for m in record["meshes"]), record["meshes"]
    assert [d["rewrite"] for d in record["decisions"]] == [tune_programs.MERGE]
    assert set(record["times"]) == {"torch", "ours", f"ours without {tune_programs.MERGE}"}
    assert all(len(ts) == 8 for ts in record["times"].values())
    # every variant's peak bytes, from every rank's 3 memory rounds; the step holds at least
    # its result (16 x 8 float32) and the buffers of its all_reduces
    assert record["memory_rounds"] == 3 and record["memory_device"] == "cpu"
    assert set(record["peaks"]) == set(record["times"])
    for peak in record["peaks"].values():
        assert len(peak["per_rank"]) == 4 and all(len(r) == 3 for r in peak["per_rank"])
        assert peak["bytes"] == max(min(r) for r in peak["per_rank"]) >= 16 * 8 * 4
    assert (tune_programs.MERGE in profile["model"]["slower_in_steps"]) is (not keep)


def test_a_rewrite_that_slows_the_step_is_dropped_on_every_rank_though_one_rank_is_late(tunings):
    # rank 2 sleeps 10 ms in every step; every rank's step sleeps 30 ms more when it is
    # planned with the merge (the injected cost of the rewrite)
    results = tunings[0]["skewed"]
    _same_on_every_rank(results, "decisions", "digest", "slower_in_steps", "after", "times")
    (decision,) = results[0]["decisions"]
    assert decision[:2] == (tune_programs.MERGE, False)
    assert decision[3][1] < 1.0  # the whole interval below 1: slower with it
    assert tune_programs.MERGE in results[0]["slower_in_steps"]
    assert results[0]["after"]["counts"] == {"c10d_functional.all_reduce": 2}
    # every timed step waited for the late rank: no per-rank time leaked into the decision
    assert min(min(ts) for ts in results[0]["times"].values()) >= 0.01


def test_tuning_a_compiled_step_compiles_each_variant_and_the_restart_equals_torch(tunings):
    results = tunings[0]["compiled"]
    _same_on_every_rank(results, "decisions", "digest")
    assert [name for name, _ in results[0]["decisions"]] == [tune_programs.MERGE]
    assert results[0]["compiles"] == 3  # torch, ours, ours without merge-reductions
    assert all(r["equal_to_torch"] for r in results)
