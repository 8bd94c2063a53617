"""The one module that reads and builds DeviceMesh internals and c10d groups.

A DeviceMesh keeps its dims as layouts over its root mesh's rank map
(``torch.distributed._mesh_layout``), its flattened meshes in its root's
``_flatten_mapping``, its process groups by name in ``_dim_group_names`` (looked
up through the root's ``_pg_registry``); none of it is public. This module reads
those and hands the IR plain data: each dim's layout as flat ``(sizes, strides)``
int tuples (the IR's :class:`redist_opt.ir.layout_algebra.FlatLayout` takes them:
this bottom layer imports nothing of the IR), rank maps as int tuples, group names
as str tuples; what the IR needs of a mesh and its root together is read at once
(:class:`MeshInternals`). It builds the flattened meshes redist_opt creates and their c10d
groups. Everything above it (``redist_opt.ir.layout``) gives these facts meaning.

Read in the sources of torch 2.11.0, 2.12.1, 2.13.0, 2.14.1 and 2.15.0
(``device_mesh.py``, ``_mesh_layout.py``, ``distributed_c10d.py``):

- ``DeviceMesh._layout``: 2.13 to 2.15, a ``_MeshLayout``, a sequence of one
  coalesced ``_FlatLayout`` (``.shape``, ``.stride``: flat int tuples) per dim.
  2.11 and 2.12, the older ``_MeshLayout`` that *is* a pycute ``Layout``: dim ``i``
  is ``layout[i]``, whose shape and stride are an int or a nested int tuple (their
  ``_create_flatten_mesh`` coalesces a flattened mesh's layout and nests it into
  one mode when it keeps several).
- A flattened mesh's layout: 2.13 to 2.15, ``_MeshLayout([_FlatLayout(...)])``;
  2.11 and 2.12, ``_MeshLayout(sizes, strides).coalesce()``, ``.nest()``-ed when it
  has several modes: built here as each release's ``_create_flatten_mesh`` does.
- ``DeviceMesh(device_type, _layout=, _rank_map=, mesh_dim_names=, _root_mesh=,
  _init_backend=)``, ``_get_root_mesh()``, ``_is_current_rank_part_of_mesh()``,
  ``_flatten(name)``, and the instance attributes ``_rank_map`` (1-D int tensor),
  ``_flatten_rank_map`` (its tuple), ``_flatten_mapping``, ``_pg_registry``,
  ``_dim_group_names``: the same in all five (checked at import: the constructor
  sets every one).
  ``_dim_group_names`` is set only once a mesh's groups exist (torch's own
  ``get_group`` tests for it): a mesh without it is a legitimate state, not a
  missing name.
- ``preserve_rank_order``: 2.15 adds the constructor argument and
  ``_preserve_rank_order`` (in the mesh's hash and equality). A mesh made with it
  creates its groups with ``new_group(sort_ranks=False)``: a group lists its ranks
  in its layout's order over the rank map, not ascending, and a world-sized dim over
  a permuted rank map gets its own group instead of the default one. Views and
  flattened meshes take their root's value. Before 2.15 (2.14 included) every
  group is sorted.
- c10d: ``_new_process_group_helper`` (the same parameters in all five; 2.14 adds
  ``enable_reconfigure``, unused), ``_world`` (``pg_names``, ``pg_group_ranks``),
  and ``_set_pg_timeout`` up to 2.13 (the default store comes through ``c10d.py``) (2.14 deprecates it,
  still there, for the public ``dist.set_timeout``, used from 2.14 on).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from redist_opt.torch_api.c10d import default_store, process_rank
from redist_opt.torch_api.version import (
    TORCH_VERSION_STRING,
    PrivateName,
    TorchAPIError,
    at_least,
    private,
    resolve_declared,
)

__all__ = [
    "PRIVATE_NAMES",
    "FLAT_LAYOUTS",
    "PRESERVE_RANK_ORDER",
    "root_mesh",
    "dim_sizes_strides",
    "rank_map",
    "flattened_meshes",
    "flattened_count",
    "add_flattened_mesh",
    "remove_flattened_mesh",
    "dim_group_names",
    "preserves_rank_order",
    "rank_in_mesh",
    "MeshInternals",
    "internals",
    "flatten",
    "new_flattened_mesh",
    "attach_process_group",
    "member_process_group",
]

_MESH = "torch.distributed.device_mesh"
_LAYOUT = "torch.distributed._mesh_layout"
_C10D = "torch.distributed.distributed_c10d"


def _instance(name: str, **kwargs) -> PrivateName:
    """A private attribute of DeviceMesh instances."""
    return PrivateName(_MESH, f"DeviceMesh.{name}", instance=True, **kwargs)


# The release-dependent names: 2.13's per-dim layout class, 2.15's rank-order flag.
_FLAT_LAYOUT = PrivateName(_LAYOUT, "_FlatLayout", since=(2, 13))
_PRESERVE_RANK_ORDER = _instance("_preserve_rank_order", since=(2, 15))

PRIVATE_NAMES = (
    PrivateName(_MESH, "DeviceMesh._get_root_mesh"),
    PrivateName(_MESH, "DeviceMesh._is_current_rank_part_of_mesh"),
    PrivateName(_MESH, "DeviceMesh._flatten"),
    _instance("_layout"),
    _instance("_rank_map"),
    _instance("_flatten_rank_map"),
    _instance("_flatten_mapping"),
    _instance("_pg_registry"),
    _instance("_dim_group_names"),
    _PRESERVE_RANK_ORDER,
    PrivateName(_LAYOUT, "_MeshLayout"),
    _FLAT_LAYOUT,
    PrivateName(_LAYOUT, "_MeshLayout.coalesce", until=(2, 12)),
    PrivateName(_LAYOUT, "_MeshLayout.nest", until=(2, 12)),
    PrivateName(_C10D, "_new_process_group_helper"),
    PrivateName(_C10D, "_world"),
    PrivateName(_C10D, "_set_pg_timeout"),
)
resolve_declared(PRIVATE_NAMES)
# Private keyword arguments of DeviceMesh(...) redist_opt passes (every release read),
# and the parameters of c10d's _new_process_group_helper it passes.
_CONSTRUCTOR_ARGUMENTS = ("_layout", "_rank_map", "_root_mesh", "_init_backend")
_GROUP_HELPER_ARGUMENTS = (
    "group_size",
    "group_rank",
    "global_ranks_in_group",
    "backend",
    "store",
    "group_name",
    "timeout",
    "group_desc",
)


def _missing(name: str) -> TorchAPIError:
    """The error for a private DeviceMesh / c10d name this torch lacks."""
    return TorchAPIError(
        f"redist_opt needs torch's private name {name}, which torch {TORCH_VERSION_STRING} does not have "
        "(read in torch 2.11 to 2.15)"
    )


def _check_parameters(function, names, qualified: str) -> None:
    """Raise TorchAPIError unless ``function`` takes every parameter in ``names``."""
    parameters = inspect.signature(function).parameters
    for name in names:
        if name not in parameters:
            raise _missing(f"{qualified}({name}=...)")


def _check_instance_attributes() -> None:
    """Raise TorchAPIError unless this torch's DeviceMesh constructor sets every
    instance attribute of PRIVATE_NAMES its release should have (they exist only on
    instances: the constructor's code naming them is what can be checked at import)."""
    sets = set(DeviceMesh.__init__.__code__.co_names)
    for entry in PRIVATE_NAMES:
        attribute = entry.name.rsplit(".", 1)[-1] if entry.instance else None
        if attribute is not None and entry.expected and attribute not in sets:
            raise _missing(f"{entry.path} (set by DeviceMesh.__init__)")


_get_root_mesh = private(_MESH, "DeviceMesh._get_root_mesh")
_is_current_rank_part_of_mesh = private(_MESH, "DeviceMesh._is_current_rank_part_of_mesh")
_flatten = private(_MESH, "DeviceMesh._flatten")
_check_instance_attributes()
_check_parameters(DeviceMesh.__init__, _CONSTRUCTOR_ARGUMENTS, "DeviceMesh.__init__")
_new_process_group_helper = private(_C10D, "_new_process_group_helper")
_check_parameters(_new_process_group_helper, _GROUP_HELPER_ARGUMENTS, f"{_C10D}._new_process_group_helper")
# A group's timeout: public ``set_timeout`` from 2.14 (which deprecates ``_set_pg_timeout``
# with a FutureWarning), the private one before (2.11 to 2.13 have no public one).
_set_timeout = dist.set_timeout if at_least(2, 14) else private(_C10D, "_set_pg_timeout")
_MeshLayout = private(_LAYOUT, "_MeshLayout")

# Which layout classes this torch has: 2.13 to 2.15 a ``_FlatLayout`` per dim; 2.11 and
# 2.12 the pycute-based ``_MeshLayout`` alone, with its own ``coalesce`` and ``nest``.
FLAT_LAYOUTS: bool = _FLAT_LAYOUT.expected
if FLAT_LAYOUTS:
    _FlatLayout = _FLAT_LAYOUT.get()

# Whether DeviceMesh takes ``preserve_rank_order`` (2.15; no release read before it does).
PRESERVE_RANK_ORDER: bool = _PRESERVE_RANK_ORDER.expected
if PRESERVE_RANK_ORDER:
    _check_parameters(DeviceMesh.__init__, ("preserve_rank_order",), "DeviceMesh.__init__")


def _attribute(obj, name: str):
    """``obj.name`` for a private attribute every supported release sets, loudly."""
    try:
        return getattr(obj, name)
    except AttributeError as e:
        raise _missing(f"{type(obj).__name__}.{name}") from e


def _flat_ints(x) -> tuple[int, ...]:
    """The ints of an int or a nested int tuple (2.11 and 2.12's layout modes), left to right."""
    if isinstance(x, int):
        return (int(x),)
    return tuple(i for e in x for i in _flat_ints(e))


# -- reading a mesh --------------------------------------------------------------------


def root_mesh(device_mesh) -> DeviceMesh:
    """The root DeviceMesh ``device_mesh`` is a view of (itself for a root)."""
    return _get_root_mesh(device_mesh)


def dim_sizes_strides(device_mesh) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """Each dim's layout over the root's rank map, as flat ``(sizes, strides)``."""
    layout = _attribute(device_mesh, "_layout")
    if FLAT_LAYOUTS:
        return tuple((tuple(map(int, axis.shape)), tuple(map(int, axis.stride))) for axis in layout)
    return tuple((_flat_ints(layout[i].shape), _flat_ints(layout[i].stride)) for i in range(len(layout)))


def rank_map(device_mesh) -> tuple[int, ...]:
    """The global rank at each index of the mesh's rank map (its root's, for a view)."""
    return tuple(int(r) for r in _attribute(device_mesh, "_flatten_rank_map"))


def flattened_meshes(device_mesh) -> dict[str, DeviceMesh]:
    """Name -> 1-D DeviceMesh of every flattened mesh of ``device_mesh``'s root (a copy)."""
    return dict(_attribute(root_mesh(device_mesh), "_flatten_mapping"))


def flattened_count(device_mesh) -> int:
    """How many flattened meshes ``device_mesh``'s root holds (no copy: eager hot path)."""
    return len(_attribute(root_mesh(device_mesh), "_flatten_mapping"))


def add_flattened_mesh(root: DeviceMesh, name: str, flat: DeviceMesh) -> None:
    """Record ``flat`` as ``root``'s flattened mesh ``name`` (where torch's ``_flatten`` puts its own)."""
    _attribute(root, "_flatten_mapping")[name] = flat


def remove_flattened_mesh(root: DeviceMesh, name: str) -> None:
    """Take the flattened mesh ``name`` out of ``root``'s mapping."""
    del _attribute(root, "_flatten_mapping")[name]


def dim_group_names(device_mesh) -> tuple[str, ...] | None:
    """Names of the process groups of the mesh's dims; None when its groups were never
    initialized (built with ``_init_backend=False`` and not given any: torch's
    ``get_group`` refuses such a mesh); empty when the calling rank is in none."""
    try:
        names = device_mesh._dim_group_names
    except AttributeError:
        return None  # not a missing name: _check_instance_attributes found the constructor sets it
    return tuple(names or ())


def preserves_rank_order(device_mesh) -> bool:
    """Whether the mesh's groups list their ranks in layout order instead of ascending
    (``preserve_rank_order``, torch 2.15; False on a torch without it)."""
    if not PRESERVE_RANK_ORDER:
        return False
    return bool(_attribute(device_mesh, "_preserve_rank_order"))


def rank_in_mesh(device_mesh) -> bool:
    """Whether the calling rank is one of the mesh's ranks."""
    return bool(_is_current_rank_part_of_mesh(device_mesh))


SizesStrides = tuple[tuple[int, ...], tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class MeshInternals:
    """What torch keeps of a DeviceMesh and of its root, read at once as plain data
    (beside the live root and flattened meshes, which callers hand on as they are):
    ``redist_opt.ir.layout`` gives it meaning without coming back here for each fact."""

    mesh: DeviceMesh
    root: DeviceMesh
    dims: tuple[SizesStrides, ...]  # the mesh's dims, over the root's rank map
    root_dims: tuple[SizesStrides, ...]
    rank_map: tuple[int, ...]  # the root's
    root_group_names: tuple[str, ...] | None  # of the root's dims (dim_group_names)
    preserves_rank_order: bool  # the root's (its views and flattened meshes take it)
    flattened: tuple[tuple[str, DeviceMesh, tuple[SizesStrides, ...]], ...]  # the root's, with their dims


def internals(device_mesh) -> MeshInternals:
    """The :class:`MeshInternals` of ``device_mesh``."""
    root = root_mesh(device_mesh)
    return MeshInternals(
        mesh=device_mesh,
        root=root,
        dims=dim_sizes_strides(device_mesh),
        root_dims=dim_sizes_strides(root),
        rank_map=rank_map(root),
        root_group_names=dim_group_names(root),
        preserves_rank_order=preserves_rank_order(root),
        flattened=tuple(
            (name, flat, dim_sizes_strides(flat)) for name, flat in flattened_meshes(root).items()
        ),
    )


# -- building flattened meshes and their groups ------------------------------------------


def flatten(device_mesh, name: str | None = None) -> DeviceMesh:
    """torch's own flattening of all of ``device_mesh``'s dims into one, recorded in its
    root's flattened meshes under ``name`` (default: the dim names joined by ``_``), with
    its process group (``DeviceMesh._flatten``: the same arguments in 2.11 to 2.15)."""
    return _flatten(device_mesh, name)


def _flattened_layout(sizes: tuple[int, ...], strides: tuple[int, ...]):
    """A one-dim mesh layout of ``sizes:strides``, as this release's ``_create_flatten_mesh`` builds it."""
    if FLAT_LAYOUTS:
        return _MeshLayout([_FlatLayout(tuple(sizes), tuple(strides))])
    layout = _MeshLayout(tuple(sizes), tuple(strides)).coalesce()
    return layout.nest() if len(layout) > 1 else layout


def new_flattened_mesh(
    root: DeviceMesh, sizes: tuple[int, ...], strides: tuple[int, ...], name: str, *, init_backend: bool
) -> DeviceMesh:
    """A 1-D DeviceMesh of ``root`` whose one dim is the layout ``sizes:strides``,
    named ``name``, with its groups created by torch when ``init_backend`` (else none
    yet: :func:`attach_process_group`). It takes the root's ``preserve_rank_order``,
    as torch's own flattened meshes do (2.15)."""
    kwargs = dict(
        _layout=_flattened_layout(sizes, strides),
        _rank_map=_attribute(root, "_rank_map"),
        mesh_dim_names=(name,),
        _root_mesh=root,
        _init_backend=init_backend,
    )
    if PRESERVE_RANK_ORDER:
        kwargs["preserve_rank_order"] = preserves_rank_order(root)
    return DeviceMesh(root.device_type, **kwargs)


def attach_process_group(root: DeviceMesh, flat: DeviceMesh, pg) -> None:
    """Make ``pg`` the group of ``flat``'s one dim, found through ``root``'s registry."""
    flat._dim_group_names = [pg.group_name]
    _attribute(root, "_pg_registry")[pg.group_name] = pg


def member_process_group(ranks: list[int], name: str, desc: str, timeout):
    """The process group ``name`` over ``ranks`` (group rank ``i`` is ``ranks[i]``),
    created by its members alone (unlike ``new_group``, which every rank enters), or
    the one of that name that exists. ``timeout`` bounds the connection; the group
    then keeps the default group's timeout."""
    world = private(_C10D, "_world")
    for pg, pg_name in world.pg_names.items():
        if pg_name == name:
            return pg
    store = default_store()
    default_timeout = store.timeout
    pg, _ = _new_process_group_helper(
        len(ranks),
        ranks.index(process_rank()),
        ranks,
        dist.get_backend(),
        store,
        name,
        timeout=timeout or default_timeout,
        group_desc=desc,
    )
    world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    if timeout is not None and timeout != default_timeout:
        _set_timeout(default_timeout, pg)
    return pg
