"""Runtime: execute an IR graph on the calling rank over a DeviceMesh's process groups.

Every collective goes through ``torch.distributed._functional_collectives`` (so
it is traceable, ``CommDebugMode`` counts it, and ``LocalTensorMode`` simulates
it). Local ops whose sizes depend on the mesh coordinate are evaluated per rank:
on a real process group that is the calling rank; under ``LocalTensorMode`` it
is each simulated rank in turn (``torch.distributed._local_tensor.tensor_map``).
What a local op does is defined once, in :mod:`redist_opt.ir.local_ops` (the graph
lowering emits the same definitions); this module only resolves its sizes per rank.

Which process group runs each collective is decided by layout, in
``redist_opt.runtime.groups``; a group that cannot be resolved raises
``GroupUnavailable`` there.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.distributed._functional_collectives as funcol
import torch.fx as fx

from redist_opt.ir import symbolic as sym
from redist_opt.ir.local_ops import rank_params, run_local_op
from redist_opt.ir.mesh import MeshGroup
from redist_opt.ir.ops import ir_name
from redist_opt.ir.placements import RedistributeError
from redist_opt.runtime import torch_dtensor as tdt
from redist_opt.runtime.groups import resolve_group

__all__ = [
    "execute",
    "check_local_shape",
    "rank_coordinates",
    "apply_local_op",
    "run_collective",
    "input_shape",
]


# -- coordinates ----------------------------------------------------------------

_coords_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rank_coordinates(device_mesh) -> dict[int, tuple[int, ...]] | tuple[int, ...]:
    """This rank's mesh coordinate, or {rank: coordinate} under LocalTensorMode."""
    lm = tdt.local_tensor_mode()
    if lm is None:
        coord = device_mesh.get_coordinate()
        if coord is None:
            raise RuntimeError("the calling rank is not part of the mesh")
        return tuple(int(c) for c in coord)
    key = (id(lm), lm.ranks)
    per_mesh = _coords_cache.setdefault(device_mesh, {})
    if key not in per_mesh:
        coords = device_mesh.get_coordinate()
        per_mesh[key] = {r: tuple(tdt.int_on_rank(c, r) for c in coords) for r in lm.ranks}
    return per_mesh[key]


# -- local ops --------------------------------------------------------------------


def apply_local_op(name: str, t: torch.Tensor, params: Sequence) -> torch.Tensor:
    """One local op on one rank's tensor, ``params`` already ints: the op table's eager
    entry, which ``execute`` and the specialized programs (``runtime.specialize``) call."""
    return run_local_op(name, t, params)


def _run_local(name: str, x: torch.Tensor, params: Sequence, coords) -> torch.Tensor:
    if isinstance(x, funcol.AsyncCollectiveTensor):
        x = x.wait()  # local ops need the data (async_op=True leaves collectives pending)
    if tdt.is_per_rank(x) and tdt.local_tensor_mode() is not None:
        # Simulated ranks may hold different sizes: run the op on each rank's tensor.
        def on_rank(rank: int, t: torch.Tensor) -> torch.Tensor:
            coord = coords if coords is None or isinstance(coords, tuple) else coords[rank]
            return apply_local_op(name, t, rank_params(params, coord))

        return tdt.map_per_rank(x, on_rank)
    return apply_local_op(name, x, rank_params(params, coords))


def _is_symbolic(params: Sequence) -> bool:
    return any(isinstance(p, sym.sympy.Basic) and p.free_symbols for p in params)


# -- collectives ------------------------------------------------------------------


def _chunks(t: torch.Tensor, dim: int, n: int) -> list[torch.Tensor]:
    # torch.chunk semantics with trailing empty chunks, as Shard._custom_chunk.
    parts = list(torch.chunk(t, n, dim=dim))
    while len(parts) < n:
        shape = list(t.shape)
        shape[dim] = 0
        parts.append(t.new_zeros(shape))
    return parts


def _all_to_all_blocks(x: torch.Tensor, group, n: int, splits, cat_dim: int) -> torch.Tensor:
    # Several split dims: member k gets block k of the row-major grid of pieces.
    blocks = [x]
    for dim, pieces in splits:
        blocks = [p for blk in blocks for p in _chunks(blk, dim, pieces)]
    send = torch.stack(blocks, 0).contiguous()
    out = funcol.all_to_all_single(send, None, None, group)
    out = funcol.wait_tensor(out) if isinstance(out, funcol.AsyncCollectiveTensor) else out
    return torch.cat([c.squeeze(0) for c in torch.chunk(out, n, dim=0)], dim=cat_dim)


