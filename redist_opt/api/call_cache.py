"""The one cache of calls seen before, for the eager path and ``enabled()``'s routing.

A redistribution decided once (a rank program of redist_opt's plan, or torch's own
call handed back: :class:`~redist_opt.torch_api.dtensor.TorchHandBack`, the one
hand-back type) is kept as a :class:`CachedCall` under the key its caller decided it
by, and the next call with that key runs it after one lookup:

- the eager path (``eager.cached_runner``): ``(current spec, target spec, local dtype,
  PlanOptions)``, for what it planned or handed back;
- the routing (``routing.routed_redistribute_local_tensor``): ``(current spec, target
  spec, use_graph_based_transform)``, for what it hands back before any options or
  dtype matter (torch's own arguments, a graph-based plan requested, symbolic shapes).

The two keys are tuples of different lengths: they never meet in the one dict. An
entry holds while the call comes on the very mesh object it was decided for, that
mesh's root has as many flattened meshes (a new one may change the plan, or make
torch's merge pass possible) and the same ``LocalTensorMode`` (or none) is active.
The cache forgets everything past :data:`LIMIT` entries and on
``redist_opt.clear_caches()`` (``planning.CLEAR_HOOKS``).
"""

from __future__ import annotations

import weakref

from redist_opt.api import planning
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api import mesh as tm

__all__ = ["CachedCall", "LIMIT", "lookup", "remember", "hand_back"]

# key -> CachedCall (the module docstring gives both keys)
_calls: dict = {}
LIMIT = 65536


class CachedCall:
    """How one call seen before runs: ``run(local_tensor, current_spec, target_spec,
    async_op, is_explicit=False, **torch_kwargs)`` (a rank program's runner, or a
    :class:`~redist_opt.torch_api.dtensor.TorchHandBack`), and what it was decided for.
    ``zero_fills``: whether torch's own call ran a zero-fill when it was decided (None:
    it cannot; the eager path checks it again per call)."""

    __slots__ = ("mesh_ref", "root", "flattened", "local_mode", "run", "zero_fills")

    def __init__(self, device_mesh, run, zero_fills: bool | None) -> None:
        self.mesh_ref = weakref.ref(device_mesh)
        self.root = tm.root_mesh(device_mesh)
        self.flattened = tm.flattened_count(self.root)
        self.local_mode = tdt.local_tensor_mode()
        self.run = run
        self.zero_fills = zero_fills


def lookup(key, device_mesh) -> CachedCall | None:
    """The call remembered under ``key`` if it still holds for ``device_mesh`` (the same
    mesh object, as many flattened meshes on its root, the same LocalTensorMode), else
    None. One dict lookup and three identity checks: the hot path of every cached call."""
    try:
        hit = _calls.get(key)
    except TypeError:  # a symbolic shape (dynamic shapes while tracing) is not hashable
        return None
    if (
        hit is None
        or hit.mesh_ref() is not device_mesh
        or hit.flattened != tm.flattened_count(hit.root)
        or hit.local_mode is not tdt.local_tensor_mode()
    ):
        return None
    return hit


def remember(key, device_mesh, run, zero_fills: bool | None = None) -> None:
    """Keep ``run`` as the way the call ``key`` on ``device_mesh`` runs (nothing for a
    key that cannot be hashed: a symbolic shape)."""
    try:
        hash(key)
    except TypeError:
        return
    if len(_calls) > LIMIT:
        _calls.clear()
    _calls[key] = CachedCall(device_mesh, run, zero_fills)


def hand_back(device_mesh) -> tdt.TorchHandBack:
    """torch's own call for a call on ``device_mesh`` redist_opt hands back: its merge pass
    reads torch's plan per call only where the mesh's root has a flattened mesh (torch's
    merge pass merges over one; without one nothing can merge)."""
    return tdt.TorchHandBack(mergeable=tm.flattened_count(tm.root_mesh(device_mesh)) > 0)


planning.CLEAR_HOOKS.append(_calls.clear)
