"""The meaning of a raised chain: its ``src -> dst`` placements, global shape and dtype.

:func:`assign_placements` replays a chain's ops on per-mesh-dim placements
(legality 3, 4 and 6 of :mod:`redist_opt.graph.raise_chains`)::

    all_reduce(dims)        each dim: untouched -> Partial(op) in src, Replicate now
    reduce_scatter(dims, t) the same, then Shard(t) now (dims innermost on t)
    slice(dims, t)          each dim: untouched -> Replicate in src (DTensor's slices
                            only), Shard(t) now
    all_gather(dims, t)     untouched dims: Shard(t) in src; or the innermost shards
                            of t made in the chain; either way Replicate now
    pointwise               only once no dim is partial any more

A mesh dim the chain never touches is ``Replicate`` on both sides.
"""

from __future__ import annotations

import dataclasses
import math

from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from redist_opt.graph.chain import Chain, ChainOp, node_val, static_shape
from redist_opt.ir.mesh import MeshSpec

__all__ = ["assign_placements"]


@dataclasses.dataclass
class _Replay:
    """Per-mesh-dim placements as the chain goes (None: the dim is untouched so far)."""

    spec: MeshSpec
    shape: list[int]  # local shape as the chain goes
    src: list[Placement | None] = dataclasses.field(default_factory=list)
    cur: list[Placement | None] = dataclasses.field(default_factory=list)
    order: dict[int, list[int]] = dataclasses.field(
        default_factory=dict
    )  # tensor dim -> mesh dims sharding it now (outer first)
    src_order: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    # the first pointwise op so far: a dim reduced after it was partial when it ran
    pointwise: str | None = None

    def __post_init__(self) -> None:
        self.src = [None] * self.spec.ndim
        self.cur = [None] * self.spec.ndim

    def group_size(self, dims) -> int:
        return math.prod(self.spec.sizes[d] for d in dims)


def _pointwise(r: _Replay, op: ChainOp) -> str | None:
    if any(isinstance(p, Partial) for p in r.cur):
        return f"{op.nodes[0].name}: a pointwise op on a value that is still partial"
    r.pointwise = r.pointwise or op.nodes[0].name
    return None


def _reduce(r: _Replay, op: ChainOp) -> str | None:
    if any(r.cur[d] is not None for d in op.dims):
        return f"{op.nodes[0].name}: reduces mesh dims {op.dims} that are not partial any more"
    if r.pointwise is not None:  # the dims reduced here were partial when it ran
        return f"{r.pointwise}: a pointwise op on a value that is still partial over mesh dims {op.dims}"
    for d in op.dims:
        r.src[d] = Partial(op.reduce_op)
        r.cur[d] = Replicate()
    return None


def _shard(r: _Replay, op: ChainOp) -> str | None:
    dims, t = op.dims, op.tensor_dim
    if any(r.cur[d] is not None and not isinstance(r.cur[d], Replicate) for d in dims):
        return f"{op.nodes[0].name}: shards mesh dims {dims} that are not replicated"
    if op.kind == "slice" and not op.trusted and any(r.cur[d] is None for d in dims):
        # Only DTensor declares a value replicated over dims nothing in the chain
        # touched; a slice of unknown origin selects over dims a collective of the
        # chain made replicated, or it is not raised (its input may differ across ranks).
        return (
            f"{op.nodes[0].name}: slices over mesh dims {dims} that no collective of the chain "
            "made replicated (only DTensor metadata declares them replicated)"
        )
    existing = r.order.setdefault(t, [])
    if list(dims) != sorted(dims) or (existing and max(existing) >= min(dims)):
        return (
            f"{op.nodes[0].name}: shard order {existing + list(dims)} of tensor dim {t} "
            "is not DTensor's default (ascending mesh dims)"
        )
    n = r.group_size(dims)
    if r.shape[t] % n:
        return f"{op.nodes[0].name}: tensor dim {t} ({r.shape[t]}) is not divisible by {n}"
    for d in dims:
        if r.src[d] is None:
            r.src[d] = Replicate()
        r.cur[d] = Shard(t)
    existing.extend(dims)
    r.shape[t] //= n
    return None


def _gather(r: _Replay, op: ChainOp) -> str | None:
    dims, t = op.dims, op.tensor_dim
    existing = r.order.setdefault(t, [])
    if all(r.cur[d] is None for d in dims):
        if existing:
            return f"{op.nodes[0].name}: gathers mesh dims {dims} sharded outside shards made in the chain"
        r.src_order[t] = list(dims) + r.src_order.get(t, [])
        for d in dims:
            r.src[d] = Shard(t)
            r.cur[d] = Replicate()
    elif all(isinstance(r.cur[d], Shard) and r.cur[d].dim == t for d in dims) and existing[
        -len(dims) :
    ] == list(dims):
        del existing[-len(dims) :]
        for d in dims:
            r.cur[d] = Replicate()
    else:
        return f"{op.nodes[0].name}: gathers mesh dims {dims} that are not the innermost shards of dim {t}"
    r.shape[t] *= r.group_size(dims)
    return None


# chain op kind -> the replay steps it takes, in order
_STEPS = {
    "view": (),
    "pointwise": (_pointwise,),
    "all_reduce": (_reduce,),
    "reduce_scatter": (_reduce, _shard),
    "slice": (_shard,),
    "all_gather": (_gather,),
}


def assign_placements(chain: Chain) -> str | None:
    """Replay the chain on per-mesh-dim placements (legality 3, 4, 6); fill src/dst/shape.

    Returns None on success, else the reason the chain is not raised.
    """
    in_shape = static_shape(chain.input)
    val = node_val(chain.input)
    if in_shape is None or val is None:
        return "the chain's input has no static shape"
    spec = chain.ctx.spec
    r = _Replay(spec, list(in_shape))
    for op in chain.ops:
        for step in _STEPS[op.kind]:
            why = step(r, op)
            if why is not None:
                return why
    for t, ds in r.src_order.items():
        if ds != sorted(ds):
            return f"source shard order {ds} of tensor dim {t} is not DTensor's default"
    # Global shape: the input's local shape times the source shards.
    global_shape = list(in_shape)
    for d, p in enumerate(r.src):
        if isinstance(p, Shard):
            global_shape[p.dim] *= spec.sizes[d]
    chain.src = tuple(p if p is not None else Replicate() for p in r.src)
    chain.dst = tuple(p if p is not None else Replicate() for p in r.cur)
    chain.shape = tuple(global_shape)
    chain.dtype = val.dtype
    out_shape = static_shape(chain.end)
    if out_shape is not None and tuple(r.shape) != out_shape:
        return f"the chain's output shape {out_shape} is not the derived {tuple(r.shape)}"
    return None
