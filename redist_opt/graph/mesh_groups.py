"""The DeviceMeshes of a compiled program, and process-group names read as mesh dims.

A functional collective names its group by string. Raising needs the group as an
ordered set of dims of one DeviceMesh (legality 2 of
:mod:`redist_opt.graph.raise_chains`): :func:`resolve_group_name` finds the dims
whose ranks, through this rank's coordinate, are the group's ranks in order.
:func:`mesh_contexts` lists the meshes to search, in the same order on every
rank: root meshes, and the ``_unflatten`` views of a root that frameworks build
(torchtitan), matched through their layouts in the root's index space
(:mod:`redist_opt.ir.layout`). What the search needs of each mesh (its root, the
root dims it spans, its layouts key, its MeshSpec) is read once per mesh
(:func:`redist_opt.runtime.mesh_facts.mesh_facts`, cached per mesh, shared with the
eager path); live meshes are found by :func:`redist_opt.runtime.mesh_facts.live_meshes`,
and the full views a given view needs among those the last scan found
(:func:`redist_opt.runtime.mesh_facts.scanned_full_views`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from torch.distributed.device_mesh import DeviceMesh

from redist_opt.ir import layout as L
from redist_opt.ir.mesh import MeshSpec
from redist_opt.runtime.mesh_facts import MeshFacts, live_meshes, mesh_facts, scanned_full_views
from redist_opt.torch_api.c10d import process_group_ranks
from redist_opt.torch_api.version import TorchAPIError

__all__ = ["MeshContext", "GivenMeshes", "mesh_contexts", "resolve_group_name"]


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
    facts: MeshFacts | None = dataclasses.field(default=None, repr=False)

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
    meshes span (every dim with ``meshes=None``). ``meshes`` may be a
    :class:`GivenMeshes`: its contexts, built once.
    """
    if isinstance(meshes, GivenMeshes):
        return meshes.contexts()
    given = meshes is not None
    if meshes is None:
        meshes = live_meshes()
    elif isinstance(meshes, DeviceMesh):
        meshes = [meshes]
    facts = {id(m): f for m in meshes if (f := _facts(m)) is not None}  # a view whose root is gone: skipped
    meshes = [m for m in meshes if id(m) in facts]
    if not given:
        # The garbage collector lists objects in an order that changes as they age and
        # differs between ranks; the first mesh of a view names its context.
        meshes.sort(key=lambda m: _view_order(m, facts[id(m)]))
    live = meshes
    if given and any(facts[id(m)].root_dims is None for m in meshes):
        live = _with_full_views(meshes, facts)
    views = sorted(
        (v for v in live if id(v) in facts and facts[id(v)].full_view),
        key=lambda v: _view_order(v, facts[id(v)]),
    )
    contexts: dict[tuple, MeshContext] = {}
    for m in meshes:
        base, spanned = _base_of(m, facts, views)
        ctx = _context(contexts, base, facts[id(base)] if id(base) in facts else _facts(base), given=True)
        if ctx is not None:
            spanned = spanned if given and spanned is not None else tuple(range(ctx.spec.ndim))
            ctx.scope_dims = tuple(sorted(set(ctx.scope_dims) | set(spanned)))
    roots = {id(c.facts.root) for c in contexts.values()}
    for v in views:  # sibling views of the same roots: later in the search order
        if id(facts[id(v)].root) in roots:
            ctx = _context(contexts, v, facts[id(v)], given=False)
            if ctx is not None and not ctx.scope_dims:
                ctx.scope_dims = tuple(range(ctx.spec.ndim))
    return sorted(contexts.values(), key=lambda c: (not c.given, *_context_order(c)))


