"""The mesh diagram: the mesh's ranks as a grid, then one panel per collective of
each plan colouring which ranks it groups together.

1-D meshes are one row; 2-D rows x columns; 3-D and up one small grid of the last
two dims per coordinate of the leading dims. Ranks come from
``redist_opt.ir.layout.rank_lists``; a rank's small number is its position in its
group (the chunk order of a gather/scatter). Each panel is ``<g class="panel"
data-title=...>`` holding exactly one ``<rect class="rank" data-rank=...
data-group=...>`` per rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from redist_opt.debug import svg
from redist_opt.ir import layout as L

__all__ = ["mesh_svg", "MAX_DRAWN_RANKS"]

# Mesh diagrams draw every rank; beyond this they would be unreadable anyway.
MAX_DRAWN_RANKS = 1024

# Light, distinguishable fills for rank groups (ColorBrewer Set3), then golden-angle hues.
GROUP_PALETTE = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#d9d9d9",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
)


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


def mesh_svg(
    mesh, plans: Sequence[tuple[str, object]] = (), *, groups: Sequence[tuple[str, object]] = ()
) -> str:
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

    sections = _sections(mesh, plans, groups)

    # Panel widths must fit their titles.
    def title_w(item):
        return max(svg.text_w(item[0], 12), svg.text_w(item[1], 11)) + 4

    heading_h = 22.0
    max_panels = max(len(items) for _, items in sections)
    panel_w = max([panel_w] + [title_w(it) for _, items in sections for it in items])
    wrap = max(1, min(max_panels, max(1, int(1400 // (panel_w + panel_gap)))))
    width = pad * 2 + wrap * (panel_w + panel_gap) - panel_gap
    height = pad
    for _, items in sections:
        height += heading_h + math.ceil(len(items) / wrap) * (panel_h + panel_gap)
    height += pad - panel_gap
    out = svg.svg_open(width, height, f"redist_opt mesh diagram: mesh ({mesh.shape_str})")
    y = pad
    for heading, items in sections:
        out.append(svg.text(pad, y + 15, heading, size=14, weight="bold", cls="section"))
        y += heading_h
        for k, (ptitle, subtitle, group) in enumerate(items):
            px = pad + (k % wrap) * (panel_w + panel_gap)
            py = y + (k // wrap) * (panel_h + panel_gap)
            out.extend(
                _panel(
                    mesh,
                    cells,
                    ptitle,
                    subtitle,
                    group,
                    px,
                    py,
                    panel_w,
                    panel_h,
                    title_h,
                    cell,
                    gap,
                    grid_w,
                    grid_h,
                    mult_label_h,
                    mult_gap,
                    per_row,
                    lead,
                )
            )
        y += math.ceil(len(items) / wrap) * (panel_h + panel_gap)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _sections(mesh, plans, groups) -> list[tuple[str, list]]:
    """(heading, [(panel title, subtitle, group or None)]): the ranks, each plan's
    collectives, then the extra groups."""
    sections: list[tuple[str, list]] = [
        ("ranks", [("ranks (index in the root rank map)", _axes_caption(mesh), None)])
    ]
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
    return sections


def _axes_caption(mesh) -> str:
    n = [mesh.dim_name(d) for d in range(mesh.ndim)]
    if mesh.ndim == 1:
        return f"columns: {n[0]}"
    text = f"rows: {n[-2]}, columns: {n[-1]}"
    if mesh.ndim > 2:
        text += ", one grid per " + ",".join(n[:-2])
    return text


def _panel(
    mesh,
    cells,
    ptitle,
    subtitle,
    group,
    px,
    py,
    pw,
    ph,
    title_h,
    cell,
    gap,
    grid_w,
    grid_h,
    mult_label_h,
    mult_gap,
    per_row,
    lead,
) -> list[str]:
    out = [f'<g class="panel" data-title={quoteattr(ptitle)}>']
    out.append(
        f'<rect class="frame" x="{px - 6:.1f}" y="{py - 4:.1f}" width="{pw + 12:.1f}" '
        f'height="{ph + 8:.1f}" rx="6" fill="none" stroke="#cccccc"/>'
    )
    out.append(svg.text(px, py + 13, ptitle, weight="bold"))
    if subtitle:
        out.append(svg.text(px, py + 27, subtitle, size=11, fill="#555555"))
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
            out.append(svg.text(gx, gy - 4, label, size=10, fill="#555555"))
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
            f'rx="3" fill="{fill}" stroke="#666666" data-rank="{rank}"{data}>'
            f"<title>{escape(tip)}</title></rect>"
        )
        out.append(svg.text(x + cell / 2, y + cell / 2 + 2, str(rank), anchor="middle", size=11))
        if group is not None and rank in membership and group.size > 1:
            out.append(
                svg.text(
                    x + cell - 3, y + cell - 3, str(membership[rank][1]), anchor="end", size=8, fill="#555555"
                )
            )
    out.append("</g>")
    return out
