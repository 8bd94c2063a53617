"""Each IR op as the aten / ``_c10d_functional`` nodes one rank runs: the table lowering uses.

The IR is rank-free; a compiled graph is one rank's. Every size, start and index
of an op is evaluated at this rank's mesh coordinate first
(:func:`redist_opt.ir.local_ops.rank_params`), so the nodes take plain ints (as
DTensor's own traced graphs do).

Local ops are not written here: their one definition is :data:`redist_opt.ir.local_ops.LOCAL_OPS`,
which the runtime calls eagerly and which :class:`Emitter` turns into graph nodes (so a
compiled graph equals the eager plan bitwise). Collectives are lowered here::

    all_reduce(x, G, op)             all_reduce(x, op, name(G))
    reduce_scatter(x, G, op, d)      [d>0: cat(split(x, s/|G|, d))] reduce_scatter_tensor(x, op, |G|, name(G))
    all_gather(x, G, d)              all_gather_into_tensor(x, |G|, name(G)) | [d>0: cat(split(y, rows), d)]
    all_to_all(x, G, s, c)           permute(s to front) all_to_all_single | cat(permute back(split(y)), c)
    all_to_all(x, G, ((d, k),..), c) cat(unsqueeze(blocks)) all_to_all_single | cat(squeeze(split(y, 1)), c)

``|`` marks the wait: a collective's lowering returns the issued node and a
``post`` step that runs on the waited value, so the caller places the wait.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from redist_opt.graph.chain import C10D
from redist_opt.ir.local_ops import LOCAL_OPS, contiguous
from redist_opt.ir.local_ops import pieces as split_pieces
from redist_opt.ir.ops import OPS

__all__ = ["Emitter", "COLLECTIVE_LOWERINGS", "LOWERED_OPS"]

aten = torch.ops.aten


def _fake_val(target, args, kwargs):
    def val(a):
        if isinstance(a, fx.Node):
            return a.meta.get("val")
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a

    vargs, vkwargs = val(args), {k: val(v) for k, v in kwargs.items()}
    flat = [a for a in torch.utils._pytree.tree_leaves((vargs, vkwargs)) if isinstance(a, torch.Tensor)]
    if not flat:
        return None
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(flat)
    if mode is None:
        return None
    with mode:
        return target(*vargs, **vkwargs)


class Emitter:
    """The graph emitter of :mod:`redist_opt.ir.local_ops`: appends each aten / funcol call at
    the graph's insertion point, with a fake ``meta["val"]`` where the inputs carry one (so
    later passes and Inductor see shapes and strides)."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        v = _fake_val(target, args, kwargs)
        if v is not None:
            node.meta["val"] = v
        return node

    @staticmethod
    def is_contiguous(x: fx.Node) -> bool:
        # Without a fake value the layout is unknown: say no, so a copy is made (a
        # contiguous copy is what eager's .contiguous() returns for a strided view).
        v = x.meta.get("val")
        return isinstance(v, torch.Tensor) and v.is_contiguous()


def _split_cat(emit: Emitter, x: fx.Node, size: int, split_dim: int, n: int, cat_dim: int) -> fx.Node:
    parts = emit(aten.split.Tensor, x, size, split_dim)
    items = [emit(operator.getitem, parts, i) for i in range(n)]
    return emit(aten.cat.default, items, cat_dim)


# -- collectives: (emit, x, shape, group_name, group_size, *params) -> (issued, post) -------------
# ``post(emit, waited)`` runs after the wait (None: the waited value is the result).


def _all_reduce(emit, x, shape, name, n, op):
    return emit(C10D.all_reduce.default, x, op, name), None


def _reduce_scatter(emit, x, shape, name, n, op, dim):
    if dim != 0:  # funcol stacks the blocks of dim on dim 0 first
        x = _split_cat(emit, x, shape[dim] // n, dim, n, 0)
    return emit(C10D.reduce_scatter_tensor.default, contiguous(emit, x), op, n, name), None


def _all_gather(emit, x, shape, name, n, dim):
    issued = emit(C10D.all_gather_into_tensor.default, contiguous(emit, x), n, name)
    if dim == 0:
        return issued, None
    return issued, lambda emit, y: _split_cat(emit, y, shape[0], 0, n, dim)


def _all_to_all(emit, x, shape, name, n, split_dim, cat_dim):
    if isinstance(split_dim, tuple):
        return _all_to_all_blocks(emit, x, shape, name, n, split_dim, cat_dim)
    # funcol splits dim 0: bring split_dim to the front, exchange equal chunks, then lay
    # the chunk from member i at position i of cat_dim (runtime.execute._all_to_all).
    front = [split_dim] + [d for d in range(len(shape)) if d != split_dim]
    back = [front.index(d) for d in range(len(shape))]
    moved = x if split_dim == 0 else emit(aten.permute.default, x, front)
    rows = shape[split_dim] // n
    issued = emit(C10D.all_to_all_single.default, contiguous(emit, moved), [rows] * n, [rows] * n, name)

    def post(emit, y):
        parts = [
            p if split_dim == 0 else emit(aten.permute.default, p, back)
            for p in split_pieces(emit, y, [rows] * n, 0)
        ]
        return emit(aten.cat.default, parts, cat_dim)

    return issued, post


def _all_to_all_blocks(emit, x, shape, name, n, splits, cat_dim):
    # Member k gets block k of the row-major grid of pieces of several split dims.
    blocks = [x]
    for dim, pieces in splits:
        size = shape[dim] // pieces
        blocks = [p for b in blocks for p in split_pieces(emit, b, [size] * pieces, dim)]
    send = emit(aten.cat.default, [emit(aten.unsqueeze.default, b, 0) for b in blocks], 0)
    issued = emit(C10D.all_to_all_single.default, send, [1] * n, [1] * n, name)

    def post(emit, y):
        parts = [emit(aten.squeeze.dim, p, 0) for p in split_pieces(emit, y, [1] * n, 0)]
        return emit(aten.cat.default, parts, cat_dim)

    return issued, post


COLLECTIVE_LOWERINGS: dict[str, Callable] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
}

LOWERED_OPS = frozenset(LOCAL_OPS) | frozenset(COLLECTIVE_LOWERINGS)
assert all(OPS[name].is_collective for name in COLLECTIVE_LOWERINGS), "collective table mismatch"
