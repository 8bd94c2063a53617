"""The one module that touches torch's private mesh-layout algebra.

torch describes every DeviceMesh dimension as a CuTe-style layout (sizes:strides
over indices into the root mesh's rank map), in ``torch.distributed._mesh_layout``
(``_FlatLayout``, ``_MeshLayout``, built on ``torch.distributed._pycute``). A
communicator is identified by the *collapsed* layout of the mesh dims it spans:
two groups with equal collapsed layouts contain the same ranks in the same order,
whatever they are called. Everything redist_opt knows about groups is derived
here, so a torch upgrade that moves these classes touches this file only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from itertools import permutations

import torch.distributed as dist
from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout
from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "FlatLayout",
    "row_major_dim_layouts",
    "collapse",
    "rank_lists",
    "format_layout",
]

# Public alias: a coalesced, hashable, canonical sizes:strides layout.
FlatLayout = _FlatLayout


def row_major_dim_layouts(sizes: Sequence[int]) -> tuple[FlatLayout, ...]:
    """One layout per dim of a row-major mesh of ``sizes`` (what init_device_mesh builds)."""
    mesh_layout = _MeshLayout.from_sizes_strides(tuple(int(s) for s in sizes))
    return tuple(mesh_layout)


def collapse(dim_layouts: Sequence[FlatLayout]) -> FlatLayout:
    """The layout of one communicator spanning ``dim_layouts``, first dim slowest.

    Coalescing merges adjacent modes whose strides line up (dims a,b of a
    row-major mesh become one mode); non-adjacent dims (a and c of a x b x c)
    stay as two modes: still one valid communicator, just a non-contiguous one.
    """
    return _MeshLayout(tuple(dim_layouts)).collapse()


def numel(layout: FlatLayout) -> int:
    return int(layout.numel())


def rank_lists(layout: FlatLayout, index_space: int, limit: int | None = None) -> list[list[int]]:
    """Indices (into the root rank map) of the groups the layout tiles ``index_space`` into.

    With ``limit`` only the first ``limit`` groups are produced: dumps of a plan at
    100k ranks show a few example groups without enumerating the world.
    """
    members = layout.all_ranks_from_zero()
    offsets_layout = layout.complement(index_space)
    groups: list[list[int]] = []
    for offset in _iter_layout(offsets_layout):
        groups.append([offset + m for m in members])
        if limit is not None and len(groups) >= limit:
            break
    return groups


def _iter_layout(layout: FlatLayout):
    shape, stride = layout.shape, layout.stride
    total = math.prod(shape)
    for linear in range(total):
        idx, rem = 0, linear
        for size, st in zip(reversed(shape), reversed(stride)):
            rem, coord = divmod(rem, size)
            idx += coord * st
        yield idx


def format_layout(layout: FlatLayout) -> str:
    """``(2,2):(4,1)`` style, as CuTe prints layouts."""
    shape = ",".join(str(s) for s in layout.shape)
    stride = ",".join(str(s) for s in layout.stride)
    if len(layout.shape) == 1:
        return f"{shape}:{stride}"
    return f"({shape}):({stride})"


def device_mesh_dim_layouts(device_mesh) -> tuple[FlatLayout, ...]:
    """The per-dim layouts of a live DeviceMesh, in its root's rank-map index space."""
    return tuple(device_mesh._layout)


def known_communicators(device_mesh) -> dict[FlatLayout, tuple]:
    """Collapsed layout -> (mesh, mesh_dim) or ("world", None) of every communicator
    that already exists beside ``device_mesh``'s own dims:

    * each flattened mesh of the root (``root._flatten_mapping``);
    * each dim of the root mesh itself: an ``_unflatten`` view's root is the mesh it
      was unflattened from, whose groups span several of the view's dims;
    * the default (world) group, when the root's rank map is ``0..world-1`` in order.
    """
    root = device_mesh._get_root_mesh()
    out: dict[FlatLayout, tuple] = {}
    if dist.is_initialized():
        world = dist.get_world_size()
        rank_map = root._flatten_rank_map
        if len(rank_map) == world and tuple(rank_map) == tuple(range(world)):
            out[_FlatLayout((world,), (1,))] = ("world", None)
    for d, lay in enumerate(root._layout):
        if dim_group_names(root):
            out[lay] = (root, d)
    for flat in root._flatten_mapping.values():
        out[flat._layout.collapse()] = (flat, 0)
    return out


