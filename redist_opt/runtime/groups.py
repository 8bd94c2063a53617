"""Group resolution: the process group of a plan's ``MeshGroup``, by layout, never by name.

1. a group over one mesh dim (ignoring size-1 dims) -> that dim's process group;
2. a multi-dim group -> a flattened mesh of the root whose layout equals the
   group's collapsed layout (or the world group, when its layout is the world's);
3. under ``groups="create"`` -> a flattened mesh created on first use from the
   group's layout (no mesh dim names needed, any dim order; cached in the root
   mesh, see ``redist_opt.ir.layout.create_flattened_mesh``). While torch.compile
   traces, this runs at trace time: every rank traces the same program, so groups
   are created in the same order.

A group that cannot be resolved raises :class:`GroupUnavailable`; the API falls
back to the unmerged plan and warns once.
"""

from __future__ import annotations

import torch.distributed as dist

from redist_opt.ir import layout as L
from redist_opt.ir.mesh import MeshGroup
from redist_opt.runtime.torch_dtensor import outside_tracing

__all__ = ["resolve_group", "GroupUnavailable"]


class GroupUnavailable(RuntimeError):
    """No process group with the layout a merged collective needs exists."""


def resolve_group(device_mesh, group: MeshGroup, policy: str = "existing"):
    """A funcol group argument for ``group`` on ``device_mesh``."""
    real_dims = [d for d, n in zip(group.dims, group.sizes) if n > 1] or list(group.dims[:1])
    if len(real_dims) == 1:
        return (device_mesh, real_dims[0])
    found = L.known_communicators(device_mesh).get(group.layout)
    if found is not None:
        if found[0] == "world":
            return dist.group.WORLD
        return found
    if policy != "existing":
        try:
            with outside_tracing():
                flat = L.create_flattened_mesh(device_mesh, group.layout)
        except Exception as e:  # a backend that cannot make a new communicator
            raise GroupUnavailable(f"creating a flattened group over {group.dims} failed: {e}") from e
        return (flat, 0)
    raise GroupUnavailable(
        f"no process group has the layout of mesh dims {group.dims} "
        f"({group.layout}); flatten them or use groups='create'"
    )
