"""The IR's own layout algebra (redist_opt.ir.layout_algebra): each operation on
known cases (every torch), exhaustively on small layouts and by property against
torch's own: pycute's lexicographic ``coalesce`` / ``complement`` (in every
release 2.11 to 2.15), torch's ``_FlatLayout`` / ``_MeshLayout`` (2.13 and later)
and 2.11 and 2.12's pycute-based ``_MeshLayout``.
"""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from redist_opt.ir import layout as L
from redist_opt.ir.layout_algebra import (
    FlatLayout,
    coalesce,
    collapse,
    dim_layouts,
    remap,
    row_major,
    suffix_product,
    tiles,
)
from redist_opt.torch_api.version import has_private

_LAYOUT = "torch.distributed._mesh_layout"
HAS_FLAT_LAYOUT = has_private(_LAYOUT, "_FlatLayout")  # torch 2.13 and later
HAS_PYCUTE_MESH_LAYOUT = not HAS_FLAT_LAYOUT and has_private(_LAYOUT, "_MeshLayout.nest")  # torch 2.11, 2.12
needs_flat_layout = pytest.mark.skipif(
    not HAS_FLAT_LAYOUT,
    reason=f"torch {torch.__version__} has no _mesh_layout._FlatLayout (torch 2.13 and later have it)",
)
needs_pycute_mesh_layout = pytest.mark.skipif(
    not HAS_PYCUTE_MESH_LAYOUT,
    reason=f"torch {torch.__version__}'s _MeshLayout is not the pycute-based one of torch 2.11 and 2.12",
)


def _pycute():
    from torch.distributed import _pycute

    return _pycute


def _torch_coalesced(shape, stride) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """pycute's lexicographic coalesce, flat, with ``_FlatLayout``'s ``():()`` for one index."""
    pc = _pycute()
    out = pc.coalesce(pc.Layout(tuple(shape), tuple(stride)))
    flat = pc.flatten(out.shape), pc.flatten(out.stride)
    return ((), ()) if flat == ((1,), (0,)) else flat


def _all_layouts(max_modes=3, sizes=(1, 2, 3), strides=(0, 1, 2, 3, 4, 6)):
    """Every (shape, stride) with up to ``max_modes`` modes from the given values."""
    for n in range(max_modes + 1):
        for shape in itertools.product(sizes, repeat=n):
            for stride in itertools.product(strides, repeat=n):
                yield shape, stride


# -- known cases (every torch) ---------------------------------------------------------------


def test_coalesce_merges_contiguous_modes_and_drops_size_one():
    assert coalesce((2, 3), (3, 1)) == ((6,), (1,))
    assert coalesce((2, 2), (4, 1)) == ((2, 2), (4, 1))
    assert coalesce((2, 1, 2), (2, 7, 1)) == ((4,), (1,))
    assert coalesce((1, 1), (5, 3)) == ((), ())
    assert coalesce((), ()) == ((), ())
    assert coalesce((2, 2), (1, 2)) == ((2, 2), (1, 2))  # column-major stays two modes


def test_flat_layout_is_canonical_and_hashable():
    assert FlatLayout((2, 3), (3, 1)) == FlatLayout((6,), (1,)) == FlatLayout(6, 1) == FlatLayout((6,))
    assert hash(FlatLayout((2, 3), (3, 1))) == hash(FlatLayout((6,), (1,)))
    assert FlatLayout((2, 3)) == FlatLayout((6,), (1,))  # row-major by default
    assert FlatLayout(((2, 2),), ((4, 1),)) == FlatLayout((2, 2), (4, 1))  # nested modes flatten
    assert FlatLayout((1,), (0,)).shape == () == FlatLayout((), ()).stride
    assert FlatLayout((2, 2), (4, 1)) != FlatLayout((2, 2), (1, 4))
    assert len({FlatLayout((4,), (1,)), FlatLayout((2, 2), (2, 1)), FlatLayout((2,), (1,))}) == 2
    assert pickle.loads(pickle.dumps(FlatLayout((2, 2), (4, 1)))) == FlatLayout((2, 2), (4, 1))


