"""The IR's own sizes:strides layout algebra (CuTe-style, lexicographic).

A layout maps a coordinate in ``shape`` (row-major: the last mode is fastest) to
the index ``sum(coord[i] * stride[i])``. The IR names every communicator by such
a layout over the root mesh's rank-map indices: a mesh dim is one, a group over
several dims is the *collapse* of theirs (first dim slowest), and the groups a
layout tiles the index space into are its *complement*'s offsets plus its own
indices.

This is the algebra of torch's ``torch.distributed._mesh_layout._FlatLayout``
(torch 2.13 to 2.15) and of pycute's lexicographic ``coalesce`` / ``complement``
(``torch.distributed._pycute``, 2.11 to 2.15), written here so the IR does not
depend on a private torch class that torch 2.11 and 2.12 lack (their mesh layout
is the older pycute-based one). ``tests/ir/test_layout_algebra.py`` checks every
operation against the installed torch's. Two deliberate differences, both on
layouts no DeviceMesh has: :meth:`FlatLayout.complement` refuses a layout that is
not orthogonal (torch returns a meaningless layout or asserts), and
:meth:`FlatLayout.check_orthogonal` answers False for a stride-0 mode (torch
divides by zero).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from itertools import product

__all__ = [
    "FlatLayout",
    "coalesce",
    "collapse",
    "suffix_product",
    "dim_layouts",
    "row_major",
    "tiles",
    "remap",
]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _flatten(x) -> tuple[int, ...]:
    """The ints of a nested int tuple, left to right (an int is a tuple of one)."""
    if _is_int(x):
        return (int(x),)
    return tuple(i for e in x for i in _flatten(e))


def _same_structure(a, b) -> bool:
    """Whether nested int tuples ``a`` and ``b`` have the same nesting (pycute's ``match_structure``)."""
    if _is_int(a) and _is_int(b):
        return True
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_structure(x, y) for x, y in zip(a, b))
    return False


