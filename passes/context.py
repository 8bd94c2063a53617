"""What every pass may read, the one profitability rule, and the base class of our passes."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import torch
from torch.fx.passes.infra.pass_base import PassBase

from redist_opt import ir
from redist_opt.ir.cost import CostModel
from redist_opt.ir.layout import format_layout
from redist_opt.ir.mesh import MeshGroup, MeshSpec
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.plan import Note

__all__ = ["PassContext", "RedistPass", "GroupChoice", "Cost", "MARGIN"]

# The one margin of the profitability rule (PassContext.profitable): a rewrite that
# issues fewer collectives pays when its modelled time is at most this much (relative)
# above the time it replaces. A model calibrated on a noisy machine should not flip a
# merge on a 1% difference, and one collective also gives bitwise-equal replicas.
MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Cost:
    """What some collectives cost: modelled time (s), how many, bytes fed per rank."""

    time: float
    collectives: int
    nbytes: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.time + other.time, self.collectives + other.collectives, self.nbytes + other.nbytes)


ZERO = Cost(0.0, 0, 0)


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
    # The caller's options whole, with the cost profile resolved (run_pipeline resolves it).
    options: PlanOptions = dataclasses.field(default_factory=lambda: PlanOptions(cost=CostModel.default()))
    notes: list[Note] = dataclasses.field(default_factory=list)
    # The pass classes of the pipeline being run, in order (run_pipeline sets them).
    # reorder-collectives scores candidate orders by running exactly these passes
    # after itself; a context without them scores an order by itself.
    pipeline: tuple = ()

    def __post_init__(self) -> None:
        if self.options.cost is None:
            raise ValueError(
                "PassContext needs options with a resolved cost model (run_pipeline resolves it)"
            )

    @property
    def groups(self) -> str | tuple:
        return self.options.groups

    @property
    def cost(self) -> CostModel:
        return self.options.cost

    @property
    def prefer(self) -> str:
        """ "time", or "consistency": merge every reduction a group allows."""
        return self.options.prefer

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
                return GroupChoice(
                    group, "create", extra
                ), f"groups={self._policy_str()} creates {_fmt(group)}"
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

    # -- profitability ------------------------------------------------------------------

    def new_cost(self, kind: str, choice: GroupChoice, nbytes: int) -> Cost:
        """The cost of one new ``kind`` over ``choice`` fed ``nbytes`` per rank."""
        return Cost(self.collective_time(kind, choice, nbytes), 1, nbytes)

    def cost_of(self, regions) -> Cost:
        """The cost of the collectives of ``regions`` (``steps.Region``) as they are."""
        total = ZERO
        for r in regions:
            node = r.collective
            if node is not None:
                nbytes = self.bytes_of(node.args[0].meta["shape"])
                time = self.cost.collective_time(ir.ir_name(node), node.args[1], nbytes, self.mesh)
                total = total + Cost(time, 1, nbytes)
        return total

    def profitable(
        self, before: Cost, after: Cost, *, what: str = "the rewrite", trades_bytes: bool = False
    ) -> tuple[bool, str]:
        """Whether replacing collectives costing ``before`` by ones costing ``after`` pays,
        and why (``what`` names the new collectives in the reason). The rule of every pass:

        1. never more bytes fed per rank (padding uneven pieces can make a merged
           collective move more than the separate ones did), unless ``trades_bytes``:
           a rewrite made to trade bytes on the wire for launches
           (merge-reductions-into-all-reduce), which must instead be strictly faster
           (no margin, no ``prefer="consistency"`` waiver: it is made for time only);
        2. ``prefer="consistency"``: no more collectives pays whatever the time;
        3. otherwise the modelled time: no slower, or, with fewer collectives, at most
           ``MARGIN`` slower.
        """
        times = (
            f"{what} {after.time * 1e6:.1f}us vs {before.time * 1e6:.1f}us "
            f"under the {self.cost.name} cost model"
        )
        if trades_bytes:
            return (True, times) if after.time < before.time else (False, "cost: " + times)
        if after.nbytes > before.nbytes:
            return False, f"padding: {what} is fed {after.nbytes} B vs {before.nbytes} B"
        if self.prefer == "consistency" and after.collectives <= before.collectives:
            return True, f"prefer=consistency: {after.collectives} vs {before.collectives} collectives"
        slack = 1 + MARGIN if after.collectives < before.collectives else 1
        if after.time <= before.time * slack:
            return True, times
        return False, "cost: " + times

    def best(self, options: Sequence, *, trades_bytes: bool = False):
        """Among alternative rewrites of one run (each with a ``cost``), the one to make:
        the fastest, or one with fewer collectives that is ``profitable`` against it;
        never fed more bytes than the option with the most collectives (the run as it
        is) unless ``trades_bytes``. Fewest collectives first, then time."""
        kept = max(options, key=lambda o: o.cost.collectives)
        legal = [o for o in options if trades_bytes or o.cost.nbytes <= kept.cost.nbytes] or [kept]
        fastest = min(legal, key=lambda o: (o.cost.time, o.cost.collectives))
        bar = Cost(fastest.cost.time, fastest.cost.collectives, kept.cost.nbytes)
        ok = [o for o in legal if o is fastest or self.profitable(bar, o.cost, trades_bytes=trades_bytes)[0]]
        return min(ok, key=lambda o: (o.cost.collectives, o.cost.time))


@functools.cache
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _fmt(group: MeshGroup) -> str:
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