def test_flat_layout_rejects_bad_input():
    with pytest.raises(ValueError, match="don't match"):
        FlatLayout((2, 2), (1,))
    with pytest.raises(TypeError):
        FlatLayout("2", "1")
    with pytest.raises(ValueError, match="negative"):
        FlatLayout((2,), (-1,))


def test_repr_and_format_are_what_they_were():
    lay = FlatLayout((2, 2), (4, 1))
    assert repr(lay) == "_FlatLayout(shape=(2, 2), stride=(4, 1))"
    assert L.format_layout(lay) == "(2,2):(4,1)"
    assert L.format_layout(FlatLayout((4,), (2,))) == "4:2"
    assert L.format_layout(FlatLayout((), ())) == "():()"


def test_collapse_first_dim_slowest():
    a, b, c = row_major((2, 2, 2))
    assert (a, b, c) == (FlatLayout((2,), (4,)), FlatLayout((2,), (2,)), FlatLayout((2,), (1,)))
    assert collapse([a, b]) == FlatLayout((4,), (2,))
    assert collapse([a, c]) == FlatLayout((2, 2), (4, 1))  # non-adjacent: one group, two modes
    assert collapse([c, a]) == FlatLayout((2, 2), (1, 4))
    assert collapse([a, b, c]) == FlatLayout((8,), (1,))
    assert collapse([]) == FlatLayout((), ())


def test_dim_layouts_and_suffix_product():
    assert suffix_product((2, 3, 4)) == (12, 4, 1)
    assert suffix_product(()) == ()
    assert dim_layouts((2, 4), (1, 2)) == (FlatLayout((2,), (1,)), FlatLayout((4,), (2,)))
    with pytest.raises(ValueError, match="same length"):
        dim_layouts((2, 2), (1,))


def test_numel_cosize_and_indices():
    lay = FlatLayout((2, 3), (1, 2))
    assert lay.numel() == 6
    assert lay.cosize() == 6
    assert lay.all_ranks_from_zero() == [0, 2, 4, 1, 3, 5]  # torch's docstring example B
    assert list(lay.indices()) == lay.all_ranks_from_zero()
    assert FlatLayout((2, 2), (4, 1)).all_ranks_from_zero() == [0, 1, 4, 5]
    assert FlatLayout((), ()).all_ranks_from_zero() == [0]
    assert FlatLayout((2, 2), (4, 1)).cosize() == 6
    assert list(FlatLayout((2, 2), (4, 1)).sizes_and_strides) == [(2, 4), (2, 1)]


def test_check_orthogonal():
    assert FlatLayout((2, 3), (6, 1)).check_orthogonal()
    assert FlatLayout((2, 2), (4, 1)).check_orthogonal()
    assert FlatLayout((), ()).check_orthogonal()
    assert not FlatLayout((2, 3), (2, 1)).check_orthogonal()  # ranks overlap
    assert not FlatLayout((4, 2), (1, 1)).check_orthogonal()
    assert not FlatLayout((2, 2), (3, 1)).check_orthogonal()  # no overlap, but tiles nothing
    assert not FlatLayout((2,), (0,)).check_orthogonal()  # index 0 twice


def test_complement():
    assert FlatLayout((4,), (1,)).complement(8) == FlatLayout((2,), (4,))
    assert FlatLayout((2,), (4,)).complement(8) == FlatLayout((4,), (1,))
    assert FlatLayout((2, 2), (4, 1)).complement(8) == FlatLayout((2,), (2,))
    assert FlatLayout((), ()).complement(8) == FlatLayout((8,), (1,))
    assert FlatLayout((8,), (1,)).complement(8) == FlatLayout((), ())
    with pytest.raises(ValueError, match="not orthogonal"):
        FlatLayout((2, 3), (2, 1)).complement(8)


