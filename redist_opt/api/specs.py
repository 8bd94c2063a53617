"""MeshSpecs of live DeviceMeshes, cached per mesh, and a record of the meshes planned on.

``spec_of`` is on the eager hot path: one dict lookup per call after the first.
``recording_meshes`` lets ``redist_opt.backend`` see the meshes one trace planned on.
"""

from __future__ import annotations

import contextlib
import weakref

from redist_opt.ir import layout as L
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError

__all__ = ["spec_of", "as_spec", "recording_meshes", "meshes_seen", "clear_spec_cache", "cache_generation"]

# id(mesh) -> (weakref to the mesh, stamp, spec). Keyed by identity, not by
# DeviceMesh equality: two equal meshes can have different roots and so
# different flattened groups.
_spec_cache: dict[int, tuple] = {}


def _forget_spec(key: int, dead_ref) -> None:
    # Only if the entry is still the dead mesh's: its id may belong to a new mesh now.
    if _spec_cache.get(key, (None,))[0] is dead_ref:
        del _spec_cache[key]


# Open recorders of the meshes planned on (redist_opt.backend: the meshes of one trace).
_mesh_recorders: list[dict] = []


@contextlib.contextmanager
def recording_meshes():
    """Yields a dict (id -> DeviceMesh) of the meshes planned on inside the block."""
    used: dict = {}
    _mesh_recorders.append(used)
    try:
        yield used
    finally:
        _mesh_recorders.remove(used)


def spec_of(device_mesh) -> MeshSpec:
    """``MeshSpec.from_device_mesh``, cached per mesh until its root gains a flattened mesh."""
    for used in _mesh_recorders:
        used[id(device_mesh)] = device_mesh
    stamp = L.communicators_stamp(device_mesh)
    hit = _spec_cache.get(id(device_mesh))
    if hit is None or hit[0]() is not device_mesh or hit[1] != stamp:
        key = id(device_mesh)
        ref = weakref.ref(device_mesh, lambda r, key=key: _forget_spec(key, r))
        hit = (ref, stamp, MeshSpec.from_device_mesh(device_mesh))
        _spec_cache[key] = hit
    return hit[2]


def meshes_seen() -> list:
    """The live DeviceMeshes redist_opt has planned on (graph dumps name their groups)."""
    return [m for m in (entry[0]() for entry in list(_spec_cache.values())) if m is not None]


def as_spec(mesh) -> MeshSpec:
    """``mesh`` itself if it is a MeshSpec, the (cached) spec of a DeviceMesh, else an error."""
    if isinstance(mesh, MeshSpec):
        return mesh
    if L.is_device_mesh(mesh):
        return spec_of(mesh)
    raise RedistributeError(f"expected a DeviceMesh or MeshSpec, got {type(mesh).__name__}")


def clear_spec_cache() -> None:
    """Forget every cached MeshSpec (``redist_opt.clear_caches``), and start a new
    cache generation: state kept on compiler instances (the graph pass's agreement
    rounds) resets itself when it sees one."""
    global _generation
    _spec_cache.clear()
    _generation += 1


# How many times the caches were cleared: instances holding state compare it.
_generation = 0


def cache_generation() -> int:
    """The number of ``redist_opt.clear_caches()`` calls so far."""
    return _generation
