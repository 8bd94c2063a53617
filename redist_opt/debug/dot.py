"""The IR graph of plans: a networkx graph and Graphviz DOT text.

* :func:`plan_graph`: one DiGraph holding the IR of several plans, with data-flow
  edges and provenance edges (``node.meta["from_node"]``: which nodes of the
  previous plan a pass rewrote into this one);
* :func:`plans_to_dot` / :func:`plan_to_dot`: that graph as DOT, one cluster per
  plan, collectives highlighted, provenance dashed. The per-pass dumps write it.

The SVG pictures (:mod:`redist_opt.debug.visualize`) draw the same graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import networkx as nx

from redist_opt import ir
from redist_opt.ir import layout as L
from redist_opt.ir import symbolic as sym

__all__ = ["plan_graph", "plan_to_dot", "plans_to_dot", "node_label_lines", "plan_caption", "node_fill"]

COLLECTIVE_FILL = {
    "all_reduce": "#f6bd60",
    "reduce_scatter": "#f28482",
    "all_gather": "#9ed2b4",
    "all_to_all": "#b9b5f0",
}
LOCAL_FILL = "#ffffff"
TERMINAL_FILL = "#eeeeee"


# -- the graph -----------------------------------------------------------------


def _arg_str(a, names) -> str:
    if isinstance(a, sym.sympy.Basic):
        return sym.expr_str(a, names)
    if hasattr(a, "layout") and hasattr(a, "dims"):
        return "+".join(names.get(d, str(d)) for d in a.dims) + " " + L.format_layout(a.layout)
    if isinstance(a, (tuple, list)):
        return "(" + ", ".join(_arg_str(x, names) for x in a) + (",)" if len(a) == 1 else ")")
    return repr(a) if isinstance(a, str) else str(a)


def _named_args(node, names) -> str:
    """``tp 2:1, dim=1``: the group bare, other parameters by name (from the op's signature)."""
    op = ir.OPS.get(ir.ir_name(node))
    try:
        params = list(inspect.signature(op.shape_fn).parameters)[1:]
    except (TypeError, ValueError, AttributeError):
        params = []
    parts = []
    for i, a in enumerate(node.args[1:]):
        text = _arg_str(a, names)
        if hasattr(a, "layout") and hasattr(a, "dims"):
            parts.append(text)
        elif i < len(params):
            parts.append(f"{params[i]}={text}")
        else:
            parts.append(text)
    return ", ".join(parts)


def node_label_lines(plan, node, bytes_in: int | None = None) -> list[str]:
    """The text of one IR node in a picture: op, arguments, local shape, bytes, provenance."""
    names = plan.mesh.dim_names_by_index()
    shape = "(" + ", ".join(sym.expr_str(s, names) for s in node.meta.get("shape", ())) + ")"
    if node.op == "placeholder":
        return [f"%{node.name}: input", shape]
    if node.op == "output":
        return [f"return %{node.args[0].name}"]
    lines = [f"%{node.name} = {ir.ir_name(node)}", _named_args(node, names), shape]
    if bytes_in is not None:
        lines.append(f"{bytes_in} B in per rank")
    src = ir.from_nodes(node)
    if src:
        lines.append("<- " + ", ".join("%" + s for s in src))
    return lines


def plan_graph(plans: Sequence[tuple[str, object]]) -> nx.DiGraph:
    """One DiGraph holding the IR of every ``(label, plan)``.

    Nodes are ``(label, node_name)`` with attributes ``plan``, ``name``, ``op``
    (IR op, ``input`` or ``output``), ``collective``, ``lines`` (label text);
    edges have ``kind`` ``"flow"`` (data flow inside a plan) or ``"from"``
    (provenance: a node of the previous plan that a pass rewrote into this one).
    """
    g = nx.DiGraph()
    previous_names: set[str] = set()
    previous_label = None
    for label, plan in plans:
        if plan.graph is None:
            g.add_node(
                (label, "fallback"),
                plan=label,
                name="fallback",
                op="fallback",
                collective=False,
                lines=["torch's own path:", str(plan.fallback_reason)],
            )
            previous_names, previous_label = set(), label
            continue
        bytes_of = {c.node: c.bytes_in for c in plan.collectives()}
        names_here = set()
        for node in plan.graph.graph.nodes:
            op = {"placeholder": "input", "output": "output"}.get(node.op) or ir.ir_name(node) or node.op
            g.add_node(
                (label, node.name),
                plan=label,
                name=node.name,
                op=op,
                collective=ir.is_collective(node),
                lines=node_label_lines(plan, node, bytes_of.get(node.name)),
            )
            names_here.add(node.name)
            for inp in node.all_input_nodes:
                g.add_edge((label, inp.name), (label, node.name), kind="flow")
            if previous_label is not None:
                for src in ir.from_nodes(node):
                    if src in previous_names:
                        g.add_edge((previous_label, src), (label, node.name), kind="from")
        previous_names, previous_label = names_here, label
    return g


# -- DOT -----------------------------------------------------------------------


def _dot_id(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_label(lines: Sequence[str]) -> str:
    body = "".join(line.replace("\\", "\\\\").replace('"', '\\"') + "\\l" for line in lines)
    return '"' + body + '"'


def plans_to_dot(plans: Sequence[tuple[str, object]], *, name: str = "redist_opt") -> str:
    """Graphviz DOT text for the IR of every ``(label, plan)``, one cluster each."""
    g = plan_graph(plans)
    out = [
        f"digraph {_dot_id(name)} {{",
        "  rankdir=TB;",
        '  node [shape=box, fontname="monospace", fontsize=10, style="rounded,filled", fillcolor="#ffffff"];',
        '  edge [fontname="monospace", fontsize=9];',
    ]
    for i, (label, plan) in enumerate(plans):
        out.append(f"  subgraph cluster_{i} {{")
        out.append(f"    label={_dot_id(label + ': ' + plan_caption(plan))};")
        out.append('    fontname="monospace";')
        for _node, data in g.nodes(data=True):
            if data["plan"] != label:
                continue
            fill = node_fill(data)
            style = '"rounded,filled,bold"' if data["collective"] else '"rounded,filled"'
            out.append(
                f"    {_dot_id(label + '/' + data['name'])} [label={_dot_label(data['lines'])}, "
                f'fillcolor="{fill}", style={style}];'
            )
        out.append("  }")
    for u, v, data in g.edges(data=True):
        a, b = _dot_id(u[0] + "/" + u[1]), _dot_id(v[0] + "/" + v[1])
        if data["kind"] == "flow":
            out.append(f"  {a} -> {b};")
        else:
            out.append(f'  {a} -> {b} [style=dashed, color="#888888", constraint=false];')
    out.append("}")
    return "\n".join(out) + "\n"


def plan_to_dot(plan, *, name: str = "plan") -> str:
    """DOT text for one plan's IR."""
    return plans_to_dot([(name, plan)], name=name)


def plan_caption(plan) -> str:
    if plan.fallback:
        return "runs through torch"
    n = plan.num_collectives
    return f"{n} collective{'s' if n != 1 else ''}, {plan.bytes_per_rank} B in per rank"


def node_fill(data) -> str:
    if data["collective"]:
        return COLLECTIVE_FILL.get(data["op"], "#f6bd60")
    if data["op"] in ("input", "output", "fallback"):
        return TERMINAL_FILL
    return LOCAL_FILL
