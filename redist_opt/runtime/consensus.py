"""Agreement across ranks at run time: a decision that rests on a rank-local fact is
agreed by every rank that acts on it, before any of them acts, within a bound.

Two such decisions are made at run time (the compiled-graph pass agrees its own,
in ``redist_opt.graph.agreement``):

* **whether a merged group could be created** (``groups="create"``): every rank
  of the mesh reports whether creating its group succeeded; all use the merged
  groups, or all run the unmerged plan (:func:`agree_group_created`);
* **what planning reads from the rank's environment**: the cost profile
  (``$REDIST_OPT_COST_PROFILE``, a calibrated file, or ``cost=``). Every rank of a
  mesh exchanges a digest of its resolved profile at its first planning on that
  mesh; if they differ (or a rank cannot read its file) every rank raises, naming
  the setting and the ranks (:func:`check_planning_inputs`). Raising rather than
  adopting rank 0's profile: a profile that differs by rank is a deployment
  mistake (a file copied to some hosts only, an environment set per node), and
  planning with a profile the user did not give on that rank would hide it.

One round, through the default group's key-value store (a store key is no
collective, so it cannot interleave with collectives in flight)::

    set  <prefix>/<topic, ranks>/<n>/<rank> = my value
    wait until every rank's key is there, for at most agreement_timeout_s()
    verdict = compare_set(.../decision, "", "commit" | "abort")

The first rank to decide fixes the verdict for all: either every rank gets every
value ("commit"), or every rank raises :class:`AgreementError` naming the ranks
that did not join: a rank slower than the bound, one that exited or died. A rank
arriving after the others gave up finds "abort" at once and raises too. So no
rank waits longer than the bound, and no rank acts on a decision another did not
make.

The bound is the default process group's timeout (``init_process_group(timeout=)``,
read from its store): the time a collective of that group would wait for a rank
that is not there. redist_opt never fails a rank earlier than torch would have.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import time
from collections.abc import Sequence

import torch.distributed as dist

from redist_opt.ir import cost as cost_module
from redist_opt.ir import layout as L
from redist_opt.runtime import torch_dtensor as tdt

__all__ = [
    "AgreementError",
    "agreement_timeout_s",
    "exchange",
    "needs_agreement",
    "agree_group_created",
    "check_planning_inputs",
    "check_compiled_profile",
    "abandoned_reason",
    "WAITS",
]

_PREFIX = "redist_opt/runtime/agree"
_POLL_MIN_S, _POLL_MAX_S = 0.001, 0.05

# Rounds asked so far per (topic, ranks): the n-th round of a topic is the same
# round on every rank, because every rank asks its rounds in program order.
_rounds: collections.Counter = collections.Counter()

# (topic, seconds waited) of every round this process took part in (tests and the
# fault harness read the worst wait from here).
WAITS: list = []


class AgreementError(dist.DistError):
    """Ranks that must agree before acting did not (all joined too late, or some never),
    or found that they would act differently. torch's type for a distributed failure
    (a ``RuntimeError``), not a ``RedistributeError``: nothing is wrong with the
    input, and the API must not retry it through torch's function, whose
    collectives the other ranks would not issue."""


def needs_agreement(device_mesh) -> bool:
    """True when ranks of ``device_mesh`` are separate processes that must agree
    (not one process simulating them, not a single rank)."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_backend() == "fake":
        return False
    if tdt.local_tensor_mode() is not None:
        return False
    return device_mesh.size() > 1


def agreement_timeout_s() -> float:
    """How long a rank waits for the others of a round: the default group's timeout."""
    return tdt.default_store().timeout.total_seconds()


def _mesh_ranks(device_mesh) -> list[int]:
    with tdt.outside_tracing():  # planning may run while AOTAutograd traces
        return [int(r) for r in device_mesh.mesh.flatten().tolist()]


def _digest(what) -> str:
    return hashlib.sha256(repr(what).encode()).hexdigest()[:32]


def exchange(topic: str, ranks: Sequence[int], value, *, timeout_s: float | None = None) -> dict:
    """{rank: value} of every rank of ``ranks`` for the next round of ``topic``, or
    :class:`AgreementError` on every rank if some rank did not join within
    ``timeout_s`` (default :func:`agreement_timeout_s`). Each rank of ``ranks``
    must call this for the same topics in the same order."""
    store = tdt.default_store()
    ranks = tuple(sorted(ranks))
    what = (topic, ranks)
    _rounds[what] += 1
    base = f"{_PREFIX}/{_digest(what)}/{_rounds[what]}"
    me = dist.get_rank()
    timeout_s = agreement_timeout_s() if timeout_s is None else timeout_s
    start = time.monotonic()
    store.set(f"{base}/{me}", pickle.dumps(value))
    keys = [f"{base}/{r}" for r in ranks]
    decision = f"{base}/decision"
    poll = _POLL_MIN_S
    while True:
        if store.check(keys):
            verdict = store.compare_set(decision, "", "commit")
            break
        if store.check([decision]):
            verdict = store.get(decision)
            break
        if time.monotonic() - start >= timeout_s:
            verdict = store.compare_set(decision, "", "abort")
            break
        time.sleep(poll)
        poll = min(poll * 2, _POLL_MAX_S)
    WAITS.append((topic, time.monotonic() - start))
    if verdict == b"commit":
        return {r: pickle.loads(store.get(k)) for r, k in zip(ranks, keys)}
    missing = [r for r, k in zip(ranks, keys) if not store.check([k])]
    who = (
        f"rank(s) {missing} did not join it"
        if missing
        else f"this rank ({me}) joined after the others had given up waiting"
    )
    raise AgreementError(
        f"redist_opt: ranks {list(ranks)} must agree on {topic} before any of them acts on it, and "
        f"{who} within {timeout_s:g} s (a rank slower than that, or one that exited or died); "
        "every rank of the round raises this error instead of issuing collectives the others may not"
    )


