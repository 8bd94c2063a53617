"""Each IR op as the aten / ``_c10d_functional`` nodes one rank runs: the table lowering uses.

The IR is rank-free; a compiled graph is one rank's. Every size, start and index
of an op is evaluated at this rank's mesh coordinate first, so the nodes below
take plain ints (as DTensor's own traced graphs do). Each lowering computes the
same values, with the same arithmetic, as :mod:`redist_opt.runtime.execute` does
eagerly (so a compiled graph equals the eager plan bitwise)::

    all_reduce(x, G, op)             all_reduce(x, op, name(G))
    reduce_scatter(x, G, op, d)      [d>0: cat(split(x, s/|G|, d), 0)] reduce_scatter_tensor(x, op, |G|, name(G))
    all_gather(x, G, d)              all_gather_into_tensor(x, |G|, name(G)) | wait | [d>0: cat(split(y, rows, 0), d)]
    all_to_all(x, G, s, c)           permute(s to front) all_to_all_single | wait | cat(permute back(split(y)), c)
    all_to_all(x, G, ((d, k),..), c) cat(unsqueeze(blocks), 0) all_to_all_single | wait | cat(squeeze(split(y, 1)), c)
    pad_to(x, d, size)               constant_pad_nd (negative: crops, as F.pad)
    pad_nested(x, d, counts)         cat(constant_pad_nd(split_with_sizes(x, nested chunk sizes, d)), d)
    unpad_nested(x, d, n, counts)    cat(slice(x, d, k*slot, k*slot+size_k), d)
    narrow(x, d, start, n)           slice; clone (contiguous, as eager's .contiguous())
    select_chunk(x, d, n, i)         slice(x, d, torch.chunk bounds of chunk i); clone
    divide(x, k) / power / root      div.Tensor / pow.Tensor_Scalar(x, p) / pow.Tensor_Scalar(x, 1/p)
    unpack_blocks(x, d, counts, blocks, *lengths)
                                     even blocks: view(x, counts split out of d) | permute | clone | view;
                                     uneven: cat of the sliced blocks per tensor dim, as execute does

``|`` marks the wait: a collective's lowering returns the issued node and a
``post`` step that runs on the waited value, so the caller places the wait.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from redist_opt.graph.chain import C10D
from redist_opt.ir import symbolic as sym
from redist_opt.ir.ops import OPS, split_dims

__all__ = ["Emitter", "LOCAL_LOWERINGS", "COLLECTIVE_LOWERINGS", "LOWERED_OPS", "rank_params"]

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
    """Appends aten / funcol calls at the graph's insertion point, with fake ``meta["val"]``
    where the inputs carry one (so later passes and Inductor see shapes and strides)."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        v = _fake_val(target, args, kwargs)
        if v is not None:
            node.meta["val"] = v
        return node

    def pieces(self, x: fx.Node, sizes, dim: int) -> list[fx.Node]:
        parts = self(aten.split_with_sizes.default, x, list(sizes), dim)
        return [self(operator.getitem, parts, i) for i in range(len(sizes))]

    def split_cat(self, x: fx.Node, size: int, split_dim: int, n: int, cat_dim: int) -> fx.Node:
        parts = self(aten.split.Tensor, x, size, split_dim)
        items = [self(operator.getitem, parts, i) for i in range(n)]
        return self(aten.cat.default, items, cat_dim)

    def contiguous(self, x: fx.Node) -> fx.Node:
        # Without a fake value the layout is unknown: copy (a contiguous copy is
        # what eager's .contiguous() would return for a strided view).
        v = x.meta.get("val")
        if isinstance(v, torch.Tensor) and v.is_contiguous():
            return x
        return self(aten.clone.default, x, memory_format=torch.contiguous_format)

    def pad_end(self, x: fx.Node, ndim: int, dim: int, amount: int) -> fx.Node:
        # F.pad(t, [0, 0, ..., 0, amount]), as runtime.execute._pad_end: negative crops.
        if amount == 0:
            return x
        pad = [0, 0] * (ndim - dim)
        pad[-1] = amount
        return self(aten.constant_pad_nd.default, x, pad, 0.0)


