"""Raising: chains of ``_c10d_functional`` collectives in a compiled FX graph -> one redistribution.

A compiled forward/backward graph (AOTAutograd output, pre- or post-grad) holds
collectives as ``torch.ops._c10d_functional`` calls, each followed by its
``wait_tensor``, with groups named by string. A *chain* is a run of them on one
value, with the local ops DTensor's lowering and hand-written code put between
them. This module reads such a chain back as one redistribution of a DTensor
over a mesh: ``src -> dst`` placements, a global shape and a dtype, so the
planner and the pass pipeline can optimize it as a whole.

Rewrite (the meaning a chain is given)::

    w0 = wait(all_reduce(x, "sum", tp))            x: [P on tp, P on dp, ...]
    w1 = wait(reduce_scatter_tensor(w0, "sum", 2, dp))
    y  = w1 * 2                                     pointwise with scalars
      ==>  redistribute(x, src=[P(dp), P(tp)], dst=[S(0) on dp, R on tp]), then * 2

Legality (a chain is raised only when every condition holds; otherwise it is
left exactly as it was and a one-line reason is recorded):

1. Every collective is ``all_reduce`` (sum/avg/max/min), ``reduce_scatter_tensor``
   or ``all_gather_into_tensor`` (tensor dim 0, or dim d when funcol's
   ``cat(split(x, s, d), 0)`` before a scatter / ``cat(split(y, s, 0), d)`` after a
   gather surrounds it, every piece used once in order), and its only user is its
   ``wait_tensor``; intermediate values have exactly one user (the next op of the
   chain), so nothing else observes a value the rewrite removes.
2. Every group name resolves (``_resolve_process_group`` +
   ``get_process_group_ranks``) to the ranks of an ordered set of dims of one root
   DeviceMesh: the ranks equal, in order, the rank map of those dims through this
   rank's coordinate. All collectives of a chain live on one root mesh.
3. Each op is a legal DTensor transition of the mesh dims it touches, in
   default shard order: a dim is reduced only while it still holds its source
   ``Partial``; a reduce_scatter / chunk adds its dims innermost on its tensor dim
   in ascending mesh order; an all_gather removes the innermost dims of tensor
   dim 0 (an untouched dim gathered first was sharded in the source).
4. Shards are even: every tensor dim a chain shards or gathers is divisible by
   the product of the mesh dims involved (no pad/narrow appears; uneven chains are
   not raised).
5. A rank-dependent slice (``split`` + ``getitem`` or ``slice``) with a constant
   index is raised only when it comes from ``DTensor.redistribute``
   (``node.meta["source_fn_stack"]``: DTensor always selects the caller's own
   block) *and* the mesh dims it selects over are known on every rank alike: the
   root mesh has exactly one ordered set of dims of that size whose block index
   is this rank's, after intersecting the candidates of all ranks
   (:func:`agree_slice_dims`: one exchange through the default group's store at
   compile time on a real backend; a hand-written ``chunk(n)[0]`` has no
   candidate common to all ranks).
   A mesh dim the chain has not touched before such a slice is taken to hold
   equal replicas: the DTensor that issued the slice declares it ``Replicate``
   (so "slice then gather back" over it is the identity).
6. Pointwise ops with scalar operands (``mul``/``div``/``add``/``sub``/``neg``/...)
   are allowed only where no mesh dim is partial any more: they then commute
   exactly with the remaining data movement and are re-applied at the end.

Every decision reads only rank-independent facts (graph structure, shapes,
dtypes, layouts), or facts agreed across ranks (condition 5), so every rank
raises the same chains the same way.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from redist_opt.ir.mesh import MeshSpec

__all__ = [
    "C10D",
    "ChainOp",
    "Chain",
    "NotRaised",
    "MeshContext",
    "mesh_contexts",
    "find_chains",
    "assign_placements",
    "agree_slice_dims",
    "truncate",
]

C10D = torch.ops._c10d_functional
_COLLECTIVES = {
    C10D.all_reduce.default: "all_reduce",
    C10D.reduce_scatter_tensor.default: "reduce_scatter",
    C10D.all_gather_into_tensor.default: "all_gather",
    C10D.all_to_all_single.default: "all_to_all",
}
_WAIT = C10D.wait_tensor.default
_REDUCE_OPS = ("sum", "avg", "max", "min")

aten = torch.ops.aten
# Ops that only re-view a value: transparent in a chain when the shape is unchanged.
_VIEWS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.alias.default,
    aten.clone.default,
    aten.contiguous.default,
}
# Elementwise ops whose operands other than the chain value are Python scalars.
_POINTWISE = {
    aten.mul.Tensor,
    aten.mul.Scalar,
    aten.div.Tensor,
    aten.div.Scalar,
    aten.add.Tensor,
    aten.add.Scalar,
    aten.sub.Tensor,
    aten.sub.Scalar,
    aten.neg.default,
    aten.relu.default,
    aten.abs.default,
}


# -- meshes and groups -----------------------------------------------------------------


@dataclasses.dataclass
class MeshContext:
    """One root DeviceMesh of the program, as raising and lowering see it."""

    device_mesh: object  # the root DeviceMesh
    spec: MeshSpec
    coord: tuple[int, ...]  # this rank's coordinate in the root
    rank_map: list  # the root's ranks as nested lists (mesh.tolist())

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
    """
    from torch.distributed.device_mesh import DeviceMesh

    if meshes is None:
        import gc

        meshes = [o for o in gc.get_objects() if isinstance(o, DeviceMesh)]
    elif isinstance(meshes, DeviceMesh):
        meshes = [meshes]
    roots = {}
    for m in meshes:
        try:
            root = m._get_root_mesh()
        except ReferenceError:  # a view whose root mesh was garbage-collected
            continue
        coord = root.get_coordinate()
        if coord is None:
            continue
        roots[id(root)] = MeshContext(
            root, MeshSpec.from_device_mesh(root), tuple(int(c) for c in coord), root.mesh.tolist()
        )
    return sorted(
        roots.values(),
        key=lambda c: (
            -c.spec.ndim, -len(c.device_mesh._flatten_mapping), c.spec.sizes, c.spec.names or (), repr(c.rank_map)
        ),
    )


