"""``redist_opt.tools.quality``: the quality benchmark against torch's shipped redistribute.

* its torch numbers equal an independent count: torch's redistribute (merge pass
  on) run here under ``CommDebugMode`` on a fresh mesh with the case's flattened
  groups, per collective kind; and torch's bytes at the realistic shape follow
  from the simulation shape exactly (checked against a run without scaling);
* its numbers for ours equal the plans' (``plan`` + ``optimize``);
* worse cases are listed (fed a fake result), unsupported ones are listed, not raised.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import Counter

from support.inputs import build_input
from support.runs import collective_kind
import pytest
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.tools import quality
from redist_opt.ir.cost import CostModel

pytestmark = pytest.mark.xdist_group("quality")  # the result fixture runs the corpus

BY_ID = {c.id: c for c in quality.load_corpus()}
SMALL = ["hsdp_grad", "gradnorm_3d", "ep_dispatch_borrow_cp"]


@pytest.fixture(scope="module")
def result():
    return quality.quality_bench([BY_ID[i] for i in SMALL], verify=True)


def _independent_torch_counts(case) -> Counter:
    """torch 2.13's redistribute, merge pass on, counted by a plain CommDebugMode."""
    spec = case.spec()
    src, dst = case.placements()
    sim, _ = case.sim_shape()
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
        sum(model.collective_time(k, BY_ID["hsdp_grad"].spec().group(d), full, BY_ID["hsdp_grad"].spec())
            for k, d in (("all_reduce", (0,)), ("reduce_scatter", (1,))))
    )


@pytest.mark.parametrize("case_id", SMALL)
def test_our_numbers_are_the_plans(result, case_id):
    case = BY_ID[case_id]
    row = next(r for r in result["cases"] if r["id"] == case_id)
    naive = redist_opt.plan(case.spec(), case.src, case.dst, shape=case.shape, dtype=case.torch_dtype())
    for policy in quality.POLICIES:
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
    sim, scale = case.sim_shape()
    assert sim == (23, 1) and scale == 6
    scaled = quality.quality_bench([case], verify=False)["cases"][0]["torch"]
    monkeypatch.setattr(quality.CorpusCase, "sim_shape", lambda self: (self.shape, 1))
    direct = quality.quality_bench([case], verify=False)["cases"][0]["torch"]
    assert scaled["bytes"] == direct["bytes"] and scaled["collectives"] == direct["collectives"]
    assert scaled["time"] == pytest.approx(direct["time"])


def test_worse_cases_are_listed(result):
    fake = copy.deepcopy(result)
    row = next(r for r in fake["cases"] if r["id"] == "gradnorm_3d")
    row["existing"]["collectives"] = row["torch"]["collectives"] + 1
    row["create"]["bytes"] = row["torch"]["bytes"] * 2
    worse = quality.find_worse(fake)
    assert {(w["id"], w["policy"]) for w in worse} == {("gradnorm_3d", "existing"), ("gradnorm_3d", "create")}
    assert any("collectives" in r for w in worse for r in w["reasons"])
    assert any("bytes/rank" in r for w in worse for r in w["reasons"])
    text = quality.format_quality(fake)
    assert "WORSE" in text
    assert "- gradnorm_3d (groups=existing): collectives" in text
    assert "- gradnorm_3d (groups=create): bytes/rank" in text
    # and a real result without worse cases says so
    assert "None: on every case" in quality.format_quality(result)


def test_time_only_worse_is_listed(result):
    fake = copy.deepcopy(result)
    row = next(r for r in fake["cases"] if r["id"] == "hsdp_grad")
    row["existing"]["time"] = row["torch"]["time"] * 1.01
    assert [w["policy"] for w in quality.find_worse(fake)] == ["existing"]


def test_torch_log_levels_are_restored():
    """The bench quiets torch's redistribution loggers for its own run only."""
    import logging

    names = ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._collective_utils")
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.INFO)
        quality.quality_bench([BY_ID["hsdp_grad"]], verify=False)
        assert [lg.level for lg in loggers] == [logging.INFO] * len(loggers)
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)


