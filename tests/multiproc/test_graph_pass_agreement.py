"""Compile-time agreement across ranks cannot hang a job (real gloo ranks, 4 processes).

The mesh dims of a rank slice are agreed through the default group's store, one
round per compiled graph under a key that names what is agreed (the graph and the
mesh), among the ranks that compile the same program, for at most
``AGREEMENT_TIMEOUT_S``; a round that does not complete leaves the chain as it was on
every rank of it, or as an earlier committed round of the same chain decided. Every rank compares its
compiled outputs with the uncompiled program's (see ``agreement_programs``).
"""

from __future__ import annotations

import time

import pytest
from support import agreement_programs as A

from redist_opt.graph.agreement import AGREEMENT_TIMEOUT_S
from redist_opt.tools.spawn import run_ranks

pytestmark = pytest.mark.xdist_group(
    "graph_pass_agreement"
)  # the recompile and stages fixtures: 4 gloo ranks each

# A round that completes waits only for the other ranks to reach it: under load on a
# small machine that can take a moment, but never the timeout.
QUICK_S = AGREEMENT_TIMEOUT_S - 1.0
# A round that gives up returns right after the timeout.
GIVE_UP_S = AGREEMENT_TIMEOUT_S + 2.0
GAVE_UP = "gave its slice facts within"


def _run(target):
    start = time.perf_counter()
    results = run_ranks(target, 4, (), timeout=600)
    print(f"{target.__name__}: {time.perf_counter() - start:.1f} s wall on 4 gloo ranks")
    for rank, r in enumerate(results):  # seconds each run of the pass took (-s shows them)
        print(f"  rank {rank}:", {k: round(v["seconds"], 2) for k, v in r.items() if isinstance(v, dict)})
    return results


@pytest.fixture(scope="module")
def recompile():
    return _run(A.recompile_on_one_rank)


@pytest.fixture(scope="module")
def stages():
    return _run(A.pipeline_stages)


def test_agreed_on_every_rank_before_any_recompile(recompile):
    for r in recompile:
        assert r["first"]["modified"] and r["first"]["seconds"] < QUICK_S, r["first"]


def test_recompile_on_one_rank_reuses_the_agreement(recompile):
    # rank 0 compiled the graph twice, the others once; the second compile's round
    # found nobody (bounded wait), then took the answer the round of every rank
    # committed for the same chain and facts, and made the same rewrite (the
    # collectives paired up: every rank ran its graph and got the right output)
    assert recompile[0]["graphs_compiled"] == 2
    assert all(r["graphs_compiled"] == 1 for r in recompile[1:])
    again = recompile[0]["recompiled"]
    assert again["modified"] and again["after"] == recompile[0]["first"]["after"]
    assert AGREEMENT_TIMEOUT_S <= again["seconds"] < GIVE_UP_S, again
    assert "an earlier round of the same chain agreed" in again["explain"], again


def test_graph_compiled_on_one_rank_gives_up_in_bounded_time(recompile):
    lone = recompile[0]["lone"]
    assert AGREEMENT_TIMEOUT_S <= lone["seconds"] < GIVE_UP_S, lone
    assert GAVE_UP in lone["explain"]
    assert lone["after"] == lone["before"]  # the all_reduce and the slice stay


def test_later_agreements_are_unaffected_by_extra_graphs(recompile):
    for r in recompile:
        assert r["after"]["modified"] and r["after"]["after"] == 0, r["after"]
        assert r["after"]["seconds"] < QUICK_S, r["after"]


def test_give_up_holds_for_every_rank_at_once(recompile):
    # rank 0 gave up on that chain: the others now find the verdict and leave it too
    for r in recompile:
        row = r["lone_everywhere"]
        assert not row["modified"] and GAVE_UP in row["explain"], row
        assert row["seconds"] < QUICK_S, row


def test_pipeline_stages_agree_within_their_stage(stages):
    assert sorted(r["stage"] for r in stages) == [0, 0, 1, 1]
    for r in stages:
        for step in ("own", "same"):
            assert r[step]["modified"] and r[step]["seconds"] < QUICK_S, (step, r[step])


def test_pipeline_stages_asked_as_one_mesh_give_up_in_bounded_time(stages):
    # the root mesh given: each stage waits for ranks that compile another program
    for r in stages:
        row = r["root"]
        assert not row["modified"] and GAVE_UP in row["explain"], row
        assert row["seconds"] < GIVE_UP_S, row