def rank_params(params, coord) -> list:
    """An op's parameters on the rank at ``coord``: size expressions evaluated, as execute does."""
    return list(sym.evaluate_params(params, coord))


def _chunk_bounds(size: int, n: int, index: int) -> tuple[int, int]:
    # torch.chunk: pieces of ceil(size / n); trailing chunks may be short or empty.
    step = -(-size // n) if size else 0
    start = min(index * step, size)
    return start, min(start + step, size)


# -- local ops: (emit, x, shape, *params) -> value ----------------------------------------------


def _pad_to(emit, x, shape, dim, size):
    return emit.pad_end(x, len(shape), dim, size - shape[dim])


def _pad_nested(emit, x, shape, dim, counts):
    if shape[dim] % math.prod(counts) == 0:
        return emit.contiguous(x)
    full = sym.evaluate(sym.nested_max_chunk(shape[dim], counts), ())
    sizes = sym.nested_chunk_sizes(shape[dim], counts)
    parts = emit.pieces(x, sizes, dim)
    return emit(aten.cat.default, [emit.pad_end(p, len(shape), dim, full - s) for p, s in zip(parts, sizes)], dim)


def _unpad_nested(emit, x, shape, dim, length, counts):
    sizes = sym.nested_chunk_sizes(length, counts)
    slot = shape[dim] // len(sizes)
    if all(s == slot for s in sizes):
        return x
    parts = [emit(aten.slice.Tensor, x, dim, k * slot, k * slot + s) for k, s in enumerate(sizes)]
    return emit(aten.cat.default, parts, dim)


def _narrow(emit, x, shape, dim, start, length):
    if start == 0 and length == shape[dim]:
        return x
    return emit.contiguous(emit(aten.slice.Tensor, x, dim, start, start + length))


def _select_chunk(emit, x, shape, dim, n, index):
    start, end = _chunk_bounds(shape[dim], n, index)
    return emit(aten.clone.default, emit(aten.slice.Tensor, x, dim, start, end))


def _divide(emit, x, shape, divisor):
    return emit(aten.div.Tensor, x, divisor)


def _power(emit, x, shape, p):
    return emit(aten.pow.Tensor_Scalar, x, p)


def _root(emit, x, shape, p):
    return emit(aten.pow.Tensor_Scalar, x, 1.0 / p)


def _unpack_blocks(emit, x, shape, dim, counts, blocks, *lengths):
    """See ``runtime.execute._unpack_blocks``: slot k of ``dim`` (row-major over ``counts``)
    holds the block at the nested chunk indices its coordinates give, padded to the largest."""
    n = math.prod(counts)
    slot = shape[dim] // n
    block_shape = list(shape)
    block_shape[dim] = slot
    sizes = {t: sym.nested_chunk_sizes(int(length), [counts[p] for p in pos])
             for (t, pos), length in zip(blocks, lengths)}
    covered = sorted(p for _, pos in blocks for p in pos)
    even = all(s == block_shape[t] for t, ss in sizes.items() for s in ss)
    if even and covered == list(range(len(counts))):
        return _unpack_even_blocks(emit, x, shape, dim, counts, blocks, slot)
    return _unpack_sliced_blocks(emit, x, shape, dim, counts, blocks, slot, sizes)


def _unpack_even_blocks(emit, x, shape, dim, counts, blocks, slot):
    # view: [..., c_0, .., c_m-1, slot, ...]; tensor dim t gathers the count axes of its
    # positions (outermost first) in front of its own axis; then merge them.
    m = len(counts)
    ndim = len(shape)
    viewed = emit(aten.view.default, x, [*shape[:dim], *counts, slot, *shape[dim + 1:]])

    def axis(t):  # where tensor dim t's own axis is in the view
        return t if t < dim else t + m

    positions = dict(blocks)
    order, out_shape = [], []
    for t in range(ndim):
        pos = positions.get(t, ())
        order += [dim + p for p in pos] + [axis(t)]
        out_shape.append((slot if t == dim else shape[t]) * math.prod(counts[p] for p in pos))
    moved = emit(aten.permute.default, viewed, order)
    copied = emit(aten.clone.default, moved, memory_format=torch.contiguous_format)
    return emit(aten.view.default, copied, out_shape)


def _unpack_sliced_blocks(emit, x, shape, dim, counts, blocks, slot, sizes):
    def block(pieces: dict) -> fx.Node:
        index = sym.block_slot_index(pieces, blocks, counts)
        b = emit(aten.slice.Tensor, x, dim, index * slot, (index + 1) * slot)
        for t, _ in blocks:
            size = sizes[t][pieces[t]]
            if size != (slot if t == dim else shape[t]):
                b = emit(aten.slice.Tensor, b, t, 0, size)
        return b

    def build(level: int, pieces: dict) -> fx.Node:
        if level == len(blocks):
            return block(pieces)
        t, _ = blocks[level]
        return emit(aten.cat.default, [build(level + 1, {**pieces, t: k}) for k in range(len(sizes[t]))], t)

    return emit.contiguous(build(0, {}))  # as execute's .contiguous()


LOCAL_LOWERINGS: dict[str, Callable] = {
    "pad_to": _pad_to,
    "pad_nested": _pad_nested,
    "unpad_nested": _unpad_nested,
    "narrow": _narrow,
    "select_chunk": _select_chunk,
    "divide": _divide,
    "power": _power,
    "root": _root,
    "unpack_blocks": _unpack_blocks,
}


# -- collectives: (emit, x, shape, group_name, group_size, *params) -> (issued, post) -------------
# ``post(emit, waited)`` runs after the wait (None: the waited value is the result).


def _all_reduce(emit, x, shape, name, n, op):
    return emit(C10D.all_reduce.default, x, op, name), None


def _reduce_scatter(emit, x, shape, name, n, op, dim):
    if dim != 0:  # funcol stacks the blocks of dim on dim 0 first
        x = emit.split_cat(x, shape[dim] // n, dim, n, 0)
    return emit(C10D.reduce_scatter_tensor.default, emit.contiguous(x), op, n, name), None


def _all_gather(emit, x, shape, name, n, dim):
    issued = emit(C10D.all_gather_into_tensor.default, emit.contiguous(x), n, name)
    if dim == 0:
        return issued, None
    return issued, lambda emit, y: emit.split_cat(y, shape[0], 0, n, dim)


def _all_to_all(emit, x, shape, name, n, split_dim, cat_dim):
    if isinstance(split_dim, tuple):
        return _all_to_all_blocks(emit, x, shape, name, n, split_dim, cat_dim)
    # funcol splits dim 0: bring split_dim to the front, exchange equal chunks, then lay
    # the chunk from member i at position i of cat_dim (runtime.execute._all_to_all).
    front = [split_dim] + [d for d in range(len(shape)) if d != split_dim]
    back = [front.index(d) for d in range(len(shape))]
    moved = x if split_dim == 0 else emit(aten.permute.default, x, front)
    rows = shape[split_dim] // n
    issued = emit(C10D.all_to_all_single.default, emit.contiguous(moved), [rows] * n, [rows] * n, name)

    def post(emit, y):
        parts = [p if split_dim == 0 else emit(aten.permute.default, p, back)
                 for p in emit.pieces(y, [rows] * n, 0)]
        return emit(aten.cat.default, parts, cat_dim)

    return issued, post


def _all_to_all_blocks(emit, x, shape, name, n, splits, cat_dim):
    # Member k gets block k of the row-major grid of pieces of several split dims.
    blocks = [x]
    for dim, pieces in splits:
        size = shape[dim] // pieces
        blocks = [p for b in blocks for p in emit.pieces(b, [size] * pieces, dim)]
    send = emit(aten.cat.default, [emit(aten.unsqueeze.default, b, 0) for b in blocks], 0)
    issued = emit(C10D.all_to_all_single.default, send, [1] * n, [1] * n, name)

    def post(emit, y):
        parts = [emit(aten.squeeze.dim, p, 0) for p in emit.pieces(y, [1] * n, 0)]
        return emit(aten.cat.default, parts, cat_dim)

    return issued, post


COLLECTIVE_LOWERINGS: dict[str, Callable] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
}

LOWERED_OPS = frozenset(LOCAL_LOWERINGS) | frozenset(COLLECTIVE_LOWERINGS)
assert all(OPS[name].is_collective for name in COLLECTIVE_LOWERINGS), "collective table mismatch"
