"""The compiled-graph pass on meshes built as torchtitan builds them (``_unflatten``
views of a 1-D world mesh, flattened groups of those views, sibling dense and
expert meshes), on one fake rank (rank 5 of 8) in a subprocess; see
``graph_views_programs.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "graph_views_programs.py"), "fake", "5"],
        capture_output=True, text=True, timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0 and "JSON" in out, proc.stderr[-4000:]
    return json.loads(out[out.index("JSON") + 4:])


MESH = "on pp=1,dp_replicate=1,dp_shard=2,cp=2,tp=2"


@pytest.mark.parametrize("given", ["given", "live"])
def test_simplefsdp_grad_on_unflattened_views(report, given):
    (g,) = report[f"{given}/simplefsdp_grad"]
    assert g["before"] == {"all_reduce": 2, "reduce_scatter": 1}
    assert g["after"] == {"all_reduce": 1}, g["explain"]
    assert "is no set of dims" not in g["explain"]
    assert f"R,R,P,P,P -> R,R,R,S(0),R (8, 4) {MESH}" in g["explain"]
    assert "3 -> 1 collectives, 320 -> 224 B" in g["explain"], g["explain"]


@pytest.mark.parametrize("given", ["given", "live"])
def test_ppp_grad_on_a_slice_of_a_view(report, given):
    (g,) = report[f"{given}/ppp_grad"]
    assert g["before"] == {"all_reduce": 2, "reduce_scatter": 1}
    assert g["after"] == {"all_reduce": 1}, g["explain"]
    assert "3 -> 1 collectives, 256 -> 224 B" in g["explain"], g["explain"]


@pytest.mark.parametrize("given", ["given", "live"])
def test_expert_mesh_groups_resolve_on_the_dense_view(report, given):
    # efsdp (4 ranks, stride 2) is dp_shard x cp of the dense view, ep is its tp
    (g,) = report[f"{given}/expert_grad"]
    assert g["before"] == {"reduce_scatter": 1, "all_reduce": 1}
    assert g["after"] == {"all_reduce": 1}, g["explain"]
    assert "reduce_scatter(dp_shard+cp) ; all_reduce(tp) => all_reduce(dp_shard+cp+tp)" in g["explain"]
