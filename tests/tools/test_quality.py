"""The quality bench against torch's shipped redistribute: ``redist-opt bench --part
quality`` (``redist_opt.tools.quality``, torch's plan modelled) and the harness
``benchmarks.quality`` (torch run under LocalTensorMode).

* the modelled torch side equals the run one on every case of the shipped corpus;
* the run's torch numbers equal an independent count: torch's redistribute (merge
  pass on) run here under ``CommDebugMode`` on a fresh mesh with the case's
  flattened groups, per collective kind; and torch's bytes at the realistic shape
  follow from the simulation shape exactly (checked against a run without scaling);
* its numbers for ours equal the plans' (``plan`` + ``optimize``);
* worse cases are listed (fed a fake result), unsupported ones are listed, not raised.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
import sys
from collections import Counter

import pytest
from support.inputs import build_input
from support.paths import ROOT
from support.runs import collective_kind
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from benchmarks import quality as harness_run
from redist_opt.ir.cost import CostModel
from redist_opt.tools import quality
from redist_opt.tools.cli import main
from redist_opt.tools.corpus import load_corpus
from redist_opt.tools.quality_report import POLICIES, find_worse, format_quality

pytestmark = pytest.mark.xdist_group("quality")  # the result fixture runs the corpus


BY_ID = {c.id: c for c in load_corpus()}
SMALL = ["hsdp_grad", "gradnorm_3d", "ep_dispatch_borrow_cp"]


@pytest.fixture(scope="module")
def result():
    return harness_run.quality_bench([BY_ID[i] for i in SMALL], verify=True)


def _sides(row: dict) -> dict:
    keys = ("status", "collectives", "bytes", "time", "ops")
    return {side: {k: row[side].get(k) for k in keys} for side in ("torch",) + POLICIES}


@pytest.mark.slow  # starts a process
def test_modelled_torch_equals_the_run_on_the_whole_corpus(tmp_path):
    """The shipped command models torch's plan (torch_merged_plan); run, torch issues the same.
    The harness runs in a process of its own: its fake world must be larger than any mesh."""
    cases = load_corpus()
    modelled = quality.quality_bench(cases)
    out = tmp_path / "run.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.quality",
            "--no-verify",
            "--json",
            str(out),
            "--report",
            str(tmp_path / "run.md"),
        ],
        check=True,
        timeout=600,
        cwd=ROOT,
    )
    run = json.loads(out.read_text())
    assert len(modelled["cases"]) == len(cases) > 50
    for m, r in zip(modelled["cases"], run["cases"]):
        assert _sides(m) == _sides(r), m["id"]
    assert modelled["totals"] == run["totals"]


def _independent_torch_counts(case) -> Counter:
    """torch 2.13's redistribute, merge pass on, counted by a plain CommDebugMode."""
    spec = case.spec()
    src, dst = case.placements()
    sim, _ = harness_run.sim_shape(case)
    sim = sim or (1,)  # build_input needs a dim; a 1-element vector issues the same collectives
    with LocalTensorMode(spec.num_ranks) as lm:
        with lm.disable():
            mesh = init_device_mesh("cpu", spec.sizes, mesh_dim_names=spec.names)
            for g in case.flatten:
                mesh[tuple(spec.names[d] for d in spec.dims_of(g))]._flatten()
        inp = build_input(mesh, lm, list(src), sim, case.torch_dtype(), seed=7)
        with CommDebugMode() as cdm:
            inp.dt.redistribute(mesh, list(dst))
    return Counter({collective_kind(k): v for k, v in cdm.get_comm_counts().items() if v})


@pytest.mark.parametrize("case_id", SMALL)
def test_torch_counts_match_comm_debug_mode(result, case_id):
    row = next(r for r in result["cases"] if r["id"] == case_id)
    want = _independent_torch_counts(BY_ID[case_id])
    assert row["torch"]["status"] == "ok"
    assert row["torch"]["collectives"] == sum(want.values())
    short = {"AR": "all_reduce", "RS": "reduce_scatter", "AG": "all_gather", "A2A": "all_to_all"}
    got = Counter(short[op.split("(")[0]] for op in row["torch"]["ops"])
    assert got == want