def test_unsupported_case_is_listed_not_raised():
    case = BY_ID["loss_parallel_mixed"]
    res = quality.quality_bench([case], verify=True)
    row = res["cases"][0]
    assert row["torch"]["status"] == "ok" and row["torch"]["collectives"] == 2
    for policy in quality.POLICIES:
        if row[policy]["status"] == "ok":  # mixed avg/sum partials landed
            continue
        assert row[policy]["status"] == "unsupported"
        assert any(u["id"] == case.id and u["side"] == policy for u in res["unsupported"])
        assert f"{case.id} (ours groups={policy}): unsupported" in quality.format_quality(res)
    assert res["totals"]["compared"] == (1 if all(row[p]["status"] == "ok" for p in quality.POLICIES) else 0)


def test_cli(tmp_path, capsys):
    out, js = tmp_path / "q.md", tmp_path / "q.json"
    rc = quality.main(["--corpus-case", "gradnorm_3d", "--no-verify", "--report", str(out), "--json", str(js)])
    assert rc == 0
    text = out.read_text()
    assert "| gradnorm_3d | grad_norm |" in text and "## Totals" in text
    assert js.read_text().lstrip().startswith("{")
    assert quality.main(["--corpus-case", "nope"]) == 2
    assert "unknown case id" in capsys.readouterr().err
    assert quality.main(["--corpus", str(tmp_path / "missing.json")]) == 2
    assert quality.main(["--corpus-case", "gradnorm_3d", "--profile", str(tmp_path / "nope.json")]) == 2
    assert "--profile" in capsys.readouterr().err


def test_bench_part_quality(tmp_path, capsys):
    """Wired as `redist-opt bench --part quality` beside the bench's own options."""
    from redist_opt.tools.cli import main

    out = tmp_path / "q.md"
    assert main(["bench", "--part", "quality", "--corpus-case", "gradnorm_3d", "--no-verify",
                 "--profile", "gloo", "--report", str(out)]) == 0
    assert "cost model 'gloo'" in out.read_text()
    assert main(["bench", "--part", "quality", "--corpus-case", "nope"]) == 2


def test_arguments_fit_beside_the_bench_options():
    """The lead wires them into `redist-opt bench`, which has its own --case/--json/--profile."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--case", action="append")
    p.add_argument("--json")
    p.add_argument("--profile")
    quality.add_quality_arguments(p, common=False)  # no argparse conflict
    args = p.parse_args(["--corpus-case", "hsdp_grad", "--profile", "gloo", "--json", "x.json"])
    assert args.corpus_case == ["hsdp_grad"] and args.profile == "gloo" and args.report is None


def test_sim_shapes():
    # even dims shrink to the product of the mesh dims sharding them, unsharded dims to 1,
    # uneven dims keep their size
    assert BY_ID["jagged_5x8_param"].sim_shape() == ((4096, 8), 14336 // 8)  # 4096 % 5 != 0
    assert BY_ID["hsdp_grad"].sim_shape() == ((4, 1), 14336 * 4096 // 4)
    assert BY_ID["ep_dispatch_borrow_cp"].sim_shape() == ((4, 4, 1), 64 * 2048 * 4096 // 16)
    assert BY_ID["gradnorm_3d"].sim_shape() == ((), 1)


def test_verify_failures_are_reported(result):
    fake = copy.deepcopy(result)
    fake["verify_failures"] = [
        dict(id="hsdp_grad", policy="existing", ok=False, executed={"bytes": 1}, planned={"bytes": 2})
    ]
    row = next(r for r in fake["cases"] if r["id"] == "hsdp_grad")
    row["verify"]["existing"]["ok"] = False
    text = quality.format_quality(fake)
    assert "- hsdp_grad groups=existing: executed {'bytes': 1}, planned {'bytes': 2}" in text
    assert f"{len(SMALL) * 2 - 1} of {len(SMALL) * 2} of our plans" in text
