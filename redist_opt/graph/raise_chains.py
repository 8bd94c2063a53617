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
   chain), so nothing else observes a value the rewrite removes. A chain may also go
   on through a value with several users along one of them: that value and the ops
   before it are then kept for the others (``Chain.kept``), and the graph pass counts
   their collectives on both sides of its cost comparison.
2. Every group name resolves (:mod:`redist_opt.graph.mesh_groups`) to the ranks of an ordered set
   of dims of one root
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
5. A rank slice (``split`` + ``getitem`` or ``slice`` taking one even block, with
   this rank's constant index) is raised only when it is proven to select this
   rank's own block over one ordered set of mesh dims, the same set on every rank
   that compiles the same program: each rank lists the dim sets whose block index
   is its constant (from its mesh coordinate), and the ranks intersect their lists
   (:class:`redist_opt.graph.agreement.SliceAgreement`: one exchange per graph
   through the default group's store at compile time on a real backend, keyed by
   the graph and the mesh, bounded in time; a failed or timed-out round leaves the
   chain as traced from the slice on, on every rank of it, unless an earlier round
   of the same chain answered for every rank present). Only dim sets whose coordinates
   vary among those ranks count, so a constant that user code wrote (the same on
   every rank: ``chunk(n)[0]``) never matches, whatever the graph's metadata says.
   A slice that DTensor's redistribute put there (``node.meta["source_fn_stack"]``)
   is known to select the caller's block: when exactly one dim set of the root mesh
   has its size, it needs no exchange (so it is raised on the fake backend too).
   A mesh dim the chain has not touched before such a slice is taken to hold
   equal replicas: the DTensor that issued the slice declares it ``Replicate``
   (so "slice then gather back" over it is the identity).
6. Pointwise ops with scalar operands (``mul``/``div``/``add``/``sub``/``neg``/...)
   are allowed only where no mesh dim is partial any more: they then commute
   exactly with the remaining data movement and are re-applied at the end.

Every decision reads only rank-independent facts (graph structure, shapes,
dtypes, layouts), or facts agreed across ranks (condition 5), so every rank
raises the same chains the same way. Metadata is never needed: graphs from other
tracers (autoparallel copies the user op's metadata onto the ops it emits) raise
as DTensor's do, given a real backend for the agreement.

This module finds chains (the greedy walk, conditions 1, 2, 5's slice matching
and 6's operand check); :mod:`redist_opt.graph.chain_placements` gives a chain its
meaning (conditions 3, 4, 6) and :mod:`redist_opt.graph.agreement` its slices'
mesh dims (condition 5).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

from redist_opt.graph.chain import (
    C10D,
    COLLECTIVE_KINDS,
    COLLECTIVES,
    REDUCE_OPS,
    WAIT,
    Chain,
    ChainOp,
    NotRaised,
    node_val,
    static_shape,
    trim,
)
from redist_opt.graph.mesh_groups import MeshContext, resolve_group_name
from redist_opt.torch_api.tracing import is_redistribute_source

__all__ = ["find_chains", "scatter_prologue"]

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


def _sole_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _from_redistribute(node: fx.Node) -> bool:
    return any(is_redistribute_source(target) for _name, target in node.meta.get("source_fn_stack", ()) or ())


def _match_slice(node: fx.Node, shape):
    """(ChainOp, reason) for ``split``+``getitem`` / ``slice`` taking one even block.

    The block index is this rank's constant; whether it is this rank's *own* block is
    decided later, from the mesh coordinates and across ranks (legality 5)."""
    if node.target is aten.split.Tensor:
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        size = node.args[1]
        users = list(node.users)
        # every piece a getitem, one of them used (tracers leave the others dead)
        live = [u for u in users if u.users]
        if not users or any(u.target is not operator.getitem for u in users) or len(live) != 1:
            return None, "split with several blocks used is not a rank slice"
        get = live[0]
        k = get.args[1]
        nodes = (node, *(u for u in users if u is not get), get)
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
    return ChainOp("slice", nodes, tensor_dim=dim, n=n, index=k, trusted=_from_redistribute(node)), None


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
    if sorted(pieces, key=lambda u: u.args[1]) != pieces or [u.args[1] for u in pieces] != list(
        range(len(items))
    ):
        return None
    if len(pieces) != len(items):
        return None
    c = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    shape = static_shape(split.args[0])
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


def _match_collective(node, kind, prologue, tensor_dim, contexts, cache):
    """(ChainOp, None) for collective ``node`` (with its wait, and the split/cat around
    it on a non-zero tensor dim), or (None, why it is not part of a chain)."""
    if kind == "all_to_all":
        return None, f"{node.name}: all_to_all_single is not raised (split sizes)"
    wait = _sole_user(node)
    if wait is None or wait.target is not WAIT:
        return None, f"{node.name}: its only user is not a wait_tensor"
    group = node.args[-1]
    found = resolve_group_name(group, contexts, cache)
    if isinstance(found, str):
        return None, f"{node.name}: {found}"
    ctx, dims = found
    op = node.args[1] if kind in ("all_reduce", "reduce_scatter") else None
    if op is not None and op not in REDUCE_OPS:
        return None, f"{node.name}: reduce op {op!r} is not raised"
    nodes = (*prologue, node, wait)
    if kind == "all_gather":
        found = _split_cat(_sole_user(wait)) if _sole_user(wait) is not None else None
        if found and found[0] == 0 and found[1] != 0 and found[2] == node.args[1]:
            tensor_dim, nodes = found[1], nodes + found[3]
    return ChainOp(
        kind,
        nodes,
        dims=dims,
        tensor_dim=None if kind == "all_reduce" else tensor_dim,
        reduce_op=op,
        group_name=group,
        ctx=ctx,
    ), None


def _match_local(node):
    """(ChainOp, None) for a view, scalar pointwise op or rank slice, or (None, why not)."""
    shape_in = static_shape(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    shape_out = static_shape(node)
    if shape_in is None:
        return None, f"{node.name}: no static shape"
    if node.target in _VIEWS:
        if shape_out != shape_in or node_val(node).dtype != node_val(node.args[0]).dtype:
            return None, None
        return ChainOp("view", (node,)), None
    if (
        node.target in _POINTWISE
        and _scalar_args(node)
        and shape_out == shape_in
        and (node_val(node).dtype == node_val(node.args[0]).dtype)
    ):
        return ChainOp("pointwise", (node,)), None
    return _match_slice(node, shape_in)


def _walk(start: fx.Node, contexts, cache):
    """Greedy walk from ``start`` (a collective, or a local op after a shared value): the
    ops of the chain, why it stopped, and the value it stopped at when that value has
    several users (else None)."""
    ops: list[ChainOp] = []
    node = start
    while node is not None:
        if node.op != "call_function":
            return ops, None, None
        prologue = ()
        tensor_dim = 0
        if node.target is aten.split.Tensor:
            found = _split_cat(node)
            rs = _sole_user(found[3][-1]) if found else None
            if rs is not None and rs.target is C10D.reduce_scatter_tensor.default and scatter_prologue(rs):
                tensor_dim, prologue, node = found[0], found[3], rs
        kind = COLLECTIVES.get(node.target)
        if kind is not None:
            op, why = _match_collective(node, kind, prologue, tensor_dim, contexts, cache)
        else:
            op, why = _match_local(node)
        if op is None:
            return ops, why, None
        ops.append(op)
        last = op.nodes[-1]
        node = _sole_user(last)
        if node is None:
            n = len(last.users)
            return (
                ops,
                (f"{last.name}, whose value has {n} users" if n > 1 else None),
                (last if n > 1 else None),
            )
    return ops, None, None


def _through(prefix: list[ChainOp], shared: fx.Node, contexts, cache, depth: int = 0):
    """Chains that go on through ``shared`` (the end of ``prefix``, a value with several
    users) along one of its users: the prefix is kept for the others (``Chain.kept``).
    Only branches with a collective of their own: re-planning the whole chain can then
    beat the branch's collectives; without one it cannot (the kept prefix already costs
    what the branch costs)."""
    out = []
    for user in shared.users:
        if user.op != "call_function" or not user.args or user.args[0] is not shared:
            continue
        raw, why, again = _walk(user, contexts, cache)
        ops = trim(list(raw))
        if not any(op.kind in COLLECTIVE_KINDS for op in ops):
            continue
        out.append((prefix + ops, len(prefix), why))
        if again is not None and depth < _MAX_SHARED_DEPTH:
            out += _through(prefix + raw, again, contexts, cache, depth + 1)
    return out


# How many shared values a chain may go through.
_MAX_SHARED_DEPTH = 2


def _one_context(ops: list[ChainOp]):
    ctxs = {id(op.ctx): op.ctx for op in ops if op.ctx is not None}
    return next(iter(ctxs.values())) if len(ctxs) == 1 else None


def find_chains(graph: fx.Graph, contexts: Sequence[MeshContext]):
    """(raw chains, not-raised records); slices still need dims (see graph_pass).

    A chain that stops at a value with several users is also continued through it, once
    per user that leads to more collectives (chains with ``kept > 0``). Chains come in
    the order they are to be tried, since a rewritten chain takes its nodes from the
    chains overlapping it: first the chains through shared values (deepest first; the
    graph pass uses one only when it beats the chain after the shared value alone),
    then the chains through no shared value, then the chains ending at a shared value."""
    cache: dict = {}
    seen: set[fx.Node] = set()
    chains: list[Chain] = []
    through: list[Chain] = []
    prefixes: list[Chain] = []
    skipped: list[NotRaised] = []
    for node in graph.nodes:
        if node in seen or node.op != "call_function" or node.target not in COLLECTIVES:
            continue
        start = node
        if node.target is C10D.reduce_scatter_tensor.default:
            pro = scatter_prologue(node)
            if pro is not None and not (set(pro[3]) & seen):
                start = pro[3][0]
        raw, why, shared = _walk(start, contexts, cache)
        ops = trim(list(raw))
        for op in ops:
            seen.update(op.nodes)
        if not ops:
            skipped.append(NotRaised((node.name,), why or "nothing to raise"))
            continue
        ctx = _one_context(ops)
        if ctx is None:
            skipped.append(
                NotRaised(
                    tuple(n.name for op in ops for n in op.nodes),
                    "collectives of the chain live on different root meshes",
                )
            )
            continue
        chain = Chain(start.args[0], ops, ctx)
        chain.stop_reason = why
        found = _through(raw, shared, contexts, cache) if shared is not None else []
        for t_ops, kept, t_why in found:
            t_ctx = _one_context(t_ops)
            if t_ctx is not None:
                through.append(Chain(start.args[0], t_ops, t_ctx, stop_reason=t_why, kept=kept))
        (prefixes if found else chains).append(chain)
    through.sort(key=lambda c: -c.kept)  # stable: graph order among equals
    return through + chains + prefixes, skipped
