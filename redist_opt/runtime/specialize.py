"""An IR plan specialized to the calling rank: what a cached eager call runs.

:func:`redist_opt.runtime.execute.execute` interprets the FX graph and evaluates
size expressions (sympy) on every call, which suits a plan run once (and a
trace). A cached call instead runs a :class:`RankProgram`, built once per plan,
mesh and rank:

- every size, start and index is an ``int`` for this rank's coordinates (under
  ``LocalTensorMode``: one tuple of ints per simulated rank);
- every group is resolved to its process group's name once (what funcol
  resolves ``(mesh, dim)`` to on every call);
- the program is a straight list of steps: funcol calls and local-op calls
  (through :func:`redist_opt.runtime.execute.apply_local_op`, the one place local
  ops are implemented).

Collectives stay pending as in torch: with ``async_op=True`` the last
collective's ``AsyncCollectiveTensor`` is returned unwaited (a local op after a
collective needs its data, and so waits, as torch's padding steps do); with
``async_op=False`` the result is waited before it is returned. No check runs on
a specialized call that torch does not also make (the first call of a plan, which
builds the program, checked the local shape).
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
import torch.fx as fx

from redist_opt.ir import symbolic as sym
from redist_opt.ir.ops import ir_name
from redist_opt.runtime import torch_dtensor as tdt
from redist_opt.runtime.execute import apply_local_op, rank_coordinates, run_collective
from redist_opt.runtime.groups import resolve_group

__all__ = ["RankProgram", "specialize"]

_ASYNC = funcol.AsyncCollectiveTensor


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


def specialize(gm: fx.GraphModule, device_mesh, *, groups="existing") -> RankProgram:
    """The plan ``gm`` bound to the calling rank of ``device_mesh`` (or to every
    simulated rank, under ``LocalTensorMode``). Raises ``GroupUnavailable`` where a
    group cannot be resolved under the ``groups`` policy, as ``execute`` does."""
    coords = None
    steps, text = [], []
    for node in gm.graph.nodes:
        name = ir_name(node)
        if name is None:
            continue
        params = tuple(node.args[1:])
        if node.target.is_collective:
            group_name = tdt.group_name(resolve_group(device_mesh, params[0], groups))
            steps.append(_collective_step(name, params, group_name))
            text.append(f"{name}{(group_name, *params[1:])}")
            continue
        if coords is None:
            coords = rank_coordinates(device_mesh)
        per_rank = isinstance(coords, dict)
        if per_rank:
            values = {r: sym.evaluate_params(params, c) for r, c in coords.items()}
            text.append(f"{name} per rank {values}")
        else:
            values = sym.evaluate_params(params, coords)
            text.append(f"{name}{values}")
        steps.append(_local_step(name, values, per_rank))
    return RankProgram(steps, text)


def _collective_step(name: str, params: tuple, group_name: str):
    def step(x):
        return run_collective(name, x, params, group_name)

    return step


def _local_step(name: str, values, per_rank: bool):
    if per_rank:  # LocalTensorMode: each simulated rank's tensor with its own integers

        def step(x):
            if type(x) is _ASYNC:
                x = x.wait()
            if tdt.is_per_rank(x):
                return tdt.map_per_rank(x, lambda rank, t: apply_local_op(name, t, values[rank]))
            return apply_local_op(name, x, values[next(iter(values))])

        return step

    def step(x):
        if type(x) is _ASYNC:
            x = x.wait()  # a local op needs the data
        return apply_local_op(name, x, values)

    return step
