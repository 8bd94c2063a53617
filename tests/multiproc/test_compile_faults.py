"""Faults at compile time (4 gloo ranks, each run under the fault harness's watchdog).

Each test compiles programs with ``redist_opt.backend`` and with torch's
``aot_eager`` (the reference), injects a fault (a lone recompile, compile orders that
differ, pipeline stages, a graph traced for any rank) and asserts, from the gloo
flight recorder, that every rank issued the same collectives in every process
group, that the outputs equal the reference's, and that no compile waited longer
than the agreement's bound. The measured worst waits are in docs/faults.md (Compile time).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compile_fault_programs as P  # noqa: E402
import fault_harness as H  # noqa: E402

from redist_opt.graph.agreement import AGREEMENT_TIMEOUT_S  # noqa: E402
from redist_opt.ir.cost import CostModel  # noqa: E402

pytestmark = pytest.mark.slow

WORLD = 4
# A compile that waits for the agreement waits at most the timeout, plus the lock
# holder's few store reads, plus tracing and compiling the graph on a loaded machine.
BOUND_S = AGREEMENT_TIMEOUT_S + 20.0
# A round every rank joins never waits for the timeout.
QUICK_S = AGREEMENT_TIMEOUT_S - 0.5


def _run(program, **kw) -> dict:
    reports = H.run_program(program, WORLD, bound_s=240.0, **kw)
    texts = {}
    for rank, rep in reports.items():  # "_" keys are texts a program returned, not outputs
        texts[rank] = {k: P.text_of(rep.outputs, k) for k in list(rep.outputs or {}) if k.startswith("_")}
        for d in (rep.outputs, rep.reference):
            for k in [k for k in (d or {}) if k.startswith("_")]:
                del d[k]
    H.assert_consistent(reports, bound_s=BOUND_S)
    worst = H.worst_wait(reports)
    print(f"{program.__name__}: worst section {worst:.2f} s")
    return {"reports": reports, "texts": texts, "worst": worst}


def _sections(run, rank):
    return run["reports"][rank].sections


def test_a_lone_recompile_of_a_dtensor_chain_runs_the_others_collectives():
    run = _run(P.lone_recompile_dtensor)
    # rank 0 recompiled alone: it waited for the others (bounded), then took the
    # answer of the round every rank committed; the others never waited
    assert _sections(run, 0)["step1"] >= AGREEMENT_TIMEOUT_S
    assert all(_sections(run, r)["step1"] < QUICK_S for r in (1, 2, 3))
    explain = run["texts"][0]["_explain"]
    assert "rewritten" in explain and "an earlier round of the same chain agreed" in explain, explain


def test_a_lone_recompile_of_a_chain_of_unknown_origin_runs_the_others_collectives():
    run = _run(P.lone_recompile_unknown_origin)
    explain = run["texts"][0]["_explain"]
    first, again = explain.split("\n----\n")[:2]
    assert "all_reduce(tp) => reduce_scatter(tp): rewritten" in first, first
    assert (
        "reduce_scatter(tp): rewritten" in again and "an earlier round of the same chain agreed" in again
    ), again


def test_compile_orders_that_differ_give_every_rank_the_same_collectives():
    run = _run(P.compile_orders_differ)
    for rank in range(WORLD):
        texts = run["texts"][rank]
        # one function traced for two placements: every rank's first round holds A on
        # some ranks and B on the others, and no slice dims fit them all
        assert "not determined" in texts["_explain_same"], texts["_explain_same"]
        # programs of different structure wait for each other on their first compile
        # (bounded), and give up together; the second compile finds the verdict at once
        waits = _sections(run, rank)
        first = max(waits["other0a"], waits["other0b"])
        assert AGREEMENT_TIMEOUT_S <= first, waits
        assert "gave its slice facts within" in texts["_explain_other"], texts["_explain_other"]


def test_pipeline_stages_compile_different_programs_independently():
    run = _run(P.pipeline_stages)
    for rank in range(WORLD):
        sections, texts = _sections(run, rank), run["texts"][rank]
        assert sections["stage0"] < QUICK_S and sections["stage1"] < QUICK_S, sections
        assert "rewritten" in texts["_explain0"] and "rewritten" in texts["_explain1"], texts
    for rank in (2, 3):  # stage pp=1's funcol chain: the whole root mesh asked, bounded give-up
        assert AGREEMENT_TIMEOUT_S <= _sections(run, rank)["funcol"] < BOUND_S
        assert "gave its slice facts within" in run["texts"][rank]["_explain_funcol"]


def test_a_graph_compiled_for_any_rank_stays_rank_independent():
    run = _run(P.compiled_for_any_rank)
    codes = {run["texts"][r]["_code"] for r in range(WORLD)}
    assert len(codes) == 1, "the graphs differ by rank:\n" + "\n########\n".join(sorted(codes))
    # no rank waited for an agreement: the pass asked no round (the graph has no rank slice)
    assert all(run["texts"][r]["_rounds"] == "0" for r in range(WORLD)), run["texts"]
    # traced by torch (coordinates read at run time), left as traced by the pass
    assert "_runtime_compute_coordinate_on_dim" in next(iter(codes))
    assert "rewritten" not in run["texts"][0]["_explain"]


def _launch_bound_profile(tmp_path) -> str:
    """A gloo profile whose launches cost 10 s: every combination is latency-bound."""
    path = tmp_path / "launch_bound.json"
    dataclasses.replace(CostModel.profile("gloo"), launch=10.0, fitted=()).save(str(path))
    return str(path)


def test_ranks_pricing_with_different_profiles_compile_the_graph_as_traced(tmp_path):
    # (f, compiled) rank 1 alone would combine the two gathers: every rank sees the
    # profiles differ in one round, so every rank's pass stops and the graph runs as
    # traced everywhere (the same collectives on every rank, checked by _run)
    run = _run(P.gathers_priced, rank_env={1: {"REDIST_OPT_COST_PROFILE": _launch_bound_profile(tmp_path)}})
    assert all(run["texts"][r]["_explain"] == "pass failed" for r in range(WORLD)), run["texts"]
    assert all(_sections(run, r)["step0"] < BOUND_S for r in range(WORLD))


def test_ranks_pricing_with_one_profile_combine_alike(tmp_path):
    run = _run(P.gathers_priced, env={"REDIST_OPT_COST_PROFILE": _launch_bound_profile(tmp_path)})
    for r in range(WORLD):
        assert "combined 2 all_gathers over group" in run["texts"][r]["_explain"], run["texts"][r]
