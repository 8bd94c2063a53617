"""The wall benchmarks' statistics (redist_opt/measure/wall_stats.py, the one rule of "faster"),
and the step bench's report of them, on given times: no timing."""

import pytest

from benchmarks.step_bench import first_step
from benchmarks.step_bench.model import StepConfig
from benchmarks.step_bench.wall import ablation_arguments, union_length, variant_names
from benchmarks.step_bench.wall_report import format_markdown, summarize
from redist_opt.graph_pass import GraphRewrites
from redist_opt.measure import wall_stats as stats
from redist_opt.passes import DEFAULT_PIPELINE


def test_rounds_alternate_the_order_so_neither_side_always_follows():
    assert stats.interleaved_order(["A", "B"], 4) == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    names = variant_names(("eager", "inductor"))
    assert names == ["eager/torch", "eager/ours", "inductor/torch", "inductor/ours"]
    rounds = stats.interleaved_order(names, 30)
    assert len(rounds) == 30 and all(sorted(r) == sorted(names) for r in rounds)
    # each side runs first in half of the rounds, and every pair stays adjacent
    torch_first = sum(r.index("eager/torch") < r.index("eager/ours") for r in rounds)
    assert torch_first == 15
    assert all(abs(r.index("inductor/torch") - r.index("inductor/ours")) == 1 for r in rounds)


def test_ratio_is_torch_over_ours():
    assert stats.median_ratio([2.0, 2.0, 9.0], [1.0, 1.0, 1.0]) == 2.0


def test_a_clear_speedup_has_an_interval_above_one():
    torch_times = [1.00 + 0.01 * (i % 5) for i in range(30)]
    ours = [t / 1.2 for t in torch_times]
    lo, hi = stats.bootstrap_interval(torch_times, ours)
    assert lo == pytest.approx(1.2) and hi == pytest.approx(1.2)  # every round 1.2x: no spread
    assert stats.verdict((lo, hi)) == "ours faster"
    assert stats.verdict((0.7, 0.9)) == "ours slower"


def test_noise_without_an_effect_is_no_change():
    # the same 30 noisy times on both sides, paired in a different order
    times = [1.0 + 0.1 * ((7 * i) % 11) for i in range(30)]
    shuffled = times[10:] + times[:10]
    interval = stats.bootstrap_interval(times, shuffled)
    assert interval[0] < 1.0 < interval[1]
    assert stats.verdict(interval) == "no change"
    assert stats.verdict((1.0, 1.3)) == "no change"  # an end at 1 is inside


def test_interval_brackets_the_ratio_and_is_reproducible():
    torch_times = [1.0 + 0.05 * ((3 * i) % 7) for i in range(31)]
    ours = [0.9 + 0.08 * ((5 * i) % 9) for i in range(31)]
    lo, hi = stats.bootstrap_interval(torch_times, ours)
    assert lo <= stats.median_ratio(torch_times, ours) <= hi
    assert (lo, hi) == stats.bootstrap_interval(torch_times, ours)
    assert (lo, hi) != stats.bootstrap_interval(torch_times, ours, seed=1)
    with pytest.raises(ValueError, match="paired step times expected: 31 torch, 30 ours"):
        stats.bootstrap_interval(torch_times, ours[:30])


