"""``_StridedShard`` (FSDP2 + TP parameters) lowered as the shard order it encodes.

FSDP2 on a (dp, tp) mesh shards a TP-sharded parameter again along the same
tensor dim: tp first, then dp. DTensor writes that right-to-left sharding as
``[_S(0, tp), S(0)]`` (``_StridedShard(0, split_factor=tp)``). How torch 2.13
redistributes it (torch/distributed/tensor/_redistribute.py, ``_dtensor_spec.py``):

* A spec holding a ``_StridedShard`` reads it as a shard order
  (``use_strided_shard_as_shard_order``, on by default: FSDP2's specs,
  ``distribute_tensor``, ``from_local``), and torch then always plans with its
  graph-based planner. That planner decodes the split factors
  (``_maybe_convert_StridedShard_to_shard_order``: here tensor dim 0 sharded by tp,
  then dp) and plans plain ``Shard`` steps on the decoded placements: the checkpoint
  gather ``[_S(0, 2), S(0)] -> [R, R]`` is ``S(0) -> R`` over dp (logical size: the
  tp chunk), then over tp, each ``Shard._to_replicate_tensor``.
* Only when the split factors encode no shard order (or the spec treats
  ``_StridedShard`` as a plain shard) does the greedy planner run, with
  ``_StridedShard._to_replicate_tensor`` (one all_gather, then an ``index_select``
  that undoes the interleaving). That path is handed back.
* torch's merge pass never merges the gathers: they come innermost first, which for
  this order is ascending mesh dims ("non-ascending order all_gather").

So a source with ``_StridedShard`` lowers here to exactly those steps: for the one
tensor dim whose sharding changes, ``Shard(t) -> Replicate`` over the mesh dims
its destination no longer shards (the end of its shard order), innermost first,
each with the logical shape of the shard state before it (torch's
``get_logical_shape``). merge-all-gathers can then make them one all_gather over
a dp+tp communicator, which ranks its members dp-major while the blocks are in
tp-major (shard) order: the merged step permutes the blocks locally after the
gather (``gather_blocks`` / ``unpack_blocks``).

Lowered only when the result is exactly torch's (``strided_reason`` says why not):

1. the source's split factors decode to a shard order; the destination holds no
   ``_StridedShard``;
2. one tensor dim changes, and its destination shard order is a prefix of its
   source order (the gathered mesh dims become ``Replicate``); every other mesh dim
   keeps its placement (so torch's min-cost path is forced: there is one order of
   gathers, innermost first);
3. uneven sizes: DTensor's local size of a ``_StridedShard`` tensor dim is its
   left-to-right split (``_StridedShard.local_shard_size_and_offset``), while the
   planned gathers assume the nested chunks of the shard order. They agree for
   every even size and for most uneven ones (FSDP2 + TP on 2 x tp); where some rank's
   sizes differ, the call is handed back.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from torch.distributed.tensor.placement_types import Placement, Replicate, Shard

from redist_opt.ir import symbolic as sym
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.ops import StepInfo
from redist_opt.ir.placements import placements_str, shard_order
from redist_opt.ir.steps import ShardState
from redist_opt.torch_api.placements import StridedShard

__all__ = ["has_strided", "strided_reason", "strided_steps"]

# Coordinates the uneven-size check enumerates at most (per tensor dim).
_MAX_CHECKED_COORDS = 1 << 14


def has_strided(*placements: Sequence[Placement]) -> bool:
    return any(isinstance(p, StridedShard) for ps in placements for p in ps)


def _gathers(mesh: MeshSpec, src, dst) -> tuple[dict, str | None]:
    """{tensor dim: mesh dims gathered, outermost first}, or why the transition is
    not one the module lowers (conditions 1-2 of the module docstring)."""
    order = shard_order(src, mesh.sizes)
    if order is None:
        return {}, (
            f"_StridedShard split factors in {placements_str(src)} encode no shard order on mesh "
            f"({mesh.shape_str}): torch's greedy planner reassembles them "
            "(_StridedShard._to_replicate_tensor)"
        )
    if has_strided(dst):
        return {}, f"target {placements_str(dst)} holds _StridedShard: only gathers out of one are lowered"
    dst_order = shard_order(dst, mesh.sizes)
    gathers = {}
    for t in sorted(set(order) | set(dst_order)):
        have, want = order.get(t, ()), dst_order.get(t, ())
        if have == want:
            continue
        if have[: len(want)] != want or any(not dst[d].is_replicate() for d in have[len(want) :]):
            return {}, (
                f"{placements_str(src)} -> {placements_str(dst)} reorders the sharding of tensor dim {t} "
                f"(shard order {have} -> {want}): torch's min-cost planner chooses that path"
            )
        gathers[t] = have[len(want) :]
    if len(gathers) > 1:
        return {}, (
            f"{placements_str(src)} -> {placements_str(dst)} unshards several tensor dims: torch's "
            "min-cost planner orders those steps"
        )
    moved = {d for ds in gathers.values() for d in ds}
    for d, (s, t) in enumerate(zip(src, dst)):
        if d not in moved and s != t:
            return {}, (
                f"{placements_str(src)} -> {placements_str(dst)} also changes mesh dim {d} "
                f"({mesh.dim_name(d)}): torch's min-cost planner orders those steps"
            )
    return gathers, None


def _dtensor_size(length: int, src, mesh_sizes, coords: dict[int, int], t: int) -> int:
    """DTensor's local size of tensor dim ``t``: its placements applied left to right."""
    for d, p in enumerate(src):
        if isinstance(p, StridedShard) and p.dim == t:
            sf, n = int(p.split_factor), mesh_sizes[d]
            length = sum(sym.chunk_size(sym.chunk_size(length, sf, j), n, coords[d]) for j in range(sf))
        elif isinstance(p, Shard) and p.dim == t:
            length = sym.chunk_size(length, mesh_sizes[d], coords[d])
    return length


