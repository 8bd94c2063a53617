"""Pictures of plans: the IR graph as DOT and SVG, and a mesh diagram as SVG.

Everything here is written by our own code (no graphviz binary, no browser):

* :func:`plans_to_dot` / :func:`plan_to_dot`: the IR graph of one or more plans
  as Graphviz DOT text, one cluster per plan, collectives highlighted, and
  dashed edges for provenance (``node.meta["from_node"]``: which nodes of the
  previous plan a pass rewrote into this one).
* :func:`plan_graph_svg`: the same graph drawn as SVG with a simple layered
  layout (networkx builds the graph and gives the layers; each plan is a
  column, each layer a row).
* :func:`mesh_svg`: the mesh's ranks as a grid (1-D: one row; 2-D: rows x
  columns; 3-D and up: one small grid of the last two dims per coordinate of the
  leading dims), then one panel per collective of each plan colouring which
  ranks it groups together (``redist_opt.ir.layout.rank_lists``); a rank's small
  number is its position in its group (the chunk order of a gather/scatter).

SVG structure (what tests and tools may rely on): root ``<svg>``; each panel of a
mesh diagram is ``<g class="panel" data-title=...>`` holding exactly one
``<rect class="rank" data-rank=... data-group=...>`` per rank; each IR node of a
plan graph is ``<g class="node" data-plan=... data-node=... data-op=...>`` with one
``<rect>``; edges are ``<path class="edge flow">`` or ``<path class="edge from">``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import networkx as nx

from redist_opt import ir
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

# Mesh diagrams draw every rank; beyond this they would be unreadable anyway.
MAX_DRAWN_RANKS = 1024

COLLECTIVE_FILL = {
    "all_reduce": "#f6bd60",
    "reduce_scatter": "#f28482",
    "all_gather": "#9ed2b4",
    "all_to_all": "#b9b5f0",
}
LOCAL_FILL = "#ffffff"
TERMINAL_FILL = "#eeeeee"
# Light, distinguishable fills for rank groups (ColorBrewer Set3), then golden-angle hues.
GROUP_PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
)

FONT = 12
CHAR_W = 7.2  # monospace advance at FONT px, for sizing boxes
LINE_H = 15


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


# -- SVG helpers ---------------------------------------------------------------


def _text_w(text: str, size: float = FONT) -> float:
    return len(text) * CHAR_W * size / FONT


def _svg_open(width: float, height: float, title: str) -> list[str]:
    w, h = math.ceil(width), math.ceil(height)
    return [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="monospace" font-size="{FONT}">',
        f"<title>{escape(title)}</title>",
        f'<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>',
    ]


def _text(x, y, s, *, size=FONT, anchor="start", weight=None, fill="#222222", cls=None) -> str:
    attrs = f'x="{x:.1f}" y="{y:.1f}"'
    if size != FONT:
        attrs += f' font-size="{size}"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if weight:
        attrs += f' font-weight="{weight}"'
    if fill != "#222222":
        attrs += f' fill="{fill}"'
    if cls:
        attrs += f' class="{cls}"'
    return f"<text {attrs}>{escape(s)}</text>"


def write_text(path, text: str) -> Path:
    """Write ``text`` to ``path`` (parents created); returns the Path."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


# -- plan graph as SVG ---------------------------------------------------------


