"""An IR plan specialized to the calling rank: the one executable form eager runs.

Every eager run of a plan, cached or not, runs a :class:`RankProgram` built from the
plan's IR for one mesh and rank (a cached call keeps its program; ``execute`` builds
one per call; a trace builds one while tracing):

- every size, start and index is an ``int`` for this rank's coordinates (under
  ``LocalTensorMode``: one tuple of ints per simulated rank);
- every group is resolved to its process group's name once (what funcol
  resolves ``(mesh, dim)`` to on every call);
- the program is a straight list of steps: the walk of
  :mod:`redist_opt.runtime.rank_walk` (the one the graph lowering takes too) binds
  each op at this rank's coordinate, and the op definitions of
  :mod:`redist_opt.ir.local_ops` (local ops, and each collective's layout and
  functional collective) run through its eager emitter.

Every collective goes through ``torch.ops._c10d_functional`` (so it is traceable,
``CommDebugMode`` counts it, and ``LocalTensorMode`` simulates it). Collectives stay
pending as in torch: with ``async_op=True`` the last collective's
``AsyncCollectiveTensor`` is returned unwaited (a local op after a collective needs its
data, and so waits, as torch's padding steps do); with ``async_op=False`` the result is
waited before it is returned. While tracing, each collective is waited at once, as
funcol does. No check runs on a specialized call that torch does not also make (the
first call of a plan, which builds the program, checked the local shape).

Which process group runs each collective is decided by layout, in
``redist_opt.runtime.groups``; a group that cannot be resolved raises
``GroupUnavailable`` there, before the program issues anything.
"""

from __future__ import annotations

import weakref

import torch
import torch.fx as fx

from redist_opt.ir.local_ops import EAGER, Collective, run_local_op
from redist_opt.runtime.groups import group_name
from redist_opt.runtime.rank_walk import plan_ops, walk_plan
from redist_opt.torch_api import c10d
from redist_opt.torch_api import local_tensor as lt

__all__ = ["RankProgram", "specialize", "rank_coordinates"]

_ASYNC = c10d.AsyncCollectiveTensor
_wait = c10d.WAIT


class RankProgram:
    """A plan's steps with this rank's integers and group names bound in.

    Call as ``program(local_tensor, async_op)``.
    """

    __slots__ = ("steps", "text")

    def __init__(self, steps: list, text: list[str]) -> None:
        self.steps = steps
        self.text = text  # one line per step, for tests and debugging

    def __call__(self, x: torch.Tensor, async_op: bool = False) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        if not async_op and type(x) is _ASYNC:
            x = x.wait()
        return x

    def __repr__(self) -> str:
        return "RankProgram(\n  " + "\n  ".join(self.text) + "\n)"


# -- coordinates ----------------------------------------------------------------

_coords_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rank_coordinates(device_mesh) -> dict[int, tuple[int, ...]] | tuple[int, ...]:
    """This rank's mesh coordinate, or {rank: coordinate} under LocalTensorMode."""
    lm = lt.local_tensor_mode()
    if lm is None:
        coord = device_mesh.get_coordinate()
        if coord is None:
            raise RuntimeError("the calling rank is not part of the mesh")
        return tuple(int(c) for c in coord)
    key = (id(lm), lm.ranks)
    per_mesh = _coords_cache.setdefault(device_mesh, {})
    if key not in per_mesh:
        coords = device_mesh.get_coordinate()
        per_mesh[key] = {r: tuple(lt.int_on_rank(c, r) for c in coords) for r in lm.ranks}
    return per_mesh[key]


# -- building ---------------------------------------------------------------------


def specialize(gm: fx.GraphModule, device_mesh, *, dtype: torch.dtype, groups="existing") -> RankProgram:
    """The plan ``gm`` for a local tensor of ``dtype``, bound to the calling rank of
    ``device_mesh`` (or to every simulated rank, under ``LocalTensorMode``). Raises
    ``GroupUnavailable`` where a group cannot be resolved under the ``groups`` policy."""
    nodes = plan_ops(gm)
    # Every group first: one that cannot be had (GroupUnavailable, agreed on every
    # rank) is then known before this rank issued any collective of the plan.
    names = {n: group_name(device_mesh, n.args[1], groups) for n in nodes if n.target.is_collective}
    coords = rank_coordinates(device_mesh) if nodes else ()
    steps = _EagerSteps(names, per_rank=isinstance(coords, dict), traced=c10d.are_we_tracing())
    walk_plan(nodes, coords, dtype, steps)
    return RankProgram(steps.steps, steps.text)


class _EagerSteps:
    """The eager emitter of :func:`~redist_opt.runtime.rank_walk.walk_plan`: each step a
    closure on this rank's tensor (on each simulated rank's, under LocalTensorMode)."""

    def __init__(self, names: dict, *, per_rank: bool, traced: bool) -> None:
        self.names, self.per_rank, self.traced = names, per_rank, traced
        self.steps: list = []
        self.text: list[str] = []

    def _first(self, step):
        return next(iter(step.values())) if self.per_rank else step

    def _on_ranks(self, step, field: str):
        if self.per_rank:
            return {r: getattr(s, field) for r, s in step.items()}
        return getattr(step, field)

    def local(self, step) -> None:
        name, values = self._first(step).name, self._on_ranks(step, "params")
        self.steps.append(_local_step(_local_op(name), values, self.per_rank))
        self.text.append(f"{name} per rank {values}" if self.per_rank else f"{name}{values}")

    def before(self, step) -> None:
        self.steps.append(_local_step(_before, self._on_ranks(step, "parts"), self.per_rank))

    def issue(self, step, last: bool) -> None:
        first = self._first(step)
        name = self.names[first.node]
        pending = first.parts.after is None and not self.traced
        self.steps.append(_issue_step(first.parts.issue, name, pending=pending))
        self.text.append(f"{first.name}{(name, *first.node.args[2:])}")

    def after(self, step) -> None:
        self.steps.append(_local_step(_after, self._on_ranks(step, "parts"), self.per_rank))


def _local_op(name: str):
    return lambda values: lambda x: run_local_op(name, x, values)


def _before(c: Collective):
    return lambda x: c.before(EAGER, x)


def _after(c: Collective):
    return lambda x: c.after(EAGER, x)


def _issue_step(issue, group: str, pending: bool):
    # ``pending``: the result is left in flight (an AsyncCollectiveTensor, as funcol returns
    # outside tracing); otherwise it is waited now (what follows needs its data, or a trace).
    def step(x):
        if type(x) is _ASYNC:
            x = x.wait()
        issued = issue(EAGER, x, group)
        return _ASYNC(issued) if pending else _wait(issued)

    return step


def _local_step(bind, values, per_rank: bool):
    """A step running ``bind(v)(tensor)`` with this rank's bound ``values`` (per simulated rank
    under LocalTensorMode: each rank's tensor with its own)."""
    if per_rank:
        runs = {r: bind(v) for r, v in values.items()}
        first = next(iter(runs.values()))

        def step(x):
            if type(x) is _ASYNC:
                x = x.wait()
            if lt.is_per_rank(x):
                return lt.map_per_rank(x, lambda rank, t: runs[rank](t))
            return first(x)

        return step

    run = bind(values)

    def step(x):
        if type(x) is _ASYNC:
            x = x.wait()  # a local op needs the data
        return run(x)

    return step
