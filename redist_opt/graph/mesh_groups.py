"""The root DeviceMeshes of a compiled program, and process-group names read as mesh dims.

A functional collective names its group by string. Raising needs the group as an
ordered set of dims of a root DeviceMesh (legality 2 of
:mod:`redist_opt.graph.raise_chains`): :func:`resolve_group_name` finds the dims
whose ranks, through this rank's coordinate, are the group's ranks in order.
:func:`mesh_contexts` lists the roots to search, in the same order on every rank.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
from collections.abc import Sequence

from torch.distributed.device_mesh import DeviceMesh

from redist_opt.ir import layout as L
from redist_opt.ir.mesh import MeshSpec
from redist_opt.runtime.torch_dtensor import process_group_ranks

__all__ = ["MeshContext", "mesh_contexts", "resolve_group_name"]


@dataclasses.dataclass
class MeshContext:
    """One root DeviceMesh of the program, as raising and lowering see it."""

    device_mesh: object  # the root DeviceMesh
    spec: MeshSpec
    coord: tuple[int, ...]  # this rank's coordinate in the root
    rank_map: list  # the root's ranks as nested lists (mesh.tolist())
    # Root dims the program's meshes span: the ranks of this rank's group over them
    # are the ranks that compile the same program (a pipeline stage's submesh spans
    # fewer dims than its root).
    scope_dims: tuple[int, ...] = ()

    def ranks_of(self, dims: Sequence[int]) -> list[int]:
        """Global ranks of the group over ``dims`` (row-major, first dim slowest) holding this rank."""
        out = []
        for idx in itertools.product(*(range(self.spec.sizes[d]) for d in dims)):
            c = list(self.coord)
            for d, i in zip(dims, idx):
                c[d] = i
            r = self.rank_map
            for i in c:
                r = r[i]
            out.append(int(r))
        return out

    def block_index(self, dims: Sequence[int]) -> int:
        idx = 0
        for d in dims:
            idx = idx * self.spec.sizes[d] + self.coord[d]
        return idx

    def candidate_dims(self, size: int) -> list[tuple[int, ...]]:
        """Every ordered set of real (size > 1) mesh dims whose group has ``size`` ranks."""
        real = [d for d in range(self.spec.ndim) if self.spec.sizes[d] > 1]
        out = []
        for k in range(1, len(real) + 1):
            for dims in itertools.permutations(real, k):
                if math.prod(self.spec.sizes[d] for d in dims) == size:
                    out.append(dims)
        return out


def mesh_contexts(meshes=None) -> list[MeshContext]:
    """Root meshes to raise over: those given (any submesh stands for its root), or,
    with ``meshes=None``, every live root DeviceMesh this rank belongs to.

    Sorted by (number of dims, flattened groups, sizes, names) so the search order
    is the same on every rank; among equal roots (the same ranks, so the same
    meaning) the one with more flattened groups comes first, as it offers more merges.
    A root's ``scope_dims`` are the dims the given meshes span (every dim with
    ``meshes=None``, or when a given mesh is no set of its root's dims).
    """
    given = meshes is not None
    if meshes is None:
        meshes = _live_meshes()
    elif isinstance(meshes, DeviceMesh):
        meshes = [meshes]
    roots: dict[int, MeshContext] = {}
    for m in meshes:
        try:
            root = L.root_mesh(m)
        except ReferenceError:  # a view whose root mesh was garbage-collected
            continue
        coord = root.get_coordinate()
        if coord is None:
            continue
        ctx = roots.get(id(root))
        if ctx is None:
            ctx = roots[id(root)] = MeshContext(
                root, MeshSpec.from_device_mesh(root), tuple(int(c) for c in coord), root.mesh.tolist()
            )
        spanned = L.root_dims_spanned(m) if given else None
        spanned = tuple(range(ctx.spec.ndim)) if spanned is None else spanned
        ctx.scope_dims = tuple(sorted(set(ctx.scope_dims) | set(spanned)))
    return sorted(
        roots.values(),
        key=lambda c: (
            -c.spec.ndim, -len(L.flattened_meshes(c.device_mesh)), c.spec.sizes, c.spec.names or (),
            repr(c.rank_map),
        ),
    )


def _live_meshes() -> list:
    """Every live DeviceMesh of this process."""
    out = []
    for o in gc.get_objects():
        try:
            if isinstance(o, DeviceMesh):
                out.append(o)
        except ReferenceError:  # a weakref.proxy whose referent is gone
            continue
    return out


def resolve_group_name(name, contexts: Sequence[MeshContext], cache: dict):
    """(context, dims) whose group has the ranks of process group ``name``, or a reason string."""
    if not isinstance(name, str):
        return f"group argument {name!r} is not a group name"
    if name in cache:
        return cache[name]
    try:
        ranks = process_group_ranks(name)
    except Exception as e:  # noqa: BLE001 - an unknown name is a reason, not a crash
        cache[name] = f"group {name!r} does not resolve to a process group ({type(e).__name__})"
        return cache[name]
    found = None
    for ctx in contexts:
        for dims in ctx.candidate_dims(len(ranks)):
            if ctx.ranks_of(dims) == ranks:
                found = (ctx, dims)
                break
        if found:
            break
    cache[name] = found or f"group {name!r} (ranks {ranks}) is no set of dims of a known DeviceMesh"
    return cache[name]
