"""Group resolution: the process group of a plan's ``MeshGroup``, by layout, never by name.

1. a group over one mesh dim (ignoring size-1 dims) -> that dim's process group;
2. a multi-dim group -> a flattened mesh of the root whose layout equals the
   group's collapsed layout (or the world group, when its layout is the world's);
3. under ``groups="create"`` -> a flattened mesh created on first use from the
   group's layout (no mesh dim names needed, any dim order; cached in the root
   mesh, see ``redist_opt.runtime.flattened_meshes.create_flattened_mesh``). While torch.compile
   traces, this runs at trace time: every rank traces the same program, so groups
   are created in the same order.

Creation is agreed (``redist_opt.runtime.consensus``): every rank of the mesh
reports whether creating its group worked, and either all use the merged groups
or all raise :class:`GroupUnavailable` (then and for every later lookup of that
layout), so no rank runs the merged collective while a peer falls back. A rank
that waits for a peer that never creates its group gives up after half the
agreement bound, so that its report still reaches the round.

A group that cannot be resolved raises :class:`GroupUnavailable`; the API falls
back to the unmerged plan and warns once.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

from redist_opt.ir import layout as L
from redist_opt.ir.mesh import MeshGroup
from redist_opt.runtime import consensus, flattened_meshes, store_round
from redist_opt.torch_api import c10d
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.tracing import outside_tracing
from redist_opt.torch_api.version import TorchAPIError

__all__ = ["resolve_group", "group_name", "GroupUnavailable"]


class GroupUnavailable(RuntimeError):
    """No process group with the layout a merged collective needs exists."""


def resolve_group(device_mesh, group: MeshGroup, policy: str = "existing"):
    """A funcol group argument for ``group`` on ``device_mesh``."""
    real_dims = [d for d, n in zip(group.dims, group.sizes) if n > 1] or list(group.dims[:1])
    if len(real_dims) == 1:
        return (device_mesh, real_dims[0])
    found = L.known_communicators(tm.internals(device_mesh)).get(group.layout)
    if found is not None:
        if found[0] == "world":
            return dist.group.WORLD
        return found
    if policy != "existing":
        return (_create_agreed(device_mesh, group), 0)
    raise GroupUnavailable(
        f"no process group has the layout of mesh dims {group.dims} "
        f"({group.layout}); flatten them or use groups='create'"
    )


def group_name(device_mesh, group: MeshGroup, policy: str = "existing") -> str:
    """The name of the process group :func:`resolve_group` gives ``group``: what a
    functional collective over it names (eager rank programs and compiled graphs alike)."""
    return c10d.group_name(resolve_group(device_mesh, group, policy))


def _create_agreed(device_mesh, group: MeshGroup):
    """The flattened mesh of ``group``, created on this rank and agreed on by every
    rank of ``device_mesh``; raises :class:`GroupUnavailable` on all of them alike."""
    layout = group.layout
    abandoned = consensus.abandoned_reason(device_mesh, layout)
    if abandoned is not None:
        raise GroupUnavailable(abandoned)
    flat, failure = None, None
    try:
        timeout = None
        if consensus.needs_agreement(device_mesh):
            timeout = datetime.timedelta(seconds=store_round.bound_s() / 2)
        with outside_tracing():
            flat = flattened_meshes.create_flattened_mesh(device_mesh, layout, timeout=timeout)
    except TorchAPIError:  # a private torch name that moved: never a group "unavailable"
        raise
    except Exception as e:  # a backend that cannot make a new communicator
        failure = f"{type(e).__name__}: {e}"
    reason = consensus.agree_group_created(device_mesh, layout, group.dims, failure)
    if reason is not None:
        if flat is not None:
            flattened_meshes.forget_flattened_mesh(device_mesh, layout)
        raise GroupUnavailable(reason)
    return flat