def resolve_group_name(name, contexts: Sequence[MeshContext], cache: dict):
    """(context, dims) whose group has the ranks of process group ``name``, or a reason string."""
    if not isinstance(name, str):
        return f"group argument {name!r} is not a group name"
    if name in cache:
        return cache[name]
    from torch.distributed.distributed_c10d import _resolve_process_group, get_process_group_ranks

    try:
        ranks = list(get_process_group_ranks(_resolve_process_group(name)))
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


# -- chains ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChainOp:
    """One step of a raised chain.

    kind: all_reduce | reduce_scatter | all_gather | slice | pointwise | view
    """

    kind: str
    nodes: tuple[fx.Node, ...]
    dims: tuple[int, ...] = ()  # mesh dims (collectives, slices)
    tensor_dim: int | None = None
    reduce_op: str | None = None
    n: int = 1  # slice: number of blocks
    index: int | None = None  # slice: constant block index on this rank
    group_name: str | None = None
    ctx: MeshContext | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass
class NotRaised:
    """A chain (or a collective) that was left as it was, and why."""

    nodes: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return f"not raised [{', '.join(self.nodes)}]: {self.reason}"


@dataclasses.dataclass
class Chain:
    """A raised chain: the redistribution it performs and the graph nodes it covers."""

    input: fx.Node
    ops: list[ChainOp]
    ctx: MeshContext
    src: tuple[Placement, ...] = ()
    dst: tuple[Placement, ...] = ()
    shape: tuple[int, ...] = ()  # global shape (untouched mesh dims count as replicated)
    dtype: torch.dtype = torch.float32
    stop_reason: str | None = None  # why the walk stopped where it did (for dumps)

    @property
    def nodes(self) -> list[fx.Node]:
        return [n for op in self.ops for n in op.nodes]

    @property
    def end(self) -> fx.Node:
        return self.ops[-1].nodes[-1]

    @property
    def collectives(self) -> list[ChainOp]:
        return [op for op in self.ops if op.kind in ("all_reduce", "reduce_scatter", "all_gather")]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