def suffix_product(sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``sizes``: ``(6, 2, 1)`` for ``(2, 3, 2)``."""
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def coalesce(shape: Sequence[int], stride: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The fewest modes that map coordinates to the same indices, in canonical form.

    Walks the modes from the fastest (last) one: a size-1 mode is dropped, and a
    mode whose stride equals the span of the faster mode next to it (``size *
    stride``) merges into it. ``(2, 3):(3, 1)`` becomes ``(6):(1)``; ``(2, 2):(4,
    1)`` stays. A layout of one index (every mode of size 1) is ``():()``. This is
    pycute's lexicographic ``coalesce``, with torch's ``_FlatLayout`` convention
    for the one-index layout.
    """
    sizes, strides = [1], [0]
    for s, t in zip(reversed(tuple(shape)), reversed(tuple(stride))):
        if s == 1:
            continue
        if sizes[-1] == 1:
            sizes[-1], strides[-1] = s, t
        elif sizes[-1] * strides[-1] == t:
            sizes[-1] *= s
        else:
            sizes.append(s)
            strides.append(t)
    if sizes == [1] and strides == [0]:
        return (), ()
    return tuple(reversed(sizes)), tuple(reversed(strides))


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class FlatLayout:
    """A coalesced, hashable sizes:strides layout: the identity of a communicator.

    ``FlatLayout(shape, stride)`` takes int tuples (nested ones are flattened, an
    int is one mode; ``stride`` defaults to row-major) and stores the coalesced
    form, so two layouts that map coordinates to the same indices in the same
    order are equal, exactly as torch's ``_FlatLayout`` compares them.
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def __init__(self, shape, stride=None) -> None:
        if not (_is_int(shape) or isinstance(shape, (tuple, list))):
            raise TypeError(f"shape must be a tuple or int, got {type(shape)}")
        if stride is None:
            stride = suffix_product(_flatten(shape))
            shape = _flatten(shape)
        if not (_is_int(stride) or isinstance(stride, (tuple, list))):
            raise TypeError(f"stride must be a tuple or int, got {type(stride)}")
        if not _same_structure(shape, stride):
            raise ValueError(f"sizes {shape} and strides {stride} don't match")
        flat_shape, flat_stride = _flatten(shape), _flatten(stride)
        if any(s < 0 for s in flat_shape) or any(t < 0 for t in flat_stride):
            raise ValueError(f"sizes {shape} and strides {stride} must not be negative")
        flat_shape, flat_stride = coalesce(flat_shape, flat_stride)
        object.__setattr__(self, "shape", flat_shape)
        object.__setattr__(self, "stride", flat_stride)

    def __repr__(self) -> str:
        # The text torch 2.13's _FlatLayout printed: cache keys and notes built from
        # reprs (MeshSpec.canonical, layout.mesh_meaning) stay what they were.
        return f"_FlatLayout(shape={self.shape}, stride={self.stride})"

    @property
    def sizes_and_strides(self) -> Iterator[tuple[int, int]]:
        """(size, stride) of each mode, slowest first."""
        return zip(self.shape, self.stride)

    def numel(self) -> int:
        """How many coordinates (ranks of the group) the layout has."""
        return math.prod(self.shape)

    def cosize(self) -> int:
        """One past the largest index the layout reaches (the index space it needs)."""
        return sum((s - 1) * t for s, t in zip(self.shape, self.stride)) + 1

    def indices(self) -> Iterator[int]:
        """The index of each coordinate, coordinates in row-major order, lazily."""
        for coord in product(*(range(s) for s in self.shape)):
            yield sum(c * t for c, t in zip(coord, self.stride))

    def all_ranks_from_zero(self) -> list[int]:
        """Every index the layout maps to, coordinates in row-major order (its group's
        members, by position, relative to the group's first index)."""
        return list(self.indices())

    def check_orthogonal(self) -> bool:
        """Whether the modes, by decreasing stride, nest: each stride a multiple of the
        next mode's span. Then no index repeats and :meth:`complement` tiles an index
        space with it (torch's ``_FlatLayout.check_orthogonal``; a stride-0 mode of
        size > 1 repeats index 0: False)."""
        if len(self.shape) < 2:
            return all(t > 0 for t in self.stride)
        if any(t == 0 for t in self.stride):
            return False
        stride, shape = zip(*sorted(zip(self.stride, self.shape), reverse=True))
        return all(stride[i] % (stride[i + 1] * shape[i + 1]) == 0 for i in range(len(stride) - 1))

    def complement(self, index_space: int) -> FlatLayout:
        """The layout of the offsets that repeat this one over ``index_space`` indices:
        ``self`` at each offset of the complement is one tile, and the tiles cover the
        space once. ``(4):(1)`` in 8 is ``(2):(4)``; ``(2):(4)`` in 8 is ``(4):(1)``.
        (pycute's lexicographic ``complement``, for orthogonal layouts only.)
        """
        if not self.check_orthogonal():
            raise ValueError(f"{self} is not orthogonal: it tiles no index space")
        sizes, strides, current = [], [], 1
        for t, s in sorted(zip(self.stride, self.shape)):
            if current > s * t:
                raise ValueError(f"{self} has no complement in {index_space}")
            sizes.append(t // current)
            strides.append(current)
            current = s * t
        sizes.append(-(-int(index_space) // current))
        strides.append(current)
        return FlatLayout(tuple(reversed(sizes)), tuple(reversed(strides)))


def collapse(layouts: Iterable[FlatLayout]) -> FlatLayout:
    """One layout over several: coordinates of the first slowest, then coalesced.

    The layout of one communicator spanning mesh dims ``layouts`` (also what
    flattening a mesh's dims makes: the collapse of torch's mesh layout). Adjacent
    dims of a row-major mesh merge into one mode; non-adjacent ones (dims a and c of
    a x b x c) stay two modes: still one valid, non-contiguous communicator.
    """
    layouts = tuple(layouts)
    shape = tuple(s for lay in layouts for s in lay.shape)
    stride = tuple(t for lay in layouts for t in lay.stride)
    return FlatLayout(shape, stride)


def dim_layouts(sizes: Sequence[int], strides: Sequence[int] | None = None) -> tuple[FlatLayout, ...]:
    """One layout per dim of a mesh of ``sizes`` with index ``strides`` (row-major by
    default: what ``init_device_mesh`` builds)."""
    sizes = tuple(int(s) for s in sizes)
    strides = suffix_product(sizes) if strides is None else tuple(int(t) for t in strides)
    if len(sizes) != len(strides):
        raise ValueError(f"sizes {sizes} and strides {strides} must have the same length")
    return tuple(FlatLayout((s,), (t,)) for s, t in zip(sizes, strides))


def row_major(sizes: Sequence[int]) -> tuple[FlatLayout, ...]:
    """One layout per dim of a row-major mesh of ``sizes``."""
    return dim_layouts(sizes)


def tiles(layout: FlatLayout, index_space: int) -> Iterator[list[int]]:
    """The index lists of the groups ``layout`` tiles ``index_space`` into, in the
    order of the complement's offsets (torch's ``_FlatLayout.global_ranks``), lazily:
    a dump of a 100k-rank plan takes the first few without enumerating the rest."""
    offsets = layout.complement(index_space)
    if offsets.cosize() + layout.cosize() - 1 > index_space:
        raise ValueError(f"{layout} does not tile an index space of {index_space}")
    members = layout.all_ranks_from_zero()
    for offset in offsets.indices():
        yield [offset + m for m in members]


def remap(layout: FlatLayout, rank_map: Sequence[int]) -> list[list[int]]:
    """The global ranks of every group of ``layout`` over a mesh whose rank-map
    indices hold ``rank_map``: a group's ranks in the layout's order (what torch's
    ``remap_to_tensor`` of a one-dim mesh layout lists)."""
    rank_map = [int(r) for r in rank_map]
    return [[rank_map[i] for i in tile] for tile in tiles(layout, len(rank_map))]
