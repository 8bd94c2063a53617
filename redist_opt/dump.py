"""Text dumps of plans: what each collective does, over which ranks, moving how much."""

from __future__ import annotations

from . import ir
from . import layout as L
from . import symbolic as sym
from .placements import placement_str, placements_str

__all__ = ["format_plan", "format_graph"]


def _arg_str(a, names) -> str:
    if isinstance(a, sym.sympy.Basic):
        return sym.expr_str(a, names)
    if hasattr(a, "layout") and hasattr(a, "dims"):
        return "{" + "+".join(names.get(d, str(d)) for d in a.dims) + f" {L.format_layout(a.layout)}" + "}"
    return repr(a) if isinstance(a, str) else str(a)


def format_graph(plan) -> str:
    """One line per IR op: ``%name = op(args)  : local shape``."""
    names = {d: plan.mesh.dim_name(d) for d in range(plan.mesh.ndim)}
    lines = []
    for node in plan.graph.graph.nodes:
        if node.op == "placeholder":
            shape = ", ".join(sym.expr_str(s, names) for s in node.meta["shape"])
            lines.append(f"%x : ({shape})")
        elif node.op == "output":
            lines.append(f"return %{node.args[0].name}")
        else:
            args = ", ".join(_arg_str(a, names) for a in node.args[1:])
            shape = ", ".join(sym.expr_str(s, names) for s in node.meta["shape"])
            lines.append(f"%{node.name} = {ir.ir_name(node)}(%{node.args[0].name}, {args}) : ({shape})")
    return "\n".join(lines)


def format_plan(plan) -> str:
    head = (
        f"redistribute {placements_str(plan.src)} -> {placements_str(plan.dst)} "
        f"on mesh ({plan.mesh.shape_str}), shape {tuple(plan.shape)}, {str(plan.dtype).replace('torch.', '')}"
    )
    if plan.fallback:
        return head + f"\n  runs through torch's own path: {plan.fallback_reason}"
    colls = plan.collectives()
    lines = [head, f"  {len(colls)} collective(s), {plan.bytes_per_rank} bytes in per rank (max)"]
    for c in colls:
        op = f" {c.reduce_op}" if c.reduce_op else ""
        lines.append(
            f"  - {c.kind}{op} over {c.group.name(plan.mesh)} "
            f"[{L.format_layout(c.group.layout)}], {c.bytes_in} B in"
        )
    lines.append(format_graph(plan))
    return "\n".join(lines)
