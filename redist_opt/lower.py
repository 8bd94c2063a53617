"""Lowering: (mesh, src, dst, shape) -> the naive collective IR DTensor would run.

The step list is DTensor's greedy planner (``generate_greedy_transform_infos``
in torch/distributed/tensor/_redistribute.py) replayed on a rank-free
``MeshSpec``: same step order, same "logical shape" per step (computed from the
*source* placements, as torch does), but with sizes as expressions in the mesh
coordinates instead of the calling rank's numbers. ``tests/test_lower.py``
checks the step list against torch's own planner. Each step then expands into
exactly the collectives and local pad/unpad ops ``redistribute_local_tensor``
issues for it, so the unoptimized plan is bit-for-bit DTensor.

Cases torch plans with its graph-based planner (``_StridedShard``, non-default
shard orders) or that use placement subclasses we do not model (``_MaskPartial``)
are not lowered: the plan is marked ``fallback`` and runs through torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)

from . import symbolic as sym
from .ir import GraphBuilder, StepInfo
from .mesh import MeshSpec
from .placements import RedistributeError, placement_str

__all__ = ["greedy_steps", "lower_steps", "unsupported_reason", "check_transition", "describe_steps"]


def unsupported_reason(src: Sequence[Placement], dst: Sequence[Placement]) -> str | None:
    """Why these placements must go through torch's own path, or None if we lower them."""
    for p in (*src, *dst):
        if type(p) not in (Shard, Replicate, Partial):
            return f"placement {p!r} ({type(p).__name__}) is planned by torch's graph-based planner"
    return None


def check_transition(src: Sequence[Placement], dst: Sequence[Placement], mesh: MeshSpec) -> None:
    """Reject per-dim transitions DTensor cannot perform, naming the mesh dim."""
    for d, (s, t) in enumerate(zip(src, dst)):
        if s == t:
            continue
        where = f"mesh dim {d} ({mesh.dim_name(d)}) of mesh ({mesh.shape_str})"
        if t.is_partial() and s.is_partial():
            raise RedistributeError(
                f"cannot redistribute {placement_str(s)} -> {placement_str(t)} on {where}: "
                "one partial reduce op cannot become another"
            )
        if t.is_partial() and s.is_shard():
            raise RedistributeError(
                f"cannot redistribute {placement_str(s)} -> {placement_str(t)} on {where}: "
                "DTensor does not support Shard -> Partial"
            )
        if t.is_partial() and t.reduce_op not in ("sum", "avg", "max", "min"):
            raise RedistributeError(
                f"cannot redistribute {placement_str(s)} -> {placement_str(t)} on {where}: "
                f"Replicate -> Partial({t.reduce_op}) has no exact partition"
            )


def greedy_steps(
    mesh: MeshSpec, src: Sequence[Placement], dst: Sequence[Placement], global_shape: Sequence[int]
) -> list[StepInfo]:
    """DTensor's greedy planner on a rank-free mesh (see module docstring)."""
    sizes = mesh.sizes
    initial = tuple(sym.as_expr(s) for s in global_shape)
    steps: list[StepInfo] = []

    def add(mesh_dim, cur, tgt, logical):
        steps.append(StepInfo(len(steps), (mesh_dim,), cur, tgt, tuple(logical)))

    if mesh.ndim == 1:
        if src[0] != dst[0]:
            add(0, src[0], dst[0], initial)
        return steps

    logical_shapes = [initial]
    for i, p in enumerate(src):
        current = logical_shapes[i]
        if isinstance(p, Shard):
            if i < mesh.ndim - 1:
                new = list(current)
                new[p.dim] = sym.ChunkSize(current[p.dim], sizes[i], sym.coord(i))
                logical_shapes.append(tuple(new))
        else:
            logical_shapes.append(current)

    current = list(src)
    target = list(dst)
    num_shards = 1
    for i, p in enumerate(src):
        if p.is_shard():
            num_shards *= sizes[i]
    if num_shards > 1:
        for mesh_dim in reversed(range(len(current))):
            cur, tgt = current[mesh_dim], target[mesh_dim]
            if isinstance(tgt, Shard):
                shard_dim = tgt.dim
                cur_sharding = [i for i in range(mesh_dim) if current[i].is_shard(shard_dim)]
                tgt_sharding = [i for i in range(mesh_dim) if target[i].is_shard(shard_dim)]
                if cur_sharding != tgt_sharding:
                    tgt = Replicate()
            if cur != tgt:
                add(mesh_dim, cur, tgt, logical_shapes[mesh_dim])
                current[mesh_dim] = tgt
    for mesh_dim, (cur, tgt) in enumerate(zip(current, target)):
        if cur != tgt:
            add(mesh_dim, cur, tgt, logical_shapes[mesh_dim])
            current[mesh_dim] = tgt
    return steps


