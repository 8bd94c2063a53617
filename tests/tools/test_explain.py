"""``redist-opt explain``: text, json and dot output, files it writes, and its errors.

Most tests call ``redist_opt.tools.cli.main`` in-process (fast); one runs the real
entry point in a subprocess to check exit code 2 and no traceback end to end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.explain_cases import case_argv, case_plans, load_cases

import redist_opt
from redist_opt.debug import dump, explain
from redist_opt.debug.units import format_bytes, format_time
from redist_opt.ir.cost import CostModel
from redist_opt.tools import cli

ROOT = Path(__file__).resolve().parents[2]
ACCEPTANCE = [
    "explain",
    "--mesh",
    "a=2,b=2,c=2",
    "--flatten",
    "a+c",
    "--src",
    "P,P,P",
    "--dst",
    "R,S(0),R",
    "--shape",
    "8,4",
]


def run(argv, capsys):
    """(exit code, stdout, stderr) of ``redist-opt <argv>`` run in-process."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse errors exit from inside parse_args
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_acceptance_text(capsys):
    code, out, err = run(ACCEPTANCE, capsys)
    assert code == 0, err
    naive, optimized = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    assert "naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives" in out
    assert f"optimized plan: {optimized.num_collectives} collective" in out
    # every collective: kind, group name, layout, bytes, modelled time, rank lists
    model = CostModel.default()
    for plan in (naive, optimized):
        for c in plan.collectives():
            line = next(
                text
                for text in out.splitlines()
                if f" {c.kind}" in text and f" {L_fmt(c.group)} " in text and c.group.name(plan.mesh) in text
            )
            assert format_bytes(c.bytes_in) in line
            assert format_time(model.collective_time(c.kind, c.group, c.bytes_in, plan.mesh)) in line
    assert "[0,4] [1,5] +2 more" in out  # rank lists of the first groups of a (2:4)
    assert "naive/optimized:" in out and "modelled time" in out
    # the notes: every decision a pass recorded, with its reason
    for note in optimized.notes:
        assert note.what in out and note.reason in out
    assert "IR (optimized):" in out


def L_fmt(group):
    from redist_opt.ir.layout import format_layout

    return format_layout(group.layout)


