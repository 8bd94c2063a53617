"""The one store round (:mod:`redist_opt.runtime.store_round`), in one process: ranks
are threads sharing one ``HashStore``. Which keys a round leaves, what a rank gets when
the rank that took the decision never writes it, and how counts restart."""

from __future__ import annotations

import pickle
import threading

from torch.distributed import HashStore

import redist_opt
from redist_opt.runtime import store_round


def _round(store, key, ranks, who, timeout_s=2.0, on_abort=None) -> dict:
    out = {}

    def one(r):
        out[r] = store_round.run_round(
            store, key, ranks, r, f"v{r}", timeout_s=timeout_s, topic="test", on_abort=on_abort
        )

    threads = [threading.Thread(target=one, args=(r,)) for r in who]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _keys(key, ranks):
    return [f"{key}/decision", f"{key}/done"] + [f"{key}/facts/{r}" for r in ranks]


def test_a_committed_round_gives_every_value_and_leaves_no_key():
    store, ranks = HashStore(), (0, 1, 2)
    got = _round(store, "r/1", ranks, ranks)
    assert all(v.committed and v.values == {0: "v0", 1: "v1", 2: "v2"} for v in got.values())
    assert not any(store.check([k]) for k in _keys("r/1", ranks))


def test_an_aborted_round_keeps_only_its_verdict_with_what_on_abort_made():
    store, ranks = HashStore(), (0, 1, 2)
    (lone,) = _round(store, "r/1", ranks, [0], timeout_s=0.1, on_abort=sorted).values()
    assert not lone.committed and lone.missing == (1, 2) and lone.on_abort == [0]
    late = _round(store, "r/1", ranks, [1, 2])
    assert all(v == lone for v in late.values())  # at once, the stored verdict
    keys = _keys("r/1", ranks)
    assert store.check([keys[0]]) and not any(store.check([k]) for k in keys[1:])


def test_a_decider_that_never_writes_is_named_after_the_bound():
    store = HashStore()
    store.set("r/1/facts/1", pickle.dumps("v1"))
    store.compare_set("r/1/decision", "", "lock 1")  # rank 1 took the decision, then died
    (got,) = _round(store, "r/1", (0, 1), [0], timeout_s=0.1).values()
    assert not got.committed and got.silent_decider == 1


def test_counts_are_per_asker_and_restart_in_a_new_generation():
    one, other = store_round.Rounds(), store_round.Rounds()
    first, second = one.next_key("s"), one.next_key("s")
    assert first.endswith("/1") and second.endswith("/2") and other.next_key("s") == first
    assert one.asked == 2
    redist_opt.clear_caches()
    again = one.next_key("s")
    assert again.endswith("/1") and again != first and one.asked == 1