def _all_to_all(x: torch.Tensor, group, n: int, split_dim, cat_dim: int) -> torch.Tensor:
    if isinstance(split_dim, tuple):
        return _all_to_all_blocks(x, group, n, split_dim, cat_dim)
    # funcol's all_to_all splits dim 0: bring split_dim to the front, exchange equal
    # chunks, then lay the chunk received from member i at position i of cat_dim.
    moved = x.movedim(split_dim, 0).contiguous()
    out = funcol.all_to_all_single(moved, None, None, group)
    out = funcol.wait_tensor(out) if isinstance(out, funcol.AsyncCollectiveTensor) else out
    pieces = [c.movedim(0, split_dim) for c in torch.chunk(out, n, dim=0)]
    return torch.cat(pieces, dim=cat_dim)


def run_collective(name: str, x: torch.Tensor, params: Sequence, pg) -> torch.Tensor:
    group: MeshGroup = params[0]
    if name == "all_reduce":
        return funcol.all_reduce(x, reduceOp=params[1], group=pg)
    if name == "reduce_scatter":
        return funcol.reduce_scatter_single(x.contiguous(), params[1], scatter_dim=params[2], group=pg)
    if name == "all_gather":
        return funcol.all_gather_single(x.contiguous(), gather_dim=params[1], group=pg)
    if name == "all_to_all":
        return _all_to_all(x, pg, group.size, params[1], params[2])
    raise AssertionError(f"unknown collective {name}")


def check_local_shape(expected, x: torch.Tensor, device_mesh, what: str = "its placements") -> None:
    """Refuse a local tensor whose shape is not what its placements define.

    A DTensor built with ``from_local(..., run_check=False)`` and a wrong shape
    would otherwise produce a silently wrong result.
    """
    if all(isinstance(e, sym.sympy.Integer) for e in expected):
        want_of = lambda rank: tuple(int(e) for e in expected)  # noqa: E731
    else:
        coords = rank_coordinates(device_mesh)
        want_of = lambda rank: tuple(  # noqa: E731
            sym.evaluate(e, coords if isinstance(coords, tuple) else coords[rank]) for e in expected
        )
    locals_ = tdt.per_rank_tensors(x)
    items = locals_.items() if locals_ is not None else [(None, x)]
    for rank, t in items:
        want = want_of(rank)
        if tuple(t.shape) != want:
            who = "this rank" if rank is None else f"rank {rank}"
            raise RedistributeError(
                f"the local tensor on {who} has shape {tuple(t.shape)} but {what} define a "
                f"local shape {want}: the DTensor's spec does not match its data"
            )


def input_shape(gm: fx.GraphModule) -> tuple:
    """The local shape (size expressions) a plan's graph takes as input."""
    return next(iter(gm.graph.nodes)).meta["shape"]


def execute(
    gm: fx.GraphModule,
    local_tensor: torch.Tensor,
    device_mesh,
    *,
    groups: str = "existing",
    async_op: bool = False,
) -> torch.Tensor:
    """Run the IR chain on this rank's local tensor (or every simulated rank's)."""
    coords = None
    x = local_tensor
    check_local_shape(input_shape(gm), x, device_mesh)
    # Every group first: one that cannot be had (GroupUnavailable, agreed on every
    # rank) is then known before this rank issued any collective of the plan.
    pgs = {
        node: resolve_group(device_mesh, node.args[1], groups)
        for node in gm.graph.nodes
        if ir_name(node) is not None and node.target.is_collective
    }
    for node in gm.graph.nodes:
        name = ir_name(node)
        if name is None:
            continue
        params = node.args[1:]
        if node.target.is_collective:
            x = run_collective(name, x, params, pgs[node])
            if not async_op and isinstance(x, funcol.AsyncCollectiveTensor):
                x = x.wait()
        else:
            if coords is None and _is_symbolic(params):
                coords = rank_coordinates(device_mesh)
            x = _run_local(name, x, params, coords)
    return x
