"""What redist_opt needs of a live DeviceMesh, computed once per mesh and cached, and the
live meshes of the process: the one cache the eager API and the compiled-graph pass share.

``mesh_facts`` is on the eager hot path (``redist_opt.api.specs.spec_of``): one dict
lookup per call after the first. ``live_meshes`` is the one way to find the meshes of
the process; ``scanned_full_views`` keeps the full views its last scan found, so that a
compile of many graphs scans once (``redist_opt.graph.mesh_groups``).
"""

from __future__ import annotations

import dataclasses
import gc
import weakref

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from redist_opt.ir import layout as L
from redist_opt.ir.mesh import MeshSpec
from redist_opt.torch_api import mesh as tm

__all__ = ["MeshFacts", "mesh_facts", "live_meshes", "scanned_full_views", "clear_mesh_facts"]


@dataclasses.dataclass(frozen=True)
class MeshFacts:
    """One DeviceMesh as planning, routing and the graph pass read it."""

    root: object  # the root DeviceMesh
    spec: MeshSpec
    # sorted dims of the root this mesh's dims span, or None (a view not made of root dims)
    root_dims: tuple[int, ...] | None
    full_view: bool  # the root, or an _unflatten view of all of it
    view_key: tuple  # equal for objects standing for the same mesh
    flattened: int  # flattened meshes its root holds


# id(mesh) -> (weakref to the mesh, stamp, MeshFacts). Keyed by identity, not by
# DeviceMesh equality: two equal meshes can have different roots and so
# different flattened groups.
_facts_cache: dict[int, tuple] = {}


def _forget_facts(key: int, dead_ref) -> None:
    # Only if the entry is still the dead mesh's: its id may belong to a new mesh now.
    cache = _facts_cache
    if cache is not None and cache.get(key, (None,))[0] is dead_ref:  # None: interpreter shutdown
        del cache[key]


def mesh_facts(device_mesh) -> MeshFacts:
    """What redist_opt needs of ``device_mesh``, computed once per mesh (again when its
    root gains a flattened mesh). Raises ReferenceError for a view whose root is gone."""
    stamp = _communicators_stamp(device_mesh)
    hit = _facts_cache.get(id(device_mesh))
    if hit is None or hit[0]() is not device_mesh or hit[1] != stamp:
        key = id(device_mesh)
        ref = weakref.ref(device_mesh, lambda r, key=key: _forget_facts(key, r))
        hit = (ref, stamp, _read_facts(device_mesh))
        _facts_cache[key] = hit
    return hit[2]


def _communicators_stamp(device_mesh) -> tuple:
    """A value that changes whenever the mesh's known communicators may: the root mesh,
    how many flattened meshes it holds, and whether the default group is up (read on
    every eager call: no copy of the root's flattened meshes)."""
    root = tm.root_mesh(device_mesh)
    return (id(root), tm.flattened_count(root), dist.is_initialized())


def _read_facts(m) -> MeshFacts:
    # Rank-free: no coordinate (under LocalTensorMode it stands for every rank at once).
    internals = tm.internals(m)
    return MeshFacts(
        root=internals.root,
        spec=MeshSpec.from_internals(internals),
        root_dims=L.root_dims_spanned(internals),
        full_view=L.is_full_view(internals),
        view_key=L.view_key(internals),
        flattened=len(internals.flattened),
    )


def live_meshes() -> list:
    """Every live DeviceMesh of this process (a scan of the garbage collector's objects:
    meshes the program built, whether redist_opt planned on them or not)."""
    # By type(o), not isinstance: isinstance falls back to reading o.__class__, which
    # runs code on proxies and lazily loaded objects; after a compile the process
    # holds hundreds of thousands of them and the scan took about a second per graph.
    return [o for o in gc.get_objects() if issubclass(type(o), DeviceMesh)]


# The full views (roots, and _unflatten views of a whole root) that the last scan found,
# by id, held weakly. A scan reads every object of the process (0.2-0.3 s after a compile
# on the 2-core machine) and a job compiles two graphs per block (torchtitan compiles each
# block on its own), so the graph pass matches its meshes against these first.
_full_views: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_full_views_scanned = False


def scanned_full_views(*, rescan: bool) -> list:
    """The live full views (roots and ``_unflatten`` views of a whole root) found by the
    last scan of the process's objects (:func:`live_meshes`); a scan now if ``rescan``
    or none was made yet. A view built after the last scan is missing until the next:
    the caller rescans when what it looks for is not among these."""
    global _full_views_scanned
    if rescan or not _full_views_scanned:
        _full_views.clear()
        for m in live_meshes():
            try:
                if mesh_facts(m).full_view:
                    _full_views[id(m)] = m
            except ReferenceError:  # a view whose root mesh was garbage-collected
                continue
        _full_views_scanned = True
    return list(_full_views.values())


def clear_mesh_facts() -> None:
    """Forget every mesh's facts and the scanned full views."""
    global _full_views_scanned
    _facts_cache.clear()
    _full_views.clear()
    _full_views_scanned = False
