"""What redist_opt knows about communicators, in layouts.

torch describes every DeviceMesh dimension as a CuTe-style layout (sizes:strides
over indices into the root mesh's rank map). A communicator is identified by the
*collapsed* layout of the mesh dims it spans: two groups with equal collapsed
layouts contain the same ranks in the same order, whatever they are called.

The algebra is the IR's own (:mod:`redist_opt.ir.layout_algebra`); a live mesh's
internals (its dims' layouts, root, flattened meshes, group names) are read through
the one version-aware boundary, :mod:`redist_opt.torch_api.mesh`; what is needed of a
mesh and its root together is read there at once (``MeshInternals``), and the functions
here that take it do not read the live mesh again. This module gives those facts their
meaning: which communicators exist, which mesh dims a group spans, what a mesh is
across processes. Callers that need a fact as torch keeps it (a mesh's root, its
flattened meshes, whether this rank is in it) read it from
:mod:`redist_opt.torch_api.mesh` themselves; creating a flattened mesh with its group
is the runtime's (:mod:`redist_opt.runtime.flattened_meshes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import islice, permutations

import torch.distributed as dist

from redist_opt.ir.layout_algebra import FlatLayout, collapse, tiles
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.c10d import process_rank

__all__ = [
    "rank_lists",
    "format_layout",
    "layouts",
    "device_mesh_dim_layouts",
    "collapsed_layout",
    "known_communicators",
    "flatten_mapping_layouts",
    "flattened_dims",
    "ranks_ascending",
    "root_index_space",
    "root_dims_spanned",
    "is_full_view",
    "view_key",
    "root_group_names",
    "dim_group_names",
    "group_name",
    "dims_of_layout",
    "dims_spanned",
    "mesh_meaning",
]


def rank_lists(layout: FlatLayout, index_space: int, limit: int | None = None) -> list[list[int]]:
    """Indices (into the root rank map) of the groups the layout tiles ``index_space`` into.

    With ``limit`` only the first ``limit`` groups are produced: dumps of a plan at
    100k ranks show a few example groups without enumerating the world.
    """
    return list(islice(tiles(layout, index_space), limit))


def format_layout(layout: FlatLayout) -> str:
    """``(2,2):(4,1)`` style, as CuTe prints layouts."""
    shape = ",".join(str(s) for s in layout.shape)
    stride = ",".join(str(s) for s in layout.stride)
    if len(layout.shape) == 1:
        return f"{shape}:{stride}"
    return f"({shape}):({stride})"


def layouts(dims: Sequence[tuple[Sequence[int], Sequence[int]]]) -> tuple[FlatLayout, ...]:
    """The layouts of dims read as ``(sizes, strides)`` (:mod:`redist_opt.torch_api.mesh`)."""
    return tuple(FlatLayout(sizes, strides) for sizes, strides in dims)


def device_mesh_dim_layouts(device_mesh) -> tuple[FlatLayout, ...]:
    """The per-dim layouts of a live DeviceMesh, in its root's rank-map index space."""
    return layouts(tm.dim_sizes_strides(device_mesh))


def collapsed_layout(device_mesh) -> FlatLayout:
    """The layout of one communicator over all of ``device_mesh``'s dims (a flattened
    mesh's one dim: what identifies its group)."""
    return collapse(device_mesh_dim_layouts(device_mesh))


# -- a mesh with its root, read at once (torch_api.mesh.internals) ----------------------
# What planning (MeshSpec.from_device_mesh, redist_opt.api.specs) and group resolution
# need of a mesh's root and its flattened meshes is read in one go as MeshInternals;
# these give it meaning without reading the live mesh again.


def known_communicators(internals: tm.MeshInternals) -> dict[FlatLayout, tuple]:
    """Collapsed layout -> (mesh, mesh_dim) or ("world", None) of every communicator
    that already exists beside the mesh's own dims:

    * each flattened mesh of the root;
    * each dim of the root mesh itself: an ``_unflatten`` view's root is the mesh it
      was unflattened from, whose groups span several of the view's dims;
    * the default (world) group, when the root's rank map is ``0..world-1`` in order.
    """
    out: dict[FlatLayout, tuple] = {}
    if dist.is_initialized():
        world = dist.get_world_size()
        if internals.rank_map == tuple(range(world)):
            out[FlatLayout((world,), (1,))] = ("world", None)
    if internals.root_group_names:
        for d, lay in enumerate(layouts(internals.root_dims)):
            out[lay] = (internals.root, d)
    for _, flat, dims in internals.flattened:
        out[collapse(layouts(dims))] = (flat, 0)
    return out


def flatten_mapping_layouts(internals: tm.MeshInternals) -> frozenset:
    """Collapsed layouts of the root's flattened meshes: the groups torch's merge
    pass finds (by layout), unlike :func:`known_communicators` not the world group
    nor the root's own dims."""
    return frozenset(collapse(layouts(dims)) for _, _, dims in internals.flattened)


def flattened_dims(internals: tm.MeshInternals) -> list[tuple[str, object, tuple[int, ...] | None]]:
    """(name, flattened mesh, root dims it spans or None) for every flattened mesh of
    the root, in the root's order."""
    root_layouts = layouts(internals.root_dims)
    return [
        (name, flat, dims_of_layout(collapse(layouts(dims)), root_layouts, min_dims=2))
        for name, flat, dims in internals.flattened
    ]


