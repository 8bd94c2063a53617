"""One walk of an IR plan on one rank, for its two emitters.

The IR is rank-free; what one rank runs is each op with every size, start and index
evaluated at the rank's mesh coordinate. :func:`walk_plan` is that walk, the one both
executable forms of a plan take:

- :mod:`redist_opt.runtime.specialize` emits eager steps (a rank program, one closure per step);
- :mod:`redist_opt.graph.lower_chains` emits FX nodes into a compiled graph.

Each op of the plan, in order, is first bound at the coordinate (:func:`bind_op`): a local
op to its parameters (:class:`LocalStep`), a collective to the layout before it, the
functional collective and the layout after it (:class:`CollectiveStep`, from the one
definition in :mod:`redist_opt.ir.local_ops`). The emitter is then told, per op:
``local(step)``, or ``before(step)`` (when the collective lays its input out),
``issue(step, last)`` and ``after(step)`` (when it lays its result out). What a step
becomes, when a collective is waited, and where nodes are placed are the emitter's.

Under ``LocalTensorMode`` eager runs every simulated rank at once: the walk then binds
each op at every rank's coordinate, and the emitter gets ``{rank: step}``.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
import torch.fx as fx

from redist_opt.ir import symbolic as sym
from redist_opt.ir.local_ops import Collective, collective, rank_params
from redist_opt.ir.mesh import MeshGroup
from redist_opt.ir.ops import ir_name

__all__ = ["LocalStep", "CollectiveStep", "PlanEmitter", "plan_ops", "shape_at", "bind_op", "walk_plan"]


@dataclasses.dataclass(frozen=True)
class LocalStep:
    """A local IR op on one rank: its parameters after the input, every size an int."""

    node: fx.Node
    name: str
    params: tuple


@dataclasses.dataclass(frozen=True)
class CollectiveStep:
    """An IR collective on one rank: over ``group``, in the three parts ``parts`` holds."""

    node: fx.Node
    name: str
    group: MeshGroup
    parts: Collective


class PlanEmitter(Protocol):
    """What a walk hands each op to: one step, or ``{rank: step}`` under LocalTensorMode.
    ``before`` and ``after`` are called only where the collective has that part; ``last``:
    the plan's last collective."""

    def local(self, step) -> None: ...
    def before(self, step) -> None: ...
    def issue(self, step, last: bool) -> None: ...
    def after(self, step) -> None: ...


def plan_ops(plan) -> list[fx.Node]:
    """The IR ops of a Plan (or of its IR GraphModule), in order."""
    gm = plan if isinstance(plan, fx.GraphModule) else plan.graph
    return [n for n in gm.graph.nodes if ir_name(n) is not None]


def shape_at(node: fx.Node, coord) -> list[int]:
    """The shape of op ``node``'s input on the rank at ``coord``."""
    return [sym.evaluate(s, coord) for s in node.args[0].meta["shape"]]


def bind_op(node: fx.Node, coord, dtype: torch.dtype) -> LocalStep | CollectiveStep:
    """IR op ``node`` on the rank at ``coord``, for a local tensor of ``dtype``."""
    name = ir_name(node)
    if not node.target.is_collective:
        return LocalStep(node, name, rank_params(tuple(node.args[1:]), coord))
    group, *params = node.args[1:]
    parts = collective(name, shape_at(node, coord), dtype, group.size, rank_params(params, coord))
    return CollectiveStep(node, name, group, parts)


def walk_plan(nodes: list[fx.Node], coords, dtype: torch.dtype, emitter: PlanEmitter) -> None:
    """Bind every op of ``nodes`` at ``coords`` (one coordinate, or {rank: coordinate})
    and hand it to ``emitter``."""
    per_rank = isinstance(coords, dict)
    last = max((i for i, n in enumerate(nodes) if n.target.is_collective), default=-1)
    for i, node in enumerate(nodes):
        if per_rank:
            step = {r: bind_op(node, c, dtype) for r, c in coords.items()}
            first = next(iter(step.values()))
        else:
            step = first = bind_op(node, coords, dtype)
        if isinstance(first, LocalStep):
            emitter.local(step)
            continue
        if first.parts.before is not None:
            emitter.before(step)
        emitter.issue(step, i == last)
        if first.parts.after is not None:
            emitter.after(step)
