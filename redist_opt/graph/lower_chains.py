"""Lowering back: an optimized redistribution IR -> ``_c10d_functional`` nodes in the compiled graph.

The inverse of :mod:`redist_opt.graph.raise_chains`. Each IR collective becomes the
functional collective torch itself would trace, over a real group name, followed
by its ``wait_tensor``; local IR ops become aten ops with this rank's sizes and
block indices (the IR is rank-free; the graph a rank compiles holds its own
constants, exactly as DTensor's traced graphs do). Every op of the IR op table
(``redist_opt.ir.ops.OPS``) is lowered by emitting its one definition in
:mod:`redist_opt.ir.local_ops` through the graph emitter of :mod:`redist_opt.graph.lower_ops`:
local ops (padding and narrowing for uneven shards, ``unpack_blocks``, the local half of a
``gather_blocks`` step) from ``LOCAL_OPS``, collectives (all_to_all with one split dim or
several) from ``collective``, the same definitions the eager rank programs run.

Placement (so Inductor's bucketing and overlap passes see ordinary collectives
where the program had them): every node up to the last collective is inserted
where the chain's first collective was; the last ``wait_tensor`` and everything
after it where the chain's last wait was.

Groups: ``groups="existing"`` uses a mesh dim's group, a flattened mesh or the
world group with the same layout (``redist_opt.runtime.groups.resolve_group``);
``groups="create"`` flattens the mesh dims on first use. Groups are created at
compile time, in graph order, which is the same on every rank.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.fx as fx

from redist_opt import ir
from redist_opt.graph.chain import C10D
from redist_opt.graph.lower_ops import LOWERED_OPS, Emitter
from redist_opt.graph.mesh_groups import MeshContext
from redist_opt.ir import layout as L
from redist_opt.ir import symbolic as sym
from redist_opt.ir.local_ops import LOCAL_OPS, collective, rank_params
from redist_opt.runtime.groups import GroupUnavailable, resolve_group

__all__ = ["Unlowerable", "group_name", "lower_into_graph", "lower_plan"]

aten = torch.ops.aten


class Unlowerable(RuntimeError):
    """The optimized IR needs something this lowering does not emit."""


def group_name(ctx: MeshContext, group, policy: str) -> str:
    try:
        found = resolve_group(ctx.device_mesh, group, policy)
    except GroupUnavailable as e:
        raise Unlowerable(str(e)) from e
    if isinstance(found, tuple):
        mesh, dim = found
        return L.group_name(mesh, dim)
    return (found if found is not None else dist.group.WORLD).group_name


def _shape_at(shape, coord) -> list[int]:
    return [sym.evaluate(s, coord) for s in shape]


def _plan_ops(plan) -> list[fx.Node]:
    gm = plan if isinstance(plan, fx.GraphModule) else plan.graph  # a Plan, or its IR
    return [n for n in gm.graph.nodes if ir.ir_name(n) is not None]


def _group_names(ops, ctx: MeshContext, policy: str) -> dict:
    """Every op is lowerable and every group resolves, or Unlowerable (graph untouched)."""
    names = {}
    for n in ops:
        name = ir.ir_name(n)
        if name not in LOWERED_OPS:
            raise Unlowerable(f"the optimized plan needs {name}, which is not lowered into graphs")
        if ir.is_collective(n) and n.args[1] not in names:
            names[n.args[1]] = group_name(ctx, n.args[1], policy)
    return names


def lower_plan(graph: fx.Graph, plan, x: fx.Node, ctx: MeshContext, policy: str) -> fx.Node:
    """Emit ``plan``'s IR on ``x`` at ``graph``'s insertion point (waits right after their
    collectives); the value on this rank. For graphs built around a plan (tests, tools); a bare
    IR graph holds no dtype, and is lowered as a real one."""
    ops = _plan_ops(plan)
    names = _group_names(ops, ctx, policy)
    dtype = getattr(plan, "dtype", torch.float32)
    x = _emit_ops(Emitter(graph), ops, x, names, ctx.coord, dtype, None, None)
    return x if ops else Emitter(graph)(aten.clone.default, x)


def lower_into_graph(graph: fx.Graph, chain, plan, policy: str) -> fx.Node:
    """Emit ``plan``'s IR for ``chain`` into ``graph``; returns the new value (not yet used).

    Raises :class:`Unlowerable` before touching the graph when the IR holds an op
    this lowering does not emit or a group that cannot be had.
    """
    ctx: MeshContext = chain.ctx
    ops = _plan_ops(plan)
    names = _group_names(ops, ctx, policy)
    colls = [op for op in chain.ops if op.kind in ("all_reduce", "reduce_scatter", "all_gather")]
    first_coll = colls[0].nodes[0]  # (or the split/cat laying out its input)
    last_wait = next(n for n in colls[-1].nodes if n.target is C10D.wait_tensor.default)

    emit = Emitter(graph)
    x = _emit_ops(emit, ops, chain.input, names, ctx.coord, chain.dtype, first_coll, last_wait)
    with graph.inserting_before(last_wait):
        if not ops:
            x = emit(aten.clone.default, x)  # a fresh tensor, as the chain's output was
        for op in chain.ops:
            if op.kind == "pointwise":
                node = op.nodes[0]
                x = emit(node.target, x, *node.args[1:], **node.kwargs)
    return x


def _at(graph: fx.Graph, anchor):
    return graph.inserting_before(anchor) if anchor is not None else contextlib.nullcontext()


def _emit_ops(emit: Emitter, ops, x: fx.Node, names, coord, dtype, first_anchor, last_anchor) -> fx.Node:
    """Ops up to the last collective go before ``first_anchor``; the last collective's wait
    and everything after it before ``last_anchor`` (None: the current insertion point)."""
    last_coll = max([i for i, n in enumerate(ops) if ir.is_collective(n)], default=-1)
    pending = None
    with _at(emit.graph, first_anchor):
        for i, n in enumerate(ops[: last_coll + 1]):
            if not ir.is_collective(n):
                x = _emit_local(emit, n, x, coord)
                continue
            issued, post = _emit_collective(emit, n, x, names, coord, dtype)
            if i != last_coll:
                x = _finish(emit, issued, post)
            else:
                pending = (issued, post)
    with _at(emit.graph, last_anchor):
        if pending is not None:
            x = _finish(emit, *pending)
        for n in ops[last_coll + 1 :]:
            x = _emit_local(emit, n, x, coord)
    return x


def _finish(emit: Emitter, issued: fx.Node, post) -> fx.Node:
    y = emit(C10D.wait_tensor.default, issued)
    return post(emit, y) if post is not None else y


def _emit_local(emit: Emitter, n: fx.Node, x: fx.Node, coord) -> fx.Node:
    shape = _shape_at(n.args[0].meta["shape"], coord)
    return LOCAL_OPS[ir.ir_name(n)](emit, x, shape, *rank_params(n.args[1:], coord))


def _emit_collective(emit: Emitter, n: fx.Node, x: fx.Node, names, coord, dtype):
    group, *params = n.args[1:]
    shape = _shape_at(n.args[0].meta["shape"], coord)
    c = collective(ir.ir_name(n), shape, dtype, group.size, rank_params(params, coord))
    if c.before is not None:
        x = c.before(emit, x)
    return c.issue(emit, x, names[group]), c.after