def flatten_mapping_layouts(device_mesh) -> frozenset:
    """Collapsed layouts of the root's ``_flatten`` meshes: the groups torch 2.13's
    merge pass finds (``_get_flattened_mesh_by_layout``), unlike
    :func:`known_communicators` not the world group nor the root's own dims."""
    root = device_mesh._get_root_mesh()
    return frozenset(flat._layout.collapse() for flat in root._flatten_mapping.values())


def ranks_ascending(device_mesh) -> bool:
    """Whether the root's rank map lists global ranks in ascending order (so a
    communicator's rank order, ascending global rank, is ascending rank index)."""
    rank_map = tuple(int(r) for r in device_mesh._get_root_mesh()._flatten_rank_map)
    return all(a < b for a, b in zip(rank_map, rank_map[1:]))


def root_index_space(device_mesh) -> int:
    """Size of the root mesh's rank map (the index space layouts live in)."""
    root = device_mesh._get_root_mesh()
    return int(root._layout.numel())


def create_flattened_mesh(device_mesh, layout: FlatLayout, *, timeout=None):
    """A 1-D DeviceMesh whose one dim is the communicator ``layout`` (root index space).

    Built from the layout, as DeviceMesh._flatten builds its meshes, but without
    needing mesh dim names (a mesh from ``init_device_mesh(..., (2, 2, 2))`` has
    none) and for any dim order. Cached in the root's ``_flatten_mapping`` under a
    name derived from the layout, so the next lookup (``known_communicators``)
    finds it; :func:`forget_flattened_mesh` takes it out again.

    On a real backend only the calling rank's own group (its tile of the layout) is
    created, by its members only, under a name derived from its ranks: so ranks
    that run different programs (pipeline stages) can create different groups, or
    none, without shifting the sequential names of groups created later, and the
    members agree on the name whatever groups each created before. ``timeout``
    bounds the connection to the other members (a member that never arrives);
    the group then gets the default group's timeout. Under the ``fake`` backend
    (simulated ranks, one process) every tile is created, as DeviceMesh does.
    """
    root = device_mesh._get_root_mesh()
    name = "redist_opt_{}_s{}".format("x".join(map(str, layout.shape)), "x".join(map(str, layout.stride)))
    existing = root._flatten_mapping.get(name)
    if existing is not None and existing._layout.collapse() == layout:
        return existing
    if dist.get_backend() == "fake":
        flat = DeviceMesh(
            root._device_type,
            _layout=_MeshLayout((layout,)),
            _rank_map=root._rank_map,
            mesh_dim_names=(name,),
            _root_mesh=root,
        )
    else:
        tiles = _MeshLayout((layout,)).remap_to_tensor(root._rank_map).tolist()
        me = dist.get_rank()
        tile = next(t for t in tiles if me in t)
        pg = _member_group(sorted(tile), f"mesh_{name}", timeout)
        flat = DeviceMesh(
            root._device_type,
            _layout=_MeshLayout((layout,)),
            _rank_map=root._rank_map,
            mesh_dim_names=(name,),
            _root_mesh=root,
            _init_backend=False,
        )
        flat._dim_group_names = [pg.group_name]
        root._pg_registry[pg.group_name] = pg
    root._flatten_mapping[name] = flat
    return flat


