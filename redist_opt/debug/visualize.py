"""Pictures of plans: the IR graph as DOT and SVG, and a mesh diagram as SVG.

Everything here is written by our own code (no graphviz binary, no browser):

* :func:`plans_to_dot` / :func:`plan_to_dot`: the IR graph of one or more plans
  as Graphviz DOT text, one cluster per plan, collectives highlighted, and
  dashed edges for provenance (``node.meta["from_node"]``: which nodes of the
  previous plan a pass rewrote into this one).
* :func:`plan_graph_svg`: the same graph drawn as SVG with a simple layered
  layout (networkx builds the graph and gives the layers; each plan is a
  column, each layer a row).
* :func:`mesh_svg` (from :mod:`redist_opt.debug.mesh_diagram`): the mesh's ranks
  as a grid, then one panel per collective of each plan colouring which ranks it
  groups together.

SVG structure (what tests and tools may rely on): root ``<svg>``; each panel of a
mesh diagram is ``<g class="panel" data-title=...>`` holding exactly one
``<rect class="rank" data-rank=... data-group=...>`` per rank; each IR node of a
plan graph is ``<g class="node" data-plan=... data-node=... data-op=...>`` with one
``<rect>``; edges are ``<path class="edge flow">`` or ``<path class="edge from">``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

import networkx as nx

from redist_opt import ir
from redist_opt.debug import svg
from redist_opt.debug.mesh_diagram import MAX_DRAWN_RANKS, mesh_svg
from redist_opt.debug.svg import LINE_H, write_text
from redist_opt.ir import layout as L
from redist_opt.ir import symbolic as sym

__all__ = [
    "plan_graph",
    "plan_to_dot",
    "plans_to_dot",
    "plan_graph_svg",
    "mesh_svg",
    "write_text",
    "node_label_lines",
    "MAX_DRAWN_RANKS",
]

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
            g.add_node((label, "fallback"), plan=label, name="fallback", op="fallback",
                       collective=False, lines=["torch's own path:", str(plan.fallback_reason)])
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
        out.append(f"    label={_dot_id(label + ': ' + _plan_caption(plan))};")
        out.append('    fontname="monospace";')
        for n, data in g.nodes(data=True):
            if data["plan"] != label:
                continue
            fill = _node_fill(data)
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


def _plan_caption(plan) -> str:
    if plan.fallback:
        return "runs through torch"
    n = plan.num_collectives
    return f"{n} collective{'s' if n != 1 else ''}, {plan.bytes_per_rank} B in per rank"


def _node_fill(data) -> str:
    if data["collective"]:
        return COLLECTIVE_FILL.get(data["op"], "#f6bd60")
    if data["op"] in ("input", "output", "fallback"):
        return TERMINAL_FILL
    return LOCAL_FILL


# -- plan graph as SVG ---------------------------------------------------------

_PAD, _COL_GAP, _ROW_GAP, _HEAD, _BOX_GAP = 16.0, 90.0, 26.0, 44.0, 12.0

_MARKERS = (
    "<defs>"
    '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
    'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#444444"/></marker>'
    '<marker id="arrow-from" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
    'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#999999"/></marker>'
    "</defs>"
)


def _layers(g: nx.DiGraph, members: list) -> list[list]:
    """Rows of one plan's column: topological generations of its data flow."""
    sub = g.subgraph(members)
    flow = sub.edge_subgraph([(u, v) for u, v, d in sub.edges(data=True) if d["kind"] == "flow"]).copy()
    flow.add_nodes_from(members)
    return [sorted(layer, key=members.index) for layer in nx.topological_generations(flow)]


