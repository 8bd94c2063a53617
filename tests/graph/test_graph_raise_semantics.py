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

import dataclasses

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.fx.experimental.proxy_tensor import make_fx

from redist_opt.graph.graph_pass import count_collectives, optimize_graph
from redist_opt.graph.mesh_groups import mesh_contexts


@pytest.fixture(scope="module")
def mesh3():
    # 8 of the session's 16 fake ranks; this process is rank 0 (coordinate (0, 0, 0)).
    return DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=("x", "y", "z"))


def _other_ranks(mesh, index_of):
    """``all_gather`` standing in for the mesh's ranks: rank r's candidates for each
    slice of 2 blocks are the single dims whose coordinate is ``index_of(coord_r)``."""
    ctx = mesh_contexts(mesh)[0]
    coords = [tuple(int(c) for c in (torch.arange(8).view(2, 2, 2) == r).nonzero()[0]) for r in range(8)]

    def all_gather(facts):
        out = []
        for coord in coords:
            other = dataclasses.replace(ctx, coord=coord)
            k = index_of(coord)
            out.append([sorted(d for d in other.candidate_dims(2) if other.block_index(d) == k)
                        for _ in facts])
        return out

    return all_gather


def _weight_gather(mesh, t):
    """S(0),R,S(0) -> R,R,S(0) of an (8, 8) weight over (x, z), as autoparallel traces it."""
    gx, gz = mesh.get_group(0), mesh.get_group(2)

    def f(x):  # (2, 8)
        y = funcol.all_gather_single(x, 0, gz)
        y = y.split(4, dim=1)[t].clone()
        y = funcol.all_gather_single(y, 0, gx)
        y = funcol.all_gather_single(y, 1, gz)
        return y.split(4)[t] * 2

    return f


def _trace(fn, shape):
    return make_fx(fn, tracing_mode="fake")(torch.zeros(shape))


def test_autoparallel_shaped_chain_raises_by_agreement(mesh3):
    t = mesh3.get_coordinate()[2]
    gm = _trace(_weight_gather(mesh3, t), (2, 8))
    assert not any("source_fn_stack" in n.meta for n in gm.graph.nodes)
    before = count_collectives(gm)
    result = optimize_graph(gm, meshes=mesh3, all_gather=_other_ranks(mesh3, lambda c: c[2]))
    assert before == {"all_gather": 3}
    assert result.modified, result.explain()
    assert "S(0),R,S(0) -> R,R,S(0)" in result.explain()
    assert sum(count_collectives(gm).values()) < 3


def test_constant_index_is_refused_when_other_ranks_differ(mesh3):
    gm = _trace(_weight_gather(mesh3, 0), (2, 8))  # index 0 on every rank: user code
    code = gm.code
    result = optimize_graph(gm, meshes=mesh3, all_gather=_other_ranks(mesh3, lambda c: 0))
    assert gm.code == code and not result.modified
    assert "cannot be proven to select this rank's block" in result.explain()


def test_without_agreement_the_fake_backend_leaves_it(mesh3):
    gm = _trace(_weight_gather(mesh3, 0), (2, 8))
    code = gm.code
    result = optimize_graph(gm, meshes=mesh3)
    assert gm.code == code
    assert "fake backend cannot give" in result.explain()


def test_a_chain_of_unknown_origin_is_agreed_afresh_on_every_compile(mesh3, monkeypatch):
    """On the rank of coordinate 0 a user's constant ``[0]`` reads exactly like the
    rank-dependent slice compiled before it; on the other ranks it does not. So the
    second compile must not reuse the first one's answer: a new round (key) every time,
    which names the earlier one (for the warning of a lone recompile)."""
    from redist_opt.graph import agreement

    rounds = []
    real = agreement.agreement_for
    monkeypatch.setattr(agreement, "agreement_for", lambda chain, facts: rounds.append(real(chain, facts)) or rounds[-1])
    t = mesh3.get_coordinate()[2]
    assert t == 0  # so both traces below are the same graph on this rank
    first = optimize_graph(_trace(_weight_gather(mesh3, t), (2, 8)), meshes=mesh3,
                           all_gather=_other_ranks(mesh3, lambda c: c[2]))
    second = optimize_graph(_trace(_weight_gather(mesh3, 0), (2, 8)), meshes=mesh3,
                            all_gather=_other_ranks(mesh3, lambda c: 0))
    # the second compile: the whole chain, then the gathers after the refused slice
    assert first.modified and not second.modified
    assert len(rounds) == 3 and rounds[0].key != rounds[1].key
    assert rounds[1].earlier == rounds[0].key and rounds[1].ranks == rounds[0].ranks


def test_a_lone_recompile_after_a_committed_round_keeps_the_chain_and_warns(monkeypatch):
    """Rank 0 alone asks a round of a chain whose earlier round (with rank 1) was
    committed: it gives up in bounded time, and warns, since rank 1 may run the rewrite."""
    import pickle

    from torch.distributed import HashStore

    from redist_opt.graph import agreement

    store = HashStore()
    monkeypatch.setattr(agreement, "_store_or_reason", lambda: store)
    store.set(f"{agreement._KEY_PREFIX}/k1/1", pickle.dumps([[(0,)]]))
    (both,) = agreement.store_exchange([agreement.Agreement("k1", (0, 1), [[(0,)]])], timeout_s=5)
    assert both == [[[(0,)]], [[(0,)]]]
    with pytest.warns(UserWarning, match="may not match the rewritten ones"):
        (lone,) = agreement.store_exchange([agreement.Agreement("k2", (0, 1), [[(0,)]], earlier="k1")],
                                           timeout_s=0.05)
    assert "not every rank of [0, 1]" in lone


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
