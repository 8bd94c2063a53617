"""Lowering: (mesh, src, dst, shape) -> the naive collective IR DTensor would run.

The step list is DTensor's greedy planner (``generate_greedy_transform_infos``
in torch/distributed/tensor/_redistribute.py) replayed on a rank-free
``MeshSpec``: same step order, same "logical shape" per step (computed from the
*source* placements, as torch does), but with sizes as expressions in the mesh
coordinates instead of the calling rank's numbers. ``tests/ir/test_lower.py``
checks the step list against torch's own planner. Each step then expands into
exactly the collectives and local pad/unpad ops ``redistribute_local_tensor``
issues for it, so the unoptimized plan is bit-for-bit DTensor.

A partial p-norm (``_NormPartial(p)``, reduce op ``"norm(p)"``) reduces as torch
does: ``power(x, p)``, the sum collective, ``root(x, p)``; R -> P(norm p) divides
by ``n ** (1/p)``. A merged norm step is one pre-step, one collective, one post-step.

``_StridedShard`` sources lower as the shard order they encode
(``redist_opt.ir.strided``: torch plans them with its graph-based planner as plain
``Shard`` steps). Placement subclasses we do not model are not lowered: the plan
is marked ``fallback`` and runs through torch. So is torch 2.15's ``Shard ->
Partial("sum")`` (a local zero-fill, ``Shard._to_partial_tensor``); torch 2.13 refuses
it, and ``check_transition`` with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from redist_opt.ir import symbolic as sym
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.ops import STEP_VARIANTS, GraphBuilder, StepInfo
from redist_opt.ir.placements import RedistributeError, norm_type_of, placement_str, reduce_op_of
from redist_opt.torch_api.dtensor import ZERO_FILLS_SHARD_TO_PARTIAL
from redist_opt.torch_api.placements import StridedShard

__all__ = [
    "greedy_steps",
    "lower_steps",
    "lower_step",
    "unsupported_reason",
    "dtype_reason",
    "check_transition",
]


def unsupported_reason(src: Sequence[Placement], dst: Sequence[Placement]) -> str | None:
    """Why these placements must go through torch's own path, or None if we lower them."""
    for p in (*src, *dst):
        kind = type(p).__name__
        if type(p) not in (Shard, Replicate, Partial, StridedShard) and norm_type_of(p) is None:
            return f"{kind} placements are not modelled by redist_opt"
    ops = {reduce_op_of(p) for p in (*src, *dst) if p.is_partial()}
    if len(ops) > 1 and any(op.startswith("norm(") for op in ops):
        return f"partial placements mix the reductions {sorted(ops)}: torch defines their order"
    if ZERO_FILLS_SHARD_TO_PARTIAL and any(
        type(s) is Shard and type(t) is Partial and t.reduce_op == "sum" for s, t in zip(src, dst)
    ):
        return "Shard -> Partial is torch's local zero-fill, which redist_opt does not lower"
    return None


def dtype_reason(src: Sequence[Placement], dtype: torch.dtype) -> str | None:
    """Why a dtype's partials must go through torch's own path, or None.

    c10d reduces complex numbers by sum and avg only (its all_reduce refuses max, min and
    product; they have no order), while a reduce_scatter does not check: a plan that reduces
    with another collective than torch's would raise where torch's does not, or the reverse.
    Read from the dtype and placements only, so every rank decides alike."""
    if not dtype.is_complex:
        return None
    ops = sorted({reduce_op_of(p) for p in src if p.is_partial()} - {"sum", "avg"})
    if not ops:
        return None
    return f"complex partials reduced by {', '.join(ops)}: c10d reduces complex numbers by sum and avg only"


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
                + (
                    "DTensor supports Shard -> Partial(sum) only"
                    if ZERO_FILLS_SHARD_TO_PARTIAL
                    else "DTensor does not support Shard -> Partial"
                )
            )
        if t.is_partial() and reduce_op_of(t) not in ("sum", "avg", "max", "min") and norm_type_of(t) is None:
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
    """Expand each step into the ops ``redistribute_local_tensor`` runs for it.

    A step over one mesh dim lowers to exactly DTensor's ops for it. A step over
    several mesh dims (made by a merge pass) lowers to one collective over their
    product group, with nested padding for uneven shards (``pad_nested`` /
    ``unpad_nested``) so every rank ends with the sizes DTensor defines.
    """
    b = GraphBuilder(input_shape)
    for step in steps:
        lower_step(b, mesh, step)
    return b.finish()


