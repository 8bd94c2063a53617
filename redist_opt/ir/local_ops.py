"""The semantics of the IR's local ops, written once, run eagerly or emitted into a graph.

Design (one op definition, two emitters). Each local op of :data:`redist_opt.ir.ops.OPS`
is one function ``semantics(emit, x, shape, *params) -> value`` in :data:`LOCAL_OPS`:

* ``x`` is the op's input value, ``shape`` its local shape on this rank as ints;
* ``params`` are the IR node's parameters after ``x``, resolved for this rank
  (:func:`rank_params`: sizes, starts and indices as ints, no sympy);
* every tensor operation is one call ``emit(aten_op, *args)`` of a ``torch.ops.aten``
  overload (or ``operator.getitem`` on a split's result), and the one layout question
  an op asks is ``emit.is_contiguous(x)``.

Two emitters implement that small interface. :data:`EAGER` calls the op now, on a real
tensor (the runtime, :mod:`redist_opt.runtime.execute`); the graph emitter of
:mod:`redist_opt.graph.lower_ops` appends a ``call_function`` node with a fake value
(the lowering into compiled graphs). The branches a function takes depend only on its
int arguments, so both emitters run the same aten calls on the same sizes and a
compiled graph equals the eager plan bitwise.

Entry point for eager code, e.g. a per-rank executable built once per plan::

    run_local_op(name, x, params)   # params: this rank's ints, as rank_params returns
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import torch

from redist_opt.ir import symbolic as sym

__all__ = ["LOCAL_OPS", "EAGER", "run_local_op", "rank_params", "pieces", "contiguous"]

aten = torch.ops.aten


class EagerEmit:
    """The emitter that runs each aten call now, on real tensors."""

    __slots__ = ()

    def __call__(self, target, *args, **kwargs):
        return target(*args, **kwargs)

    @staticmethod
    def is_contiguous(x: torch.Tensor) -> bool:
        return x.is_contiguous()


EAGER = EagerEmit()


def run_local_op(name: str, x: torch.Tensor, params: Sequence) -> torch.Tensor:
    """Run local IR op ``name`` now on this rank's tensor ``x``.

    ``params`` are the IR node's arguments after ``x`` with every size expression
    already evaluated at this rank's coordinate (``rank_params(node.args[1:], coord)``):
    ints, tuples of ints, a float divisor or exponent. No sympy is touched here.
    """
    return LOCAL_OPS[name](EAGER, x, tuple(x.shape), *params)


def rank_params(params: Sequence, coord: Sequence[int]) -> tuple:
    """An op's parameters on the rank at ``coord``: size expressions evaluated to ints."""
    return sym.evaluate_params(params, coord)


# -- building blocks over an emitter (shared with the collectives' lowering) -------------------


def contiguous(emit, x):
    """``x.contiguous()``: a copy only where ``x`` is (or may be) strided."""
    if emit.is_contiguous(x):
        return x
    return emit(aten.clone.default, x, memory_format=torch.contiguous_format)


def pieces(emit, x, sizes: Sequence[int], dim: int) -> list:
    """``x`` split along ``dim`` into pieces of ``sizes`` (views)."""
    parts = emit(aten.split_with_sizes.default, x, list(sizes), dim)
    return [emit(operator.getitem, parts, i) for i in range(len(sizes))]


def _pad_end(emit, x, ndim: int, dim: int, amount: int):
    # F.pad(t, [0, 0, ..., 0, amount]) as DTensor's pad_tensor: a negative amount crops.
    if amount == 0:
        return x
    pad = [0, 0] * (ndim - dim)
    pad[-1] = amount
    return emit(aten.constant_pad_nd.default, x, pad, 0.0)


