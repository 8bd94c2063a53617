"""Decision accuracy (`python -m benchmarks.decisions`): the cases, the alternatives the
pipeline chooses between, how a profile's picks are judged against measured times,
and one live case on 8 gloo ranks."""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks.decisions import (
    RANKS,
    DecisionCase,
    alternatives,
    decision_cases,
    format_decisions,
    judge,
    measure_decisions,
    told_apart,
)
from redist_opt.ir.cost import CostModel

LOSS = DecisionCase("loss", "dp=2,cp=2,tp=2", (), "P,P,P", "R,R,R", ())


def test_cases_are_eight_rank_and_scaled_down():
    cases = decision_cases(targets=(4096,))
    assert cases and all(math.prod(c.spec().sizes) == RANKS for c in cases)
    assert all(math.prod(c.shape) * 4 <= 4096 for c in cases)
    assert len({c.id for c in cases}) == len(cases)
    # Scalars (loss, grad norm) once however many targets.
    assert len([c for c in decision_cases(targets=(4096, 1 << 20)) if c.shape == ()]) == len(
        [c for c in cases if c.shape == ()]
    )


def test_alternatives_of_a_loss_reduction_are_separate_and_merged():
    alts = alternatives(LOSS, [])
    ops = sorted(len(p.collectives()) for _, p in alts)
    assert ops[0] == 1 and ops[-1] == 3  # one all_reduce over 8 ranks, or one per dim
    assert alts[0][0] == "torch-nomerge"
    # No choice to make: a redistribution with a single plan has no alternatives.
    assert alternatives(DecisionCase("x", "dp=2,cp=2,tp=2", (), "S(0),R,R", "S(0),R,R", (8, 8)), []) == []


def _measured(times: dict[str, float], stderr: float = 1e-4) -> dict:
    alts = alternatives(LOSS, [])
    by_count = {len(p.collectives()): (label, p) for label, p in alts}
    return {
        "ranks": RANKS,
        "iters": 5,
        "wall_s": 0.0,
        "cases": [
            {
                "case": {"id": "loss"},
                "equal": True,
                "alternatives": [
                    {"label": by_count[n][0], "plan": by_count[n][1], "median_s": t, "stderr_s": stderr}
                    for n, t in times.items()
                ],
            }
        ],
    }


def test_judge_counts_the_pick_against_the_measured_faster_one():
    measured = _measured({3: 0.020, 1: 0.010})  # one merged all_reduce measured faster
    gloo, ring = judge(measured, CostModel.profile("gloo")), judge(measured, CostModel.profile("gloo-ring"))
    assert (gloo["judged"], gloo["correct"], gloo["accuracy"]) == (1, 1, 1.0)
    assert (ring["judged"], ring["correct"], ring["accuracy"]) == (1, 0, 0.0)  # the ring model splits it
    (pair,) = ring["pairs"]
    assert pair["beyond_noise"] and pair["measured_faster"] == "b" and pair["model_pick"] == "a"


def test_judge_leaves_out_differences_within_noise():
    noisy = judge(_measured({3: 0.0100, 1: 0.0102}), CostModel.profile("gloo"))  # 2%: below 5%
    wide = judge(_measured({3: 0.020, 1: 0.010}, stderr=0.01), CostModel.profile("gloo"))  # 3 sigma = 42 ms
    for v in (noisy, wide):
        assert v["judged"] == 0 and math.isnan(v["accuracy"]) and v["pairs"][0]["correct"] is None


def test_profiles_sharing_a_name_are_told_apart_by_file():
    four = dataclasses.replace(CostModel.profile("gloo"), name="gloo-calibrated-4")
    models = told_apart([four, four, CostModel.profile("nccl")], ["runs/a.json", "b.json", "nccl"])
    assert [m.name for m in models] == ["gloo-calibrated-4 (a.json)", "gloo-calibrated-4 (b.json)", "nccl"]
    verdicts = [judge(_measured({3: 0.020, 1: 0.010}), m) for m in models]
    header = format_decisions(verdicts, _measured({3: 0.020, 1: 0.010})).splitlines()[len(models) + 2]
    assert header.split()[-3:] == ["a.json", "b.json", "nccl"]


@pytest.mark.slow
def test_one_case_live_on_eight_gloo_ranks():
    res = measure_decisions([LOSS], [CostModel.profile("gloo")], iters=2, warmup=1, timeout=300)
    (case,) = res["cases"]
    assert case["equal"] and len(case["alternatives"]) >= 2
    assert all(a["median_s"] > 0 and a["stderr_s"] >= 0 for a in case["alternatives"])
    assert len(judge(res, CostModel.profile("gloo"))["pairs"]) == math.comb(len(case["alternatives"]), 2)
