"""All-reduce reassociation on a compiled 2-layer tensor-parallel decoder
(``graph_reassociate_programs.py``): on one fake rank the backward's all_reduces
drop from one per colwise projection (q, k, v, gate, up: 10) to one per summed
group (4); on 2 gloo ranks (slow) outputs and grads equal eager within rounding."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import SUPPORT
from support.program_report import read as read_report
from torch.distributed.elastic.utils.distributed import get_free_port

SCRIPT = os.path.join(SUPPORT, "graph_reassociate_programs.py")


def _report(proc) -> dict:
    return read_report(proc.returncode, proc.stdout, proc.stderr)


def test_backward_all_reduces_one_per_summed_group():
    r = _report(
        subprocess.run([sys.executable, SCRIPT, "fake", "1"], capture_output=True, text=True, timeout=900)
    )
    (fw_off, bw_off), (fw_on, bw_on) = r["off"]["graphs"], r["on"]["graphs"]
    # forward: one all_reduce per rowwise projection (o, down) per layer, untouched
    assert fw_off["after"] == fw_on["after"] == {"all_reduce": 4}
    assert bw_off["before"] == bw_off["after"] == {"all_reduce": 10}
    assert bw_on["before"] == {"all_reduce": 10}
    assert bw_on["after"] == {"all_reduce": 4}, bw_on["explain"]
    folded = sorted(
        int(line.split(": ")[1].split()[0])
        for line in bw_on["explain"].splitlines()
        if line.startswith("reassociated")
    )
    assert folded == [2, 2, 3, 3]  # (gate, up) and (q, k, v) of each layer


@pytest.mark.slow
def test_values_on_two_gloo_ranks():
    port = str(get_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, "gloo", str(r), "2", port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=900)
        r = _report(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        assert r["on"]["graphs"][1]["after"] == {"all_reduce": 4}
        assert r["off"]["max_diff"] == 0.0
        assert r["on"]["max_diff"] < 1e-5, r["on"]["max_diff"]