def _chunk_bounds(size: int, n: int, index: int) -> tuple[int, int]:
    # torch.chunk: pieces of ceil(size / n); trailing chunks may be short or empty.
    step = -(-size // n) if size else 0
    start = min(index * step, size)
    return start, min(start + step, size)


# -- the local ops: (emit, x, shape, *params) -> value ----------------------------------------


def _pad_to(emit, x, shape, dim, size):
    return _pad_end(emit, x, len(shape), dim, size - shape[dim])


def _pad_nested(emit, x, shape, dim, counts):
    if shape[dim] % math.prod(counts) == 0:
        return contiguous(emit, x)
    sizes = sym.nested_chunk_sizes(shape[dim], counts)
    full = max(sizes)  # the first piece: ceil at every level
    parts = pieces(emit, x, sizes, dim)
    return emit(
        aten.cat.default, [_pad_end(emit, p, len(shape), dim, full - s) for p, s in zip(parts, sizes)], dim
    )


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
    return contiguous(emit, emit(aten.slice.Tensor, x, dim, start, start + length))


def _select_chunk(emit, x, shape, dim, n, index):
    start, end = _chunk_bounds(shape[dim], n, index)
    return emit(aten.clone.default, emit(aten.slice.Tensor, x, dim, start, end))


def _divide(emit, x, shape, divisor):
    return emit(aten.div.Tensor, x, divisor)


def _power(emit, x, shape, p):  # torch's _NormPartial._pre_reduce_transform
    return emit(aten.pow.Tensor_Scalar, x, p)


def _root(emit, x, shape, p):  # its _post_reduce_transform
    return emit(aten.pow.Tensor_Scalar, x, 1.0 / p)


def _unpack_blocks(emit, x, shape, dim, counts, blocks, *lengths):
    """Reassemble an all_gather of padded blocks along ``dim``.

    Slot k of ``dim`` (row-major over ``counts``, the gathering group's dims) holds one
    rank's block padded to the largest; for each ``(tensor dim, positions)`` of ``blocks``
    the slot's coordinates at ``positions`` (outermost first) are the nested chunk index
    of its piece along that tensor dim, whose full length is the matching ``lengths``.
    """
    slot = shape[dim] // math.prod(counts)
    sizes = {
        t: sym.nested_chunk_sizes(int(length), [counts[p] for p in pos])
        for (t, pos), length in zip(blocks, lengths)
    }
    covered = sorted(p for _, pos in blocks for p in pos)
    even = all(s == (slot if t == dim else shape[t]) for t, ss in sizes.items() for s in ss)
    if even and covered == list(range(len(counts))):
        return _unpack_even_blocks(emit, x, shape, dim, counts, blocks, slot)
    return _unpack_sliced_blocks(emit, x, shape, dim, counts, blocks, slot, sizes)


def _unpack_even_blocks(emit, x, shape, dim, counts, blocks, slot):
    # One copy: view [..., c_0, .., c_m-1, slot, ...]; tensor dim t gathers the count axes
    # of its positions (outermost first) in front of its own axis; then merge them.
    m = len(counts)
    viewed = emit(aten.view.default, contiguous(emit, x), [*shape[:dim], *counts, slot, *shape[dim + 1 :]])
    positions = dict(blocks)
    order, out_shape = [], []
    for t in range(len(shape)):
        pos = positions.get(t, ())
        order += [dim + p for p in pos] + [t if t < dim else t + m]
        out_shape.append((slot if t == dim else shape[t]) * math.prod(counts[p] for p in pos))
    moved = emit(aten.permute.default, viewed, order)
    copied = emit(aten.clone.default, moved, memory_format=torch.contiguous_format)
    return emit(aten.view.default, copied, out_shape)


def _unpack_sliced_blocks(emit, x, shape, dim, counts, blocks, slot, sizes):
    def block(chunk_index: dict):
        index = sym.block_slot_index(chunk_index, blocks, counts)
        b = emit(aten.slice.Tensor, x, dim, index * slot, (index + 1) * slot)
        for t, _ in blocks:
            size = sizes[t][chunk_index[t]]
            if size != (slot if t == dim else shape[t]):
                b = emit(aten.slice.Tensor, b, t, 0, size)
        return b

    def build(level: int, chunk_index: dict):
        if level == len(blocks):
            return block(chunk_index)
        t, _ = blocks[level]
        return emit(
            aten.cat.default, [build(level + 1, {**chunk_index, t: k}) for k in range(len(sizes[t]))], t
        )

    return contiguous(emit, build(0, {}))


LOCAL_OPS: dict[str, Callable] = {
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
