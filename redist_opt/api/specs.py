"""The MeshSpec the API plans on, and a record of the meshes planned on.

``spec_of`` is on the eager hot path: one dict lookup per call after the first, in the
per-mesh cache of :mod:`redist_opt.runtime.mesh_facts` (which the compiled-graph pass
reads too). ``recording_meshes`` lets ``redist_opt.backend`` see the meshes one trace
planned on.
"""

from __future__ import annotations

import contextlib

from torch.distributed.device_mesh import DeviceMesh

from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError
from redist_opt.runtime.mesh_facts import clear_mesh_facts, mesh_facts

__all__ = ["spec_of", "as_spec", "recording_meshes", "clear_spec_cache"]

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
    """``MeshSpec.from_device_mesh``, cached per mesh until its root gains a flattened
    mesh; the mesh is recorded as planned on (:func:`recording_meshes`)."""
    for used in _mesh_recorders:
        used[id(device_mesh)] = device_mesh
    return mesh_facts(device_mesh).spec


def as_spec(mesh) -> MeshSpec:
    """``mesh`` itself if it is a MeshSpec, the (cached) spec of a DeviceMesh, else an error."""
    if isinstance(mesh, MeshSpec):
        return mesh
    if isinstance(mesh, DeviceMesh):
        return spec_of(mesh)
    raise RedistributeError(f"expected a DeviceMesh or MeshSpec, got {type(mesh).__name__}")


def clear_spec_cache() -> None:
    """Forget every cached MeshSpec and the scanned full views (``redist_opt.clear_caches``)."""
    clear_mesh_facts()