class GivenMeshes:
    """A compiler's given meshes, whose contexts are built once and handed down to every
    graph it compiles (``mesh_contexts(given)``) for as long as they are what
    :func:`mesh_contexts` would build again: while every given mesh keeps its cached
    :class:`~redist_opt.runtime.mesh_facts.MeshFacts` (a root that gains a flattened mesh
    gets new ones, as does ``redist_opt.clear_caches``). Where a given mesh is not made of
    its root's dims, its contexts come from the views the process's last scan found, which
    may change between graphs: they are built for every graph."""

    def __init__(self, meshes) -> None:
        self.meshes = [meshes] if isinstance(meshes, DeviceMesh) else list(meshes)
        self._facts: tuple | None = None
        self._contexts: list[MeshContext] = []

    def contexts(self) -> list[MeshContext]:
        facts = tuple(_facts(m) for m in self.meshes)
        if self._facts is not None and all(a is b for a, b in zip(facts, self._facts)):
            return self._contexts
        contexts = mesh_contexts(self.meshes)
        reusable = all(f is not None and f.root_dims is not None for f in facts)
        self._facts, self._contexts = (facts, contexts) if reusable else (None, [])
        return contexts


def _with_full_views(meshes: list, facts: dict) -> list:
    """``meshes`` and the full views of the process: those the last scan found, or a new
    scan's when a given mesh that is not made of its root's dims spans dims of none of them.

    A view built after the last scan and needed by no given mesh (a sibling) is found at
    the next scan. Every rank builds the same meshes in the same order (a view's groups
    are created collectively) and compiles the same graphs, so the ranks scan at the same
    points and know the same views."""
    ids = {id(m) for m in meshes}
    for rescan in (False, True):
        live = [*meshes, *(v for v in scanned_full_views(rescan=rescan) if id(v) not in ids)]
        facts.update({id(v): f for v in live if id(v) not in facts and (f := _facts(v)) is not None})
        views = [v for v in live if id(v) in facts and facts[id(v)].full_view]
        if all(facts[id(m)].root_dims is not None or _spanning_view(m, views) for m in meshes):
            break
    return live


def _facts(m) -> MeshFacts | None:
    try:
        return mesh_facts(m)
    except ReferenceError:  # a view whose root mesh was garbage-collected
        return None


def _base_of(m, facts: dict, views):
    """(mesh whose dims ``m`` is a set of, the dims it spans there)."""
    f = facts[id(m)]
    if f.root_dims is not None:
        return f.root, f.root_dims
    return _spanning_view(m, views) or (m, tuple(range(m.ndim)))


def _spanning_view(m, views) -> tuple | None:
    """(the first of ``views`` whose dims ``m`` is a set of, the dims it spans), or None."""
    for v in views:
        spanned = L.dims_spanned(v, m)
        if spanned is not None:
            return v, spanned
    return None


def _context(contexts: dict, mesh, facts: MeshFacts | None, *, given: bool) -> MeshContext | None:
    if facts is None:
        return None
    ctx = contexts.get(facts.view_key)
    if ctx is None:
        coord = mesh.get_coordinate()
        if coord is None:
            return None
        ctx = contexts[facts.view_key] = MeshContext(
            mesh, facts.spec, tuple(int(c) for c in coord), mesh.mesh.tolist(), given=given, facts=facts
        )
    return ctx


# Both orders are total on what a mesh means (its spec, ranks and root's groups), so
# they are the same on every rank and on every call, whatever order the meshes came in.


def _view_order(m, f: MeshFacts) -> tuple:
    sizes = f.spec.sizes
    return (
        -len(sizes),
        -sum(s > 1 for s in sizes),
        tuple(sizes),
        f.spec.names or (),
        repr(m.mesh.tolist()),
        f.spec.canonical(),
        L.root_group_names(m),
    )


def _context_order(c: MeshContext) -> tuple:
    return (
        -c.spec.ndim,
        -sum(s > 1 for s in c.spec.sizes),
        -c.facts.flattened,
        c.spec.sizes,
        c.spec.names or (),
        repr(c.rank_map),
        c.spec.canonical(),
        L.root_group_names(c.device_mesh),
    )


def resolve_group_name(name, contexts: Sequence[MeshContext], cache: dict):
    """(context, dims) whose group has the ranks of process group ``name``, or a reason string."""
    if not isinstance(name, str):
        return f"group argument {name!r} is not a group name"
    if name in cache:
        return cache[name]
    try:
        ranks = process_group_ranks(name)
    except TorchAPIError:  # a private torch name that moved: loud, never a reason
        raise
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
