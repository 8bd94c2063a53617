"""``benchmarks/gloo_decision.py``: the built-in gloo decision written from a tuned wall run."""

from __future__ import annotations

import pytest

from benchmarks import gloo_decision
from redist_opt import gloo_step_decision
from redist_opt.ir.cost import CostModel

CONFIG = "simplefsdp_tp 1x2x2 dim 1024"


def _run(decisions) -> dict:
    tuning = {"seconds": 301.4, "steps": 88, "compiles": 4, "decisions": decisions, "slower_in_steps": []}
    return {
        "command": "python -m benchmarks.step_bench --wall --tune-rounds 20",
        "torch": "2.13.0+cpu",
        "results": [{"config": CONFIG, "tuning": {"inductor": tuning}}],
    }


def _slower_in_steps(block: str) -> tuple:
    namespace: dict = {}
    exec(block, namespace)  # the block is Python: comments and one tuple
    return namespace["SLOWER_IN_STEPS"]


def test_the_block_lists_the_dropped_rewrites_with_the_commands():
    decisions = [
        {"rewrite": "merge-reductions", "keep": True, "ratio": 1.02, "interval": [0.99, 1.05]},
        {
            "rewrite": "merge-reductions-into-all-reduce",
            "keep": False,
            "ratio": 0.97,
            "interval": [0.95, 0.99],
        },
    ]
    block = gloo_decision.decision_block(_run(decisions), CONFIG, "inductor", "abc1234")
    assert _slower_in_steps(block) == ("merge-reductions-into-all-reduce",)
    assert "python -m benchmarks.step_bench --wall --tune-rounds 20" in block
    assert "commit abc1234, torch 2.13.0+cpu" in block
    assert "merge-reductions: 1.020x [0.990, 1.050], kept" in block
    assert all(len(line) <= 110 for line in block.splitlines())  # ruff's line length


def test_nothing_dropped_gives_an_empty_tuple():
    decisions = [{"rewrite": "merge-reductions", "keep": True, "ratio": 1.1, "interval": [1.0, 1.2]}]
    assert _slower_in_steps(gloo_decision.decision_block(_run(decisions), CONFIG, "inductor", "x")) == ()


def test_an_untuned_config_is_refused_naming_it():
    with pytest.raises(SystemExit, match="no config 'other'"):
        gloo_decision.decision_block(_run([]), "other", "inductor", "x")
    with pytest.raises(SystemExit, match="not tuned with aot_eager"):
        gloo_decision.decision_block(_run([]), CONFIG, "aot_eager", "x")


def test_the_shipped_file_has_one_block_to_replace():
    text = gloo_decision.GLOO_STEP_DECISION.read_text()
    match = gloo_decision._BLOCK.search(text)
    assert match is not None and match.group(0).count("SLOWER_IN_STEPS =") == 1
    assert _slower_in_steps(match.group(0)) == gloo_step_decision.SLOWER_IN_STEPS
    assert CostModel.profile("gloo").slower_in_steps == gloo_step_decision.SLOWER_IN_STEPS  # declared
