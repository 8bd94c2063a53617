"""Lowering back: an optimized redistribution IR -> ``_c10d_functional`` nodes in the compiled graph.

The inverse of :mod:`redist_opt.graph.raise_chains`. Each IR collective becomes the
functional collective torch itself would trace, over a real group name, followed
by its ``wait_tensor``; local IR ops become aten ops with this rank's sizes and
block indices (the IR is rank-free; the graph a rank compiles holds its own
constants, exactly as DTensor's traced graphs do). The plan is walked as eager rank
programs walk it (:mod:`redist_opt.runtime.rank_walk`: each op bound at this rank's
coordinate, then a collective's layout before, issue, layout after), and every op of the IR
op table (``redist_opt.ir.ops.OPS``) is lowered by emitting its one definition in
:mod:`redist_opt.ir.local_ops` through the graph emitter of :mod:`redist_opt.graph.lower_ops`:
local ops (padding and narrowing for uneven shards, ``unpack_blocks``, the local half of a
``gather_blocks`` step) from ``LOCAL_OPS``, collectives (all_to_all with one split dim or
several) from ``collective``, the same definitions the eager rank programs run.

Placement (so Inductor's bucketing and overlap passes see ordinary collectives
where the program had them): every node up to the last collective is inserted
where the chain's first collective was; the last ``wait_tensor`` and everything
after it where the chain's last wait was.

Groups: ``groups="existing"`` uses a mesh dim's group, a flattened mesh or the
world group with the same layout, named as eager names it
(``redist_opt.runtime.groups.group_name``);
``groups="create"`` flattens the mesh dims on first use. Groups are created at
compile time, in graph order, which is the same on every rank.
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx as fx

from redist_opt import ir
from redist_opt.graph.chain import C10D
from redist_opt.graph.lower_ops import LOWERED_OPS, Emitter
from redist_opt.graph.mesh_groups import MeshContext
from redist_opt.ir.local_ops import LOCAL_OPS
from redist_opt.runtime.groups import GroupUnavailable, group_name
from redist_opt.runtime.rank_walk import plan_ops, shape_at, walk_plan

__all__ = ["Unlowerable", "lower_into_graph", "lower_plan"]

aten = torch.ops.aten


class Unlowerable(RuntimeError):
    """The optimized IR needs something this lowering does not emit."""


def _group_names(ops, ctx: MeshContext, policy: str) -> dict:
    """Every op is lowerable and every group resolves, or Unlowerable (graph untouched)."""
    names = {}
    for n in ops:
        name = ir.ir_name(n)
        if name not in LOWERED_OPS:
            raise Unlowerable(f"the optimized plan needs {name}, which is not lowered into graphs")
        if ir.is_collective(n) and n.args[1] not in names:
            try:
                names[n.args[1]] = group_name(ctx.device_mesh, n.args[1], policy)
            except GroupUnavailable as e:
                raise Unlowerable(str(e)) from e
    return names


def lower_plan(graph: fx.Graph, plan, x: fx.Node, ctx: MeshContext, policy: str) -> fx.Node:
    """Emit ``plan``'s IR on ``x`` at ``graph``'s insertion point (waits right after their
    collectives); the value on this rank. For graphs built around a plan (tests, tools); a bare
    IR graph holds no dtype, and is lowered as a real one."""
    ops = plan_ops(plan)
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
    ops = plan_ops(plan)
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


def _emit_ops(emit: Emitter, ops, x: fx.Node, names, coord, dtype, first_anchor, last_anchor) -> fx.Node:
    """Ops up to the last collective go before ``first_anchor``; the last collective's wait
    and everything after it before ``last_anchor`` (None: the current insertion point)."""
    nodes = _GraphNodes(emit, x, names, coord, first_anchor, last_anchor, any(map(ir.is_collective, ops)))
    walk_plan(ops, coord, dtype, nodes)
    return nodes.x


class _GraphNodes:
    """The graph emitter of :func:`~redist_opt.runtime.rank_walk.walk_plan`: each step as
    nodes on the value ``x``, before ``first_anchor`` up to the last collective's issue and
    before ``last_anchor`` from its wait on (from the first op where the plan has no collective)."""

    def __init__(self, emit: Emitter, x: fx.Node, names, coord, first_anchor, last_anchor, collectives: bool):
        self.emit, self.x, self.names, self.coord = emit, x, names, coord
        self.first_anchor, self.last_anchor = first_anchor, last_anchor
        self.anchor = first_anchor if collectives else last_anchor

    def _at(self, anchor):
        return self.emit.graph.inserting_before(anchor) if anchor is not None else contextlib.nullcontext()

    def local(self, step) -> None:
        with self._at(self.anchor):
            shape = shape_at(step.node, self.coord)
            self.x = LOCAL_OPS[step.name](self.emit, self.x, shape, *step.params)

    def before(self, step) -> None:
        with self._at(self.anchor):
            self.x = step.parts.before(self.emit, self.x)

    def issue(self, step, last: bool) -> None:
        with self._at(self.anchor):
            issued = step.parts.issue(self.emit, self.x, self.names[step.group])
        if last:
            self.anchor = self.last_anchor
        with self._at(self.anchor):
            self.x = self.emit(C10D.wait_tensor.default, issued)

    def after(self, step) -> None:
        with self._at(self.anchor):
            self.x = step.parts.after(self.emit, self.x)