def forget_flattened_mesh(device_mesh, layout: FlatLayout) -> None:
    """Take the flattened mesh of ``layout`` out of the root's mapping (its group is
    no longer found by ``known_communicators``)."""
    root = device_mesh._get_root_mesh()
    for name, flat in list(root._flatten_mapping.items()):
        if name.startswith("redist_opt_") and flat._layout.collapse() == layout:
            del root._flatten_mapping[name]


def _member_group(ranks: list[int], desc: str, timeout):
    """The process group over ``ranks`` (sorted, as ``new_group`` orders them), made by
    its members alone under a name that depends on the ranks only."""
    c10d = dist.distributed_c10d
    name = "redist_opt_" + hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()[:20]
    for pg, pg_name in c10d._world.pg_names.items():
        if pg_name == name:
            return pg
    default_timeout = c10d._get_default_store().timeout
    pg, _ = c10d._new_process_group_helper(
        len(ranks),
        ranks.index(dist.get_rank()),
        ranks,
        dist.get_backend(),
        c10d._get_default_store(),
        name,
        timeout=timeout or default_timeout,
        group_desc=desc,
    )
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    if timeout is not None and timeout != default_timeout:
        c10d._set_pg_timeout(default_timeout, pg)
    return pg


# -- live DeviceMesh facts the compiled-graph pass reads (redist_opt.graph) -------------


def root_mesh(device_mesh):
    """The root DeviceMesh ``device_mesh`` is a view of (itself for a root).

    Raises ReferenceError when the view's root was garbage-collected.
    """
    return device_mesh._get_root_mesh()


def root_group_names(device_mesh) -> tuple[str, ...]:
    """Names of the process groups of the root mesh's dims (empty before groups
    exist): the same on every rank, and different for two roots over the same ranks,
    so they tell such roots apart where ``id()`` (per process) cannot."""
    return dim_group_names(root_mesh(device_mesh))


def dim_group_names(device_mesh) -> tuple[str, ...]:
    """Names of the process groups of ``device_mesh``'s own dims (empty before groups exist)."""
    return tuple(getattr(device_mesh, "_dim_group_names", None) or ())


def flattened_meshes(device_mesh) -> dict:
    """Name -> 1-D DeviceMesh of every flattened mesh of ``device_mesh``'s root."""
    return dict(root_mesh(device_mesh)._flatten_mapping)


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


def flattened_dims(device_mesh) -> list[tuple[str, object, tuple[int, ...] | None]]:
    """(name, flattened mesh, root dims it spans or None) for every flattened mesh of
    ``device_mesh``'s root, in the root's order."""
    root = root_mesh(device_mesh)
    dim_layouts = device_mesh_dim_layouts(root)
    return [
        (name, flat, dims_of_layout(collapse(device_mesh_dim_layouts(flat)), dim_layouts, min_dims=2))
        for name, flat in root._flatten_mapping.items()
    ]


def root_dims_spanned(device_mesh) -> tuple[int, ...] | None:
    """Sorted dims of the root mesh that ``device_mesh``'s dims span (all of them for
    a root; a submesh's own dims; a flattened mesh's dims), or None when one of its
    dims is no set of the root's dims."""
    return dims_spanned(root_mesh(device_mesh), device_mesh)


def dims_spanned(base, device_mesh) -> tuple[int, ...] | None:
    """Sorted dims of ``base`` that ``device_mesh``'s dims span, or None when one of
    its dims is no set of ``base``'s dims (or the two have different roots).

    ``base`` is a root or a view of it (``_unflatten``): its dims and
    ``device_mesh``'s are layouts in the same root index space, so a slice, a
    flattened group or a sibling view's dim is found by comparing collapsed layouts.
    """
    if root_mesh(base) is not root_mesh(device_mesh):
        return None
    dim_layouts = device_mesh_dim_layouts(base)
    spanned: set[int] = set()
    for lay in device_mesh_dim_layouts(device_mesh):
        dims = dims_of_layout(collapse([lay]), dim_layouts)
        if dims is None:
            return None
        spanned.update(dims)
    return tuple(sorted(spanned))


