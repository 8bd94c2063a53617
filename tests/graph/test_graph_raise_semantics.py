"""Rank slices without DTensor metadata, in this process (fake backend, ``make_fx``).

An autoparallel-shaped chain built by hand from funcol collectives and Python
slices: ``make_fx`` graphs carry no ``source_fn_stack`` (and keep the dead
``getitem`` nodes of each split), so a slice is raised only through agreement
across ranks. The fake backend has no other ranks; the test stands in for them
with an ``all_gather`` that computes what each rank of the mesh would contribute
for the same program (its candidates, from its own coordinate and index).
The same programs on real gloo ranks: ``test_graph_pass_semantics``.
"""

from __future__ import annotations

import pytest
import torch
from support.slice_facts import other_ranks
from torch.distributed.device_mesh import DeviceMesh
from torch.fx.experimental.proxy_tensor import make_fx

from redist_opt.graph_pass import count_collectives, optimize_graph
from redist_opt.torch_api import c10d  # all_gather_single on every torch (funcol has it from 2.13)


@pytest.fixture(scope="module")
def mesh3():
    # 8 of the session's 16 fake ranks; this process is rank 0 (coordinate (0, 0, 0)).
    return DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))


def _weight_gather(mesh, t):
    """S(0),R,S(0) -> R,R,S(0) of an (8, 8) weight over (x, z), as autoparallel traces it."""
    gx, gz = mesh.get_group(0), mesh.get_group(2)

    def f(x):  # (2, 8)
        y = c10d.all_gather_single(x, 0, gz)
        y = y.split(4, dim=1)[t].clone()
        y = c10d.all_gather_single(y, 0, gx)
        y = c10d.all_gather_single(y, 1, gz)
        return y.split(4)[t] * 2

    return f


def _trace(fn, shape):
    return make_fx(fn, tracing_mode="fake")(torch.zeros(shape))


def test_autoparallel_shaped_chain_raises_by_agreement(mesh3):
    t = mesh3.get_coordinate()[2]
    gm = _trace(_weight_gather(mesh3, t), (2, 8))
    assert not any("source_fn_stack" in n.meta for n in gm.graph.nodes)
    before = count_collectives(gm)
    result = optimize_graph(gm, meshes=mesh3, all_gather=other_ranks(mesh3, lambda c: c[2]))
    assert before == {"all_gather": 3}
    assert result.modified, result.explain()
    assert "S(0),R,S(0) -> R,R,S(0)" in result.explain()
    assert sum(count_collectives(gm).values()) < 3


def test_constant_index_is_refused_when_other_ranks_differ(mesh3):
    gm = _trace(_weight_gather(mesh3, 0), (2, 8))  # index 0 on every rank: user code
    code = gm.code
    result = optimize_graph(gm, meshes=mesh3, all_gather=other_ranks(mesh3, lambda c: 0))
    assert gm.code == code and not result.modified
    assert "cannot be proven to select this rank's block" in result.explain()


def test_without_agreement_the_fake_backend_leaves_it(mesh3):
    gm = _trace(_weight_gather(mesh3, 0), (2, 8))
    code = gm.code
    result = optimize_graph(gm, meshes=mesh3)
    assert gm.code == code
    assert "fake backend cannot give" in result.explain()


def test_rounds_of_one_graph_are_counted_per_compiler_and_reset_by_clear_caches():
    """On the rank of coordinate 0 a user's constant ``[0]`` reads exactly like the
    rank-dependent slice compiled before it; on the other ranks it does not. So a
    second compile of the same graph text must not reuse the first one's answer: each
    round of a graph hash is a new key, counted on the compiler's agreement (not in
    the module), and ``clear_caches()`` restarts the count."""
    import redist_opt
    from redist_opt.graph.agreement import SliceAgreement

    one, other = SliceAgreement(), SliceAgreement()
    first, second = one.rounds.next_key("graph"), one.rounds.next_key("graph")
    assert first != second and first.endswith("/1") and second.endswith("/2")
    assert other.rounds.next_key("graph") == first  # another compiler starts at 1 too
    redist_opt.clear_caches()
    again = one.rounds.next_key("graph")
    assert again.endswith("/1") and again != first  # a new cache generation


def test_collectives_after_a_refused_slice_are_raised_on_their_own(mesh3):
    """The fake backend cannot agree on the first slice, so the chain is cut there; the
    gathers after it (S(0) over x, then S(1) over z) are still one chain of their own,
    merged into one all_gather over x+z when groups may be created."""
    gm = _trace(_weight_gather(mesh3, 0), (2, 8))
    result = optimize_graph(gm, meshes=mesh3, groups="create")
    text = result.explain()
    assert result.modified, text
    assert count_collectives(gm) == {"all_gather": 2}
    assert "the chain stops before split" in text and "S(0),R,S(1) -> R,R,R" in text, text