def lower_steps(mesh: MeshSpec, steps: Sequence[StepInfo], input_shape: Sequence):
    """Expand each planner step into the ops ``redistribute_local_tensor`` runs for it."""
    b = GraphBuilder(input_shape)
    for step in steps:
        (mesh_dim,) = step.mesh_dims
        n = mesh.sizes[mesh_dim]
        if n == 1:
            continue  # DTensor short-cuts single-rank mesh dims: no op at all
        b.step = step
        group = mesh.group((mesh_dim,))
        c = sym.coord(mesh_dim)
        cur, tgt = step.src, step.dst
        if tgt.is_replicate():
            if cur.is_partial():
                b.emit("all_reduce", group, cur.reduce_op)
            elif cur.is_shard():
                _lower_all_gather(b, group, cur.dim, step.logical_shape[cur.dim], n, mesh)
            else:
                raise _unsupported(step, mesh)
        elif tgt.is_shard():
            if cur.is_partial():
                size = b.shape[tgt.dim]
                if not sym.is_divisible(size, n, mesh.sizes):
                    b.emit("pad_chunks", tgt.dim, n)
                b.emit("reduce_scatter", group, cur.reduce_op, tgt.dim)
                if not sym.is_divisible(size, n, mesh.sizes):
                    b.emit("narrow", tgt.dim, 0, sym.ChunkSize(size, n, c))
            elif cur.is_replicate():
                b.emit("select_chunk", tgt.dim, n, c)
            elif cur.is_shard():
                if cur.dim != tgt.dim:
                    _lower_all_to_all(b, group, cur.dim, tgt.dim, step.logical_shape, n, c, mesh)
            else:
                raise _unsupported(step, mesh)
        elif tgt.is_partial():
            if cur.is_replicate():
                if tgt.reduce_op == "sum":
                    b.emit("divide", n)
                # avg / max / min of n equal values is the value: nothing to do.
            else:
                raise _unsupported(step, mesh)
        else:
            raise _unsupported(step, mesh)
    return b.finish()


def _lower_all_gather(b: GraphBuilder, group, dim: int, logical, n: int, mesh: MeshSpec) -> None:
    # Shard._to_replicate_tensor: pad to the full chunk, gather, drop the tail.
    even = sym.is_divisible(logical, n, mesh.sizes)
    if not even:
        b.emit("pad_to", dim, sym.CeilDiv(logical, n))
    b.emit("all_gather", group, dim)
    if not even:
        b.emit("narrow", dim, 0, logical)


def _lower_all_to_all(b, group, old_dim, new_dim, logical, n, c, mesh) -> None:
    # Shard._to_new_shard_dim: pad old dim to the full chunk and new dim to n full
    # chunks, exchange, then drop the padding of both.
    old_even = sym.is_divisible(logical[old_dim], n, mesh.sizes)
    new_even = sym.is_divisible(logical[new_dim], n, mesh.sizes)
    if not old_even:
        b.emit("pad_to", old_dim, sym.CeilDiv(logical[old_dim], n))
    if not new_even:
        b.emit("pad_to", new_dim, sym.CeilDiv(logical[new_dim], n) * n)
    b.emit("all_to_all", group, new_dim, old_dim)
    if not old_even:
        b.emit("narrow", old_dim, 0, logical[old_dim])
    if not new_even:
        b.emit("narrow", new_dim, 0, sym.ChunkSize(logical[new_dim], n, c))


def _unsupported(step: StepInfo, mesh: MeshSpec) -> RedistributeError:
    (d,) = step.mesh_dims
    return RedistributeError(
        f"redistribute from {placement_str(step.src)} to {placement_str(step.dst)} on mesh dim "
        f"{d} ({mesh.dim_name(d)}) of mesh ({mesh.shape_str}) is not supported by DTensor"
    )


def describe_steps(steps: Sequence[StepInfo], mesh: MeshSpec) -> str:
    return "; ".join(
        f"{mesh.dim_name(s.mesh_dims[0])}: {placement_str(s.src)}->{placement_str(s.dst)}"
        for s in steps
    )

