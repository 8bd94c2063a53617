"""The agreement round itself (:mod:`redist_opt.graph.agreement`), in one process:
ranks are threads sharing one ``HashStore``, as real ranks share the default group's
store. What every rank gets, how long it waits, and which keys stay behind."""

from __future__ import annotations

import threading
import time

import pytest
from torch.distributed import HashStore

from redist_opt.graph import agreement as A

TEXTS = ["chain-a"]


def _run_ranks(store, key, ranks, facts_of, timeout_s=5.0, who=None):
    """Run one round on each rank of ``who`` (default: all of ``ranks``) at once:
    {rank: (verdict, seconds)}."""
    out = {}

    def one(r):
        start = time.monotonic()
        v = A._Round(store, key, tuple(ranks), timeout_s, r).run(facts_of(r), TEXTS)
        out[r] = (v, time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(r,)) for r in (who if who is not None else ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 3)
    return out


def _facts(r):
    # one chain, one slice of 2 blocks on a 2x2 mesh, over mesh dim 1: ranks 0 and 3
    # (coordinates (0, 0), (1, 1)) have both dims as candidates, ranks 1 and 2 only dim 1
    return [[[(1,)] if r in (1, 2) else [(0,), (1,)]]]


def _round_keys(store, key, ranks):
    base = f"{A._KEY_PREFIX}/{key}"
    return [f"{base}/decision", f"{base}/done"] + [f"{base}/facts/{r}" for r in ranks]


def test_every_rank_gets_the_same_commit_and_the_round_leaves_no_keys():
    store, ranks = HashStore(), [0, 1, 2, 3]
    got = _run_ranks(store, "g/1", ranks, lambda r: [[[(0,)], [(1,), (0,)]]])
    verdicts = {repr(v) for v, _ in got.values()}
    assert len(verdicts) == 1 and got[0][0][0] == "commit"
    assert not any(store.check([k]) for k in _round_keys(store, "g/1", ranks))
    assert all(s < 1.0 for _, s in got.values())


def test_a_rank_alone_aborts_within_the_bound_and_later_ranks_get_its_verdict_at_once():
    store, ranks = HashStore(), [0, 1, 2, 3]
    lone = _run_ranks(store, "g/1", ranks, _facts, timeout_s=0.3, who=[0])
    verdict, seconds = lone[0]
    assert verdict[0] == "abort" and "not every rank of [0, 1, 2, 3]" in verdict[1]
    assert 0.3 <= seconds < 1.3
    late = _run_ranks(store, "g/1", ranks, _facts, timeout_s=0.3, who=[1, 2, 3])
    assert all(repr(v) == repr(verdict) for v, _ in late.values())
    assert all(s < 0.3 for _, s in late.values())
    # an aborted round keeps its verdict only (for ranks that join it later)
    keys = _round_keys(store, "g/1", ranks)
    assert store.check([keys[0]]) and not any(store.check([k]) for k in keys[2:])


def test_a_lone_recompile_gets_the_answer_the_others_committed():
    store, ranks = HashStore(), [0, 1, 2, 3]
    committed = _run_ranks(store, "g/1", ranks, _facts)
    assert committed[0][0][0] == "commit"
    lone = _run_ranks(store, "g/2", ranks, _facts, timeout_s=0.2, who=[0])
    verdict = lone[0][0]
    assert verdict[0] == "abort"
    facts, dims = verdict[2][0]
    assert facts[0] == _facts(0)[0] and dims == [(1,)]  # the one dim set common to all four


def test_an_answer_for_other_facts_is_not_reused():
    store, ranks = HashStore(), [0, 1, 2, 3]
    _run_ranks(store, "g/1", ranks, _facts)
    other = lambda r: [[[(0,)]]] if r == 0 else _facts(r)  # noqa: E731 - rank 0 compiles another chain
    lone = _run_ranks(store, "g/2", ranks, other, timeout_s=0.2, who=[0])
    assert lone[0][0][0] == "abort" and 0 not in lone[0][0][2]


def test_two_earlier_answers_that_fit_differently_are_refused_with_a_reason():
    store, ranks = HashStore(), [0, 1]
    # the same chain text, agreed twice with different dims; rank 0's facts the same both times
    _run_ranks(store, "g/1", ranks, lambda r: [[[(0,), (1,)] if r == 0 else [(0,)]]])
    _run_ranks(store, "g/2", ranks, lambda r: [[[(0,), (1,)] if r == 0 else [(1,)]]])
    lone = _run_ranks(store, "g/3", ranks, lambda r: [[[(0,), (1,)]]], timeout_s=0.2, who=[0])
    verdict = lone[0][0]
    assert verdict[0] == "abort" and "agreed on different mesh dims" in verdict[2][0]


def test_records_are_written_once_per_distinct_answer():
    store, ranks = HashStore(), [0, 1, 2, 3]
    for k in range(3):  # the same program compiled three times by every rank
        _run_ranks(store, f"g/{k + 1}", ranks, _facts)
    assert store.add(f"{A._RECORDS}/{TEXTS[0]}/n", 0) == 1


@pytest.mark.parametrize("late", [1, 3])
def test_a_late_rank_within_the_bound_still_commits(late):
    store, ranks = HashStore(), [0, 1, 2, 3]
    out = {}

    def delayed():
        time.sleep(0.2)
        out.update(_run_ranks(store, "g/1", ranks, _facts, who=[late]))

    t = threading.Thread(target=delayed)
    t.start()
    got = _run_ranks(store, "g/1", ranks, _facts, who=[r for r in ranks if r != late])
    t.join()
    got.update(out)
    assert {repr(v) for v, _ in got.values()} == {repr(got[0][0])} and got[0][0][0] == "commit"
