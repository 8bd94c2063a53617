"""The GPU check (``python -m benchmarks.gpu_check``) as a dry run on CPU: every part runs the code
it runs on a GPU (CPU tensors, gloo for NCCL, tiny sizes) and none may fail."""

import json
import subprocess
import sys

import pytest
from support.paths import ROOT

from benchmarks import gpu_check


def test_sample_is_the_tests_sample():
    from support.sampling import in_sample

    ids = [f"case-{i}" for i in range(400)]
    assert [gpu_check.in_sample(i, 20) for i in ids] == [in_sample(i, 20) for i in ids]


def test_unknown_part_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--parts", "differential,warp_drive", "--dry-run"])
    assert "warp_drive" in capsys.readouterr().err


@pytest.mark.slow  # minutes on 2 cores: Inductor compiles in four processes
def test_dry_run_passes_every_part(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert list(parts) == list(gpu_check.PARTS)
    failed = {k: v.get("reason") for k, v in parts.items() if v["status"] == "fail"}
    assert not failed, failed
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["info"]["dry_run"] and report["info"]["device"] == "cpu"
    diff = parts["differential"]
    assert diff["status"] == "pass" and diff["cases_ran"] > 0 and diff["device_of_inputs"] == "cpu"
    assert parts["nccl"]["status"] == "pass" and parts["nccl"]["group_backend"] == "gloo"
    hand = parts["nccl"]["compiled"]["hand-written all_reduces, backend()"]
    assert hand["equal"] and hand["collectives"]["eager"] == 2
    assert parts["inductor"]["variants"]["ours"]["ok"]
    assert parts["first_step"]["status"] == "pass"
    assert "summary" in proc.stdout