def ranks_ascending(internals: tm.MeshInternals) -> bool:
    """Whether the root's rank map lists global ranks in ascending order (so a
    communicator's rank order, ascending global rank, is ascending rank index)."""
    ranks = internals.rank_map
    return all(a < b for a, b in zip(ranks, ranks[1:]))


def root_index_space(internals: tm.MeshInternals) -> int:
    """Size of the root mesh's index space (the rank-map indices layouts live in)."""
    return math.prod(lay.numel() for lay in layouts(internals.root_dims))


def root_dims_spanned(internals: tm.MeshInternals) -> tuple[int, ...] | None:
    """Sorted dims of the root mesh that the mesh's dims span (all of them for a root;
    a submesh's own dims; a flattened mesh's dims), or None when one of its dims is no
    set of the root's dims."""
    return _spanned(layouts(internals.root_dims), layouts(internals.dims))


def is_full_view(internals: tm.MeshInternals) -> bool:
    """Whether the mesh is a root mesh or a view of all of it, as
    ``root._unflatten(...)`` builds them (torchtitan's ``ParallelDims.build_mesh``
    makes every mesh so from a 1-D world mesh): not a flattened mesh, and its dims
    tile the root's whole index space. Such a view can stand for its root when
    group names are read as mesh dims."""
    if internals.mesh is internals.root:
        return True
    if any(internals.mesh is flat for _, flat, _ in internals.flattened):
        return False
    return math.prod(lay.numel() for lay in layouts(internals.dims)) == root_index_space(internals)


def view_key(internals: tm.MeshInternals) -> tuple:
    """Equal for two DeviceMesh objects with the same root and the same per-dim
    layouts (the same mesh, whichever object or name)."""
    return (id(internals.root), layouts(internals.dims))


# -- live DeviceMesh facts the compiled-graph pass reads (redist_opt.graph) -------------


def root_group_names(device_mesh) -> tuple[str, ...]:
    """Names of the process groups of the root mesh's dims (empty before groups
    exist): the same on every rank, and different for two roots over the same ranks,
    so they tell such roots apart where ``id()`` (per process) cannot."""
    return dim_group_names(tm.root_mesh(device_mesh))


def dim_group_names(device_mesh) -> tuple[str, ...]:
    """Names of the process groups of ``device_mesh``'s own dims: empty while it has
    none (its groups were never initialized, or the calling rank is in none of them)."""
    names = tm.dim_group_names(device_mesh)
    return () if names is None else names


def group_name(device_mesh, dim: int = 0) -> str:
    """The name of the process group of ``device_mesh``'s dim ``dim``, read as funcol reads
    ``(mesh, dim)``. Not through ``DeviceMesh.get_group``: while torch.compile traces, torch
    2.15's ``get_group`` looks the group up in the root mesh's registry, which does not hold
    every group a mesh view names (torchtitan's meshes on 2.15: "PG 11 was not found while
    torch.compile tracing"), where the name alone is all that is needed."""
    names = dim_group_names(device_mesh)
    if not 0 <= dim < len(names):
        raise RuntimeError(
            f"mesh {device_mesh} has no process group for dim {dim} on rank {process_rank()} "
            f"(its groups: {list(names)})"
        )
    return names[dim]


def dims_of_layout(
    layout: FlatLayout, dim_layouts: Sequence[FlatLayout], min_dims: int = 1
) -> tuple[int, ...] | None:
    """The first ordered set of at least ``min_dims`` dims (fewest dims first) whose
    collapsed ``dim_layouts`` equal ``layout``, or None."""
    n = len(dim_layouts)
    for k in range(min_dims, n + 1):
        for dims in permutations(range(n), k):
            if collapse([dim_layouts[d] for d in dims]) == layout:
                return dims
    return None


def dims_spanned(base, device_mesh) -> tuple[int, ...] | None:
    """Sorted dims of ``base`` that ``device_mesh``'s dims span, or None when one of
    its dims is no set of ``base``'s dims (or the two have different roots).

    ``base`` is a root or a view of it (``_unflatten``): its dims and
    ``device_mesh``'s are layouts in the same root index space, so a slice, a
    flattened group or a sibling view's dim is found by comparing collapsed layouts.
    """
    if tm.root_mesh(base) is not tm.root_mesh(device_mesh):
        return None
    return _spanned(device_mesh_dim_layouts(base), device_mesh_dim_layouts(device_mesh))


def _spanned(base_layouts: Sequence[FlatLayout], dim_layouts: Sequence[FlatLayout]) -> tuple[int, ...] | None:
    """Sorted indices of ``base_layouts`` that ``dim_layouts`` span, or None when one of
    them is no set of ``base_layouts``."""
    spanned: set[int] = set()
    for lay in dim_layouts:
        dims = dims_of_layout(collapse([lay]), base_layouts)
        if dims is None:
            return None
        spanned.update(dims)
    return tuple(sorted(spanned))


def mesh_meaning(device_mesh) -> tuple:
    """What a DeviceMesh is, with nothing of the process that holds it: device type,
    rank map, per-dim layouts, dim names and process-group names, and the same of its
    root. Equal in every process of a job that builds the same mesh (group names are
    given in creation order), unlike its hash and thread id."""
    root = tm.root_mesh(device_mesh)
    parts = [
        (
            m.device_type,
            m.mesh.tolist(),
            repr(device_mesh_dim_layouts(m)),
            m.mesh_dim_names,
            dim_group_names(m),
        )
        for m in (device_mesh, root)
    ]
    return tuple(parts)