def _layout(g: nx.DiGraph, plans) -> tuple[dict, list, float, float]:
    """(node -> box (x, y, w, h), columns (label, plan, x, width, bottom), width, height)."""
    boxes: dict = {}
    x = _PAD
    columns = []
    for label, plan in plans:
        members = [n for n, d in g.nodes(data=True) if d["plan"] == label]
        layers = _layers(g, members)
        sizes = {
            n: (max(svg.text_w(s) for s in g.nodes[n]["lines"]) + 16, len(g.nodes[n]["lines"]) * LINE_H + 10)
            for n in members
        }
        col_w = max(
            [sum(sizes[n][0] for n in layer) + _BOX_GAP * (len(layer) - 1) for layer in layers]
            + [svg.text_w(label + ": " + _plan_caption(plan)) + 4]
        )
        y = _PAD + _HEAD
        for layer in layers:
            layer_w = sum(sizes[n][0] for n in layer) + _BOX_GAP * (len(layer) - 1)
            lx = x + (col_w - layer_w) / 2
            for n in layer:
                w, h = sizes[n]
                boxes[n] = (lx, y, w, h)
                lx += w + _BOX_GAP
            y += max(sizes[n][1] for n in layer) + _ROW_GAP
        columns.append((label, plan, x, col_w, y))
        x += col_w + _COL_GAP
    width = x - _COL_GAP + _PAD
    height = max((c[4] for c in columns), default=_PAD + _HEAD) - _ROW_GAP + _PAD
    return boxes, columns, width, height


def _edge_svg(kind: str, src_box, dst_box) -> str:
    """A data-flow arrow (straight down) or a dashed provenance curve (side to side)."""
    x0, y0, w0, h0 = src_box
    x1, y1, w1, h1 = dst_box
    if kind == "flow":
        return (
            f'<path class="edge flow" d="M {x0 + w0 / 2:.1f} {y0 + h0:.1f} L {x1 + w1 / 2:.1f} {y1:.1f}" '
            'stroke="#444444" stroke-width="1.2" fill="none" marker-end="url(#arrow)"/>'
        )
    sx, sy, ex, ey = x0 + w0, y0 + h0 / 2, x1, y1 + h1 / 2
    mx = (sx + ex) / 2
    return (
        f'<path class="edge from" d="M {sx:.1f} {sy:.1f} C {mx:.1f} {sy:.1f}, {mx:.1f} {ey:.1f}, '
        f'{ex:.1f} {ey:.1f}" stroke="#999999" stroke-width="1.2" stroke-dasharray="5,4" '
        'fill="none" marker-end="url(#arrow-from)"/>'
    )


def _node_svg(d: dict, box) -> list[str]:
    """One IR node: a ``<g class="node">`` with its box and its label lines."""
    bx, by, bw, bh = box
    stroke, sw = ("#333333", 2.0) if d["collective"] else ("#888888", 1.0)
    out = [
        f'<g class="node{" collective" if d["collective"] else ""}" data-plan={quoteattr(d["plan"])} '
        f'data-node={quoteattr(d["name"])} data-op={quoteattr(d["op"])}>',
        f"<title>{escape(chr(10).join(d['lines']))}</title>",
        f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" '
        f'fill="{_node_fill(d)}" stroke="{stroke}" stroke-width="{sw}"/>',
    ]
    for i, line in enumerate(d["lines"]):
        weight = "bold" if i == 0 and d["collective"] else None
        fill = "#666666" if line.startswith("<- ") else "#222222"
        out.append(svg.text(bx + 8, by + 5 + (i + 1) * LINE_H - 3, line, weight=weight, fill=fill))
    out.append("</g>")
    return out


def plan_graph_svg(plans: Sequence[tuple[str, object]] | object, *, title: str | None = None) -> str:
    """The IR of one plan, or of several ``(label, plan)`` side by side, as SVG.

    Layered layout: each plan is a column; networkx's topological generations of
    the plan's data-flow graph give the rows (an IR chain is one node per row).
    Collectives are filled by kind and drawn bold; dashed curves show provenance.
    """
    if not isinstance(plans, (list, tuple)):
        plans = [("plan", plans)]
    g = plan_graph(plans)
    boxes, columns, width, height = _layout(g, plans)
    title = title or " | ".join(label for label, _ in plans)
    out = svg.svg_open(width, height, f"redist_opt plan graph: {title}")
    out.append(_MARKERS)
    for label, plan, cx, _, _ in columns:
        out.append(svg.text(cx, _PAD + 14, label, weight="bold", size=14))
        out.append(svg.text(cx, _PAD + 30, _plan_caption(plan), size=11, fill="#555555"))
    for u, v, d in g.edges(data=True):
        out.append(_edge_svg(d["kind"], boxes[u], boxes[v]))
    for n, d in g.nodes(data=True):
        out.extend(_node_svg(d, boxes[n]))
    out.append("</svg>")
    return "\n".join(out) + "\n"