def test_known_torch_numbers(result):
    """Independently derived: torch's HSDP grad is AR(dp_replicate) on the full fp32 grad,
    then RS(dp_shard) on it; ours scatters first (a quarter of the bytes in the all_reduce)."""
    row = next(r for r in result["cases"] if r["id"] == "hsdp_grad")
    full = math.prod(BY_ID["hsdp_grad"].shape) * 4
    assert row["torch"]["bytes"] == 2 * full
    assert row["existing"]["bytes"] == full + full // 4
    model = CostModel.default()
    assert row["torch"]["time"] == pytest.approx(
        sum(
            model.collective_time(k, BY_ID["hsdp_grad"].spec().group(d), full, BY_ID["hsdp_grad"].spec())
            for k, d in (("all_reduce", (0,)), ("reduce_scatter", (1,)))
        )
    )


@pytest.mark.parametrize("case_id", SMALL)
def test_our_numbers_are_the_plans(result, case_id):
    case = BY_ID[case_id]
    row = next(r for r in result["cases"] if r["id"] == case_id)
    naive = redist_opt.plan(case.spec(), case.src, case.dst, shape=case.shape, dtype=case.torch_dtype())
    for policy in POLICIES:
        p = redist_opt.optimize(naive, groups=policy)
        assert row[policy]["collectives"] == p.num_collectives
        assert row[policy]["bytes"] == p.bytes_per_rank
        assert row[policy]["time"] == pytest.approx(CostModel.default().plan_time(p))
        # verify=True executed the simulation-shape plans: they issue what they claim
        assert row["verify"][policy]["ok"], row["verify"][policy]
    assert result["verify_failures"] == []
    assert result["worse"] == []


def test_scaling_is_exact(monkeypatch):
    """torch's bytes from the simulation shape x factor == bytes recorded at the real shape."""
    base = BY_ID["uneven_nested_reduce_scatter"]  # uneven dim kept, even dim scaled
    case = dataclasses.replace(base, id="scaled", shape=(23, 6))
    sim, scale = harness_run.sim_shape(case)
    assert sim == (23, 1) and scale == 6
    scaled = harness_run.quality_bench([case], verify=False)["cases"][0]["torch"]
    monkeypatch.setattr(harness_run, "sim_shape", lambda case: (case.shape, 1))
    direct = harness_run.quality_bench([case], verify=False)["cases"][0]["torch"]
    assert scaled["bytes"] == direct["bytes"] and scaled["collectives"] == direct["collectives"]
    assert scaled["time"] == pytest.approx(direct["time"])


def test_worse_cases_are_listed(result):
    fake = copy.deepcopy(result)
    row = next(r for r in fake["cases"] if r["id"] == "gradnorm_3d")
    row["existing"]["collectives"] = row["torch"]["collectives"] + 1
    row["create"]["bytes"] = row["torch"]["bytes"] * 2
    fake["worse"] = worse = find_worse(fake["cases"])
    assert {(w["id"], w["policy"]) for w in worse} == {("gradnorm_3d", "existing"), ("gradnorm_3d", "create")}
    assert any("collectives" in r for w in worse for r in w["reasons"])
    assert any("bytes/rank" in r for w in worse for r in w["reasons"])
    text = format_quality(fake)
    assert "WORSE" in text
    assert "- gradnorm_3d (groups=existing): collectives" in text
    assert "- gradnorm_3d (groups=create): bytes/rank" in text
    # and a real result without worse cases says so
    assert "None: on every case" in format_quality(result)


def test_time_only_worse_is_listed(result):
    fake = copy.deepcopy(result)
    row = next(r for r in fake["cases"] if r["id"] == "hsdp_grad")
    row["existing"]["time"] = row["torch"]["time"] * 1.01
    assert [w["policy"] for w in find_worse(fake["cases"])] == ["existing"]


