"""The IR as text: the printer (``str(plan)``, explain's IR, and the parseable text).

:func:`format_ir` prints everything the passes read; ``redist_opt.ir.parse.parse_ir``
reads it back into a :class:`~redist_opt.ir.plan.Plan` that prints the same and
behaves the same under every pass (the parser sits above ``plan``, this printer
below it, so ``Plan.__str__`` can use it). Pass tests are written in it (IR in, IR out)::

    redistribute [P, P, P] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
    mesh flattened=[a+c]
    %x : (8, 4)
    step 1 over b: P -> S(0), logical=(8, 4)
      %reduce_scatter = reduce_scatter(%x, {b 2:2}, 'sum', 0) : (4, 4)
    step 0 over a+c: P -> R, logical=(8, 4)
      %all_reduce = all_reduce(%reduce_scatter, {a+c (2,2):(4,1)}, 'sum') : (4, 4)  # <- %all_reduce, %all_reduce_1
    return %all_reduce

* Line 1 is the request (what ``str(plan)`` starts with): source and destination
  placements, the mesh's dim names and sizes, the global shape, the dtype.
* ``mesh ...`` (only when any is set): ``flattened=[...]`` groups that exist (dim
  names joined by ``+``, or a CuTe layout), ``backend=``, and for meshes that are
  not row-major ``layouts=[...]`` (one per dim), ``index_space=``, ``ranks_ascending=``,
  ``preserve_rank_order=`` (torch 2.15's DeviceMesh option: groups keep the layout's order).
* ``step INDEX over DIMS: SRC -> DST, logical=(...)[, avg_scale=N][, variant=NAME(...)]``
  opens the region of one planner step (:class:`~redist_opt.ir.StepInfo`: its index,
  mesh dims, placements, logical shape); the indented ops below it implement that
  step (a pass reorders steps, so indices need not ascend; steps over size-1 mesh
  dims lower to no op and do not appear). ``variant=`` names a step variant of
  :data:`redist_opt.ir.ops.STEP_VARIANTS` and its parts, tensor dim: mesh dims:
  ``split_all_to_all(1: a, 2: b)`` (one all_to_all whose mesh dims ``a`` split
  tensor dim 1 and ``b`` tensor dim 2) and ``gather_blocks(0: a, 1: b)`` (tensor
  dim 0 gathered over ``a``, 1 over ``b``).
* Op lines are :func:`format_graph`'s: ``%name = op(%input, args) : (local shape)``,
  then ``  # <- %a, %b`` for the nodes a pass rewrote into this one. Groups are
  ``{dims layout}``; sizes are expressions in the mesh coordinates ``c_<dim name>``
  (``chunk(5,2,c_a)``, ``ceildiv(x,n)``). The shape after ``:`` may be left out of
  hand-written text: the parser derives it (and checks it when given).
* ``fallback: REASON`` replaces the graph of a plan that runs through torch.

Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import torch.fx as fx

from redist_opt.ir import layout as L
from redist_opt.ir import ops
from redist_opt.ir import symbolic as sym
from redist_opt.ir.layout_algebra import FlatLayout, row_major
from redist_opt.ir.mesh import MeshGroup, MeshSpec
from redist_opt.ir.placements import placement_str, placements_str

__all__ = [
    "format_graph",
    "format_plan",
    "format_ir",
    "mesh_str",
    "arg_str",
    "shape_str",
    "head",
    "note_str",
    "dtype_str",
]


# -- the op lines (shared by explain and the parseable text) -----------------------


def arg_str(a, names) -> str:
    """One IR op argument as text: expressions, groups ``{a+c (2,2):(4,1)}``, tuples."""
    if isinstance(a, sym.sympy.Basic):
        return sym.expr_str(a, names)
    if isinstance(a, MeshGroup):
        return "{" + "+".join(names.get(d, str(d)) for d in a.dims) + f" {L.format_layout(a.layout)}" + "}"
    if isinstance(a, tuple):
        inner = ", ".join(arg_str(x, names) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(arg_str(x, names) for x in a) + "]"
    return repr(a) if isinstance(a, str) else str(a)


def shape_str(shape, names) -> str:
    return "(" + ", ".join(sym.expr_str(s, names) for s in shape) + ")"


def _node_line(node: fx.Node, names) -> str:
    if node.op == "placeholder":
        return f"%{node.name} : {shape_str(node.meta['shape'], names)}"
    if node.op == "output":
        return f"return %{node.args[0].name}"
    args = ", ".join(arg_str(a, names) for a in node.args[1:])
    shape = shape_str(node.meta["shape"], names)
    line = f"%{node.name} = {ops.ir_name(node)}(%{node.args[0].name}, {args}) : {shape}"
    src = ops.from_nodes(node)
    if src:
        line += "  # <- " + ", ".join("%" + s for s in src)
    return line


def format_graph(plan) -> str:
    """One line per IR op: ``%name = op(args) : (local shape)  # <- %provenance``."""
    names = plan.mesh.dim_names_by_index()
    return "\n".join(_node_line(node, names) for node in plan.graph.graph.nodes)