def test_acceptance_json(capsys):
    code, out, err = run(ACCEPTANCE + ["--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == explain.SCHEMA
    assert data["request"]["mesh"] == {
        "sizes": [2, 2, 2],
        "names": ["a", "b", "c"],
        "num_ranks": 8,
        "flattened": ["a+c"],
    }
    assert data["request"]["src"] == ["P", "P", "P"] and data["request"]["dst"] == ["R", "S(0)", "R"]
    naive = data["plans"]["naive"]
    assert naive["num_collectives"] == 3 and naive["bytes_per_rank"] == 320
    first = naive["collectives"][0]
    assert first["kind"] == "all_reduce" and first["reduce_op"] == "sum"
    assert first["group"]["dims"] == ["a"] and first["group"]["layout"] == "2:4"
    assert first["group"]["rank_lists"] == [[0, 4], [1, 5]] and first["group"]["num_groups"] == 4
    assert first["time_s"] > 0
    assert naive["time_s"] == pytest.approx(sum(c["time_s"] for c in naive["collectives"]))
    assert [n["op"] for n in naive["ir"]] == ["input", "all_reduce", "reduce_scatter", "all_reduce", "output"]
    # same content as the library call
    naive_p, optimized_p = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    assert data == json.loads(
        json.dumps(
            explain.explain_data(naive_p, optimized_p, cost_model=CostModel.default(), groups="existing")
        )
    )


def test_json_schema_keys_are_stable(capsys):
    """The documented top-level, plan and collective keys (see redist_opt/debug/explain.py)."""
    code, out, _ = run(case_argv(load_cases()["design3_uneven_all_gather"]) + ["--format", "json"], capsys)
    data = json.loads(out)
    assert set(data) == {"schema", "request", "cost_model", "plans", "ratio", "notes"}
    assert set(data["request"]) == {"mesh", "src", "dst", "shape", "dtype", "groups"}
    assert set(data["cost_model"]) == {"name", "devices_per_host", "algorithm", "source"}
    assert set(data["ratio"]) == {"collectives", "bytes_per_rank", "time"}
    for p in data["plans"].values():
        assert set(p) == {
            "fallback_reason",
            "applied_passes",
            "num_collectives",
            "bytes_per_rank",
            "time_s",
            "collectives",
            "ir",
        }
        for c in p["collectives"]:
            assert set(c) == {
                "index",
                "node",
                "kind",
                "reduce_op",
                "group",
                "bytes_per_rank",
                "time_s",
                "from_nodes",
            }
            assert set(c["group"]) == {
                "dims",
                "dim_indices",
                "size",
                "layout",
                "layout_shape",
                "layout_stride",
                "num_groups",
                "rank_lists",
                "exists",
            }
        for n in p["ir"]:
            assert set(n) == {"name", "op", "args", "inputs", "shape", "from_nodes"}
    for n in data["notes"]:
        assert set(n) == {"pass", "made", "what", "reason"}


def test_devices_per_host_feeds_the_cost_model(capsys):
    _, out1, _ = run(ACCEPTANCE + ["--format", "json", "--devices-per-host", "1"], capsys)
    _, out8, _ = run(ACCEPTANCE + ["--format", "json", "--devices-per-host", "8"], capsys)
    d1, d8 = json.loads(out1), json.loads(out8)
    assert d1["cost_model"]["devices_per_host"] == 1 and d8["cost_model"]["devices_per_host"] == 8
    # one device per host: every group crosses hosts, so the naive plan is slower
    assert d1["plans"]["naive"]["time_s"] > d8["plans"]["naive"]["time_s"]


def test_cost_model_profile_file(tmp_path, capsys):
    path = tmp_path / "profile.json"
    CostModel.profile("gloo").save(path)
    code, out, err = run(ACCEPTANCE + ["--format", "json", "--cost-model", str(path)], capsys)
    assert code == 0, err
    assert json.loads(out)["cost_model"]["name"] == "gloo"


def test_format_dot(capsys):
    code, out, err = run(ACCEPTANCE + ["--format", "dot"], capsys)
    assert code == 0, err
    assert out.startswith('digraph "explain" {') and out.rstrip().endswith("}")
    assert "cluster_0" in out and "cluster_1" in out
    assert '"naive/all_reduce"' in out and '"optimized/x"' in out


def test_svg_and_mesh_svg_files(tmp_path, capsys):
    plan_svg, mesh_svg = tmp_path / "out" / "plan.svg", tmp_path / "out" / "mesh.svg"
    code, out, err = run(
        ACCEPTANCE + ["--no-ir", "--svg", str(plan_svg), "--mesh-svg", str(mesh_svg)], capsys
    )
    assert code == 0, err
    assert "IR (naive)" not in out
    for path in (plan_svg, mesh_svg):
        root = ET.parse(path).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert f"wrote {path}" in err


def test_dump_dir_writes_one_file_per_changed_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(dump.DUMP_PASSES_ENV, raising=False)
    # A shape no other test uses, so the pipeline's plan cache cannot skip the run.
    argv = [
        "explain",
        "--mesh",
        "a=2,b=2,c=2",
        "--flatten",
        "a+c",
        "--src",
        "P,P,P",
        "--dst",
        "R,S(0),R",
        "--shape",
        "8,44",
        "--dump-dir",
        str(tmp_path / "dumps"),
    ]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert os.environ.get(dump.DUMP_DIR_ENV) is None  # set for the run only
    data_argv = argv[:-2] + ["--format", "json"]
    _, js, _ = run(data_argv, capsys)
    applied = json.loads(js)["plans"]["optimized"]["applied_passes"]
    txt = sorted(p.name for p in (tmp_path / "dumps").glob("*.txt"))
    stages = []
    for i, name in enumerate(txt):
        m = re.fullmatch(r"(\d{4})\.([A-Za-z0-9_.+-]+)\.(before_pipeline|after_[a-z0-9-]+)\.txt", name)
        assert m, name
        assert int(m.group(1)) == i
        stages.append(m.group(3))
    assert stages == ["before_pipeline"] + [f"after_{name}" for name in applied]
    assert sorted(p.name for p in (tmp_path / "dumps").glob("*.dot")) == [t[:-4] + ".dot" for t in txt]
    # a pass's effect is one diff away: the last dump is the optimized plan
    naive_text = (tmp_path / "dumps" / txt[0]).read_text()
    assert "%x : (8, 44)" in naive_text
    spec = redist_opt.MeshSpec(sizes=(2, 2, 2), names=("a", "b", "c"), flattened=("a+c",))
    optimized = redist_opt.optimize(redist_opt.plan(spec, "P,P,P", "R,S(0),R", shape=(8, 44)))
    assert (tmp_path / "dumps" / txt[-1]).read_text().endswith(dump.format_graph(optimized) + "\n")


# -- errors: one line naming the argument, exit code 2, no traceback ------------------

BASE = {"--mesh": "a=2,b=2", "--src": "S(0),R", "--dst": "R,R", "--shape": "8,4"}


def argv_with(**overrides):
    args = dict(BASE)
    for k, v in overrides.items():
        args["--" + k.replace("_", "-")] = v
    out = ["explain"]
    for k, v in args.items():
        if v is None:
            continue
        for item in v if isinstance(v, list) else [v]:
            out += [f"{k}={item}"] if item.startswith("-") else [k, item]
    return out


ERRORS = [
    (dict(mesh="a=2,b=x"), "--mesh", "'x'"),
    (dict(mesh="a=2,a=2"), "--mesh", "not unique"),
    (dict(mesh="a=0,b=2"), "--mesh", "size 0"),
    (dict(mesh=","), "--mesh", "name=size"),
    (dict(mesh="a-1=2,b=2"), "--mesh", "identifier"),
    (dict(src="P,Q"), "--src", "'Q'"),
    (dict(src="S(2),R"), "--src", "shard dim 2 is out of range"),
    (dict(dst="R"), "--dst", "1 entries"),
    (dict(dst="P(avg),R"), "--src/--dst", "Shard -> Partial"),  # torch 2.15 zero-fills S -> P(sum) only
    (dict(flatten=["a+x"]), "--flatten a+x", "no dim named 'x'"),
    (dict(flatten=["a+a"]), "--flatten a+a", "twice"),
    (dict(shape="8,x"), "--shape", "'8,x'"),
    (dict(shape="-1,4"), "--shape", "negative"),
    (dict(dtype="float33"), "--dtype", "float33"),
    (dict(devices_per_host="0"), "--devices-per-host", ">= 1"),
    (dict(devices_per_host="x"), "--devices-per-host", "invalid int"),
    (dict(format="xml"), "--format", "invalid choice"),
    (dict(groups="some"), "--groups", "invalid choice"),
    (dict(src=None), "--src", "required"),
    (dict(cost_model="/nonexistent/profile.json"), "--cost-model", "cannot read"),
    (dict(cost_model="nccl2"), "--cost-model", "nccl2"),
    (dict(rank_lists="-1"), "--rank-lists", ">= 0"),
    (dict(mesh="a=64,b=32", mesh_svg="/tmp/never-written.svg"), "--mesh-svg", "2048 ranks"),
]


@pytest.mark.parametrize("overrides,flag,detail", ERRORS, ids=[e[1] + ":" + e[2] for e in ERRORS])
def test_cli_errors(overrides, flag, detail, capsys):
    code, out, err = run(argv_with(**overrides), capsys)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("redist-opt explain: error: ")
    assert flag in lines[0] and detail in lines[0]
    assert "Traceback" not in err


def test_cli_error_unwritable_svg(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(argv_with(svg=str(blocker / "plan.svg")), capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "--svg: cannot write" in err


def test_cli_error_bad_dump_filter(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(dump.DUMP_PASSES_ENV, "merge-(")
    code, _, err = run(argv_with(dump_dir=str(tmp_path)), capsys)
    assert code == 2 and len(err.splitlines()) == 1 and dump.DUMP_PASSES_ENV in err


def test_cli_error_in_a_real_process():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "redist_opt.tools.cli",
            "explain",
            "--mesh",
            "a=2,b=2",
            "--src",
            "S(0),R",
            "--dst",
            "R,S(5)",
            "--shape",
            "8,4",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "redist-opt explain: error: --dst: target placement S(5) on mesh dim 1 of mesh (2x2): shard dim 5 "
        "is out of range for a 2-D tensor"
    ]
