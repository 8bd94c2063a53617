"""redist_opt.runtime.consensus without processes: ranks are threads sharing one
in-memory store (the protocol only reads and writes store keys)."""

from __future__ import annotations

import collections
import threading

import pytest
import torch.distributed as dist

from redist_opt.runtime import consensus, store_round


class _PerRank:
    """Each thread (rank) its own count of rounds, as each process has its own."""

    def __init__(self, local):
        self.local, self.by_rank = local, collections.defaultdict(store_round.Rounds)

    def next_key(self, subject):
        return self.by_rank[self.local.rank].next_key(subject)


@pytest.fixture
def ranks_as_threads(monkeypatch):
    store = dist.HashStore()
    local = threading.local()
    # consensus reaches the store and its rank through the torch boundary (c10d)
    monkeypatch.setattr(consensus.c10d, "default_store", lambda: store)
    monkeypatch.setattr(consensus.c10d, "process_rank", lambda: local.rank)
    monkeypatch.setattr(consensus, "_rounds", _PerRank(local))

    def run(values: dict, topic="t", ranks=None, timeout_s=2.0):
        """{rank: exchange() result or the exception} for every rank of ``values``."""
        results = {}

        def body(rank, value):
            local.rank = rank
            try:
                results[rank] = consensus.exchange(topic, ranks or sorted(values), value, timeout_s=timeout_s)
            except consensus.AgreementError as e:
                results[rank] = e

        threads = [threading.Thread(target=body, args=(r, v)) for r, v in values.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    return run


def test_every_rank_gets_every_value(ranks_as_threads):
    results = ranks_as_threads({0: "a", 1: None, 2: ("x", 1)})
    assert all(r == {0: "a", 1: None, 2: ("x", 1)} for r in results.values())


def test_a_missing_rank_makes_every_rank_raise_naming_it(ranks_as_threads):
    results = ranks_as_threads({0: 1, 1: 1}, ranks=[0, 1, 2], timeout_s=0.2)
    for e in results.values():
        assert isinstance(e, consensus.AgreementError) and isinstance(e, dist.DistError)
        assert "rank(s) [2] did not join it within 0.2 s" in str(e)
    # rank 2 arrives later: the round was abandoned, it raises at once too
    (late,) = ranks_as_threads({2: 1}, ranks=[0, 1, 2], timeout_s=5.0).values()
    assert "this rank (2) joined after the others had given up waiting" in str(late)
    assert consensus.WAITS[-1][1] < 1.0


def test_rounds_of_a_topic_are_counted_per_process(ranks_as_threads):
    first = ranks_as_threads({0: "a", 1: "b"})
    second = ranks_as_threads({0: "c", 1: "d"})
    assert first[0] == {0: "a", 1: "b"} and second[1] == {0: "c", 1: "d"}


def test_different_profiles_are_named_with_their_ranks():
    facts = {
        0: ("REDIST_OPT_COST_PROFILE=nccl", "aaaaaaaa11", None),
        1: ("REDIST_OPT_COST_PROFILE=gloo", "bbbbbbbb22", None),
        2: ("REDIST_OPT_COST_PROFILE=nccl", "aaaaaaaa11", None),
    }
    with pytest.raises(consensus.AgreementError) as info:
        consensus._raise_if_different(facts)
    msg = str(info.value)
    assert "ranks [0, 2] plan with REDIST_OPT_COST_PROFILE=nccl (profile aaaaaaaa)" in msg
    assert "ranks [1] plan with REDIST_OPT_COST_PROFILE=gloo (profile bbbbbbbb)" in msg
    # the same profile under two names (two paths to one file's contents) is no fault
    facts[1] = ("REDIST_OPT_COST_PROFILE=/other/path.json", "aaaaaaaa11", None)
    consensus._raise_if_different(facts)


def test_a_rank_that_cannot_read_its_profile_is_named():
    facts = {0: ("mesh backend gloo", "aaaa", None), 1: (None, None, "cannot read the cost profile: gone")}
    with pytest.raises(
        consensus.AgreementError,
        match=r"rank\(s\) \[1\] cannot resolve the cost profile "
        r"\(rank 1: cannot read the cost profile: gone\)",
    ):
        consensus._raise_if_different(facts)


def test_the_fake_backend_needs_no_agreement():
    # the test suite's fake backend runs every rank in one process
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        pytest.skip("no process group in this pytest process")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    assert not consensus.needs_agreement(mesh)


def test_simulated_ranks_need_no_agreement(monkeypatch):
    """Under LocalTensorMode one process simulates every rank, so no round is asked even
    where the group's backend is one whose ranks are processes (here gloo, as reported)."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        pytest.skip("no process group in this pytest process")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    monkeypatch.setattr(consensus.dist, "get_backend", lambda *args: "gloo")
    assert consensus.needs_agreement(mesh)  # outside the mode: separate processes, which must agree
    with LocalTensorMode(dist.get_world_size()):
        assert not consensus.needs_agreement(mesh)


def test_an_agreed_mesh_is_not_kept_alive():
    import gc
    import weakref

    from torch.distributed.device_mesh import init_device_mesh

    from redist_opt.ir.mesh import MeshSpec

    if not dist.is_initialized():
        pytest.skip("no process group in this pytest process")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    consensus.check_planning_inputs(mesh, MeshSpec.from_device_mesh(mesh))
    assert id(mesh) in consensus._agreed_meshes  # the next check is one lookup
    ref = weakref.ref(mesh)
    del mesh
    gc.collect()
    assert ref() is None
