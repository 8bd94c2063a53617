"""Rank-free sizes: local tensor sizes as sympy expressions in mesh coordinates.

One plan serves every rank, yet with uneven sharding a rank's local size depends
on its mesh coordinate. torch's planner bakes the calling rank's coordinate into
its ``logical_shape``; we keep sizes as expressions in symbols ``c0..ck`` (one
per mesh dim) with ``torch.chunk``'s ceil-division semantics, and evaluate them
per rank only at run time. A size that is provably even (``L % n == 0`` for a
known ``L``) folds to a plain integer at construction, so evenly sharded plans
carry no symbols at all.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Mapping, Sequence

import sympy

__all__ = [
    "coord",
    "CeilDiv",
    "ChunkSize",
    "as_expr",
    "evaluate",
    "evaluate_params",
    "possible_values",
    "is_divisible",
    "expr_str",
]


@functools.cache
def coord(mesh_dim: int) -> sympy.Symbol:
    """The coordinate of the executing rank along ``mesh_dim``."""
    return sympy.Symbol(f"c{mesh_dim}", integer=True, nonnegative=True)


def _is_int(x) -> bool:
    return isinstance(x, (int, sympy.Integer))


class CeilDiv(sympy.Function):
    """ceil(a / b) on non-negative integers."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a, b):
        if _is_int(a) and _is_int(b):
            return sympy.Integer(-(-int(a) // int(b)))
        if b == 1:
            return a
        return None


class ChunkSize(sympy.Function):
    """Size of chunk ``i`` when ``torch.chunk`` splits ``length`` into ``n`` chunks.

    Matches ``Shard.local_shard_size_and_offset``: chunks are ceil(length/n) long,
    the last non-empty one may be short, trailing ones are empty.
    """

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, length, n, i):
        if _is_int(length) and _is_int(n):
            length, n = int(length), int(n)
            if length % n == 0:
                return sympy.Integer(length // n)
            if _is_int(i):
                return sympy.Integer(chunk_size(length, n, int(i)))
        if n == 1:
            return length
        return None


def chunk_bounds(length: int, n: int, i: int) -> tuple[int, int]:
    """``[start, end)`` of chunk ``i`` of ``torch.chunk(length, n)``: pieces of ceil(length / n),
    the last non-empty one may be short, trailing ones are empty (at ``length``)."""
    full = -(-length // n)
    return min(length, full * i), min(length, full * (i + 1))


def chunk_size(length: int, n: int, i: int) -> int:
    start, end = chunk_bounds(length, n, i)
    return end - start


def nested_chunk_size(length, counts: Sequence[int], coords: Sequence):
    """Size of the piece at ``coords`` after chunking ``length`` by counts[0], then counts[1], ..."""
    for n, c in zip(counts, coords):
        length = ChunkSize(length, n, c)
    return length


def nested_max_chunk(length, counts: Sequence[int]):
    """The largest piece of a nested chunking: the first one, ceil at every level."""
    for n in counts:
        length = CeilDiv(length, n)
    return length


def nested_chunk_sizes(length: int, counts: Sequence[int]) -> list[int]:
    """All piece sizes of a nested chunking of a concrete length, row-major."""
    sizes = [length]
    for n in counts:
        sizes = [chunk_size(s, n, i) for s in sizes for i in range(n)]
    return sizes


def as_expr(x) -> sympy.Expr:
    return x if isinstance(x, sympy.Basic) else sympy.Integer(int(x))


_NUMERIC = {
    "CeilDiv": lambda a, b: -(-a // b),
    "ChunkSize": chunk_size,
    "Max": max,
    "Min": min,
}


@functools.lru_cache(maxsize=4096)
def _compiled(expr: sympy.Expr, ndims: int):
    symbols = [coord(d) for d in range(ndims)]
    return sympy.lambdify(symbols, expr, modules=[_NUMERIC, "math"])


def evaluate(expr, coords: Sequence[int]) -> int:
    """The value of a size expression on the rank at ``coords``."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, sympy.Integer):
        return int(expr)
    return int(_compiled(expr, len(coords))(*coords))


def evaluate_params(params: Sequence, coords: Sequence[int]) -> tuple:
    """An op's parameters on the rank at ``coords``: every size expression an int,
    anything else as given."""
    out = []
    for p in params:
        if isinstance(p, sympy.Basic):
            p = evaluate(p, coords) if p.free_symbols else int(p)
        out.append(p)
    return tuple(out)


def possible_values(expr, mesh_sizes: Sequence[int]) -> frozenset[int]:
    """Every value ``expr`` takes over all coordinates, without enumerating ranks.

    Sizes are nested chunkings, so an expression depends on a few coordinates and
    takes at most a handful of values (full chunk, one short chunk, empty). We
    propagate value sets bottom-up instead of iterating the mesh.
    """
    return frozenset(_values(as_expr(expr), tuple(mesh_sizes)))


@functools.lru_cache(maxsize=4096)
def _values(expr: sympy.Expr, mesh_sizes: tuple[int, ...]) -> frozenset[int]:
    if isinstance(expr, sympy.Integer):
        return frozenset({int(expr)})
    if isinstance(expr, sympy.Symbol):
        dim = int(expr.name[1:])
        return frozenset(range(mesh_sizes[dim]))
    if isinstance(expr, ChunkSize):
        length, n, i = expr.args
        return frozenset(
            chunk_size(L, nn, ii)
            for L in _values(length, mesh_sizes)
            for nn in _values(n, mesh_sizes)
            for ii in _values(i, mesh_sizes)
        )
    if isinstance(expr, CeilDiv):
        a, b = expr.args
        return frozenset(-(-x // y) for x in _values(a, mesh_sizes) for y in _values(b, mesh_sizes))
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        op = sum if isinstance(expr, sympy.Add) else math.prod
        sets = [_values(a, mesh_sizes) for a in expr.args]
        return frozenset(int(op(combo)) for combo in itertools.product(*sets))
    raise TypeError(f"cannot enumerate values of {expr}")


def is_divisible(expr, n: int, mesh_sizes: Sequence[int]) -> bool:
    """True when ``expr`` is a multiple of ``n`` on every rank."""
    return all(v % n == 0 for v in possible_values(expr, mesh_sizes))


def expr_str(expr, names: Mapping[int, str] | None = None) -> str:
    """Readable form: ``chunk(5,2,c0)`` rather than ``ChunkSize(5, 2, c0)``."""
    e = as_expr(expr)
    if isinstance(e, sympy.Integer):
        return str(int(e))
    text = str(e)
    text = text.replace("ChunkSize", "chunk")
    text = text.replace("CeilDiv", "ceildiv").replace(", ", ",")
    if names:
        for d, name in sorted(names.items(), key=lambda kv: -kv[0]):
            text = re.sub(rf"\bc{d}\b", f"c_{name}", text)
    return text


def block_slot_index(pieces: dict, blocks, counts) -> int:
    """Slot of a gathered block: for each ``(tensor dim, positions)`` of ``blocks``,
    the nested chunk index ``pieces[dim]`` spread over the mesh coordinates at
    ``positions`` (outermost first), read row-major over ``counts``."""
    coord = [0] * len(counts)
    for tdim, pos in blocks:
        k = pieces[tdim]
        for p in reversed(pos):
            coord[p], k = k % counts[p], k // counts[p]
    index = 0
    for c, m in zip(coord, counts):
        index = index * m + c
    return index
