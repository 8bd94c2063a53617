"""What every pass may read, and the base class of our passes."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import torch
from torch.fx.passes.infra.pass_base import PassBase

from redist_opt import ir
from redist_opt.ir.cost import CostModel
from redist_opt.ir.mesh import MeshGroup, MeshSpec
from redist_opt.ir.plan import Note

__all__ = ["PassContext", "RedistPass", "GroupChoice"]


@dataclasses.dataclass(frozen=True)
class GroupChoice:
    group: MeshGroup
    how: str  # "mesh dim", "existing", "world", "create"
    extra_cost: float = 0.0  # group creation, amortized


@dataclasses.dataclass
class PassContext:
    """Rank-independent facts only: every rank must compute the same plan."""

    mesh: MeshSpec
    shape: tuple[int, ...]
    src: tuple
    dtype: torch.dtype = torch.float32
    groups: str | tuple = "existing"
    cost: CostModel = dataclasses.field(default_factory=CostModel.default)
    prefer: str = "time"  # or "consistency": merge every reduction a group allows
    notes: list[Note] = dataclasses.field(default_factory=list)
    # The pass classes this pipeline runs (None: the default pipeline), so a pass
    # that scores alternatives by running the others (reorder-collectives) runs
    # exactly those.
    pipeline: tuple | None = None

    @property
    def itemsize(self) -> int:
        return _itemsize(self.dtype)

    def bytes_of(self, shape) -> int:
        return ir.max_numel(shape, self.mesh.sizes) * self.itemsize

    def choose_group(self, dims: Sequence[int], *, any_order: bool = False) -> tuple[GroupChoice | None, str]:
        """A communicator over ``dims`` (in that order unless ``any_order``), or why none.

        ``any_order`` is for all_reduce, whose result does not depend on rank order.
        """
        real = [d for d in dims if self.mesh.sizes[d] > 1]
        orders = itertools.permutations(real) if any_order else [tuple(real)]
        tried = []
        for order in orders:
            group = self.mesh.group(order)
            if len(order) <= 1:
                return GroupChoice(group, "mesh dim"), "a single mesh dim"
            if not group.layout.check_orthogonal():
                tried.append(f"ranks overlap in {group.layout}")
                continue
            if not any_order and self.mesh.rank_order(order) != tuple(order):
                # A communicator ranks its members by ascending global rank (c10d sorts them).
                tried.append(f"a communicator over {_fmt(group)} ranks its members in another order")
                continue
            if self.mesh.group_exists(group):
                return GroupChoice(group, "existing"), f"a process group with layout {_fmt(group)} exists"
            if not tried:  # name the layout of the first (shard) order only
                tried.append(f"no process group has layout {_fmt(group)}")
        allowed = self._creatable(real)
        if allowed:
            group = self.mesh.group(tuple(sorted(real)) if any_order else tuple(real))
            if not any_order and self.mesh.rank_order(group.dims) != tuple(group.dims):
                tried.append(f"a communicator over {_fmt(group)} ranks its members in another order")
            elif list(group.dims) == sorted(group.dims):
                extra = self.cost.group_creation_time(group, self.mesh)
                return GroupChoice(group, "create", extra), f"groups={self._policy_str()} creates {_fmt(group)}"
            else:
                tried.append("DeviceMesh flattens mesh dims in ascending order only")
        return None, "; ".join(dict.fromkeys(tried)) + f" (groups={self._policy_str()})"

    def _creatable(self, dims) -> bool:
        if self.groups == "create":
            return True
        if isinstance(self.groups, tuple):
            allowed = {tuple(sorted(self.mesh.dims_of(g))) for g in self.groups}
            return tuple(sorted(dims)) in allowed
        return False

    def _policy_str(self) -> str:
        return self.groups if isinstance(self.groups, str) else "[" + ", ".join(map(str, self.groups)) + "]"

    def collective_time(self, kind: str, choice: GroupChoice, nbytes: int) -> float:
        return self.cost.collective_time(kind, choice.group, nbytes, self.mesh) + choice.extra_cost


@functools.cache
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _fmt(group: MeshGroup) -> str:
    from redist_opt.ir.layout import format_layout

    return format_layout(group.layout)


class RedistPass(PassBase):
    """A pass over the collective IR. Subclasses set ``name`` (kebab-case)."""

    name: str = ""
    # True for a pass that may trade bytes for launches (more bytes, less modelled
    # time). reorder-collectives budgets bytes without such passes.
    may_add_bytes: bool = False

    def __init__(self, ctx: PassContext) -> None:
        super().__init__()
        self.ctx = ctx

    def note(self, made: bool, what: str, reason: str) -> None:
        self.ctx.notes.append(Note(self.name, made, what, reason))