def lower_step(b: GraphBuilder, mesh: MeshSpec, step: StepInfo) -> None:
    dims = tuple(d for d in step.mesh_dims if mesh.sizes[d] > 1)
    if not dims:
        return  # DTensor short-cuts single-rank mesh dims: no op at all
    b.step = step
    group = mesh.group(dims)
    if step.variant:
        return _VARIANT_LOWERINGS[step.variant](b, mesh, group, step, dims)
    counts = tuple(mesh.sizes[d] for d in dims)
    coords = tuple(sym.coord(d) for d in dims)
    n = group.size
    cur, tgt = step.src, step.dst
    kind = step.kind
    norm = norm_type_of(cur)
    if kind in ("all_reduce", "reduce_scatter") and norm is not None and norm != 1:
        b.emit("power", norm)  # x ** 1 is x: p = 1 needs neither step
    if kind == "all_reduce":
        b.emit("all_reduce", group, cur.reduce_op)
        if step.avg_scale > 1:
            b.emit("divide", step.avg_scale)
    elif kind == "reduce_scatter":
        size = b.shape[tgt.dim]
        even = sym.is_divisible(size, n, mesh.sizes)
        if not even:
            b.emit("pad_nested", tgt.dim, counts)
        b.emit("reduce_scatter", group, cur.reduce_op, tgt.dim)
        if not even:
            b.emit("narrow", tgt.dim, 0, sym.nested_chunk_size(size, counts, coords))
        if step.avg_scale > 1:
            b.emit("divide", step.avg_scale)
    elif kind == "all_gather":
        # Shard._to_replicate_tensor: pad to the full chunk, gather, drop the padding.
        logical = step.logical_shape[cur.dim]
        even = sym.is_divisible(logical, n, mesh.sizes)
        if not even:
            b.emit("pad_to", cur.dim, sym.nested_max_chunk(logical, counts))
        b.emit("all_gather", group, cur.dim)
        if not even:
            if len(dims) == 1:
                b.emit("narrow", cur.dim, 0, logical)
            else:
                b.emit("unpad_nested", cur.dim, logical, counts)
    elif kind == "all_to_all":
        if cur.dim != tgt.dim:
            _lower_all_to_all(b, mesh, group, cur.dim, tgt.dim, step.logical_shape, counts, coords)
    elif kind == "chunk":
        for d, c in zip(dims, coords):
            b.emit("select_chunk", tgt.dim, mesh.sizes[d], c)
    elif kind == "partition" and not cur.is_partial():
        if norm_type_of(tgt) is not None:  # _NormPartial._partition_value
            b.emit("divide", math.pow(n, 1 / norm_type_of(tgt)))
        elif tgt.reduce_op == "sum":
            b.emit("divide", n)
        # avg / max / min of n equal values is the value: nothing to do.
    else:
        raise _unsupported(step, mesh)
    if kind in ("all_reduce", "reduce_scatter") and norm is not None and norm != 1:
        b.emit("root", norm)


def _lower_all_to_all(b, mesh, group, old_dim, new_dim, logical, counts, coords) -> None:
    # Shard._to_new_shard_dim: pad the old dim to the full chunk and the new dim to
    # n full chunks, exchange, then drop the padding of both.
    n = group.size
    old_even = sym.is_divisible(logical[old_dim], n, mesh.sizes)
    new_even = sym.is_divisible(logical[new_dim], n, mesh.sizes)
    if not old_even:
        b.emit("pad_to", old_dim, sym.nested_max_chunk(logical[old_dim], counts))
    if not new_even:
        if len(counts) == 1:
            b.emit("pad_to", new_dim, sym.CeilDiv(logical[new_dim], n) * n)
        else:
            b.emit("pad_nested", new_dim, counts)
    b.emit("all_to_all", group, new_dim, old_dim)
    if not old_even:
        if len(counts) == 1:
            b.emit("narrow", old_dim, 0, logical[old_dim])
        else:
            b.emit("unpad_nested", old_dim, logical[old_dim], counts)
    if not new_even:
        b.emit("narrow", new_dim, 0, sym.nested_chunk_size(logical[new_dim], counts, coords))


