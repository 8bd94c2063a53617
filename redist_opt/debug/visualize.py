"""Pictures of plans: the IR graph as DOT and SVG, and a mesh diagram as SVG.

Everything here is written by our own code (no graphviz binary, no browser):

* :func:`plans_to_dot` / :func:`plan_to_dot` (from :mod:`redist_opt.debug.dot`):
  the IR graph of one or more plans as Graphviz DOT text, one cluster per plan, collectives highlighted, and
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

from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

import networkx as nx

from redist_opt.debug import svg
from redist_opt.debug.dot import (
    node_fill,
    node_label_lines,
    plan_caption,
    plan_graph,
    plan_to_dot,
    plans_to_dot,
)
from redist_opt.debug.mesh_diagram import MAX_DRAWN_RANKS, mesh_svg
from redist_opt.debug.svg import LINE_H, write_text

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
            + [svg.text_w(label + ": " + plan_caption(plan)) + 4]
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
        f"data-node={quoteattr(d['name'])} data-op={quoteattr(d['op'])}>",
        f"<title>{escape(chr(10).join(d['lines']))}</title>",
        f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" '
        f'fill="{node_fill(d)}" stroke="{stroke}" stroke-width="{sw}"/>',
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
        out.append(svg.text(cx, _PAD + 30, plan_caption(plan), size=11, fill="#555555"))
    for u, v, d in g.edges(data=True):
        out.append(_edge_svg(d["kind"], boxes[u], boxes[v]))
    for n, d in g.nodes(data=True):
        out.extend(_node_svg(d, boxes[n]))
    out.append("</svg>")
    return "\n".join(out) + "\n"
