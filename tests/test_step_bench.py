"""The step bench (redist-opt bench --part step) on torchtitan's own training step."""

import pytest

from redist_opt.tools import step_bench
from redist_opt.tools.cli import main

MISSING = step_bench.torchtitan_missing()


def test_parse_config():
    cfg = step_bench.parse_config("fsdp2_tp:1x4x2")
    assert (cfg.name, cfg.dp_replicate, cfg.dp_shard, cfg.tp) == ("fsdp2_tp", 1, 4, 2)
    with pytest.raises(ValueError, match="8 ranks"):
        step_bench.parse_config("fsdp2_tp:2x2x1")
    with pytest.raises(ValueError, match="unknown step config"):
        step_bench.parse_config("ddp:2x2x2")


def test_missing_torchtitan_says_what_to_install(monkeypatch, capsys):
    from redist_opt.tools.step_bench import runner

    monkeypatch.setattr(runner.importlib.util, "find_spec", lambda name: None)
    assert main(["bench", "--part", "step"]) == 2
    err = capsys.readouterr().err
    assert 'pip install -c constraints.txt -e ".[frameworks]"' in err


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_fsdp2_tp_step_plain_vs_enabled():
    cfg = step_bench.parse_config("fsdp2_tp:2x2x2")
    [res] = step_bench.run_step_bench([cfg], ("plain", "existing"), steps=2, warmup=1, log=lambda s: None)
    plain, ours = res["rows"]
    assert plain["collectives"] > 0 and plain["bytes"] > 0
    # FSDP2's own c10d calls are counted: all_gathers and reduce_scatters over the 2 fsdp ranks
    assert any(k.startswith("AG@2") for k in plain["by_kind"])
    assert any(k.startswith("RS@2") for k in plain["by_kind"])
    assert ours["loss_vs_baseline"] == "bitwise"
    assert ours["routed"] > 0
    assert plain["routed"] == 0 and plain["handed_back"] == 0
    text = step_bench.report.format_table([res])
    assert "fsdp2_tp 2x2x2" in text