def test_torch_log_levels_are_restored():
    """The bench quiets torch's redistribution loggers for its own run only."""
    import logging

    names = ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._collective_utils")
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.INFO)
        harness_run.quality_bench([BY_ID["hsdp_grad"]], verify=False)
        assert [lg.level for lg in loggers] == [logging.INFO] * len(loggers)
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)


def test_unsupported_case_is_listed_not_raised():
    case = BY_ID["loss_parallel_mixed"]
    res = harness_run.quality_bench([case], verify=True)
    row = res["cases"][0]
    assert row["torch"]["status"] == "ok" and row["torch"]["collectives"] == 2
    for policy in POLICIES:
        if row[policy]["status"] == "ok":  # mixed avg/sum partials landed
            continue
        assert row[policy]["status"] == "unsupported"
        assert any(u["id"] == case.id and u["side"] == policy for u in res["unsupported"])
        assert f"{case.id} (ours groups={policy}): unsupported" in format_quality(res)
    assert res["totals"]["compared"] == (1 if all(row[p]["status"] == "ok" for p in POLICIES) else 0)


def test_bench_part_quality(tmp_path, capsys):
    """`redist-opt bench --part quality` beside the bench's own options; bad input exits 2."""
    out, js = tmp_path / "q.md", tmp_path / "q.json"
    assert (
        main(
            [
                "bench",
                "--part",
                "quality",
                "--corpus-case",
                "gradnorm_3d",
                "--profile",
                "gloo",
                "--report",
                str(out),
                "--json",
                str(js),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert "| gradnorm_3d | grad_norm |" in text and "## Totals" in text and "cost model 'gloo'" in text
    assert "## Verification" not in text  # the harness's section: the command verifies nothing
    assert js.read_text().lstrip().startswith("{")
    assert main(["bench", "--part", "quality", "--corpus-case", "nope"]) == 2
    assert "unknown case id" in capsys.readouterr().err
    assert main(["bench", "--part", "quality", "--corpus", str(tmp_path / "missing.json")]) == 2
    assert (
        main(
            [
                "bench",
                "--part",
                "quality",
                "--corpus-case",
                "gradnorm_3d",
                "--profile",
                str(tmp_path / "nope.json"),
            ]
        )
        == 2
    )
    assert "--profile" in capsys.readouterr().err


def test_harness_command(tmp_path):
    out = tmp_path / "q.md"
    assert harness_run.main(["--corpus-case", "gradnorm_3d", "--no-verify", "--report", str(out)]) == 0
    assert "torch's side: DTensor.redistribute run" in out.read_text()


def test_sim_shapes():
    # even dims shrink to the product of the mesh dims sharding them, unsharded dims to 1,
    # uneven dims keep their size
    sim = harness_run.sim_shape
    assert sim(BY_ID["jagged_5x8_param"]) == ((4096, 8), 14336 // 8)  # 4096 % 5 != 0
    assert sim(BY_ID["hsdp_grad"]) == ((4, 1), 14336 * 4096 // 4)
    assert sim(BY_ID["ep_dispatch_borrow_cp"]) == ((4, 4, 1), 64 * 2048 * 4096 // 16)
    assert sim(BY_ID["gradnorm_3d"]) == ((), 1)


def test_verify_failures_are_reported(result):
    fake = copy.deepcopy(result)
    fake["verify_failures"] = [
        dict(id="hsdp_grad", policy="existing", ok=False, executed={"bytes": 1}, planned={"bytes": 2})
    ]
    row = next(r for r in fake["cases"] if r["id"] == "hsdp_grad")
    row["verify"]["existing"]["ok"] = False
    text = harness_run.format_report(fake)
    assert "- hsdp_grad groups=existing: executed {'bytes': 1}, planned {'bytes': 2}" in text
    assert f"{len(SMALL) * 2 - 1} of {len(SMALL) * 2} of our plans" in text
