"""Record, advise, follow the advice on 8 real gloo ranks (examples/advise_gloo.py): a
torchtitan-style 2x2x2 mesh with no flattened groups, a TP + data-parallel MLP step.
The collectives per step, counted by CommDebugMode and on the c10d wire on every rank,
are what the advice predicted, before and after creating the advised group, for
redist_opt and for torch alone; losses stay equal. The saved recording gives the same
advice through ``redist-opt advise step.json --max-new-groups 1 --profile P``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from redist_opt.ir.cost import CostModel
from redist_opt.tools.cli import main as cli_main

pytestmark = pytest.mark.xdist_group("advise_gloo")  # the gloo_run fixture: 8 gloo ranks

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "advise_gloo.py"


def _example():
    # Imported by its own name (not as a test module) so the spawned ranks, which get
    # this process's sys.path, import the same module and find its rank function.
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        spec = importlib.util.spec_from_file_location("advise_gloo", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["advise_gloo"] = module
        spec.loader.exec_module(module)
        return module
    except BaseException:
        sys.path.remove(str(EXAMPLE.parent))
        raise


@pytest.fixture(scope="module")
def gloo_run():
    ex = _example()
    return ex, ex.run(nprocs=8, max_new_groups=1, profile="nccl")


def _check_paste_able(lines, names):
    for line in lines:
        call = ast.parse(line, mode="eval").body  # mesh["dp", "cp"]._flatten()
        assert isinstance(call, ast.Call) and call.func.attr == "_flatten" and not call.args
        sub = call.func.value
        assert isinstance(sub, ast.Subscript) and sub.value.id == "mesh"
        dims = [e.value for e in sub.slice.elts]
        assert len(dims) >= 2 and set(dims) <= set(names), (line, names)


@pytest.mark.slow  # about 3-5 min: 8 gloo ranks, four runs of two steps each
def test_advice_predicts_the_collectives_on_8_gloo_ranks(gloo_run):
    ex, results = gloo_run
    head = results[0]
    mesh = head["recording"]["meshes"][0]
    assert mesh["names"] == ["dp", "cp", "tp"] and mesh["flattened"] == []  # torchtitan-style, no groups
    assert mesh["root"] == {"sizes": [8], "names": ["world"]}
    lines = head["flatten_lines"]
    assert len(lines) == 1 and all(r["flatten_lines"] == lines for r in results)
    _check_paste_able(lines, mesh["names"])

    for run in ("torch", "existing", "advised", "torch_with_group"):
        debug, wire = ex.per_step(results, run, "comm_debug"), ex.per_step(results, run, "wire")
        assert len(debug) == ex.STEPS and debug == wire, (run, debug, wire)
        assert set(debug) == {ex.predicted(results, run)}, (run, debug, ex.predicted(results, run))
    total = head["advice"]["total"]
    assert total["advised"]["collectives"] < total["existing"]["collectives"] <= total["torch"]["collectives"]
    # the new group also lets torch's own merge pass merge (the advice's model of it),
    # as the step recorded again after creating it says too
    assert ex.predicted(results, "torch_with_group") < total["torch"]["collectives"]
    assert head["torch_with_group_modelled"]["collectives"] == total["torch_advised"]["collectives"]

    agree = ex.loss_agreement(results)
    assert agree["max_rel_diff"] <= 1e-6, agree
    assert agree["params_max_abs_diff"] <= 1e-5, agree
    report = ex.format_report(results)
    assert lines[0] in report and "CommDebugMode" in report


@pytest.mark.slow  # shares the 8-rank run above; the CLI subprocess takes 10-40 s (imports torch)
def test_cli_advises_from_the_saved_recording(gloo_run, tmp_path, capsys):
    ex, results = gloo_run
    head = results[0]
    step = tmp_path / "step.json"
    step.write_text(json.dumps(head["recording"]))
    profile = tmp_path / "nccl.json"
    CostModel.profile("nccl").save(profile)
    svg = tmp_path / "advice.svg"
    # the installed entry point once (JSON, a profile file, the SVG) ...
    cmd = [sys.executable, "-m", "redist_opt", "advise", str(step), "--max-new-groups", "1"]
    out = subprocess.run(
        cmd + ["--profile", str(profile), "--format", "json", "--svg", str(svg)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [g["code"] for g in data["groups"]] == head["flatten_lines"]
    assert data["total"] == head["advice"]["total"] and data["sites"] == head["advice"]["sites"]
    assert (
        svg.read_text().startswith("<?xml")
        and svg.read_text().count('class="advised"') == len(data["sites"]) + 1
    )
    # ... and the text report in-process (a built-in profile name)
    assert cli_main(["advise", str(step), "--max-new-groups", "1", "--profile", "nccl"]) == 0
    text = capsys.readouterr().out
    assert head["flatten_lines"][0] in text and "torch 2.13" in text and text == head["advice_text"]