def _val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _shape(node) -> tuple[int, ...] | None:
    v = _val(node)
    if v is None:
        return None
    # Symbolic sizes are not raised. Never int() a SymInt: that installs a guard and
    # specializes a dim the user marked dynamic (Dynamo then refuses the compile).
    if not all(type(s) is int for s in v.shape):
        return None
    return tuple(v.shape)


def _sole_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _from_redistribute(node: fx.Node) -> bool:
    for name, target in node.meta.get("source_fn_stack", ()) or ():
        t = getattr(target, "__name__", target)
        if t == "redistribute":
            return True
    return False


def _match_slice(node: fx.Node, shape):
    """(ChainOp, reason) for ``split``+``getitem`` / ``slice`` taking one even block."""
    if node.target is aten.split.Tensor:
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        size = node.args[1]
        users = list(node.users)
        if len(users) != 1 or users[0].target is not operator.getitem:
            return None, "split with several blocks used is not a rank slice"
        get = users[0]
        k = get.args[1]
        nodes = (node, get)
    elif node.target is aten.slice.Tensor:
        a = list(node.args) + [None] * (5 - len(node.args))
        dim, start, end, step = a[1] or 0, a[2], a[3], a[4] or 1
        if not all(isinstance(v, int) for v in (start, end)) or step != 1:
            return None, "slice with a non-constant or strided range"
        size, k, nodes = end - start, None, (node,)
        if size > 0 and start % size == 0:
            k = start // size
    else:
        return None, None
    dim = dim % len(shape)
    if not isinstance(size, int) or size <= 0 or shape[dim] % size or not isinstance(k, int):
        return None, f"{node.name}: uneven or non-constant block selection"
    n = shape[dim] // size
    if not 0 <= k < n:
        return None, f"{node.name}: block index {k} out of range"
    if not _from_redistribute(node):
        return None, (
            f"{node.name}: a slice with a constant index from user code cannot be proven to "
            "select this rank's block"
        )
    return ChainOp("slice", nodes, tensor_dim=dim, n=n, index=k), None


def _scalar_args(node: fx.Node) -> bool:
    rest = list(node.args[1:]) + list(node.kwargs.values())
    return all(isinstance(a, (int, float, bool)) for a in rest)


def _split_cat(split: fx.Node):
    """``cat([split(x, s, d)[0], ..., split(x, s, d)[n-1]], c)`` with nothing else using the
    pieces: (d, c, n, nodes) or None. funcol's gather/scatter on a non-zero dim is this."""
    if split.op != "call_function" or split.target is not aten.split.Tensor:
        return None
    d = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    items = list(split.users)
    if not items or any(u.target is not operator.getitem or len(u.users) != 1 for u in items):
        return None
    cat = next(iter(items[0].users))
    if cat.target is not aten.cat.default or any(next(iter(u.users)) is not cat for u in items):
        return None
    pieces = list(cat.args[0])
    if sorted(pieces, key=lambda u: u.args[1]) != pieces or [u.args[1] for u in pieces] != list(range(len(items))):
        return None
    if len(pieces) != len(items):
        return None
    c = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    shape = _shape(split.args[0])
    if shape is None or shape[d % len(shape)] != split.args[1] * len(items):
        return None
    return d % len(shape), c % len(shape), len(items), (split, *pieces, cat)


def scatter_prologue(rs: fx.Node):
    """The split/cat that lays tensor dim d out on dim 0 before a reduce_scatter, or None."""
    cat = rs.args[0]
    if not isinstance(cat, fx.Node) or cat.target is not aten.cat.default or len(cat.users) != 1:
        return None
    first = cat.args[0][0] if cat.args[0] else None
    if not isinstance(first, fx.Node) or first.target is not operator.getitem:
        return None
    found = _split_cat(first.args[0])
    if found is None or found[1] != 0 or found[0] == 0 or found[2] != rs.args[2]:
        return None
    return found