def is_full_view(device_mesh) -> bool:
    """Whether ``device_mesh`` is a root mesh or a view of all of it, as
    ``root._unflatten(...)`` builds them (torchtitan's ``ParallelDims.build_mesh``
    makes every mesh so from a 1-D world mesh): not a flattened mesh, and its dims
    tile the root's whole index space. Such a view can stand for its root when
    group names are read as mesh dims."""
    root = root_mesh(device_mesh)
    if device_mesh is root:
        return True
    if any(device_mesh is flat for flat in root._flatten_mapping.values()):
        return False
    return int(device_mesh._layout.numel()) == root_index_space(device_mesh)


def mesh_meaning(device_mesh) -> tuple:
    """What a DeviceMesh is, with nothing of the process that holds it: device type,
    rank map, per-dim layouts, dim names and process-group names, and the same of its
    root. Equal in every process of a job that builds the same mesh (group names are
    given in creation order), unlike its ``_hash`` and ``_thread_id``."""
    root = root_mesh(device_mesh)
    parts = [
        (
            m._device_type,
            m.mesh.tolist(),
            repr(device_mesh_dim_layouts(m)),
            m.mesh_dim_names,
            dim_group_names(m),
        )
        for m in (device_mesh, root)
    ]
    return tuple(parts)


def view_key(device_mesh) -> tuple:
    """Equal for two DeviceMesh objects with the same root and the same per-dim
    layouts (the same mesh, whichever object or name)."""
    return (id(root_mesh(device_mesh)), device_mesh_dim_layouts(device_mesh))


# -- reading a live DeviceMesh (for redist_opt.api and MeshSpec.from_device_mesh) ------


def is_device_mesh(obj) -> bool:
    """Whether ``obj`` is a live DeviceMesh (anything with torch's per-dim layouts and dim names)."""
    return hasattr(obj, "_layout") and hasattr(obj, "mesh_dim_names")


def communicators_stamp(device_mesh) -> tuple:
    """A value that changes whenever :func:`known_communicators` may: the root mesh,
    how many flattened meshes it holds, and whether the default group is up."""
    root = device_mesh._get_root_mesh()
    return (id(root), len(root._flatten_mapping), dist.is_initialized())


def flattened_count(root) -> int:
    """How many flattened meshes the root mesh ``root`` holds: a cached eager call
    compares it to the count its plan was made with (a new one may change the plan)."""
    return len(root._flatten_mapping)


def rank_in_mesh(device_mesh) -> bool:
    """Whether the calling rank is one of the mesh's ranks."""
    return device_mesh._is_current_rank_part_of_mesh()


def process_group_backend(device_mesh) -> str | None:
    """The backend name of the mesh's process groups for its device type, or None.

    ``get_backend`` may name one backend per device ("cpu:gloo,cuda:nccl"); the
    mesh's device type picks one. Dims on different backends give None. A dim of size 1
    carries no collective, and a ``fake`` group moves no data: torchtitan's
    ``ParallelDims`` builds its meshes with ``backend_override={dim: "fake"}`` for every
    dim of degree 1, so those dims do not count while another dim has a real backend.
    """
    if not dist.is_initialized():
        return None
    by_dim = {}
    try:
        for d in range(device_mesh.ndim):
            name = str(dist.get_backend(device_mesh.get_group(d)))
            if ":" in name:  # "cpu:gloo,cuda:nccl"
                per_device = dict(item.split(":", 1) for item in name.split(",") if ":" in item)
                name = per_device.get(device_mesh.device_type, name)
            by_dim[d] = name
    except (RuntimeError, ValueError):
        return None
    # the dims that carry collectives, or every dim of a mesh of one rank
    found = {name for d, name in by_dim.items() if device_mesh.size(d) > 1} or set(by_dim.values())
    if len(found) > 1:
        found.discard("fake")
    return found.pop() if len(found) == 1 else None
