"""Raise legality, one condition at a time, graph in and matcher out (XLA's HLO-text
tests): each condition of :mod:`redist_opt.graph.raise_chains` has a program the pass
transforms and a ``*_not_transformed`` twin that breaks only that condition and must
come out unchanged, with the reason in the explain output.

Graphs are ``make_fx`` traces of funcol programs on the fake backend (this process is
rank 0, coordinate (0, 0, 0) of a 2x2x2 mesh); the other ranks' slice facts come from
a stand-in ``all_gather`` (``support.slice_facts``). The base program::

    w = wait(all_reduce(x, "sum", z))      x: (8, 4), partial over z
    y = split(w, 4)[coord_z]               this rank's block over z
      ==>  wait(reduce_scatter_tensor(x, "sum", 2, z))
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from support.slice_facts import other_ranks
from torch.distributed.device_mesh import DeviceMesh
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

from redist_opt.graph_pass import optimize_graph


@pytest.fixture(scope="module")
def mesh3():
    return DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))


def run_and_check(mesh, fn, shape, expected, *, index_of=lambda c: c[2], reason=None):
    """Trace ``fn``, run the pass; ``expected``: FileCheck directives (check, check_not)
    the code must match, or None: the graph must be unchanged (and ``reason`` in the
    explain output)."""
    gm = make_fx(fn, tracing_mode="fake")(torch.zeros(shape))
    before = gm.code
    result = optimize_graph(gm, meshes=mesh, all_gather=other_ranks(mesh, index_of))
    text = result.explain()
    if expected is None:
        assert gm.code == before and not result.modified, text
        assert reason in text, text
        return
    assert result.modified, text
    fc = FileCheck()
    for kind, what in expected:
        getattr(fc, kind)(what)
    fc.run(gm.code)


REDUCE_SCATTER = [("check", "reduce_scatter_tensor"), ("check_not", "all_reduce")]


def _own_block(mesh, *, reduce_op="sum", rows=8, index=None, between=None, first_dim=2):
    g = mesh.get_group(first_dim)
    t = mesh.get_coordinate()[2] if index is None else index

    def f(x):
        w = funcol.all_reduce(x, reduce_op, g)
        if between is not None:
            w = between(w)
        return w.split(rows // 2)[t].clone()

    return f


def test_base_program_is_transformed(mesh3):
    run_and_check(mesh3, _own_block(mesh3), (8, 4), REDUCE_SCATTER)


# 1. collectives the chain may hold, each used once
def test_c1_supported_reduce_op(mesh3):
    run_and_check(mesh3, _own_block(mesh3, reduce_op="max"), (8, 4), REDUCE_SCATTER)


def test_c1_supported_reduce_op_not_transformed(mesh3):
    run_and_check(mesh3, _own_block(mesh3, reduce_op="product"), (8, 4), None, reason="product")


def test_c1_value_with_another_user_not_transformed(mesh3):
    g, t = mesh3.get_group(2), mesh3.get_coordinate()[2]

    def f(x):
        w = funcol.all_reduce(x, "sum", g)
        return w.split(4)[t].clone(), w.sum()

    # the all_reduce stays for the sum: the slice alone is not cheaper to rewrite
    run_and_check(mesh3, f, (8, 4), None, reason="whose value has 2 users")


# 2. every group is an ordered set of dims of a known mesh
def test_c2_group_of_a_known_mesh_not_transformed(mesh3):
    other = DeviceMesh("cpu", torch.tensor([0, 2]))  # a mesh without the z group's ranks [0, 1]
    gm_fn = _own_block(mesh3)
    gm = make_fx(gm_fn, tracing_mode="fake")(torch.zeros((8, 4)))
    before = gm.code
    result = optimize_graph(gm, meshes=other, all_gather=other_ranks(mesh3, lambda c: c[2]))
    assert gm.code == before and "is no set of dims of a known DeviceMesh" in result.explain(), (
        result.explain()
    )


# 3. a legal DTensor transition: a dim is reduced only while it is still partial
def test_c3_dim_reduced_once(mesh3):
    gy = mesh3.get_group(1)
    run_and_check(
        mesh3,
        _own_block(mesh3, between=lambda w: funcol.all_reduce(w, "sum", gy)),
        (8, 4),
        [("check", "reduce_scatter_tensor"), ("check", "all_reduce")],
    )


def test_c3_dim_reduced_twice_not_transformed(mesh3):
    gz = mesh3.get_group(2)
    run_and_check(
        mesh3,
        _own_block(mesh3, between=lambda w: funcol.all_reduce(w, "sum", gz)),
        (8, 4),
        None,
        reason="not partial any more",
    )


# 4. even shards only
def test_c4_uneven_block_not_transformed(mesh3):
    run_and_check(
        mesh3, _own_block(mesh3, rows=7), (7, 4), None, reason="uneven or non-constant block selection"
    )


# 5. a rank slice is proven to select this rank's block over one common dim set
def test_c5_constant_index_the_same_on_every_rank_not_transformed(mesh3):
    run_and_check(
        mesh3,
        _own_block(mesh3, index=0),
        (8, 4),
        None,
        index_of=lambda c: 0,
        reason="cannot be proven to select this rank's block",
    )


# 6. pointwise ops with scalars only where no dim is partial any more
def test_c6_scalar_op_after_the_reduction(mesh3):
    run_and_check(mesh3, _own_block(mesh3, between=lambda w: w * 2), (8, 4), REDUCE_SCATTER)


def test_c6_scalar_op_on_a_partial_dim_not_transformed(mesh3):
    gz, gy, t = mesh3.get_group(2), mesh3.get_group(1), mesh3.get_coordinate()[2]

    def f(x):  # partial over z and y; the add sits between the two reductions
        w = funcol.all_reduce(x, "sum", gz) + 1
        return funcol.all_reduce(w, "sum", gy).split(4)[t].clone()

    # summed over y after the add, the 1 counts twice: re-applying it at the end is wrong
    run_and_check(
        mesh3, f, (8, 4), None, reason="a pointwise op on a value that is still partial over mesh dims (1,)"
    )
