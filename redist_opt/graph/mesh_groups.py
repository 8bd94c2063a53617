"""The DeviceMeshes of a compiled program, and process-group names read as mesh dims.

A functional collective names its group by string. Raising needs the group as an
ordered set of dims of one DeviceMesh (legality 2 of
:mod:`redist_opt.graph.raise_chains`): :func:`resolve_group_name` finds the dims
whose ranks, through this rank's coordinate, are the group's ranks in order.
:func:`mesh_contexts` lists the meshes to search, in the same order on every
rank: root meshes, and the ``_unflatten`` views of a root that frameworks build
(torchtitan), matched through their layouts in the root's index space
(:mod:`redist_opt.ir.layout`).
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
    """One DeviceMesh of the program (a root, or a full view of one), as raising and
    lowering see it."""

    device_mesh: object  # the root DeviceMesh, or an _unflatten view of all of it
    spec: MeshSpec
    coord: tuple[int, ...]  # this rank's coordinate in device_mesh
    rank_map: list  # device_mesh's ranks as nested lists (mesh.tolist())
    # Root dims the program's meshes span: the ranks of this rank's group over them
    # are the ranks that compile the same program (a pipeline stage's submesh spans
    # fewer dims than its root).
    scope_dims: tuple[int, ...] = ()
    # Whether a mesh given to the pass stands for this context (else it is a sibling
    # view of a given mesh's root, searched after the given ones).
    given: bool = True

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
    """Meshes to raise over: for each mesh given (or, with ``meshes=None``, each
    live DeviceMesh this rank belongs to), the mesh whose dims it is a set of.

    That is its root when its dims are sets of the root's dims (any submesh of an
    ``init_device_mesh`` mesh); otherwise a full view of the root (a mesh
    ``root._unflatten(...)`` built, as torchtitan builds every mesh from a 1-D
    world mesh) whose dims it spans, found among the live meshes; otherwise the
    mesh itself. Every other full view of the same root comes after them, so groups
    of sibling meshes (dense and expert meshes) resolve too. Each mesh is one
    context, whichever objects stand for it.

    Sorted by (given first, number of dims, real dims, flattened groups, sizes,
    names) so the search order is the same on every rank; among equal meshes (the
    same ranks, so the same meaning) the one with more flattened groups comes first,
    as it offers more merges. A context's ``scope_dims`` are the dims the given
    meshes span (every dim with ``meshes=None``).
    """
    given = meshes is not None
    if meshes is None:
        meshes = _live_meshes()
    elif isinstance(meshes, DeviceMesh):
        meshes = [meshes]
    live = _live_meshes() if given and not all(_spans_root(m) for m in meshes) else meshes
    views = sorted((v for v in live if _alive(v) and L.is_full_view(v)), key=_view_order)
    contexts: dict[tuple, MeshContext] = {}
    for m in meshes:
        if not _alive(m):  # a view whose root mesh was garbage-collected
            continue
        base, spanned = _base_of(m, views)
        ctx = _context(contexts, base, given=True)
        if ctx is not None:
            spanned = spanned if given and spanned is not None else tuple(range(ctx.spec.ndim))
            ctx.scope_dims = tuple(sorted(set(ctx.scope_dims) | set(spanned)))
    roots = {id(L.root_mesh(c.device_mesh)) for c in contexts.values()}
    for v in views:  # sibling views of the same roots: later in the search order
        if id(L.root_mesh(v)) in roots:
            ctx = _context(contexts, v, given=False)
            if ctx is not None and not ctx.scope_dims:
                ctx.scope_dims = tuple(range(ctx.spec.ndim))
    return sorted(contexts.values(), key=lambda c: (not c.given, *_context_order(c)))


def _alive(m) -> bool:
    try:
        L.root_mesh(m)
        return True
    except ReferenceError:
        return False


def _spans_root(m) -> bool:
    return not _alive(m) or L.root_dims_spanned(m) is not None


def _base_of(m, views):
    """(mesh whose dims ``m`` is a set of, the dims it spans there)."""
    root = L.root_mesh(m)
    spanned = L.root_dims_spanned(m)
    if spanned is not None:
        return root, spanned
    for v in views:
        spanned = L.dims_spanned(v, m)
        if spanned is not None:
            return v, spanned
    return m, tuple(range(m.ndim))


def _context(contexts: dict, mesh, *, given: bool) -> MeshContext | None:
    key = L.view_key(mesh)
    ctx = contexts.get(key)
    if ctx is None:
        coord = mesh.get_coordinate()
        if coord is None:
            return None
        ctx = contexts[key] = MeshContext(
            mesh, MeshSpec.from_device_mesh(mesh), tuple(int(c) for c in coord), mesh.mesh.tolist(), given=given
        )
    return ctx


def _view_order(m) -> tuple:
    sizes = m.mesh.shape
    return (-len(sizes), -sum(s > 1 for s in sizes), tuple(sizes), m.mesh_dim_names or (), repr(m.mesh.tolist()))


def _context_order(c: MeshContext) -> tuple:
    return (
        -c.spec.ndim, -sum(s > 1 for s in c.spec.sizes), -len(L.flattened_meshes(c.device_mesh)), c.spec.sizes,
        c.spec.names or (), repr(c.rank_map),
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
