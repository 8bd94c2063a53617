"""The semantics of the IR's ops on one rank, written once, run eagerly or emitted into a graph.

Design (one op definition, two emitters). Each local op of :data:`redist_opt.ir.ops.OPS`
is one function ``semantics(emit, x, shape, *params) -> value`` in :data:`LOCAL_OPS`:

* ``x`` is the op's input value, ``shape`` its local shape on this rank as ints;
* ``params`` are the IR node's parameters after ``x``, resolved for this rank
  (:func:`rank_params`: sizes, starts and indices as ints, no sympy);
* every tensor operation is one call ``emit(aten_op, *args)`` of a ``torch.ops.aten``
  overload (or ``operator.getitem`` on a split's result), and the one layout question
  an op asks is ``emit.is_contiguous(x)``.

Each collective of the IR is one functional collective (``_c10d_functional``) with the
layout around it: :func:`collective` binds a node's sizes and returns its
:class:`Collective` (``before``, ``issue``, ``after``), written over the same emitters.
An all_to_all's send buffer and the reassembly of what it receives
(:func:`stack_blocks`, :func:`join_blocks`) are defined here and nowhere else.

Two emitters implement that small interface. :data:`EAGER` calls the op now, on a real
tensor (the rank programs of :mod:`redist_opt.runtime.specialize`); the graph emitter of
:mod:`redist_opt.graph.lower_ops` appends a ``call_function`` node with a fake value
(the lowering into compiled graphs). The branches a function takes depend only on its
int arguments and the dtype, so both emitters run the same aten calls on the same sizes
and a compiled graph equals the eager plan bitwise.

Entry point for eager code, e.g. a per-rank executable built once per plan::

    run_local_op(name, x, params)   # params: this rank's ints, as rank_params returns
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from redist_opt.ir import symbolic as sym
from redist_opt.ir.ops import split_dims
from redist_opt.torch_api.c10d import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, C10D, REDUCE_SCATTER

__all__ = [
    "LOCAL_OPS",
    "COLLECTIVE_OPS",
    "C10D",
    "Collective",
    "collective",
    "EAGER",
    "run_local_op",
    "rank_params",
    "pieces",
    "contiguous",
    "stack_blocks",
    "join_blocks",
]

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


def viewed(emit, x, shape: Sequence[int], new_shape: Sequence[int]):
    """``x`` (contiguous, of ``shape``) viewed as ``new_shape``: ``x`` itself where the shapes
    are equal. An identity view is no op on a tensor, but it is a node in a traced graph,
    which every compiler pass after the trace visits."""
    if list(shape) == list(new_shape):
        return x
    return emit(aten.view.default, x, list(new_shape))


def rearranged(emit, x, shape: Sequence[int], sizes: Sequence[int], order: Sequence[int], out_shape):
    """``x`` (contiguous, of ``shape``) viewed as ``sizes``, permuted by ``order``, made
    contiguous and viewed as ``out_shape``: a copy only where the permutation moves data.
    Axes of size 1 go anywhere without one (a sequence-parallel ``[1, s, h]`` activation
    gathered along dim 1 is its pieces laid end to end); where only they move, the whole
    is one view of ``x`` (none where ``out_shape`` is ``shape``), not a chain of views."""
    moving = [a for a in order if sizes[a] != 1]
    if moving == sorted(moving):
        return viewed(emit, x, shape, out_shape)
    y = emit(aten.permute.default, viewed(emit, x, shape, sizes), list(order))
    y = emit(aten.clone.default, y, memory_format=torch.contiguous_format)
    return viewed(emit, y, [sizes[a] for a in order], out_shape)


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
    start, end = sym.chunk_bounds(shape[dim], n, index)
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
    positions = dict(blocks)
    order, out_shape = [], []
    for t in range(len(shape)):
        pos = positions.get(t, ())
        order += [dim + p for p in pos] + [t if t < dim else t + m]
        out_shape.append((slot if t == dim else shape[t]) * math.prod(counts[p] for p in pos))
    view_shape = [*shape[:dim], *counts, slot, *shape[dim + 1 :]]
    return rearranged(emit, contiguous(emit, x), shape, view_shape, order, out_shape)


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


# -- collectives: the one functional collective each IR collective issues, and the layout around it --


class Collective(NamedTuple):
    """One IR collective on one rank, every size bound.

    ``before(emit, x)`` lays the input out as the functional collective takes it, ``issue(emit, x,
    group_name)`` issues that collective, ``after(emit, waited)`` lays the waited result out as the
    IR op's (``None``: nothing to do). The caller places the wait between ``issue`` and ``after``.
    """

    before: Callable | None
    issue: Callable
    after: Callable | None


def collective(name: str, shape: Sequence[int], dtype: torch.dtype, n: int, params: Sequence) -> Collective:
    """IR collective ``name`` over a group of ``n`` ranks on this rank's input of ``shape`` (ints)
    and ``dtype``; ``params``: the node's arguments after the group, as ints.

    Complex data moves as real pairs where the op only moves bytes (gathers, all_to_all), as c10d
    does: a backend's all_to_all may refuse complex tensors (gloo's does). The decision reads the
    dtype only, which every rank shares, so every rank issues the same collective.
    """
    as_real = dtype.is_complex and name in ("all_gather", "all_to_all")
    return _COLLECTIVES[name](tuple(shape), n, as_real, *params)


def stack_blocks(emit, x, shape: Sequence[int], splits: Sequence[tuple[int, int]], out_shape=None):
    """``[n, *block]`` (or that viewed as ``out_shape``): row k holds block k of the row-major grid
    that cuts each tensor dim ``d`` of ``splits`` ((d, pieces), ..., outermost first) into equal
    pieces. Each cut dim is viewed as (pieces, size / pieces) and the pieces axes are moved to the
    front: one copy at most."""
    pieces = dict(splits)
    grid, block, axis = [], [], {}
    for d, size in enumerate(shape):
        if d in pieces:
            axis[d] = len(grid)
            grid.append(pieces[d])
        grid.append(size // pieces.get(d, 1))
        block.append(size // pieces.get(d, 1))
    front = [axis[d] for d, _ in splits]
    order = front + [a for a in range(len(grid)) if a not in front]
    if out_shape is None:
        out_shape = [math.prod(pieces.values()), *block]
    return rearranged(emit, contiguous(emit, x), shape, grid, order, out_shape)


def join_blocks(emit, y, n: int, block: Sequence[int], dim: int, shape=None):
    """The ``n`` rows of ``y`` (contiguous, ``[n, *block]`` or ``shape`` of as many elements)
    concatenated along ``dim``: one copy at most."""
    rows = [n, *block]
    order = [*range(1, dim + 1), 0, *range(dim + 1, len(block) + 1)]
    joined = [*block[:dim], n * block[dim], *block[dim + 1 :]]
    return rearranged(emit, y, rows if shape is None else shape, rows, order, joined)


def _real(emit, x, as_real: bool):
    return emit(aten.view_as_real.default, x) if as_real else x


def _complex(emit, y, as_real: bool):
    return emit(aten.view_as_complex.default, y) if as_real else y


def _all_reduce(shape, n, as_real, op):
    return Collective(None, lambda emit, x, group: emit(ALL_REDUCE, x, op, group), None)


def _reduce_scatter(shape, n, as_real, op, dim):
    # The functional collective scatters dim 0: stack dim's n blocks along it first.
    def before(emit, x):
        block = [size // n if d == dim else size for d, size in enumerate(shape)]
        return stack_blocks(emit, x, shape, ((dim, n),), out_shape=[n * block[0], *block[1:]])

    def issue(emit, x, group):
        return emit(REDUCE_SCATTER, contiguous(emit, x), op, n, group)

    return Collective(before if dim != 0 else None, issue, None)


def _all_gather(shape, n, as_real, dim):
    # The functional collective gathers along dim 0: the n blocks, laid along dim afterwards.
    def before(emit, x):
        return _real(emit, contiguous(emit, x), as_real)

    def issue(emit, x, group):
        return emit(ALL_GATHER, contiguous(emit, x), n, group)

    def after(emit, y):
        y = _complex(emit, y, as_real)
        if dim == 0:
            return y
        return join_blocks(emit, y, n, shape, dim, shape=[n * shape[0], *shape[1:]])

    return Collective(before if as_real else None, issue, after if dim != 0 or as_real else None)


def _all_to_all(shape, n, as_real, split_dim, cat_dim):
    # Row k of the send buffer is the block member k gets; the row from member k lands at k of cat_dim.
    splits = split_dims(split_dim, n)
    pieces = dict(splits)
    block = [size // pieces.get(d, 1) for d, size in enumerate(shape)]

    def before(emit, x):
        return _real(emit, stack_blocks(emit, x, shape, splits), as_real)

    def issue(emit, x, group):
        return emit(ALL_TO_ALL, x, [1] * n, [1] * n, group)

    def after(emit, y):
        return join_blocks(emit, _complex(emit, y, as_real), n, block, cat_dim)

    return Collective(before, issue, after)


_COLLECTIVES: dict[str, Callable] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
}
COLLECTIVE_OPS = frozenset(_COLLECTIVES)
