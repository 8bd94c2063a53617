"""What raising produces: a chain of ``_c10d_functional`` collectives and local ops on one
value, read as one redistribution (see :mod:`redist_opt.graph.raise_chains` for when a
chain is raised, and :mod:`redist_opt.graph.chain_placements` for its meaning).

The data model shared by raising, agreement across ranks, placement assignment and
lowering: :class:`ChainOp`, :class:`Chain`, :class:`NotRaised`, and the tables of the
``_c10d_functional`` / aten ops a chain may hold.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.distributed.tensor.placement_types import Placement

from redist_opt.graph.mesh_groups import MeshContext
from redist_opt.torch_api.c10d import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, C10D, REDUCE_SCATTER, WAIT

__all__ = ["C10D", "COLLECTIVES", "WAIT", "REDUCE_OPS", "ChainOp", "Chain", "NotRaised", "truncate", "after"]

# functional collective op -> chain op kind
COLLECTIVES = {
    ALL_REDUCE: "all_reduce",
    REDUCE_SCATTER: "reduce_scatter",
    ALL_GATHER: "all_gather",
    ALL_TO_ALL: "all_to_all",
}
REDUCE_OPS = ("sum", "avg", "max", "min")
# chain op kinds that are collectives (all_to_all is never part of a raised chain)
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclasses.dataclass(frozen=True)
class ChainOp:
    """One step of a raised chain.

    kind: all_reduce | reduce_scatter | all_gather | slice | pointwise | view
    """

    kind: str
    nodes: tuple[fx.Node, ...]
    dims: tuple[int, ...] = ()  # mesh dims (collectives, slices)
    tensor_dim: int | None = None
    reduce_op: str | None = None
    n: int = 1  # slice: number of blocks
    index: int | None = None  # slice: constant block index on this rank
    # slice: DTensor's redistribute put it there (node.meta["source_fn_stack"]); such a
    # slice is known to select the caller's own block on every rank, so when one dim
    # set has its size it needs no agreement. Any other slice is proven by agreement.
    trusted: bool = False
    group_name: str | None = None
    ctx: MeshContext | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass
class NotRaised:
    """A chain (or a collective) that was left as it was, and why."""

    nodes: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return f"not raised [{', '.join(self.nodes)}]: {self.reason}"


@dataclasses.dataclass
class Chain:
    """A raised chain: the redistribution it performs and the graph nodes it covers."""

    input: fx.Node
    ops: list[ChainOp]
    ctx: MeshContext
    src: tuple[Placement, ...] = ()
    dst: tuple[Placement, ...] = ()
    shape: tuple[int, ...] = ()  # global shape (untouched mesh dims count as replicated)
    dtype: torch.dtype = torch.float32
    stop_reason: str | None = None  # why the walk stopped where it did (for dumps)
    # ops[:kept] end in a value other users still need: a rewrite keeps them (and their
    # collectives) and replaces only what comes after (a chain through a shared value)
    kept: int = 0

    @property
    def nodes(self) -> list[fx.Node]:
        return [n for op in self.ops for n in op.nodes]

    @property
    def end(self) -> fx.Node:
        return self.ops[-1].nodes[-1]

    @property
    def collectives(self) -> list[ChainOp]:
        return [op for op in self.ops if op.kind in COLLECTIVE_KINDS]

    @property
    def kept_collectives(self) -> list[ChainOp]:
        return [op for op in self.ops[: self.kept] if op.kind in COLLECTIVE_KINDS]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


def node_val(node) -> torch.Tensor | None:
    """The tensor in ``node.meta["val"]`` (fake while compiling), or None."""
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def static_shape(node) -> tuple[int, ...] | None:
    """The node's shape when every size is a plain int, else None."""
    v = node_val(node)
    if v is None:
        return None
    # Symbolic sizes are not raised. Never int() a SymInt: that installs a guard and
    # specializes a dim the user marked dynamic (Dynamo then refuses the compile).
    if not all(type(s) is int for s in v.shape):
        return None
    return tuple(v.shape)


def trim(ops: list[ChainOp]) -> list[ChainOp]:
    """Drop trailing views / pointwise ops: the chain ends at its last collective or slice."""
    while ops and ops[-1].kind in ("view", "pointwise"):
        ops.pop()
    return ops


def truncate(chain: Chain, pos: int, reason: str) -> bool:
    """Cut the chain before op ``pos`` (and trailing views); False if nothing is left."""
    chain.ops = trim(list(chain.ops[:pos]))
    chain.stop_reason = reason
    return bool(chain.collectives)


def after(chain: Chain, pos: int) -> Chain | None:
    """The chain that starts at the first collective after op ``pos`` (a slice the chain
    is cut at), to be raised on its own; None when no collective follows. Only for a
    chain through no shared value: what follows a shared value is a chain of its own
    already."""
    if chain.kept:
        return None
    rest = chain.ops[pos + 1 :]
    first = next((k for k, op in enumerate(rest) if op.kind in COLLECTIVE_KINDS), None)
    if first is None:
        return None
    ops = trim(list(rest[first:]))
    return Chain(ops[0].nodes[0].args[0], ops, chain.ctx, stop_reason=chain.stop_reason)