def test_a_step_lasts_as_long_as_its_slowest_rank():
    assert stats.per_step_max([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]


def test_union_length_counts_overlaps_once():
    assert union_length([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4
    assert union_length([]) == 0


def _rank(walls_torch, walls_ours, errors=None):
    names = ("eager/torch", "eager/ours")
    return {
        "stubbed": [],
        "errors": errors or {},
        "walls": {} if errors else dict(zip(names, (walls_torch, walls_ours))),
        "collectives": {n: {"count": c} for n, c in zip(names, (17, 11))},
        "comm": {n: [0.3, 0.4, 0.5] for n in names},
    }


def test_summary_table_prints_ratio_interval_verdict_and_share():
    cfg = StepConfig("tp_classic", 1, 1, 4, dim=512)
    t = [0.2 + 0.001 * (i % 3) for i in range(30)]
    o = [x / 1.5 for x in t]
    res = summarize(cfg, [_rank(t, o), _rank([x * 0.5 for x in t], o)])
    [row] = res["rows"]
    assert row["ratio"] == pytest.approx(1.5) and row["verdict"] == "ours faster"
    text = format_markdown([res])
    assert "| tp_classic 1x1x4 dim 512 | eager | 201.0 | 134.0 | 1.500x [1.500, 1.500] | ours faster" in text
    assert "| 40% / 40% | 17 -> 11 |" in text
    failed = summarize(cfg, [_rank(t, o, errors={"eager/ours": "RuntimeError: boom"})])
    assert "FAILED | eager/ours: RuntimeError: boom" in format_markdown([failed])


def test_the_summary_has_each_sides_peak_by_the_statistic_beside_its_time():
    cfg = StepConfig("tp_classic", 1, 1, 4, dim=512)
    t = [0.2 + 0.001 * (i % 3) for i in range(30)]
    ranks = [_rank(t, t), _rank(t, t)]
    # per rank and round: torch 2 MiB on rank 0 and 3 MiB (at least) on rank 1; ours 2 MiB
    mib = 1024 * 1024
    ranks[0]["peaks"] = {"eager/torch": [2 * mib, 2 * mib], "eager/ours": [2 * mib, 2 * mib]}
    ranks[1]["peaks"] = {"eager/torch": [3 * mib, 4 * mib], "eager/ours": [2 * mib, 2 * mib]}
    [row] = summarize(cfg, ranks)["rows"]
    assert (row["peaks"]["torch"]["bytes"], row["peaks"]["ours"]["bytes"]) == (3 * mib, 2 * mib)
    assert row["peaks"]["torch"]["per_rank"] == [[2 * mib, 2 * mib], [3 * mib, 4 * mib]]
    assert "| 17 -> 11 | 3,072 / 2,048 (spread 33%) |" in format_markdown([summarize(cfg, ranks)])
    # without memory rounds: no peaks, a blank column
    [plain] = summarize(cfg, [_rank(t, t)])["rows"]
    assert "peaks" not in plain and format_markdown([summarize(cfg, [_rank(t, t)])]).endswith(
        "| 17 -> 11 |  |"
    )


def test_ablated_sides_follow_their_compilers_ours_and_turn_one_rewrite_off():
    names = variant_names(("eager", "inductor"), ("combine", "merge-reductions"))
    assert names == [
        "eager/torch",
        "eager/ours",
        "inductor/torch",
        "inductor/ours",
        "inductor/without combine",
        "inductor/without merge-reductions",
    ]
    assert ablation_arguments("ours") == {}
    assert ablation_arguments("graph-pass") == {"graph_pass": False}
    assert ablation_arguments("combine") == {"rewrites": GraphRewrites(combine=False)}
    # one pass out, the rest of the default planning (the collective cap included) kept
    assert ablation_arguments("merge-reductions") == {"without": ("merge-reductions",)}
    assert "merge-reductions" in {p.name for p in DEFAULT_PIPELINE}
    with pytest.raises(ValueError, match="ablate='fuse'"):
        ablation_arguments("fuse")


def _compiled_rank(sides: dict) -> dict:
    """One rank's record of three compiled sides (66, 58 and 62 collectives per step)."""
    return {
        "stubbed": [],
        "errors": {},
        "walls": sides,
        "collectives": {n: {"count": c} for n, c in zip(sides, (66, 58, 62))},
        "comm": {n: [0.4] for n in sides},
    }


def test_summary_has_one_row_per_ablated_side_against_torch():
    cfg = StepConfig("simplefsdp_tp", 1, 2, 2, dim=1024)
    t = [0.2 + 0.001 * (i % 3) for i in range(30)]
    sides = {"inductor/torch": t, "inductor/ours": [x / 0.9 for x in t], "inductor/without combine": t}
    rows = summarize(cfg, [_compiled_rank(sides)])["rows"]
    assert [r["compiler"] for r in rows] == ["inductor", "inductor, without combine"]
    assert rows[0]["ratio"] == pytest.approx(0.9) and rows[1]["ratio"] == pytest.approx(1.0)
    assert rows[1]["collectives_ours"] == 62


def test_first_step_table_is_the_slowest_rank_per_job_and_the_median_of_repeats():
    def rank(first, hits=0):
        cache = dict.fromkeys(
            (
                "inductor.fxgraph_cache_hit",
                "inductor.fxgraph_cache_miss",
                "aot_autograd.autograd_cache_hit",
                "aot_autograd.autograd_cache_miss",
            ),
            0,
        )
        cache["inductor.fxgraph_cache_hit"] = hits
        return {"first": first, "second": 0.5, "cache": cache}

    job = first_step._job([rank(10.0, hits=2), rank(12.0, hits=2)])
    assert job["first"] == 12.0 and job["cache"]["inductor.fxgraph_cache_hit"] == 4
    runs = {
        "torch/cold": [job, first_step._job([rank(8.0)])],
        "ours/cold": [first_step._job([rank(11.0)]), first_step._job([rank(9.0)])],
        "torch/warm": [first_step._job([rank(5.0)])],
        "ours/warm": [first_step._job([rank(4.0, hits=3)])],
    }
    text = first_step.format_markdown([{"config": "tp_classic 1x1x4 dim 512", "runs": runs}])
    assert "| tp_classic 1x1x4 dim 512 | cold | 10.0 | 10.0 | 1.00x | 0 / 0 |" in text
    assert "| tp_classic 1x1x4 dim 512 | warm | 5.0 | 4.0 | 0.80x | 3 / 0 |" in text


def test_the_tuned_side_is_also_compared_with_the_untuned_one_from_the_same_rounds():
    cfg = StepConfig("simplefsdp_tp", 1, 2, 2, dim=1024)
    t = [0.2 + 0.001 * (i % 3) for i in range(30)]
    sides = {"inductor/torch": t, "inductor/ours": [x / 0.9 for x in t], "inductor/tuned": t}
    rows = summarize(cfg, [_compiled_rank(sides)])["rows"]
    assert [r["compiler"] for r in rows] == ["inductor", "inductor, tuned"]
    assert "against_untuned" not in rows[0]
    untuned = rows[1]["against_untuned"]  # median(untuned) / median(tuned)
    assert untuned["ratio"] == pytest.approx(1 / 0.9) and untuned["verdict"] == "ours faster"
