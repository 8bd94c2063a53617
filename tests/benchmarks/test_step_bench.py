"""The step bench (python -m benchmarks.step_bench) on torchtitan's own training step."""

import pytest

from benchmarks import step_bench
from benchmarks.step_bench.__main__ import main

MISSING = step_bench.torchtitan_missing()


def test_parse_config():
    cfg = step_bench.parse_config("fsdp2_tp:1x4x2")
    assert (cfg.name, cfg.dp_replicate, cfg.dp_shard, cfg.tp) == ("fsdp2_tp", 1, 4, 2)
    with pytest.raises(ValueError, match="4 or 8 ranks"):
        step_bench.parse_config("fsdp2_tp:2x3x1")
    wide = step_bench.parse_config("fsdp2_tp:1x2x2:1024")
    assert (wide.world, wide.dim, wide.label) == (4, 1024, "fsdp2_tp 1x2x2 dim 1024")
    with pytest.raises(ValueError, match="multiple of 8 heads x tp = 16"):
        step_bench.parse_config("fsdp2_tp:1x2x2:100")
    with pytest.raises(ValueError, match="unknown step config"):
        step_bench.parse_config("ddp:2x2x2")
    classic = step_bench.parse_config("tp_classic")
    assert (classic.dp_replicate, classic.dp_shard, classic.tp) == (1, 1, 8)
    with pytest.raises(ValueError, match="tensor parallelism alone"):
        step_bench.parse_config("tp_classic:2x1x4")


def _row(mode, baseline, coll, gnorm, save, rel=0.0, backs=None, save_backs=None):
    phase = lambda n, b: {"collectives": n, "hand_back_reasons": b or {}, "handed_back": len(b or {})}  # noqa: E731
    return {
        "mode": mode,
        "baseline": baseline,
        "collectives": coll,
        "loss_rel": rel,
        "hand_back_reasons": backs or {},
        "gnorm": phase(gnorm, None),
        "save": phase(save, save_backs),
    }


def test_violations_name_what_misses_the_bar():
    plain = _row("plain", None, 46, 1, 12)
    ok = _row("create", "plain", 46, 1, 12, rel=1e-7, save_backs={"[_S(0, 2), S(0)] -> [R, R]: x": 12})
    more = _row("existing", "plain", 47, 2, 12, rel=1e-5, backs={"[P(norm2)] -> [R] on (tp) (): x": 1})
    rows = {"plain": plain, "create": ok, "existing": more}
    assert step_bench.report._violations(ok, rows) == []  # _StridedShard hand-backs are reported, not failed
    found = step_bench.report._violations(more, rows)
    assert any(v.startswith("step: 47 collectives > 46") for v in found)
    assert any(v.startswith("gnorm: 2 collectives > 1") for v in found)
    assert any(v.startswith("loss: relative difference 1.0e-05") for v in found)
    assert any("P(norm2)" in v for v in found)


def test_missing_torchtitan_says_what_to_install(monkeypatch, capsys):
    from benchmarks.step_bench import runner

    monkeypatch.setattr(runner.importlib.util, "find_spec", lambda name: None)
    for argv in ([], ["--wall"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert 'pip install -c constraints.txt -e ".[frameworks]"' in err


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_fsdp2_tp_step_plain_vs_enabled():
    cfg = step_bench.parse_config("fsdp2_tp:2x2x2")
    [res] = step_bench.run_step_bench(
        [cfg], ("plain", "existing"), steps=2, warmup=1, save=True, log=lambda s: None
    )
    plain, ours = res["rows"]
    assert plain["collectives"] > 0 and plain["bytes"] > 0
    # FSDP2's own c10d calls are counted: all_gathers and reduce_scatters over the 2 fsdp ranks
    assert any(k.startswith("AG@2") for k in plain["by_kind"])
    assert any(k.startswith("RS@2") for k in plain["by_kind"])
    assert ours["loss_vs_baseline"] == "bitwise"
    assert ours["routed"] > 0
    assert plain["routed"] == 0 and plain["handed_back"] == 0
    # clip_grad_norm_'s total_norm.full_tensor() and the checkpoint gather are counted on their own
    assert (
        plain["gnorm"]["collectives"] >= 1 and ours["gnorm"]["collectives"] <= plain["gnorm"]["collectives"]
    )
    assert ours["gnorm"]["handed_back"] == 0
    assert plain["save"]["collectives"] > 0 and ours["save"]["transitions"] == plain["save"]["transitions"]
    assert ours["violations"] == []
    text = step_bench.report.format_table([res])
    assert "fsdp2_tp 2x2x2" in text
