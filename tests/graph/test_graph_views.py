"""The compiled-graph pass on meshes built as torchtitan builds them (``_unflatten``
views of a 1-D world mesh, flattened groups of those views, sibling dense and
expert meshes), on one fake rank (rank 5 of 8) in a subprocess; see
``graph_views_programs.py``."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

import pytest
from support.paths import SUPPORT
from support.program_report import read as read_report

from redist_opt.ir.cost import PROFILE_ENV

pytestmark = pytest.mark.xdist_group(
    "graph_views"
)  # the report fixture compiles every program in a subprocess

SCRIPT = os.path.join(SUPPORT, "graph_views_programs.py")


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run([sys.executable, SCRIPT, "fake", "5"], capture_output=True, text=True, timeout=900)
    return read_report(proc.returncode, proc.stdout, proc.stderr)


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


@pytest.mark.slow
def test_outputs_equal_on_eight_gloo_ranks():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    # What is checked here is that rewritten graphs compute the same outputs over real gloo
    # groups, so every program must be rewritten: the nccl profile rewrites them all, while the
    # gloo profile (which these meshes now get) keeps some of these small chains as they are.
    env = {**os.environ, PROFILE_ENV: "nccl"}
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, "gloo", str(r), "8", port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(8)
    ]
    outs = [p.communicate(timeout=1200) for p in procs]
    reports = [read_report(p.returncode, *o) for p, o in zip(procs, outs)]
    for r in reports:  # every rank rewrote every program (outputs were checked in the ranks)
        assert all(g["modified"] for graphs in r.values() for g in graphs), r


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed")
def test_meshes_from_torchtitan_parallel_dims():
    proc = subprocess.run(
        [sys.executable, SCRIPT, "torchtitan", "5"], capture_output=True, text=True, timeout=900
    )
    r = read_report(proc.returncode, proc.stdout, proc.stderr)
    for name in ("simplefsdp_grad", "ppp_grad", "expert_grad"):
        for given in ("given", "live"):
            (g,) = r[f"{given}/{name}"]
            assert g["modified"] and g["after"] == {"all_reduce": 1}, g["explain"]