def plan_graph_svg(plans: Sequence[tuple[str, object]] | object, *, title: str | None = None) -> str:
    """The IR of one plan, or of several ``(label, plan)`` side by side, as SVG.

    Layered layout: each plan is a column; networkx's topological generations of
    the plan's data-flow graph give the rows (an IR chain is one node per row).
    Collectives are filled by kind and drawn bold; dashed curves show provenance.
    """
    if not isinstance(plans, (list, tuple)):
        plans = [("plan", plans)]
    g = plan_graph(plans)
    pad, col_gap, row_gap, head = 16.0, 90.0, 26.0, 44.0
    boxes: dict = {}
    x = pad
    columns = []
    for label, plan in plans:
        members = [n for n, d in g.nodes(data=True) if d["plan"] == label]
        flow = g.subgraph(members).edge_subgraph(
            [(u, v) for u, v, d in g.subgraph(members).edges(data=True) if d["kind"] == "flow"]
        ).copy()
        flow.add_nodes_from(members)
        layers = [sorted(layer, key=members.index) for layer in nx.topological_generations(flow)]
        sizes = {
            n: (max(_text_w(s) for s in g.nodes[n]["lines"]) + 16, len(g.nodes[n]["lines"]) * LINE_H + 10)
            for n in members
        }
        col_w = max(
            [sum(sizes[n][0] for n in layer) + 12 * (len(layer) - 1) for layer in layers]
            + [_text_w(label + ": " + _plan_caption(plan)) + 4]
        )
        y = pad + head
        for layer in layers:
            layer_w = sum(sizes[n][0] for n in layer) + 12 * (len(layer) - 1)
            lx = x + (col_w - layer_w) / 2
            for n in layer:
                w, h = sizes[n]
                boxes[n] = (lx, y, w, h)
                lx += w + 12
            y += max(sizes[n][1] for n in layer) + row_gap
        columns.append((label, plan, x, col_w, y))
        x += col_w + col_gap
    width = x - col_gap + pad
    height = max((c[4] for c in columns), default=pad + head) - row_gap + pad
    title = title or " | ".join(label for label, _ in plans)
    out = _svg_open(width, height, f"redist_opt plan graph: {title}")
    out.append(
        "<defs>"
        '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#444444"/></marker>'
        '<marker id="arrow-from" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#999999"/></marker>'
        "</defs>"
    )
    for label, plan, cx, cw, _ in columns:
        out.append(_text(cx, pad + 14, label, weight="bold", size=14))
        out.append(_text(cx, pad + 30, _plan_caption(plan), size=11, fill="#555555"))
    for u, v, d in g.edges(data=True):
        x0, y0, w0, h0 = boxes[u]
        x1, y1, w1, h1 = boxes[v]
        if d["kind"] == "flow":
            out.append(
                f'<path class="edge flow" d="M {x0 + w0 / 2:.1f} {y0 + h0:.1f} L {x1 + w1 / 2:.1f} {y1:.1f}" '
                'stroke="#444444" stroke-width="1.2" fill="none" marker-end="url(#arrow)"/>'
            )
        else:
            sx, sy, ex, ey = x0 + w0, y0 + h0 / 2, x1, y1 + h1 / 2
            mx = (sx + ex) / 2
            out.append(
                f'<path class="edge from" d="M {sx:.1f} {sy:.1f} C {mx:.1f} {sy:.1f}, {mx:.1f} {ey:.1f}, '
                f'{ex:.1f} {ey:.1f}" stroke="#999999" stroke-width="1.2" stroke-dasharray="5,4" '
                'fill="none" marker-end="url(#arrow-from)"/>'
            )
    for n, d in g.nodes(data=True):
        bx, by, bw, bh = boxes[n]
        stroke, sw = ("#333333", 2.0) if d["collective"] else ("#888888", 1.0)
        out.append(
            f'<g class="node{" collective" if d["collective"] else ""}" data-plan={quoteattr(d["plan"])} '
            f'data-node={quoteattr(d["name"])} data-op={quoteattr(d["op"])}>'
        )
        out.append(f"<title>{escape(chr(10).join(d['lines']))}</title>")
        out.append(
            f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" '
            f'fill="{_node_fill(d)}" stroke="{stroke}" stroke-width="{sw}"/>'
        )
        for i, line in enumerate(d["lines"]):
            weight = "bold" if i == 0 and d["collective"] else None
            fill = "#666666" if line.startswith("<- ") else "#222222"
            out.append(_text(bx + 8, by + 5 + (i + 1) * LINE_H - 3, line, weight=weight, fill=fill))
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- mesh diagram --------------------------------------------------------------