def _lower_split_all_to_all(b, mesh, group, step: StepInfo, dims) -> None:
    # Two all_to_alls that cat the same tensor dim, merged (merge-adjacent-all-to-alls):
    # each part's mesh dims (in mesh_dims order) split its tensor dim.
    logical = step.logical_shape
    cat = step.src.dim
    parts = [(t, tuple(d for d in ds if mesh.sizes[d] > 1)) for t, ds in step.parts]
    counts = tuple(mesh.sizes[d] for d in dims)
    cat_even = sym.is_divisible(logical[cat], group.size, mesh.sizes)
    if not cat_even:
        b.emit("pad_to", cat, sym.nested_max_chunk(logical[cat], counts))
    uneven = []
    for dim, ds in parts:
        c = tuple(mesh.sizes[d] for d in ds)
        if not sym.is_divisible(logical[dim], math.prod(c), mesh.sizes):
            uneven.append((dim, ds, c))
            b.emit("pad_nested", dim, c)
    b.emit("all_to_all", group, tuple((dim, math.prod(mesh.sizes[d] for d in ds)) for dim, ds in parts), cat)
    if not cat_even:
        b.emit("unpad_nested", cat, logical[cat], counts)
    for dim, ds, c in uneven:
        b.emit("narrow", dim, 0, sym.nested_chunk_size(logical[dim], c, tuple(sym.coord(d) for d in ds)))


def _lower_gather_blocks(b, mesh, group, step: StepInfo, dims) -> None:
    # One all_gather of several tensor dims (merge-gathers-across-dims): every rank
    # pads its block to the largest, the gather lays the blocks along the first
    # tensor dim, and unpack_blocks reassembles them.
    # The gathered slots come in the communicator's rank order (ascending global
    # rank), which need not be the order of the layout that names the group.
    slot_dims = mesh.rank_order(dims)
    assert slot_dims is not None and set(slot_dims) == set(dims), dims
    counts = tuple(mesh.sizes[d] for d in slot_dims)
    blocks, lengths = [], []
    for t, part_dims in sorted(step.parts):
        real = tuple(d for d in part_dims if mesh.sizes[d] > 1)
        if not real:
            continue
        length = step.logical_shape[t]
        pieces = tuple(mesh.sizes[d] for d in real)
        if not sym.is_divisible(length, math.prod(pieces), mesh.sizes):
            b.emit("pad_to", t, sym.nested_max_chunk(length, pieces))
        blocks.append((t, tuple(slot_dims.index(d) for d in real)))
        lengths.append(length)
    gather_dim = blocks[0][0]
    b.emit("all_gather", group, gather_dim)
    b.emit("unpack_blocks", gather_dim, counts, tuple(blocks), *lengths)


# How each step variant (ir.ops.STEP_VARIANTS) lowers.
_VARIANT_LOWERINGS = {
    "split_all_to_all": _lower_split_all_to_all,
    "gather_blocks": _lower_gather_blocks,
}
assert _VARIANT_LOWERINGS.keys() == STEP_VARIANTS.keys(), "every step variant needs a lowering"


def _unsupported(step: StepInfo, mesh: MeshSpec) -> RedistributeError:
    (d,) = step.mesh_dims
    return RedistributeError(
        f"redistribute from {placement_str(step.src)} to {placement_str(step.dst)} on mesh dim "
        f"{d} ({mesh.dim_name(d)}) of mesh ({mesh.shape_str}) is not supported by DTensor"
    )
