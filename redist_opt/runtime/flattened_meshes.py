"""The flattened meshes redist_opt creates: a 1-D DeviceMesh, with its process group,
for a communicator no mesh dim and no flattened mesh of the root already is.

Group resolution (:mod:`redist_opt.runtime.groups`) creates one under
``groups="create"`` and forgets it again when the ranks do not agree that it
worked. The mesh and its group are built through :mod:`redist_opt.torch_api.mesh`;
which layout a mesh has is the IR's (:mod:`redist_opt.ir.layout`).
"""

from __future__ import annotations

import hashlib

import torch.distributed as dist

from redist_opt.ir import layout as L
from redist_opt.ir.layout_algebra import FlatLayout, remap
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.c10d import process_rank

__all__ = ["create_flattened_mesh", "forget_flattened_mesh"]


def _flattened_name(layout: FlatLayout) -> str:
    """The name redist_opt gives its flattened mesh of ``layout`` in the root's mapping."""
    return "redist_opt_{}_s{}".format("x".join(map(str, layout.shape)), "x".join(map(str, layout.stride)))


def create_flattened_mesh(device_mesh, layout: FlatLayout, *, timeout=None):
    """A 1-D DeviceMesh whose one dim is the communicator ``layout`` (root index space).

    Built from the layout, as DeviceMesh._flatten builds its meshes, but without
    needing mesh dim names (a mesh from ``init_device_mesh(..., (2, 2, 2))`` has
    none) and for any dim order. Recorded among the root's flattened meshes under a
    name derived from the layout, so the next lookup (``known_communicators``)
    finds it; :func:`forget_flattened_mesh` takes it out again. It takes the root's
    ``preserve_rank_order`` (torch 2.15), so its group lists its ranks as the root's do.

    On a real backend only the calling rank's own group (its tile of the layout) is
    created, by its members only, under a name derived from its ranks: so ranks
    that run different programs (pipeline stages) can create different groups, or
    none, without shifting the sequential names of groups created later, and the
    members agree on the name whatever groups each created before. ``timeout``
    bounds the connection to the other members (a member that never arrives);
    the group then gets the default group's timeout. Under the ``fake`` backend
    (simulated ranks, one process) every tile is created, as DeviceMesh does.
    """
    root = tm.root_mesh(device_mesh)
    name = _flattened_name(layout)
    existing = tm.flattened_meshes(root).get(name)
    if existing is not None and L.collapsed_layout(existing) == layout:
        return existing
    if dist.get_backend() == "fake":
        flat = tm.new_flattened_mesh(root, layout.shape, layout.stride, name, init_backend=True)
    else:
        me = process_rank()
        tile = next(t for t in remap(layout, tm.rank_map(root)) if me in t)
        # c10d lists a group's ranks in the order it is given: ascending, as new_group
        # sorts them, unless the root preserves rank order (then the layout's order).
        ranks = tile if tm.preserves_rank_order(root) else sorted(tile)
        pg = _member_group(ranks, f"mesh_{name}", timeout)
        flat = tm.new_flattened_mesh(root, layout.shape, layout.stride, name, init_backend=False)
        tm.attach_process_group(root, flat, pg)
    tm.add_flattened_mesh(root, name, flat)
    return flat


def forget_flattened_mesh(device_mesh, layout: FlatLayout) -> None:
    """Take the flattened mesh of ``layout`` out of the root's mapping (its group is
    no longer found by ``known_communicators``)."""
    root = tm.root_mesh(device_mesh)
    for name, flat in tm.flattened_meshes(root).items():
        if name.startswith("redist_opt_") and L.collapsed_layout(flat) == layout:
            tm.remove_flattened_mesh(root, name)


def _member_group(ranks: list[int], desc: str, timeout):
    """The process group over ``ranks`` (in that order), made by its members alone
    under a name that depends on the ranks (and their order) only."""
    name = "redist_opt_" + hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()[:20]
    return tm.member_process_group(ranks, name, desc, timeout)
