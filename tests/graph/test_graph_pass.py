"""The compiled-graph pass (``redist_opt.graph_pass``) on the fake backend.

The acceptance programs (``graph_pass_programs.py``) are compiled on one fake
rank in a subprocess (rank 5 of 8: mesh coordinate (1, 0, 1), so block indices
are not all zero) with a small aot_autograd backend that counts the collectives
of each forward/backward graph before and after the pass. Graph-level unit
tests below build graphs with ``make_fx`` in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from support.paths import SUPPORT
from support.program_report import read as read_report
from torch.distributed.device_mesh import DeviceMesh
from torch.fx.experimental.proxy_tensor import make_fx

import redist_opt
from redist_opt.graph import mesh_groups
from redist_opt.graph.mesh_groups import GivenMeshes, mesh_contexts
from redist_opt.graph_pass import RedistGraphPass, count_collectives, optimize_graph
from redist_opt.ir.layout import mesh_meaning, root_group_names
from redist_opt.runtime.mesh_facts import live_meshes
from redist_opt.torch_api import c10d  # all_gather_single on every torch (funcol has it from 2.13)

pytestmark = [
    pytest.mark.xdist_group("graph_pass"),  # the report fixture compiles every program in a subprocess
    pytest.mark.differential,  # compiled against uncompiled; .ci/run runs it on every torch
]


def _run_script(mode: str, rank: int) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "graph_pass_programs.py"), mode, str(rank)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    return read_report(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def report():
    return _run_script("fake", 5)


def _total(graphs, key) -> int:
    return sum(sum(g[key].values()) for g in graphs)


def _first_collective(code: str) -> str:
    for line in code.splitlines():
        for kind in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"):
            if f"_c10d_functional.{kind}" in line:
                return kind
    return ""


def test_simplefsdp_with_product_group(report):
    (g,) = report["flat/simplefsdp"]
    assert g["before"] == {"all_reduce": 2, "reduce_scatter": 1}
    assert g["after"] == {"reduce_scatter": 1, "all_reduce": 1}, g["explain"]
    assert _first_collective(g["code_after"]) == "reduce_scatter_tensor"
    assert "all_reduce(dpr+tp)" in g["explain"]


def test_simplefsdp_without_product_group_moves_scatter_first(report):
    (g,) = report["noflat/simplefsdp"]
    assert g["before"] == {"all_reduce": 2, "reduce_scatter": 1}
    assert g["after"] == {"reduce_scatter": 1, "all_reduce": 2}
    assert _first_collective(g["code_before"]) == "all_reduce"
    assert _first_collective(g["code_after"]) == "reduce_scatter_tensor"
    # both all_reduces now carry half the bytes: 320 -> 192 B moved per rank (ring)
    assert "320 -> 192 B" in g["explain"], g["explain"]


def test_replicate_then_shard_is_one_reduce_scatter(report):
    (g,) = report["noflat/replicate_then_shard"]
    assert g["before"] == {"all_reduce": 1}
    assert g["after"] == {"reduce_scatter": 1}, g["explain"]
    # the pointwise ops between the redistributions are kept, after the collective
    assert "aten.mul.Tensor" in g["code_after"] and "aten.add.Tensor" in g["code_after"]


def test_gather_then_own_block_is_nothing(report):
    (g,) = report["noflat/gather_then_own_block"]
    assert g["before"] == {"all_gather": 1}
    assert g["after"] == {}, g["explain"]


def test_parameter_gathers_are_combined(report):
    (g,) = report["noflat/gathered_params"]
    assert g["before"] == {"all_gather": 2}
    assert g["after"] == {"all_gather": 1}, g["explain"]
    assert "combined 2 all_gathers over group" in g["explain"]


def test_combining_switched_off_leaves_the_gathers_apart(report):
    (g,) = report["nocombine/gathered_params"]
    assert g["after"] == {"all_gather": 2} and "combined" not in g["explain"], g["explain"]


def test_uneven_parameter_gathers_are_not_combined(report):
    # their graphs differ by rank (the pad before the gather is on some ranks only)
    (g,) = report["noflat/gathered_params_uneven"]
    assert g["before"] == {"all_gather": 2}
    assert g["after"] == {"all_gather": 2}, g["explain"]


def test_gradient_reduce_scatters_are_combined(report):
    (g,) = report["noflat/scattered_grads"]
    assert g["before"] == {"reduce_scatter": 2}
    assert g["after"] == {"reduce_scatter": 1}, g["explain"]
    assert "combined 2 reduce_scatters over group" in g["explain"]


def test_forward_and_backward_graphs(report):
    fw, bw = report["noflat/dtensor_grad"]
    # P,P,P -> R,R,R: the world group exists (the mesh is the world in rank order)
    assert _total([fw], "before") == 3 and _total([fw], "after") == 1, fw["explain"]
    assert _total([bw], "after") <= _total([bw], "before")


@pytest.mark.parametrize("name", ["replicate_then_shard@m3", "gather_then_own_block@m3"])
def test_slice_needing_agreement_is_not_raised_on_fake(report, name):
    # Every dim of the 2x2x2 mesh has size 2: which one a constant-index slice selects
    # over is only known after agreement across ranks (done on gloo, see test_graph_pass_gloo).
    (g,) = report[f"noflat/{name}"]
    assert g["code_after"] == g["code_before"]
    assert "need agreement across ranks" in g["explain"]


@pytest.mark.parametrize("name", ["user_chunk", "uneven", "two_users"])
def test_unraisable_graphs_come_out_unchanged(report, name):
    for g in report[f"noflat/{name}"]:
        assert g["code_after"] == g["code_before"], g["explain"]
        assert not g["modified"]
        assert g["explain"]  # a reason is recorded


def test_user_chunk_reason(report):
    (g,) = report["noflat/user_chunk"]
    assert "cannot be proven to select this rank's block" in g["explain"]
    (g,) = report["noflat/two_users"]
    assert "has 2 users" in g["explain"]


# -- graph-level tests in this process (make_fx, fake PG of the test session) ----------------------


@pytest.fixture(scope="module")
def mesh3():
    # 8 of the session's 16 fake ranks; this process is rank 0.
    return DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))


def _trace(fn, *shapes):
    return make_fx(fn, tracing_mode="fake")(*[torch.zeros(s) for s in shapes])


def test_graph_without_known_groups_is_unchanged(mesh3):
    world = dist.group.WORLD

    def f(x):
        a = funcol.all_reduce(x, "sum", world)  # the 16-rank world is no group of the mesh
        b = funcol.all_to_all_single(a, None, None, mesh3.get_group(2))
        return funcol.all_reduce(b * 2, "product", mesh3.get_group(0))

    gm = _trace(f, (4, 4))
    code = gm.code
    result = optimize_graph(gm, meshes=mesh3)
    assert not result.modified
    assert gm.code == code
    text = result.explain()
    assert "is no set of dims of a known DeviceMesh" in text
    assert "all_to_all_single is not raised" in text
    assert "reduce op 'product' is not raised" in text


def test_reductions_merge_over_existing_group(mesh3):
    g0, g1 = mesh3.get_group(0), mesh3.get_group(2)

    def f(x):
        return funcol.all_reduce(funcol.all_reduce(x, "sum", g0), "sum", g1) + 1

    gm = _trace(f, (4, 4))
    before = count_collectives(gm)
    result = optimize_graph(gm, meshes=mesh3, prefer="consistency")
    # no x+z group exists: the two all_reduces stay two (nothing cheaper), graph unchanged
    assert before == {"all_reduce": 2}
    assert count_collectives(gm) == before and not result.modified
    flat = mesh3["x", "z"]._flatten()
    gm = _trace(f, (4, 4))
    result = optimize_graph(gm, meshes=mesh3, prefer="consistency")
    assert count_collectives(gm) == {"all_reduce": 1}, result.explain()
    names = [n.args[2] for n in gm.graph.nodes if n.target is torch.ops._c10d_functional.all_reduce.default]
    assert names == [flat.get_group().group_name]
    # the wait of the merged collective sits where the last original wait was
    waits = [n for n in gm.graph.nodes if n.target is torch.ops._c10d_functional.wait_tensor.default]
    assert len(waits) == 1
    # meshes=None: the program's live DeviceMeshes are found (which root a group name
    # resolves to then depends on every mesh alive in the process: other tests' too)
    assert any(c.device_mesh is mesh3 for c in mesh_contexts(None))
    gm = _trace(f, (4, 4))
    optimize_graph(gm, prefer="consistency")
    assert count_collectives(gm)["all_reduce"] <= 2


def test_dumps(mesh3, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIST_OPT_DUMP_DIR", str(tmp_path))
    g0 = mesh3.get_group(1)

    def f(x):
        a = c10d.all_gather_single(x, 0, g0)
        return funcol.all_reduce(a, "sum", dist.group.WORLD)

    gm = _trace(f, (2, 4))
    optimize_graph(gm, meshes=mesh3)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith(".before.txt") for n in names)
    assert any(n.endswith(".after.txt") for n in names)
    assert any(".chain" in n for n in names), names
    explain = next(p for p in tmp_path.iterdir() if p.name.endswith(".explain.txt")).read_text()
    assert "not raised" in explain  # the world all_reduce: one line saying why
    chain = next(p for p in tmp_path.iterdir() if ".chain" in p.name).read_text()
    assert "raised (naive plan)" in chain and "all_gather" in chain


def test_custom_graph_pass_uuid_and_call(mesh3):
    a, b = RedistGraphPass(), RedistGraphPass()
    assert a.uuid() == b.uuid()  # stable: FX graph cache keys stay valid
    for groups in ("create", ["y+z"]):
        with pytest.raises(redist_opt.RedistributeError, match=r"groups=.*groups='existing' only"):
            RedistGraphPass(groups=groups)
    assert RedistGraphPass(prefer="consistency").uuid() != a.uuid()
    assert RedistGraphPass(options=redist_opt.PlanOptions(prefer="consistency")).uuid() != a.uuid()
    assert RedistGraphPass(passes=[]).uuid() != a.uuid()
    assert RedistGraphPass(cost="gloo").uuid() != a.uuid()
    g0, g1 = mesh3.get_group(0), mesh3.get_group(1)

    def f(x):
        return funcol.all_reduce(funcol.all_reduce(x, "sum", g0), "sum", g1)

    gm = _trace(f, (4, 4))
    p = RedistGraphPass(meshes=mesh3, prefer="consistency")
    p(gm.graph)  # Inductor calls it with a torch.fx.Graph
    assert p.results and p.results[0].chains
    assert isinstance(gm.graph, fx.Graph)


def test_mesh_search_order_does_not_follow_the_order_meshes_are_found_in(mesh3, monkeypatch):
    # Two roots over mesh3's ranks that differ only in which dims are flattened. The
    # garbage collector lists live objects in an order that changes as they age (and
    # differs between ranks); the search order and the pass's cache key must not follow it.
    first = DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))
    second = DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))
    first["x", "y"]._flatten()
    second["y", "z"]._flatten()
    found = live_meshes()
    orders, keys = [], []
    for listed in (found, found[::-1]):
        monkeypatch.setattr(mesh_groups, "live_meshes", lambda listed=listed: list(listed))
        contexts = mesh_contexts(None)
        orders.append([(c.spec.canonical(), root_group_names(c.device_mesh)) for c in contexts])
        keys.append(RedistGraphPass().uuid())
    assert orders[0] == orders[1]
    assert keys[0] == keys[1]


def test_a_mesh_counts_in_a_cache_key_by_what_it_is(mesh3):
    # Inductor's key of a graph of ours holds its mesh input as mesh_meaning: a root over
    # the same ranks with groups of its own is another mesh, a submesh sliced again the
    # same one, and nothing of the process (its _hash, its _thread_id) is in it.
    other = DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))
    assert mesh_meaning(other) != mesh_meaning(mesh3)
    assert mesh_meaning(mesh3["y"]) == mesh_meaning(mesh3["y"])
    assert mesh_meaning(mesh3["y"]) != mesh_meaning(mesh3["z"])
    copy = DeviceMesh.__new__(DeviceMesh)
    copy.__setstate__({**mesh3.__getstate__(), "_hash": 1, "_thread_id": 2})
    assert mesh_meaning(copy) == mesh_meaning(mesh3)


def test_given_meshes_hand_down_their_contexts_until_a_root_gains_a_flattened_mesh():
    # compiler_fn builds its meshes' contexts once, for every graph it compiles, and builds
    # them again when they would differ: a root that gained a flattened mesh (the group
    # groups="create" makes while compiling a graph, or one the program flattens).
    mesh = DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("p", "q", "r"))
    given = GivenMeshes(mesh)
    first = mesh_contexts(given)
    assert mesh_contexts(given) is first
    mesh["p", "r"]._flatten()
    again = mesh_contexts(given)
    assert again is not first and mesh_contexts(given) is again
    assert [c.spec for c in again] == [c.spec for c in mesh_contexts(mesh)] != [c.spec for c in first]


def test_views_of_given_meshes_come_from_the_last_scan_until_one_is_missing(monkeypatch):
    # A framework's meshes are views of a 1-D world mesh; the full view a submesh belongs
    # to is found by scanning the process's objects. One scan serves the graphs after it,
    # and a submesh of a view built since then makes the next call scan again.
    from redist_opt.runtime import mesh_facts

    scans = []
    scan = mesh_facts.live_meshes
    monkeypatch.setattr(mesh_facts, "live_meshes", lambda: scans.append(1) or scan())
    world = DeviceMesh("cpu", torch.arange(8), mesh_dim_names=("world",))
    dense = world._unflatten(0, (4, 2), ("dp", "tp"))
    redist_opt.clear_caches()

    def bases(*meshes):  # the mesh each given mesh is a set of dims of, with those dims
        return {(id(c.device_mesh), c.scope_dims) for c in mesh_contexts(list(meshes)) if c.given}

    assert bases(dense["dp"]) == {(id(dense), (0,))} and len(scans) == 1
    assert bases(dense["tp"]) == {(id(dense), (1,))} and len(scans) == 1  # served by the last scan
    # The pairs at distance 4 are no set of dims of the dense view: a view built for them
    # since the last scan is found by scanning again.
    pairs = world._unflatten(0, (2, 4), ("pair", "rest"))
    assert bases(pairs["pair"]) == {(id(pairs), (0,))} and len(scans) == 2
    assert bases(dense["tp"], pairs["pair"]) == {(id(dense), (1,)), (id(pairs), (0,))} and len(scans) == 2


@pytest.mark.skipif(os.environ.get("REDIST_OPT_SKIP_INDUCTOR") == "1", reason="slow: C++ compile")
@pytest.mark.slow  # Inductor's C++ compile, in a subprocess
def test_inductor_post_grad_custom_post_pass():
    r = _run_script("inductor", 5)
    assert r["modified"] == [True], r["explain"]
    assert "all_reduce(dpr+tp)" in r["explain"][0]
    assert r["code_all_reduce"] == 1  # Inductor's generated code has the merged all_reduce only


def test_groups_create_makes_the_product_group(mesh3):
    g1, g2 = mesh3.get_group(1), mesh3.get_group(2)

    def f(x):
        return funcol.all_reduce(funcol.all_reduce(x, "sum", g1), "sum", g2) * 2

    gm = _trace(f, (4, 4))
    code = gm.code
    optimize_graph(gm, meshes=mesh3, prefer="consistency")  # no y+z group: unchanged
    assert gm.code == code
    result = optimize_graph(gm, meshes=mesh3, groups="create", prefer="consistency")
    assert count_collectives(gm) == {"all_reduce": 1}, result.explain()
    (name,) = [n.args[2] for n in gm.graph.nodes if n.target is torch.ops._c10d_functional.all_reduce.default]
    ranks = dist.get_process_group_ranks(dist.distributed_c10d._resolve_process_group(name))
    assert ranks == [0, 1, 2, 3]  # y+z through rank 0's coordinate
    assert "aten.mul.Tensor" in gm.code