def _mesh_cells(mesh) -> list[tuple[tuple[int, ...], int]]:
    """(coordinates, rank index in the root rank map) of every rank, row-major."""
    members = [L.rank_lists(lay, mesh.index_space, limit=1)[0] for lay in mesh.dim_layouts]
    cells = []
    for linear in range(mesh.num_ranks):
        coords, rem = [], linear
        for s in reversed(mesh.sizes):
            rem, c = divmod(rem, s)
            coords.append(c)
        coords = tuple(reversed(coords))
        cells.append((coords, sum(members[d][c] for d, c in enumerate(coords))))
    return cells


def _group_fill(i: int) -> str:
    if i < len(GROUP_PALETTE):
        return GROUP_PALETTE[i]
    return f"hsl({(i * 137.508) % 360:.0f}, 65%, 78%)"


def _group_of_rank(group, mesh) -> dict[int, tuple[int, int]]:
    """rank index -> (group number, position in group), groups numbered by first appearance."""
    lists = L.rank_lists(group.layout, mesh.index_space)
    out = {}
    for gi, members in enumerate(lists):
        for pos, r in enumerate(members):
            out[r] = (gi, pos)
    return out


def mesh_svg(mesh, plans: Sequence[tuple[str, object]] = (), *, groups: Sequence[tuple[str, object]] = ()) -> str:
    """The mesh's ranks, then one panel per collective of each plan (and per extra group).

    ``plans`` is a sequence of ``(label, Plan)``; ``groups`` a sequence of
    ``(title, MeshGroup)`` for panels not tied to a plan. Raises ValueError for a
    mesh of more than :data:`MAX_DRAWN_RANKS` ranks.
    """
    if mesh.num_ranks > MAX_DRAWN_RANKS:
        raise ValueError(
            f"mesh ({mesh.shape_str}) has {mesh.num_ranks} ranks; diagrams are drawn up to "
            f"{MAX_DRAWN_RANKS} ranks"
        )
    cells = _mesh_cells(mesh)
    nd = mesh.ndim
    rows_n = mesh.sizes[-2] if nd >= 2 else 1
    cols_n = mesh.sizes[-1]
    lead = mesh.sizes[:-2] if nd >= 2 else ()
    n_multiples = math.prod(lead) if lead else 1
    per_row = min(n_multiples, max(1, 8 if cols_n <= 4 else 4))
    cell, gap = 30.0, 3.0
    grid_w, grid_h = cols_n * (cell + gap) - gap, rows_n * (cell + gap) - gap
    mult_label_h = 16.0 if lead else 0.0
    mult_gap = 18.0
    mrows = math.ceil(n_multiples / per_row)
    body_w = per_row * (grid_w + mult_gap) - mult_gap
    body_h = mrows * (grid_h + mult_label_h + mult_gap) - mult_gap
    title_h = 34.0
    panel_w = max(body_w, 240.0)
    panel_h = title_h + body_h
    pad, panel_gap = 16.0, 22.0

    # Sections: (heading, [(title, subtitle, group or None)])
    sections: list[tuple[str, list]] = [("ranks", [("ranks (index in the root rank map)", _axes_caption(mesh), None)])]
    for label, plan in plans:
        items = []
        for i, c in enumerate(plan.collectives(), 1):
            op = f" {c.reduce_op}" if c.reduce_op else ""
            n_groups = mesh.num_ranks // max(1, c.group.size)
            items.append(
                (
                    f"{label} #{i}: {c.kind}{op} over {c.group.name(mesh)}",
                    f"{L.format_layout(c.group.layout)}, {n_groups} group{'s' if n_groups != 1 else ''} "
                    f"of {c.group.size}",
                    c.group,
                )
            )
        if not items:
            why = "runs through torch" if plan.fallback else "no collectives"
            items.append((f"{label}: {why}", "", None))
        sections.append((label, items))
    if groups:
        sections.append(("groups", [(t, L.format_layout(gr.layout), gr) for t, gr in groups]))

    # Panel widths must fit their titles.
    def title_w(item):
        return max(_text_w(item[0], 12), _text_w(item[1], 11)) + 4

    heading_h = 22.0
    max_panels = max(len(items) for _, items in sections)
    panel_w = max([panel_w] + [title_w(it) for _, items in sections for it in items])
    wrap = max(1, min(max_panels, max(1, int(1400 // (panel_w + panel_gap)))))
    width = pad * 2 + wrap * (panel_w + panel_gap) - panel_gap
    height = pad
    for _, items in sections:
        height += heading_h + math.ceil(len(items) / wrap) * (panel_h + panel_gap)
    height += pad - panel_gap
    out = _svg_open(width, height, f"redist_opt mesh diagram: mesh ({mesh.shape_str})")
    y = pad
    for heading, items in sections:
        out.append(_text(pad, y + 15, heading, size=14, weight="bold", cls="section"))
        y += heading_h
        for k, (ptitle, subtitle, group) in enumerate(items):
            px = pad + (k % wrap) * (panel_w + panel_gap)
            py = y + (k // wrap) * (panel_h + panel_gap)
            out.extend(
                _panel(mesh, cells, ptitle, subtitle, group, px, py, panel_w, panel_h, title_h,
                       cell, gap, grid_w, grid_h, mult_label_h, mult_gap, per_row, lead)
            )
        y += math.ceil(len(items) / wrap) * (panel_h + panel_gap)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _axes_caption(mesh) -> str:
    n = [mesh.dim_name(d) for d in range(mesh.ndim)]
    if mesh.ndim == 1:
        return f"columns: {n[0]}"
    text = f"rows: {n[-2]}, columns: {n[-1]}"
    if mesh.ndim > 2:
        text += ", one grid per " + ",".join(n[:-2])
    return text


def _panel(mesh, cells, ptitle, subtitle, group, px, py, pw, ph, title_h, cell, gap,
           grid_w, grid_h, mult_label_h, mult_gap, per_row, lead) -> list[str]:
    out = [f'<g class="panel" data-title={quoteattr(ptitle)}>']
    out.append(
        f'<rect class="frame" x="{px - 6:.1f}" y="{py - 4:.1f}" width="{pw + 12:.1f}" '
        f'height="{ph + 8:.1f}" rx="6" fill="none" stroke="#cccccc"/>'
    )
    out.append(_text(px, py + 13, ptitle, weight="bold"))
    if subtitle:
        out.append(_text(px, py + 27, subtitle, size=11, fill="#555555"))
    membership = _group_of_rank(group, mesh) if group is not None else {}
    nd = mesh.ndim
    names = [mesh.dim_name(d) for d in range(nd)]
    for coords, rank in cells:
        lead_c = coords[:-2] if nd >= 2 else ()
        m = 0
        for c, s in zip(lead_c, lead):
            m = m * s + c
        r = coords[-2] if nd >= 2 else 0
        c = coords[-1]
        gx = px + (m % per_row) * (grid_w + mult_gap)
        gy = py + title_h + (m // per_row) * (grid_h + mult_label_h + mult_gap) + mult_label_h
        if lead and r == 0 and c == 0:
            label = ",".join(f"{names[d]}={lead_c[d]}" for d in range(len(lead_c)))
            out.append(_text(gx, gy - 4, label, size=10, fill="#555555"))
        x = gx + c * (cell + gap)
        y = gy + r * (cell + gap)
        where = ",".join(f"{names[d]}={coords[d]}" for d in range(nd))
        if group is not None and rank in membership:
            gi, pos = membership[rank]
            fill = _group_fill(gi)
            tip = f"rank {rank} ({where}): group {gi}, position {pos}"
            data = f' data-group="{gi}" data-position="{pos}"'
        else:
            fill, tip, data = "#f4f4f4", f"rank {rank} ({where})", ""
        out.append(
            f'<rect class="rank" x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
            f'rx="3" fill="{fill}" stroke="#666666" data-rank="{rank}"{data}><title>{escape(tip)}</title></rect>'
        )
        out.append(_text(x + cell / 2, y + cell / 2 + 2, str(rank), anchor="middle", size=11))
        if group is not None and rank in membership and group.size > 1:
            out.append(
                _text(x + cell - 3, y + cell - 3, str(membership[rank][1]), anchor="end", size=8, fill="#555555")
            )
    out.append("</g>")
    return out