def _sizes_reason(mesh: MeshSpec, src, shape) -> str | None:
    """Condition 3: every rank's DTensor local size is the nested chunk of the shard order."""
    order = shard_order(src, mesh.sizes)
    for t, dims in order.items():
        if not any(isinstance(p, StridedShard) and p.dim == t for p in src):
            continue
        counts = [mesh.sizes[d] for d in dims]
        if shape[t] % math.prod(counts) == 0:
            continue  # even: every piece is shape[t] / prod(counts) either way
        if math.prod(counts) > _MAX_CHECKED_COORDS:
            return (
                f"uneven {placements_str(src)} over {math.prod(counts)} ranks: "
                "too many to check its local sizes"
            )
        every_coord = itertools.product(*(range(n) for n in counts))  # row-major, as the pieces
        for values, nested in zip(every_coord, sym.nested_chunk_sizes(shape[t], counts)):
            if nested != _dtensor_size(shape[t], src, mesh.sizes, dict(zip(dims, values)), t):
                # no shape in the reason: the hand-back warns once per reason
                return (
                    f"uneven {placements_str(src)} on mesh ({mesh.shape_str}): DTensor's left-to-right local "
                    f"sizes of tensor dim {t} differ from the nested chunks of its shard order on some rank"
                )
    return None


def strided_reason(mesh: MeshSpec, src, dst, shape) -> str | None:
    """Why a transition with ``_StridedShard`` is handed back to torch (None: lowered
    here, or no ``_StridedShard`` at all)."""
    if not has_strided(src, dst):
        return None
    _, reason = _gathers(mesh, src, dst)
    return reason or _sizes_reason(mesh, src, shape)


def strided_steps(mesh: MeshSpec, src, dst, shape) -> list[StepInfo]:
    """torch's graph-based plan for a transition ``strided_reason`` accepts."""
    gathers, reason = _gathers(mesh, src, dst)
    assert reason is None, reason
    state = ShardState.of(src, mesh)
    steps: list[StepInfo] = []
    for t, dims in gathers.items():
        for d in reversed(dims):  # innermost first, each with the logical shape before it
            step = StepInfo(len(steps), (d,), Shard(t), Replicate(), state.logical_shape(shape, mesh, (d,)))
            state.apply(step, mesh)  # checks that d is the innermost dim sharding t
            steps.append(step)
    return steps
