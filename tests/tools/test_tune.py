"""``redist_opt.tune``'s rule and entry checks, without ranks (the rank runs are in
``tests/multiproc/test_tune_gloo.py``)."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.ir.placements import RedistributeError
from redist_opt.measure.decisions import OURS, TORCH, TuneResult, decide, format_result
from redist_opt.tools import cli
from redist_opt.tools.args import CliError
from redist_opt.tools.tune import load_factory

_WITHOUT = "ours without "


def _noisy(level: float, n: int = 20, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + 0.02 * rng.random()) for _ in range(n)]


def _times(ours: float, **without: float) -> dict:
    times = {TORCH: _noisy(1.0, seed=1), OURS: _noisy(ours, seed=2)}
    for i, (name, level) in enumerate(without.items()):
        times[_WITHOUT + name.replace("_", "-")] = _noisy(level, seed=3 + i)
    return times


def test_a_rewrite_the_step_is_slower_with_is_dropped():
    (d,) = decide(_times(1.2, merge_reductions=1.0), ["merge-reductions"])
    assert (d.rewrite, d.keep, d.verdict) == ("merge-reductions", False, "ours slower")
    assert d.interval[1] < 1.0 and d.ratio == pytest.approx(1 / 1.2, rel=0.03)


def test_a_decision_is_recorded_as_json_with_its_reason():
    # the one serializer of a decision: the profile's tuning record and the step bench's JSON
    (d,) = decide(_times(1.2, merge_reductions=1.0), ["merge-reductions"])
    assert d.record() == {
        "rewrite": "merge-reductions",
        "keep": False,
        "ratio": d.ratio,
        "interval": list(d.interval),
        "left_out_before": False,
        "reason": "drop (the step is slower with it)",
    }


def test_a_rewrite_the_step_is_faster_with_is_kept():
    (d,) = decide(_times(0.8, merge_reductions=1.0), ["merge-reductions"])
    assert (d.keep, d.verdict) == (True, "ours faster")


def test_a_rewrite_inside_the_noise_is_kept():
    rng = random.Random(7)
    same = [1.0 + 0.3 * rng.random() for _ in range(20)]
    shuffled = same[::-1]
    (d,) = decide({TORCH: same, OURS: same, _WITHOUT + "merge-reductions": shuffled}, ["merge-reductions"])
    assert d.interval[0] <= 1.0 <= d.interval[1]
    assert d.keep and d.verdict == "no change"


def test_each_rewrite_is_judged_against_ours_with_every_rewrite_on():
    decisions = decide(
        _times(1.0, merge_reductions=0.8, reduce_scatter_creator=1.3),
        ["reduce-scatter-creator", "merge-reductions"],
    )
    assert [(d.rewrite, d.keep) for d in decisions] == [
        ("merge-reductions", False),  # sorted by name; the step is faster without it
        ("reduce-scatter-creator", True),
    ]


def test_a_rewrite_the_base_leaves_out_comes_back_only_when_measured_faster():
    left_out = ["merge-reductions"]
    (faster,) = decide(_times(0.8, merge_reductions=1.0), ["merge-reductions"], left_out)
    assert faster.keep and faster.verdict == "ours faster"
    (slower,) = decide(_times(1.2, merge_reductions=1.0), ["merge-reductions"], left_out)
    assert not slower.keep
    rng = random.Random(7)
    same = [1.0 + 0.3 * rng.random() for _ in range(20)]
    times = {TORCH: same, OURS: same, _WITHOUT + "merge-reductions": same[::-1]}
    (noise,) = decide(times, ["merge-reductions"], left_out)
    assert noise.verdict == "no change" and not noise.keep  # the base's decision stands
    assert noise.reason == "left out, as the base (not measured faster)"
    assert faster.reason == "back in (measured faster)"
    (kept,) = decide(times, ["merge-reductions"])
    assert kept.keep  # and for a rewrite the base keeps, it stands the other way


def test_the_decisions_are_a_function_of_the_times_alone():
    times = _times(1.1, merge_reductions=1.0)
    assert decide(times, ["merge-reductions"]) == decide(dict(reversed(times.items())), ["merge-reductions"])


def _result(peaks: dict) -> TuneResult:
    times = _times(1.0, merge_reductions=1.0)
    return TuneResult(
        path="p.json",
        model=CostModel(),
        decisions=decide(times, ["merge-reductions"]),
        times=times,
        against_torch={},
        tuned_variant=OURS,
        not_judged=(),
        steps=45,
        seconds=1.0,
        compiles=0,
        peaks=peaks,
    )


def test_each_variants_peak_is_the_statistic_and_the_summary_prints_it_with_its_spread():
    peaks = {TORCH: [[1_000, 1_200, 1_100], [900, 950, 990]], OURS: [[800, 800, 880], [1_000, 1_000, 1_000]]}
    result = _result(peaks)
    assert (result.peak(TORCH), result.peak(OURS), result.peak(_WITHOUT + "x")) == (1_000, 1_000, None)
    text = format_result(result)
    assert "peak bytes (least of 3 memory rounds, most over ranks)" in text
    assert f"  {TORCH:<40} {1_000:>14,}{'':<39}20%" in text  # rank 0: (1,200 - 1,000) / 1,000
    assert f"  {OURS:<40} {1_000:>14,}{'':<39}10%" in text
    assert "peak bytes" not in format_result(_result({}))  # no memory rounds, no table


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"rounds": 1}, "rounds=1"),
        ({"rounds": 2.5}, "rounds=2.5"),
        ({"warmup": 0}, "warmup=0"),
        ({"memory_rounds": -1}, "memory_rounds=-1"),
        ({"compiler": "cudagraphs"}, "compiler='cudagraphs'"),
    ],
)
def test_bad_options_raise_naming_them(kwargs, named):
    with pytest.raises(RedistributeError, match=named.replace("(", r"\(").replace(")", r"\)")):
        redist_opt.tune(lambda backend: lambda: None, "unused.json", **kwargs)


def test_a_factory_that_is_not_callable_is_refused():
    with pytest.raises(RedistributeError, match="make_step=3 is not callable"):
        redist_opt.tune(3, "unused.json")


def test_without_a_process_group_it_says_so(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RedistributeError, match="no process group"):
        redist_opt.tune(lambda backend: lambda: None, "unused.json")


def test_the_fake_backend_is_refused_at_entry(tmp_path):
    assert dist.get_backend() == "fake"  # the test session's default group (conftest.py)
    with pytest.raises(RedistributeError, match="'fake' backend moves no data"):
        redist_opt.tune(lambda backend: lambda: None, str(tmp_path / "p.json"))
    assert not (tmp_path / "p.json").exists()


def test_inside_enabled_it_refuses_since_torchs_side_would_be_routed(tmp_path):
    with redist_opt.enabled(), pytest.raises(RedistributeError, match="inside redist_opt.enabled"):
        redist_opt.tune(lambda backend: lambda: None, str(tmp_path / "p.json"))


def test_the_factory_is_found_by_file_or_module(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("def make_step(backend):\n    return lambda: backend\n")
    assert load_factory(f"{job}:make_step")("x")() == "x"
    assert load_factory("redist_opt.measure:decide") is decide
    for target, message in [
        ("job.py", "expected FILE.py:FUNCTION"),
        (f"{tmp_path}/missing.py:make_step", "no file"),
        (f"{job}:nothing", "has no function 'nothing'"),
        ("no_such_module_here:make_step", "cannot import"),
    ]:
        with pytest.raises(CliError, match=message):
            load_factory(target)


def test_the_command_outside_torchrun_says_how_to_launch_it(monkeypatch, capsys):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["tune", "job.py:make_step", "--out", "p.json"]) == 2
    assert "torchrun --nproc_per_node=N -m redist_opt tune" in capsys.readouterr().err