# -- whether a merged group was created -------------------------------------------------

# (root mesh id, layout) -> why the merged group is not used, the same on every rank
_abandoned: dict = {}


def abandoned_reason(device_mesh, layout) -> str | None:
    """Why the ranks agreed not to use a group of ``layout`` (None: not abandoned)."""
    return _abandoned.get((id(L.root_mesh(device_mesh)), layout))


def agree_group_created(device_mesh, layout, dims, failure: str | None) -> str | None:
    """Agree across the ranks of ``device_mesh`` whether the merged group over mesh
    dims ``dims`` (``layout``) is used: returns None when every rank created its
    group, else why not (the same text on every rank; recorded, so later lookups
    of the layout skip creation on every rank alike). ``failure``: why creating
    the group failed on this rank, or None."""
    if not needs_agreement(device_mesh):
        return failure
    ranks = _mesh_ranks(device_mesh)
    outcomes = exchange(f"creating the merged group over mesh dims {tuple(dims)}", ranks, failure)
    failed = {r: why for r, why in outcomes.items() if why is not None}
    if not failed:
        return None
    first = min(failed)
    reason = (
        f"creating the merged group over mesh dims {tuple(dims)} failed on rank(s) {sorted(failed)} "
        f"(rank {first}: {failed[first]}); every rank of {sorted(outcomes)} runs the unmerged plan"
    )
    _abandoned[(id(L.root_mesh(device_mesh)), layout)] = reason
    return reason


# -- what planning reads from the environment ------------------------------------------

# (mesh, cost) pairs already agreed: after the first planning, one set lookup
_agreed: set = set()


def _planning_facts(spec, cost) -> tuple:
    """(setting as this rank sees it, digest of the profile it plans with or None, error or None)."""
    if cost is not None:
        return ("the cost= argument", _digest(sorted(cost.to_dict().items())), None)
    try:
        model, source = cost_module.resolve(spec)
    except ValueError as e:
        return (None, None, str(e))
    if not os.environ.get(cost_module.PROFILE_ENV, "").strip():
        source += f", {cost_module.PROFILE_ENV} unset"
    return (source, _digest(sorted(model.to_dict().items())), None)


def check_planning_inputs(device_mesh, spec, cost=None) -> None:
    """Raise :class:`AgreementError` on every rank of ``device_mesh`` when its ranks
    would plan with different cost profiles (or some cannot read theirs); agreed
    once per mesh and ``cost`` (a ``CostModel``, hashable) at the first planning."""
    key = (device_mesh, cost)
    if key in _agreed:
        return
    if needs_agreement(device_mesh):
        ranks = _mesh_ranks(device_mesh)
        _raise_if_different(exchange("the cost profile planning uses", ranks, _planning_facts(spec, cost)))
    _agreed.add(key)


def check_compiled_profile(device_mesh, spec, cost, ranks: Sequence[int], timeout_s: float) -> bool:
    """:func:`check_planning_inputs` for a compiled program: ``ranks`` are the ranks that
    compile it (a pipeline stage's, not the mesh's), agreed once per ``ranks`` and
    ``cost``. A round that not every rank joins within ``timeout_s`` (one rank compiling
    alone) returns False on every rank of it, and is not asked again: the profile stays
    unchecked, as the caller's pass would be without this check, instead of failing a
    compile that works (and the ranks' rounds stay in step)."""
    ranks = tuple(sorted(ranks))
    key = (ranks, cost)
    if key in _agreed or len(ranks) < 2 or not needs_agreement(device_mesh):
        return True
    try:
        facts = exchange(
            "the cost profile compiled programs are priced with",
            ranks,
            _planning_facts(spec, cost),
            timeout_s=timeout_s,
        )
    except AgreementError:
        _agreed.add(key)
        return False
    _raise_if_different(facts)
    _agreed.add(key)
    return True


def _raise_if_different(facts: dict) -> None:
    errors = {r: f[2] for r, f in facts.items() if f[2] is not None}
    if errors:
        first = min(errors)
        raise AgreementError(
            f"redist_opt: rank(s) {sorted(errors)} cannot resolve the cost profile (rank {first}: "
            f"{errors[first]}); every rank of {sorted(facts)} raises, since planning with different "
            "profiles would issue different collectives"
        )
    by_profile: dict = {}
    for r, (setting, digest, _) in sorted(facts.items()):
        by_profile.setdefault(digest, []).append((r, setting))
    if len(by_profile) > 1:
        parts = [
            f"ranks {[r for r, _ in members]} plan with {members[0][1]} (profile {digest[:8]})"
            for digest, members in by_profile.items()
        ]
        raise AgreementError(
            "redist_opt: the ranks of one mesh would plan with different cost profiles, and so issue "
            f"different collectives: {'; '.join(parts)}. Give every rank the same "
            f"{cost_module.PROFILE_ENV} (and the same file)"
        )
