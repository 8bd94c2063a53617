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

Each is one round of :mod:`redist_opt.runtime.store_round` (through the default
group's store, bounded by its timeout): either every rank gets every value, or every
rank raises :class:`AgreementError` naming the ranks that did not join (a rank slower
than the bound, one that exited or died); a rank arriving after the others gave up
raises at once too. So no rank waits longer than the bound, and no rank acts on a
decision another did not make.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence

import torch.distributed as dist

from redist_opt.ir import cost as cost_module
from redist_opt.runtime import store_round
from redist_opt.runtime.store_round import WAITS  # every round's wait, read by the fault harness
from redist_opt.torch_api import c10d, tracing
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.local_tensor import local_tensor_mode

__all__ = [
    "AgreementError",
    "exchange",
    "needs_agreement",
    "agree_group_created",
    "check_planning_inputs",
    "check_compiled_profile",
    "abandoned_reason",
    "WAITS",
]

_PREFIX = "redist_opt/runtime/agree"

# Rounds asked so far per (topic, ranks), by this process.
_rounds = store_round.Rounds()


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
    if local_tensor_mode() is not None:
        return False
    return device_mesh.size() > 1


def _mesh_ranks(device_mesh) -> list[int]:
    with tracing.outside_tracing():  # planning may run while AOTAutograd traces
        return [int(r) for r in device_mesh.mesh.flatten().tolist()]


def _mesh_value(device_mesh) -> tuple:
    """What makes two DeviceMesh objects equal (dim names, shape, ranks), holding neither.
    Read only where ranks must agree."""
    with tracing.outside_tracing():  # DeviceMesh.mesh builds a tensor: a real one
        mesh = device_mesh.mesh
        return (device_mesh.mesh_dim_names, tuple(mesh.shape), tuple(int(r) for r in mesh.flatten().tolist()))


def exchange(topic: str, ranks: Sequence[int], value, *, timeout_s: float | None = None) -> dict:
    """{rank: value} of every rank of ``ranks`` for the next round of ``topic``, or
    :class:`AgreementError` on every rank if some rank did not join within
    ``timeout_s`` (default: the group's timeout, :func:`~redist_opt.runtime.store_round.bound_s`).
    Each rank of ``ranks`` must call this for the same topics in the same order."""
    ranks = tuple(sorted(ranks))
    me = c10d.process_rank()
    timeout_s = store_round.bound_s() if timeout_s is None else timeout_s
    key = f"{_PREFIX}/{_rounds.next_key((topic, ranks))}"
    verdict = store_round.run_round(
        c10d.default_store(), key, ranks, me, value, timeout_s=timeout_s, topic=topic
    )
    if verdict.committed:
        return verdict.values
    if verdict.silent_decider is not None:
        who = f"rank {verdict.silent_decider} took the round's decision and never wrote it"
    elif me in verdict.missing:
        who = f"this rank ({me}) joined after the others had given up waiting"
    else:
        who = f"rank(s) {list(verdict.missing)} did not join it"
    raise AgreementError(
        f"redist_opt: ranks {list(ranks)} must agree on {topic} before any of them acts on it, and "
        f"{who} within {timeout_s:g} s (a rank slower than that, or one that exited or died); "
        "every rank of the round raises this error instead of issuing collectives the others may not"
    )


# -- whether a merged group was created -------------------------------------------------

# (root mesh's value, layout) -> why the merged group is not used, the same on every rank.
# By value, not by the mesh: nothing keeps a mesh alive, and no id of a freed mesh is
# reused by a new one on some ranks only.
_abandoned: dict = {}


def abandoned_reason(device_mesh, layout) -> str | None:
    """Why the ranks agreed not to use a group of ``layout`` (None: not abandoned)."""
    if not needs_agreement(device_mesh):  # only agreed abandonments are recorded
        return None
    return _abandoned.get((_mesh_value(tm.root_mesh(device_mesh)), layout))


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
    _abandoned[(_mesh_value(tm.root_mesh(device_mesh)), layout)] = reason
    return reason


# -- what planning reads from the environment ------------------------------------------

# What was agreed, by value: (generation of rounds, the mesh's value, its spec, cost=), and
# (generation, ranks compiling, cost=). By value, so equal meshes agree once, and whether a
# round is asked never depends on when a rank's garbage collector frees a mesh.
_agreed: set = set()

# The meshes agreed, by identity and held weakly (an agreed mesh is freed with its last
# user): id -> (weak reference, {(generation, cost=)}). A lookup in front of _agreed, so
# that after the first planning a check reads no mesh.
_agreed_meshes: dict = {}


def _forget_mesh(key: int, ref) -> None:
    if _agreed_meshes.get(key, (None,))[0] is ref:
        del _agreed_meshes[key]


def _remember_mesh(device_mesh, entry: tuple) -> None:
    key = id(device_mesh)
    hit = _agreed_meshes.get(key)
    if hit is None or hit[0]() is not device_mesh:
        ref = weakref.ref(device_mesh, lambda r, key=key: _forget_mesh(key, r))
        hit = _agreed_meshes[key] = (ref, set())
    hit[1].add(entry)


def _planning_facts(spec, cost) -> tuple:
    """(setting as this rank sees it, digest of the profile it plans with or None, error or None)."""
    if cost is not None:
        return ("the cost= argument", store_round.digest(sorted(cost.to_dict().items())), None)
    try:
        model, source = cost_module.resolve(spec)
    except ValueError as e:
        return (None, None, str(e))
    if not os.environ.get(cost_module.PROFILE_ENV, "").strip():
        source += f", {cost_module.PROFILE_ENV} unset"
    return (source, store_round.digest(sorted(model.to_dict().items())), None)


def check_planning_inputs(device_mesh, spec, cost=None) -> None:
    """Raise :class:`AgreementError` on every rank of ``device_mesh`` when its ranks
    would plan with different cost profiles (or some cannot read theirs); agreed
    once per mesh and ``cost`` (a ``CostModel``, hashable) at the first planning, and
    again after ``redist_opt.clear_caches()``."""
    entry = (store_round.generation(), cost)
    hit = _agreed_meshes.get(id(device_mesh))
    if hit is not None and hit[0]() is device_mesh and entry in hit[1]:
        return
    if needs_agreement(device_mesh):
        key = (entry[0], _mesh_value(device_mesh), spec, cost)
        if key not in _agreed:
            facts = exchange("the cost profile planning uses", list(key[1][2]), _planning_facts(spec, cost))
            _raise_if_different(facts)
            _agreed.add(key)
    _remember_mesh(device_mesh, entry)


def check_compiled_profile(device_mesh, spec, cost, ranks: Sequence[int], timeout_s: float) -> bool:
    """:func:`check_planning_inputs` for a compiled program: ``ranks`` are the ranks that
    compile it (a pipeline stage's, not the mesh's), agreed once per ``ranks`` and
    ``cost``. A round that not every rank joins within ``timeout_s`` (one rank compiling
    alone) returns False on every rank of it, and is not asked again: the profile stays
    unchecked, as the caller's pass would be without this check, instead of failing a
    compile that works (and the ranks' rounds stay in step)."""
    ranks = tuple(sorted(ranks))
    key = (store_round.generation(), ranks, cost)
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