# -- str(plan) ---------------------------------------------------------------------


def dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


def head(plan) -> str:
    """The request line: ``redistribute SRC -> DST on mesh (...), shape (...), dtype``."""
    return (
        f"redistribute {placements_str(plan.src)} -> {placements_str(plan.dst)} "
        f"on mesh ({plan.mesh.shape_str}), shape {tuple(plan.shape)}, {dtype_str(plan.dtype)}"
    )


def note_str(note: dict) -> str:
    """``+ [pass] what: reason`` for a rewrite made, ``- [pass] what: not made: reason`` otherwise."""
    if note["made"]:
        return f"+ [{note['pass']}] {note['what']}: {note['reason']}"
    return f"- [{note['pass']}] {note['what']}: not made: {note['reason']}"


def format_plan(plan) -> str:
    """The plan as text (``str(plan)``): request, collectives, passes and notes, IR."""
    lines = [head(plan)]
    if plan.fallback:
        return lines[0] + f"\n  runs through torch's own path: {plan.fallback_reason}"
    colls = plan.collectives()
    lines.append(f"  {len(colls)} collective(s), {plan.bytes_per_rank} bytes in per rank (max)")
    for c in colls:
        op = f" {c.reduce_op}" if c.reduce_op else ""
        lines.append(
            f"  - {c.kind}{op} over {c.group.name(plan.mesh)} "
            f"[{L.format_layout(c.group.layout)}], {c.bytes_in} B in"
        )
    if plan.applied_passes:
        lines.append("  passes that changed the plan: " + ", ".join(plan.applied_passes))
    if plan.cost_profile:
        lines.append(f"  cost model: {plan.cost_profile}")
    for n in plan.notes:
        lines.append(
            "  " + note_str({"pass": n.pass_name, "made": n.made, "what": n.what, "reason": n.reason})
        )
    lines.append(format_graph(plan))
    return "\n".join(lines)


def dims_str(dims, mesh: MeshSpec) -> str:
    return "+".join(mesh.dim_name(d) for d in dims)


# -- the parseable text ------------------------------------------------------------


def _step_line(step: ops.StepInfo, mesh: MeshSpec, names) -> str:
    line = (
        f"step {step.index} over {dims_str(step.mesh_dims, mesh)}: "
        f"{placement_str(step.src)} -> {placement_str(step.dst)}, "
        f"logical={shape_str(step.logical_shape, names)}"
    )
    if step.avg_scale != 1:
        line += f", avg_scale={step.avg_scale}"
    if step.variant:  # a step of ir.ops.STEP_VARIANTS: its parts, as tensor dim: mesh dims
        parts = ", ".join(f"{t}: {dims_str(dims, mesh)}" for t, dims in step.parts)
        line += f", variant={step.variant}({parts})"
    return line


def mesh_str(mesh: MeshSpec) -> str:
    """A mesh in one line, as the IR text names it: ``(a=2, b=2)`` then its ``mesh`` line's
    items (flattened groups, backend, layouts) where it has any."""
    line = _mesh_line(mesh)
    return f"({mesh.shape_str})" + ("" if line is None else " " + line.removeprefix("mesh "))


def _mesh_line(mesh: MeshSpec) -> str | None:
    items = []
    if mesh.flattened:
        flat = [
            L.format_layout(g) if isinstance(g, FlatLayout) else dims_str(mesh.dims_of(g), mesh)
            for g in mesh.flattened
        ]
        items.append("flattened=[" + ", ".join(flat) + "]")
    if mesh.backend is not None:
        items.append(f"backend={mesh.backend}")
    if tuple(mesh.dim_layouts) != tuple(row_major(mesh.sizes)):
        items.append("layouts=[" + ", ".join(L.format_layout(x) for x in mesh.dim_layouts) + "]")
    if mesh.index_space != mesh.num_ranks:
        items.append(f"index_space={mesh.index_space}")
    if not mesh.ranks_ascending:
        items.append("ranks_ascending=False")
    if mesh.preserve_rank_order:
        items.append("preserve_rank_order=True")
    return "mesh " + " ".join(items) if items else None


def format_ir(plan) -> str:
    """The plan as parseable IR text (see the module docstring); ``ir.parse.parse_ir`` reads it."""
    mesh = plan.mesh
    names = mesh.dim_names_by_index()
    lines = [head(plan)]
    mesh_line = _mesh_line(mesh)
    if mesh_line:
        lines.append(mesh_line)
    if plan.graph is None:
        lines.append(f"fallback: {plan.fallback_reason}")
        return "\n".join(lines)
    step = None
    for node in plan.graph.graph.nodes:
        if node.op == "call_function":
            s = node.meta.get("step")
            if s is not step:
                step = s
                if s is not None:
                    lines.append(_step_line(s, mesh, names))
            lines.append(("  " if s is not None else "") + _node_line(node, names))
        else:
            lines.append(_node_line(node, names))
    return "\n".join(lines)
