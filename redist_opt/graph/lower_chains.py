"""Lowering back: an optimized redistribution IR -> ``_c10d_functional`` nodes in the compiled graph.

The inverse of :mod:`redist_opt.graph.raise_chains`. Each IR collective becomes the
functional collective torch itself would trace, over a real group name, followed
by its ``wait_tensor``; local IR ops become aten ops with this rank's block
indices (the IR is rank-free; the graph a rank compiles holds its own
constants, exactly as DTensor's traced graphs do)::

    all_reduce(x, G, op)            all_reduce(x, op, name(G)); wait_tensor
    reduce_scatter(x, G, op, 0)     reduce_scatter_tensor(x, op, |G|, name(G)); wait_tensor
    reduce_scatter(x, G, op, d>0)   cat(split(x, s/|G|, d), 0) first, as funcol does
    all_gather(x, G, 0)             all_gather_into_tensor(x, |G|, name(G)); wait_tensor
    all_gather(x, G, d>0)           then cat(split(y, rows, 0), d), as funcol does
    select_chunk(x, d, n, c)        slice(x, d, c*s, (c+1)*s); clone
    divide(x, k)                    div(x, k)

Placement (so Inductor's bucketing and overlap passes see ordinary collectives
where the program had them): every node up to the last collective is inserted
where the chain's first collective was; the last ``wait_tensor`` and everything
after it where the chain's last wait was.

Groups: ``groups="existing"`` uses a mesh dim's group, a flattened mesh or the
world group with the same layout (``redist_opt.runtime.groups.resolve_group``);
``groups="create"`` flattens the mesh dims on first use. Groups are created at
compile time, in graph order, which is the same on every rank. Pad/narrow ops
(uneven shards) and all_to_all are not lowered: a plan needing them is not used.
"""

from __future__ import annotations

import operator

import torch
import torch.distributed as dist
import torch.fx as fx

from redist_opt import ir
from redist_opt.graph.chain import C10D
from redist_opt.graph.mesh_groups import MeshContext
from redist_opt.ir import symbolic as sym
from redist_opt.runtime.groups import GroupUnavailable, resolve_group

__all__ = ["Unlowerable", "group_name", "lower_into_graph"]

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
        return mesh.get_group(dim).group_name
    return (found if found is not None else dist.group.WORLD).group_name


def _fake_val(target, args, kwargs):
    def val(a):
        if isinstance(a, fx.Node):
            return a.meta.get("val")
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a

    vargs, vkwargs = val(args), {k: val(v) for k, v in kwargs.items()}
    flat = [a for a in torch.utils._pytree.tree_leaves((vargs, vkwargs)) if isinstance(a, torch.Tensor)]
    if not flat:
        return None
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(flat)
    if mode is None:
        return None
    with mode:
        return target(*vargs, **vkwargs)


class _Emitter:
    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        v = _fake_val(target, args, kwargs)
        if v is not None:
            node.meta["val"] = v
        return node

    def split_cat(self, x: fx.Node, size: int, split_dim: int, n: int, cat_dim: int) -> fx.Node:
        parts = self(aten.split.Tensor, x, size, split_dim)
        items = [self(operator.getitem, parts, i) for i in range(n)]
        return self(aten.cat.default, items, cat_dim)


def _shape_at(shape, coord) -> list[int]:
    return [sym.evaluate(s, coord) for s in shape]


def lower_into_graph(graph: fx.Graph, chain, plan, policy: str) -> fx.Node:
    """Emit ``plan``'s IR for ``chain`` into ``graph``; returns the new value (not yet used).

    Raises :class:`Unlowerable` before touching the graph when the IR holds an op
    this lowering does not emit or a group that cannot be had.
    """
    ctx: MeshContext = chain.ctx
    coord = ctx.coord
    ops = [n for n in plan.graph.graph.nodes if ir.ir_name(n) is not None]
    names = {}
    for n in ops:
        name = ir.ir_name(n)
        if name not in ("all_reduce", "reduce_scatter", "all_gather", "select_chunk", "divide"):
            raise Unlowerable(f"the optimized plan needs {name}, which is not lowered into graphs")
        if ir.is_collective(n) and n.args[1] not in names:
            names[n.args[1]] = group_name(ctx, n.args[1], policy)
    colls = [op for op in chain.ops if op.kind in ("all_reduce", "reduce_scatter", "all_gather")]
    first_coll = colls[0].nodes[0]  # (or the split/cat laying out its input)
    last_wait = next(n for n in colls[-1].nodes if n.target is C10D.wait_tensor.default)
    last_coll_index = max([i for i, n in enumerate(ops) if ir.is_collective(n)], default=-1)

    emit = _Emitter(graph)
    x = chain.input
    # Waits of all but the last collective stay right after their collective; the last
    # wait goes where the chain's last wait was.
    pending = False
    with graph.inserting_before(first_coll):
        for i, n in enumerate(ops[: last_coll_index + 1]):
            x, pending = _emit_op(emit, n, x, names, coord, wait=i != last_coll_index)
    with graph.inserting_before(last_wait):
        if pending:
            x = emit(C10D.wait_tensor.default, x)
        for n in ops[last_coll_index + 1:]:
            x, _ = _emit_op(emit, n, x, names, coord, wait=True)
        if not ops:
            x = emit(aten.clone.default, x)  # a fresh tensor, as the chain's output was
        for op in chain.ops:
            if op.kind == "pointwise":
                node = op.nodes[0]
                x = emit(node.target, x, *node.args[1:], **node.kwargs)
    return x


def _emit_op(emit: _Emitter, n: fx.Node, x: fx.Node, names, coord, *, wait: bool) -> tuple[fx.Node, bool]:
    """Emit one IR op; returns (value, whether it is a collective still to be waited on)."""
    name = ir.ir_name(n)
    params = n.args[1:]
    in_shape = _shape_at(n.args[0].meta["shape"], coord)
    if name == "all_reduce":
        group, op = params
        x = emit(C10D.all_reduce.default, x, op, names[group])
    elif name == "reduce_scatter":
        group, op, dim = params
        if dim != 0:
            x = emit.split_cat(x, in_shape[dim] // group.size, dim, group.size, 0)
        # (blocks of dim `dim` were stacked on dim 0: the result has the local shape)
        x = emit(C10D.reduce_scatter_tensor.default, x, op, group.size, names[group])
    elif name == "all_gather":
        group, dim = params
        x = emit(C10D.all_gather_into_tensor.default, x, group.size, names[group])
        if dim != 0:
            x = emit(C10D.wait_tensor.default, x)
            return emit.split_cat(x, in_shape[0], 0, group.size, dim), False
    elif name == "select_chunk":
        dim, count, index = params
        k = sym.evaluate(index, coord)
        size = in_shape[dim] // count
        x = emit(aten.slice.Tensor, x, dim, k * size, (k + 1) * size)
        return emit(aten.clone.default, x), False
    elif name == "divide":
        (divisor,) = params
        return emit(aten.div.Tensor, x, divisor), False
    else:  # pragma: no cover - checked before emitting
        raise Unlowerable(name)
    if wait:
        return emit(C10D.wait_tensor.default, x), False
    return x, True