def test_tiles_rank_lists_and_remap():
    lay = FlatLayout((2, 2), (4, 1))  # dims a and c of a 2x2x2 mesh
    assert list(tiles(lay, 8)) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert L.rank_lists(lay, 8) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert L.rank_lists(FlatLayout((2,), (1,)), 8, limit=2) == [[0, 1], [2, 3]]
    assert remap(lay, [7, 6, 5, 4, 3, 2, 1, 0]) == [[7, 6, 3, 2], [5, 4, 1, 0]]
    assert remap(FlatLayout((2,), (2,)), [10, 20, 30, 40]) == [[10, 30], [20, 40]]  # torch's docstring case 2
    with pytest.raises(ValueError, match="does not tile"):
        remap(lay, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="does not tile"):
        list(tiles(FlatLayout((2,), (2,)), 3))


def test_tiles_partition_the_index_space_exhaustively():
    # Every orthogonal layout over 3 modes from small sizes and strides tiles any index
    # space its span divides: each index exactly once.
    checked = 0
    for shape, stride in _all_layouts(strides=(1, 2, 3, 4, 6, 12)):
        lay = FlatLayout(shape, stride)
        if not lay.check_orthogonal():
            continue
        span = max((s * t for s, t in lay.sizes_and_strides), default=1)
        for n in (span, 2 * span):
            groups = list(tiles(lay, n))
            assert sorted(i for g in groups for i in g) == list(range(n)), (lay, n)
            checked += 1
    assert checked > 100


# -- exhaustive small cases against torch ----------------------------------------------------


def test_coalesce_equals_pycutes_exhaustively():
    for shape, stride in _all_layouts():
        assert coalesce(shape, stride) == _torch_coalesced(shape, stride), (shape, stride)


def test_complement_equals_pycutes_exhaustively():
    pc = _pycute()
    for shape, stride in _all_layouts(strides=(1, 2, 3, 4, 6, 12)):
        lay = FlatLayout(shape, stride)
        if not lay.check_orthogonal():
            continue
        for n in (lay.cosize(), 24, 48):
            theirs = pc.complement(pc.Layout(lay.shape, lay.stride) if lay.shape else pc.Layout(1, 0), n)
            assert lay.complement(n) == FlatLayout(theirs.shape, theirs.stride), (lay, n)


@needs_flat_layout
def test_flat_layout_equals_torchs_exhaustively():
    from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout

    for shape, stride in _all_layouts():
        ours, theirs = FlatLayout(shape, stride), _FlatLayout(shape, stride)
        assert (ours.shape, ours.stride) == (theirs.shape, theirs.stride), (shape, stride)
        assert ours.all_ranks_from_zero() == theirs.all_ranks_from_zero()
        assert ours.numel() == theirs.numel()
        if all(t > 0 for t in ours.stride):
            assert ours.check_orthogonal() == theirs.check_orthogonal(), (shape, stride)
        if ours.check_orthogonal():
            assert ours.cosize() == _MeshLayout([theirs]).cosize()
            for n in (ours.cosize(), 36):
                assert _same(ours.complement(n), theirs.complement(n)), (shape, stride, n)


# -- properties against torch ----------------------------------------------------------------

_sizes = st.integers(1, 4)
_strides = st.integers(0, 16)


@st.composite
def _layouts(draw, max_modes=4, min_stride=0):
    n = draw(st.integers(0, max_modes))
    shape = tuple(draw(_sizes) for _ in range(n))
    stride = tuple(draw(st.integers(min_stride, 16)) for _ in range(n))
    return shape, stride


@st.composite
def _mesh_dims(draw):
    """The per-dim layouts of a mesh over a permuted set of index modes: sizes, each
    dim's modes (1 or 2 of them), and strides from one orthogonal row-major layout."""
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=5))
    strides = suffix_product(sizes)
    modes = list(zip(sizes, strides))
    order = draw(st.permutations(range(len(modes))))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(modes) - 1)), max_size=len(modes) - 1)))
    dims, start = [], 0
    for cut in [*cuts, len(modes)]:
        if cut > start:
            dims.append([modes[i] for i in order[start:cut]])
            start = cut
    return [(tuple(s for s, _ in d), tuple(t for _, t in d)) for d in dims], sizes


