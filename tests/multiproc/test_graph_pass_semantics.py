"""Raising by semantics, not by metadata, on 4 gloo ranks (2x2 (dp, tp) mesh).

The compiled graphs have every node's metadata but its value stripped (as graphs
from other tracers, autoparallel's, carry no ``source_fn_stack``): rank slices are
raised when their constant index is this rank's block over mesh dims that every
rank agrees on (``redist_opt.graph.agreement``). Each rank compares the compiled
outputs (and gradients) with the uncompiled program's; see ``semantic_programs``.
"""

from __future__ import annotations

import pytest
from support import semantic_programs as S

from redist_opt.tools.spawn import run_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("graph_pass_semantics"),
]  # about 3 min on 2 busy cores: 4 gloo ranks, shared by the runs fixture


@pytest.fixture(scope="module")
def runs():
    return run_ranks(S.gloo_semantics, 4, (), timeout=1800)


def test_same_decisions_on_every_rank(runs):
    first = {k: (v["after"], v["modified"]) for k, v in runs[0].items()}
    assert all({k: (v["after"], v["modified"]) for k, v in r.items()} == first for r in runs[1:])


def test_autoparallel_shaped_chains_are_raised(runs):
    r = runs[0]
    # all_gather(tp), split, all_gather(dp), all_gather(tp) (split + cat), split
    g = r["ap_weight_gather"]
    assert (g["before"], g["after"], g["modified"]) == (3, 1, True), g["explain"]
    assert "S(0),S(0) -> R,S(0)" in g["explain"]
    g = r["ap_grad_reduce"]  # all_reduce + this rank's block: one reduce_scatter
    assert g["modified"] and g["after"] <= g["before"], g["explain"]
    assert "reduce_scatter(dp)" in g["explain"]


def test_user_constant_index_is_not_raised(runs):
    g = runs[0]["ap_weight_gather@index0"]
    # Both slices stay as traced; the two gathers between them (over dp, then over tp
    # on dim 1) are a chain of their own, one all_gather over the dp+tp group.
    assert (g["before"], g["after"]) == (3, 2), g["explain"]
    assert "cannot be proven to select this rank's block" in g["explain"]
    assert "S(0),S(1) -> R,R" in g["explain"] and "rewritten" in g["explain"]


@pytest.mark.parametrize("name", sorted(S.DTENSOR))
def test_dtensor_chains_raise_without_metadata_as_with_it(runs, name):
    stripped, meta = runs[0][name], runs[0][f"{name}+meta"]
    assert (stripped["after"], stripped["modified"]) == (meta["after"], meta["modified"])
    assert stripped["after"] <= stripped["before"]


def test_chain_through_shared_value_rewritten_when_cheaper(runs):
    g = runs[0]["shared_gather_back"]
    assert (g["before"], g["after"]) == (3, 2), g["explain"]
    assert "[all_reduce(tp) kept]" in g["explain"] and "rewritten" in g["explain"]


def test_chain_through_shared_value_left_when_not_cheaper(runs):
    g = runs[0]["shared_not_cheaper"]
    assert not g["modified"] and g["after"] == g["before"] == 2
    assert "counting 1 kept for other users of a shared value" in g["explain"]
