"""Lowering optimized plans into compiled FX graphs (``redist_opt.graph.lower_chains`` / ``lower_ops``).

* Every op of the IR op table has a graph lowering, and the plans of
  ``support.lowering_programs.CASES`` hold every op and every step variant
  between them (a new op or variant fails here until it is lowered and has a case).
* Each case lowers, at every mesh coordinate, to a graph whose shapes are the
  IR's (fake tensors, in this process) and whose values equal the eager runtime's
  and torch's ``redistribute`` with its merge pass off (gloo, 4 ranks).
* ``S(0),S(1) -> R,R`` on a 2x4 mesh compiled with ``groups="create"`` becomes
  one all_gather (one fake rank, with the graph's metadata and with only ``val``
  left), and compiled programs with a lowered ``unpack_blocks`` give the
  uncompiled values bitwise (gloo).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx
from support import lowering_programs as LP
from support.paths import SUPPORT
from support.program_report import read as read_report
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh

from redist_opt.graph import lower_chains
from redist_opt.graph.lower_ops import LOWERED_OPS
from redist_opt.graph.mesh_groups import mesh_contexts
from redist_opt.graph_pass import count_collectives
from redist_opt.ir import symbolic as sym
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.ops import OPS, STEP_VARIANTS
from redist_opt.tools.spawn import run_ranks

pytestmark = pytest.mark.xdist_group("graph_lowering")  # the mesh22 and fake_2x4 fixtures

CASE_IDS = [c[0] for c in LP.CASES]


def test_every_ir_op_has_a_graph_lowering():
    assert LOWERED_OPS == frozenset(OPS), f"not lowered into graphs: {sorted(set(OPS) - LOWERED_OPS)}"


def test_cases_cover_every_op_and_step_variant():
    spec = MeshSpec(LP.MESH, ("a", "b"))
    seen = set()
    for case in LP.CASES:
        contents = LP.plan_contents(LP.plan_of(spec, case))
        assert case[5] <= contents, (case[0], sorted(contents))
        seen |= contents
    missing = (set(OPS) | set(STEP_VARIANTS)) - seen
    assert not missing, f"no lowering case holds {sorted(missing)}: add one to lowering_programs.CASES"


@pytest.fixture(scope="module")
def mesh22():
    # 4 of the session's fake ranks; this process is rank 0.
    return DeviceMesh("cpu", torch.arange(4).view(2, 2), mesh_dim_names=("a", "b"))


def _lower_at(plan, ctx, coord, groups):
    """The plan lowered for the rank at ``coord`` on a fake input of that rank's local shape."""
    ctx = dataclasses.replace(ctx, coord=coord)
    in_shape = [sym.evaluate(s, coord) for s in next(iter(plan.graph.graph.nodes)).meta["shape"]]
    graph = fx.Graph()
    x = graph.placeholder("x")
    with FakeTensorMode():
        x.meta["val"] = torch.empty(in_shape)
    out = lower_chains.lower_plan(graph, plan, x, ctx, groups)
    graph.output(out)
    graph.lint()
    return graph, out


@pytest.mark.parametrize("case", LP.CASES, ids=CASE_IDS)
def test_lowered_graph_has_the_ir_shapes_at_every_coordinate(mesh22, case):
    spec = MeshSpec.from_device_mesh(mesh22)
    plan = LP.plan_of(spec, case)
    ctx = next(c for c in mesh_contexts(mesh22) if c.device_mesh is mesh22)
    ir_out = list(plan.graph.graph.nodes)[-1].args[0].meta["shape"]
    for coord in itertools.product(*(range(n) for n in LP.MESH)):
        graph, out = _lower_at(plan, ctx, coord, case[4])
        want = [sym.evaluate(s, coord) for s in ir_out]
        assert list(out.meta["val"].shape) == want, (case[0], coord)
        assert sum(count_collectives(graph).values()) == len(plan.collectives())


def test_unlowerable_op_leaves_the_graph_untouched(mesh22, monkeypatch):
    spec = MeshSpec.from_device_mesh(mesh22)
    plan = LP.plan_of(spec, next(c for c in LP.CASES if c[0] == "gather_blocks"))
    ctx = next(c for c in mesh_contexts(mesh22) if c.device_mesh is mesh22)
    monkeypatch.setattr(lower_chains, "LOWERED_OPS", LOWERED_OPS - {"unpack_blocks"})
    graph = fx.Graph()
    x = graph.placeholder("x")
    with pytest.raises(lower_chains.Unlowerable, match="unpack_blocks, which is not lowered"):
        lower_chains.lower_plan(graph, plan, x, ctx, "create")
    assert len(graph.nodes) == 1


@pytest.mark.slow  # 95 s here (shared 2 cores): 4 gloo ranks, 17 plans each
def test_lowered_plans_equal_eager_and_torch_on_gloo():
    results = run_ranks(LP.gloo_lowered_plans, 4, (), timeout=600)
    assert all(r == results[0] for r in results)  # every rank ran (and checked) every case
    assert set(results[0]) == {run_id for _, _, run_id in LP.runs()}


@pytest.mark.slow  # 128 s here (shared 2 cores): torch.compile of three programs on 4 gloo ranks
def test_compiled_unpack_blocks_equal_uncompiled_on_gloo():
    results = run_ranks(LP.gloo_compiled_gathers, 4, (), timeout=900)
    for name in LP.GATHER_PROGRAMS:
        # (every rank asserted its compiled output equals the uncompiled one bitwise)
        got = {r[name]["after"].get("all_gather") for r in results}
        assert got == {1}, results[0][name]["explain"]
        assert results[0][name]["before"] == {"all_gather": 2}
        assert all(r[name]["unpacked"] for r in results)


@pytest.fixture(scope="module")
def fake_2x4():
    proc = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "lowering_programs.py"), "fake", "5"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return read_report(proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("meta", ["meta", "val_only"])
def test_s0_s1_to_replicate_on_2x4_is_one_all_gather(fake_2x4, meta):
    (g,) = fake_2x4[meta]
    assert g["before"] == {"all_gather": 2}
    assert g["after"] == {"all_gather": 1}, g["explain"]
    assert "merge-gathers-across-dims" in g["explain"]
    assert "aten.permute.default" in g["code_after"]  # the blocks are unpacked in the graph
