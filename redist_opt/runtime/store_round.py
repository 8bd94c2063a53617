"""One round over the default process group's key-value store: how ranks that must
agree before any of them acts exchange their facts, within a bound, and take one
verdict. Both agreements use it: at run time (:mod:`redist_opt.runtime.consensus`:
whether a merged group was created, the cost profile planning uses) and at compile
time (:mod:`redist_opt.graph.agreement`: the mesh dims of rank slices).

A store key is no collective, so a round cannot interleave with collectives still in
flight. A round, under ``<prefix>/<generation>/<digest of its subject>/<n>``::

    set  <round>/facts/<rank> = my value
    wait until every rank's value is there, or a verdict is, for at most the bound
    compare_set(<round>/decision, "", "lock <rank>"): the one rank that wins the lock
        reads the values present and writes the verdict; the others wait for it
        (at most the bound again: a lock holder that died is named, not waited for)
    verdict = committed (every rank's value) | aborted (the ranks missing, and what
              the caller's ``on_abort`` made of the values present)

Every rank of the round takes the one verdict, so no rank acts on a decision another
did not make. A rank arriving after the others gave up finds the aborted verdict at
once. ``n`` counts the rounds of one subject an asker (:class:`Rounds`: the process,
a compiler) asked: every rank asks its rounds in program order, so the n-th round of
a subject is the same round on every rank.

Keys: each rank deletes its value once it has the verdict; a committed round's verdict
is deleted by the last of its ranks to read it (no rank can join a committed round
later); an aborted round keeps its verdict, one key, for ranks that join it later.

The bound (:func:`bound_s`) is the default group's timeout, ``init_process_group(timeout=)``:
what a collective of that group waits for a rank that is not there, so a round never
fails a rank sooner than torch would have. An asker may wait less (the graph pass, whose
aborted round is safe: a chain kept as traced), never more.

:func:`clear_caches` (``redist_opt.clear_caches()``) starts a new generation: every
counter restarts at round 1, under keys no earlier round used. Like any collective, it
is called on every rank of a job alike, or the ranks' rounds no longer meet.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import pickle
import time
from collections.abc import Callable, Sequence

from redist_opt.torch_api.c10d import default_store

__all__ = ["Verdict", "Rounds", "run_round", "bound_s", "digest", "clear_caches", "generation", "WAITS"]

# Polling backs off from 1 ms (ranks that arrive together see each other at once) to
# 50 ms (a long wait costs the store few requests).
_POLL_MIN_S, _POLL_MAX_S = 0.001, 0.05

# (topic, seconds waited) of every round this process took part in (tests and the
# fault harness read the worst wait from here).
WAITS: list = []

# How many times clear_caches() ran: part of every round's key.
_generation = 0


def clear_caches() -> None:
    """Start a new generation of rounds: every :class:`Rounds` restarts its counts."""
    global _generation
    _generation += 1


def generation() -> int:
    """The number of :func:`clear_caches` calls so far (state agreed in an earlier
    generation is agreed again)."""
    return _generation


def digest(what) -> str:
    """A short digest of ``repr(what)``, the same on every rank for equal subjects."""
    return hashlib.sha256(repr(what).encode()).hexdigest()[:32]


def bound_s(at_most: float | None = None) -> float:
    """How long a rank waits for the others of a round: the default group's timeout,
    or ``at_most`` where that is shorter."""
    group_s = default_store().timeout.total_seconds()
    return group_s if at_most is None else min(at_most, group_s)


class Rounds:
    """How many rounds of each subject one asker asked in this generation."""

    def __init__(self) -> None:
        self._counts: collections.Counter = collections.Counter()
        self._generation = _generation

    def _this_generation(self) -> collections.Counter:
        if self._generation != _generation:  # clear_caches() ran: every count restarts
            self._counts.clear()
            self._generation = _generation
        return self._counts

    def next_key(self, subject) -> str:
        """The key of the next round of ``subject``: ``<generation>/<digest>/<n>``."""
        counts, d = self._this_generation(), digest(subject)
        counts[d] += 1
        return f"{self._generation}/{d}/{counts[d]}"

    @property
    def asked(self) -> int:
        """How many rounds were asked in this generation."""
        return sum(self._this_generation().values())


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a round decided, the same on every rank of it (but ``silent_decider``)."""

    committed: bool
    values: dict  # rank -> value: every rank's when committed, else those there when decided
    missing: tuple = ()  # the ranks whose value was not there when an aborted round was decided
    on_abort: object = None  # what ``on_abort(values)`` gave the deciding rank of an aborted round
    silent_decider: int | None = None  # the rank that took the decision and never wrote it


def run_round(
    store,
    key: str,
    ranks: Sequence[int],
    me: int,
    value,
    *,
    timeout_s: float,
    topic: str,
    on_abort: Callable[[dict], object] | None = None,
) -> Verdict:
    """The verdict of the round ``key`` among ``ranks``, where this rank (``me``) gives
    ``value``: committed when every rank's value came within ``timeout_s``. ``on_abort``
    (on the one rank that decides an aborted round) adds to its verdict, from the values
    present. ``topic`` names the round in :data:`WAITS`."""
    ranks = tuple(ranks)
    facts = {r: f"{key}/facts/{r}" for r in ranks}
    decision = f"{key}/decision"
    start = time.monotonic()
    store.set(facts[me], pickle.dumps(value))
    _poll(lambda: store.check(list(facts.values())) or store.check([decision]), start + timeout_s)
    lock = f"lock {me}".encode()
    got = store.compare_set(decision, "", lock)
    if got == lock:  # this rank decides, from the values present now
        present = {r: pickle.loads(store.get(k)) for r, k in facts.items() if store.check([k])}
        if len(present) == len(ranks):
            verdict = Verdict(True, present)
        else:
            missing = tuple(r for r in ranks if r not in present)
            verdict = Verdict(False, present, missing, on_abort(present) if on_abort else None)
        store.set(decision, pickle.dumps(verdict))
    else:
        verdict = _wait_verdict(store, decision, got, timeout_s)
    WAITS.append((topic, time.monotonic() - start))
    store.delete_key(facts[me])
    # the last rank to read a committed verdict removes it: no rank can join that round later
    if verdict.committed and store.add(f"{key}/done", 1) == len(ranks):
        store.delete_key(decision)
        store.delete_key(f"{key}/done")
    return verdict


def _wait_verdict(store, decision: str, got: bytes, timeout_s: float) -> Verdict:
    # another rank holds the lock: it is reading a few keys, then writes the verdict
    if got.startswith(b"lock "):
        _poll(lambda: not store.get(decision).startswith(b"lock "), time.monotonic() + timeout_s)
        got = store.get(decision)
    if got.startswith(b"lock "):
        return Verdict(False, {}, silent_decider=int(got[5:].decode()))
    return pickle.loads(got)


def _poll(done: Callable[[], bool], deadline: float) -> None:
    """Wait until ``done()`` or the deadline, backing off between checks."""
    wait = _POLL_MIN_S
    while not done() and time.monotonic() < deadline:
        time.sleep(wait)
        wait = min(wait * 2, _POLL_MAX_S)