def _same(ours: FlatLayout, theirs) -> bool:
    return (ours.shape, ours.stride) == (tuple(theirs.shape), tuple(theirs.stride))


@settings(max_examples=300, deadline=None)
@given(_layouts())
def test_coalesce_property_vs_pycute(layout):
    shape, stride = layout
    assert coalesce(shape, stride) == _torch_coalesced(shape, stride)


@needs_flat_layout
@settings(max_examples=300, deadline=None)
@given(_layouts(), st.integers(1, 64))
def test_flat_layout_property_vs_torch(layout, n):
    from torch.distributed._mesh_layout import _FlatLayout

    shape, stride = layout
    ours, theirs = FlatLayout(shape, stride), _FlatLayout(shape, stride)
    assert _same(ours, theirs)
    assert ours.all_ranks_from_zero() == theirs.all_ranks_from_zero()
    if ours.check_orthogonal():
        assert theirs.check_orthogonal()
        assert _same(ours.complement(n), theirs.complement(n))
        m = n * max((s * t for s, t in ours.sizes_and_strides), default=1)  # an index space it tiles
        assert list(tiles(ours, m)) == theirs.global_ranks(m)


@needs_flat_layout
@settings(max_examples=200, deadline=None)
@given(_mesh_dims(), st.data())
def test_collapse_and_remap_property_vs_torch(mesh, data):
    from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout

    dims, sizes = mesh
    ours = [FlatLayout(s, t) for s, t in dims]
    theirs = _MeshLayout([_FlatLayout(s, t) for s, t in dims])
    picked = data.draw(st.lists(st.sampled_from(range(len(dims))), unique=True, min_size=1))
    assert _same(collapse([ours[d] for d in picked]), _MeshLayout([theirs[d] for d in picked]).collapse())
    n = 1
    for s in sizes:
        n *= s
    rank_map = data.draw(st.permutations(range(n)))
    for d in picked:
        expected = _MeshLayout([theirs[d]]).remap_to_tensor(torch.tensor(rank_map)).tolist()
        assert remap(ours[d], rank_map) == expected


@needs_flat_layout
@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_row_major_vs_torch(sizes):
    from torch.distributed._mesh_layout import _MeshLayout

    assert all(_same(o, t) for o, t in zip(row_major(sizes), _MeshLayout.from_sizes_strides(tuple(sizes))))


@needs_pycute_mesh_layout
@settings(max_examples=300, deadline=None)
@given(_layouts(min_stride=1), st.integers(1, 64))
def test_layout_property_vs_pycute_mesh_layout(layout, n):
    # torch 2.11 and 2.12's _MeshLayout is a pycute Layout: its coalesce keeps a size-1 layout as
    # 1:1 where ours (and 2.13's _FlatLayout) is ():(), and its flattened meshes nest.
    from torch.distributed._mesh_layout import _MeshLayout

    shape, stride = layout
    ours, theirs = FlatLayout(shape, stride), _MeshLayout(shape, stride).coalesce()
    pc = _pycute()
    flat = pc.flatten(theirs.shape), pc.flatten(theirs.stride)
    assert (ours.shape, ours.stride) == (((), ()) if flat[0] == (1,) else flat)
    assert ours.all_ranks_from_zero() == _MeshLayout(shape, stride).all_ranks_from_zero()
    if ours.check_orthogonal() and ours.shape:
        mesh = _MeshLayout(ours.shape, ours.stride)
        assert mesh.check_non_overlap()
        theirs_c = mesh.complement(n)
        assert ours.complement(n) == FlatLayout(theirs_c.shape, theirs_c.stride)
        m = n * max(s * t for s, t in ours.sizes_and_strides)  # an index space it tiles
        expected = mesh.nest().remap_to_tensor(torch.arange(m)).tolist()
        assert remap(ours, range(m)) == expected