def _walk(start: fx.Node, contexts, cache) -> tuple[list[ChainOp], str | None]:
    """Greedy walk from collective ``start``: the ops of the chain and why it stopped."""
    ops: list[ChainOp] = []
    node = start
    while node is not None:
        if node.op != "call_function":
            return ops, None
        prologue = ()
        tensor_dim = 0
        if node.target is aten.split.Tensor:
            found = _split_cat(node)
            rs = _sole_user(found[3][-1]) if found else None
            if rs is not None and rs.target is C10D.reduce_scatter_tensor.default and scatter_prologue(rs):
                tensor_dim, prologue, node = found[0], found[3], rs
        kind = _COLLECTIVES.get(node.target)
        if kind is not None:
            if kind == "all_to_all":
                return ops, f"{node.name}: all_to_all_single is not raised (split sizes)"
            wait = _sole_user(node)
            if wait is None or wait.target is not _WAIT:
                return ops, f"{node.name}: its only user is not a wait_tensor"
            group = node.args[-1]
            found = resolve_group_name(group, contexts, cache)
            if isinstance(found, str):
                return ops, f"{node.name}: {found}"
            ctx, dims = found
            op = node.args[1] if kind in ("all_reduce", "reduce_scatter") else None
            if op is not None and op not in _REDUCE_OPS:
                return ops, f"{node.name}: reduce op {op!r} is not raised"
            nodes = (*prologue, node, wait)
            if kind == "all_gather":
                found = _split_cat(_sole_user(wait)) if _sole_user(wait) is not None else None
                if found and found[0] == 0 and found[1] != 0 and found[2] == node.args[1]:
                    tensor_dim, nodes = found[1], nodes + found[3]
            ops.append(
                ChainOp(kind, nodes, dims=dims, tensor_dim=None if kind == "all_reduce" else tensor_dim,
                        reduce_op=op, group_name=group, ctx=ctx)
            )
            last = nodes[-1]
        else:
            shape_in = _shape(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
            shape_out = _shape(node)
            if shape_in is None:
                return ops, f"{node.name}: no static shape"
            if node.target in _VIEWS:
                if shape_out != shape_in or _val(node).dtype != _val(node.args[0]).dtype:
                    return ops, None
                ops.append(ChainOp("view", (node,)))
                last = node
            elif node.target in _POINTWISE and _scalar_args(node) and shape_out == shape_in and (
                _val(node).dtype == _val(node.args[0]).dtype
            ):
                ops.append(ChainOp("pointwise", (node,)))
                last = node
            else:
                op, why = _match_slice(node, shape_in)
                if op is None:
                    return ops, why
                ops.append(op)
                last = op.nodes[-1]
        node = _sole_user(last)
        if node is None:
            n = len(last.users)
            return ops, (f"{last.name}, whose value has {n} users" if n > 1 else None)
    return ops, None


def _trim(ops: list[ChainOp]) -> list[ChainOp]:
    """Drop trailing views / pointwise ops: the chain ends at its last collective or slice."""
    while ops and ops[-1].kind in ("view", "pointwise"):
        ops.pop()
    return ops


def find_chains(graph: fx.Graph, contexts: Sequence[MeshContext]):
    """(raw chains, not-raised records) in graph order; slices still need dims (see graph_pass)."""
    cache: dict = {}
    seen: set[fx.Node] = set()
    chains: list[Chain] = []
    skipped: list[NotRaised] = []
    for node in graph.nodes:
        if node in seen or node.op != "call_function" or node.target not in _COLLECTIVES:
            continue
        start = node
        if node.target is C10D.reduce_scatter_tensor.default:
            pro = scatter_prologue(node)
            if pro is not None and not (set(pro[3]) & seen):
                start = pro[3][0]
        ops, why = _walk(start, contexts, cache)
        ops = _trim(ops)
        for op in ops:
            seen.update(op.nodes)
        if not ops:
            skipped.append(NotRaised((node.name,), why or "nothing to raise"))
            continue
        ctxs = {id(op.ctx): op.ctx for op in ops if op.ctx is not None}
        if len(ctxs) != 1:
            skipped.append(NotRaised(tuple(n.name for op in ops for n in op.nodes),
                                     "collectives of the chain live on different root meshes"))
            continue
        chain = Chain(start.args[0], ops, next(iter(ctxs.values())))
        chain.stop_reason = why
        chains.append(chain)
    return chains, skipped


# -- meaning of a chain ----------------------------------------------------------------


def assign_placements(chain: Chain) -> str | None:
    """Replay the chain on per-mesh-dim placements (legality 3, 4, 6); fill src/dst/shape.

    Returns None on success, else the reason the chain is not raised.
    """
    spec = chain.ctx.spec
    nd = spec.ndim
    src: list[Placement | None] = [None] * nd  # None: untouched so far
    cur: list[Placement | None] = [None] * nd
    order: dict[int, list[int]] = {}  # tensor dim -> mesh dims sharding it now (outer first)
    src_order: dict[int, list[int]] = {}
    in_shape = _shape(chain.input)
    val = _val(chain.input)
    if in_shape is None or val is None:
        return "the chain's input has no static shape"
    shape = list(in_shape)  # local shape as the chain goes
    for op in chain.ops:
        if op.kind == "view":
            continue
        if op.kind == "pointwise":
            if any(isinstance(p, Partial) for p in cur):
                return f"{op.nodes[0].name}: a pointwise op on a value that is still partial"
            continue
        dims = op.dims
        if op.kind in ("all_reduce", "reduce_scatter"):
            if any(cur[d] is not None for d in dims):
                return f"{op.nodes[0].name}: reduces mesh dims {dims} that are not partial any more"
            for d in dims:
                src[d] = Partial(op.reduce_op)
                cur[d] = Replicate()
        if op.kind in ("reduce_scatter", "slice"):
            t = op.tensor_dim
            if any(cur[d] is not None and not isinstance(cur[d], Replicate) for d in dims):
                return f"{op.nodes[0].name}: shards mesh dims {dims} that are not replicated"
            existing = order.setdefault(t, [])
            if list(dims) != sorted(dims) or (existing and max(existing) >= min(dims)):
                return (f"{op.nodes[0].name}: shard order {existing + list(dims)} of tensor dim {t} "
                        "is not DTensor's default (ascending mesh dims)")
            n = math.prod(spec.sizes[d] for d in dims)
            if shape[t] % n:
                return f"{op.nodes[0].name}: tensor dim {t} ({shape[t]}) is not divisible by {n}"
            for d in dims:
                if src[d] is None:
                    src[d] = Replicate()
                cur[d] = Shard(t)
            existing.extend(dims)
            shape[t] //= n
        elif op.kind == "all_gather":
            t = op.tensor_dim
            existing = order.setdefault(t, [])
            n = math.prod(spec.sizes[d] for d in dims)
            if all(cur[d] is None for d in dims):
                if existing:
                    return f"{op.nodes[0].name}: gathers mesh dims {dims} sharded outside shards made in the chain"
                src_order[t] = list(dims) + src_order.get(t, [])
                for d in dims:
                    src[d] = Shard(t)
                    cur[d] = Replicate()
            elif all(isinstance(cur[d], Shard) and cur[d].dim == t for d in dims) and existing[-len(dims):] == list(dims):
                del existing[-len(dims):]
                for d in dims:
                    cur[d] = Replicate()
            else:
                return f"{op.nodes[0].name}: gathers mesh dims {dims} that are not the innermost shards of dim {t}"
            shape[t] *= n
    for t, ds in src_order.items():
        if ds != sorted(ds):
            return f"source shard order {ds} of tensor dim {t} is not DTensor's default"
    # Global shape: the input's local shape times the source shards.
    global_shape = list(in_shape)
    for d, p in enumerate(src):
        if isinstance(p, Shard):
            global_shape[p.dim] *= spec.sizes[d]
    chain.src = tuple(p if p is not None else Replicate() for p in src)
    chain.dst = tuple(p if p is not None else Replicate() for p in cur)
    chain.shape = tuple(global_shape)
    chain.dtype = val.dtype
    out_shape = _shape(chain.end)
    if out_shape is not None and tuple(shape) != out_shape:
        return f"the chain's output shape {out_shape} is not the derived {tuple(shape)}"
    return None


def slice_candidates(chain: Chain) -> list[list[tuple[int, ...]]]:
    """Per slice of the chain: the ordered dim sets whose block index is this rank's."""
    out = []
    for op in chain.ops:
        if op.kind == "slice":
            out.append([d for d in chain.ctx.candidate_dims(op.n) if chain.ctx.block_index(d) == op.index])
    return out


def agree_slice_dims(chains: Sequence[Chain], all_gather=None) -> dict[int, tuple[int, str]]:
    """Give every slice its mesh dims, the same on every rank (legality 5).

    A slice whose size matches exactly one ordered dim set of the root mesh needs no
    communication. Otherwise the candidate sets of all ranks are intersected
    (``all_gather(facts) -> list of every rank's facts``, by default one exchange
    through the default group's store, made iff the graph has such a slice, which
    is the same on every rank); a slice is resolved when exactly one candidate is
    common to all ranks. Returns {chain index: (position in chain.ops, reason)} for
    the first unresolved slice of each chain.
    """
    facts = []  # (chain index, op position, candidates) needing agreement
    failed: dict[int, tuple[int, str]] = {}

    def fail(ci, pos, reason):
        if ci not in failed or failed[ci][0] > pos:
            failed[ci] = (pos, reason)

    for ci, chain in enumerate(chains):
        for pos, op in enumerate(chain.ops):
            if op.kind != "slice":
                continue
            all_dims = chain.ctx.candidate_dims(op.n)
            cands = [d for d in all_dims if chain.ctx.block_index(d) == op.index]
            if len(all_dims) == 1:
                if cands:
                    object.__setattr__(op, "dims", cands[0])
                else:
                    fail(ci, pos, f"{op.nodes[0].name}: block {op.index} is not this rank's")
            else:
                facts.append((ci, pos, sorted(cands)))
    if not facts:
        return failed
    mine = [c for _, _, c in facts]
    gathered = (all_gather or _world_all_gather)(mine)
    for j, (ci, pos, _) in enumerate(facts):
        op = chains[ci].ops[pos]
        if isinstance(gathered, str):
            fail(ci, pos, f"{op.nodes[0].name}: {gathered}")
            continue
        common = set(map(tuple, mine[j]))
        for other in gathered:
            common &= set(map(tuple, other[j])) if len(other) == len(mine) else set()
        if len(common) != 1:
            fail(ci, pos, (
                f"{op.nodes[0].name}: the mesh dims this slice selects over are not determined "
                f"(candidates common to all ranks: {sorted(common)})"
            ))
        else:
            object.__setattr__(op, "dims", next(iter(common)))
    return failed


def truncate(chain: Chain, pos: int, reason: str) -> bool:
    """Cut the chain before op ``pos`` (and trailing views); False if nothing is left."""
    chain.ops = _trim(list(chain.ops[:pos]))
    chain.stop_reason = reason
    return bool(chain.collectives)


_AGREE_SEQ = itertools.count()


def _world_all_gather(facts, timeout_s: float = 300.0):
    """Every rank's ``facts``, exchanged through the default group's store (not a collective:
    a compile-time collective on the world group can interleave with collectives the
    program still has in flight on it; store keys cannot). Returns a reason string when
    there is no such store."""
    import datetime
    import pickle

    import torch.distributed as dist

    if not dist.is_initialized():
        return "no process group to agree on slice dims across ranks"
    if dist.get_backend() == "fake":
        return ("its mesh dims need agreement across ranks (several dim sets have its size), "
                "which the fake backend cannot give")
    store = dist.distributed_c10d._get_default_store()
    # Agreements happen in graph order, the same on every rank: the counter names them.
    key = f"redist_opt/graph_pass/agree/{next(_AGREE_SEQ)}"
    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(f"{key}/{rank}", pickle.dumps(facts))
    keys = [f"{key}/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - a rank that did not run the pass: no rewrite here
        return f"ranks did not all report their slice facts ({type(e).__name__})"
    return [pickle.loads(store.get(k)) for k in keys]
