"""The ``advise`` report as text and as an SVG bar chart, from the data of
:class:`redist_opt.api.advice.Advice` (``Advice.to_dict()``)."""

from __future__ import annotations

from redist_opt.debug.units import format_bytes, format_time

__all__ = ["format_text", "render_svg", "COLUMNS"]

# (key, heading) of the three plans compared per call site.
COLUMNS = (
    ("torch", "torch 2.13 (its merge pass, existing groups)"),
    ("existing", "redist_opt, existing groups"),
    ("advised", "redist_opt, advised groups"),
    ("torch_advised", "torch 2.13 alone, advised groups"),
)
_COLORS = {"torch": "#b0b0b0", "existing": "#7aa6d6", "advised": "#2f7d32", "torch_advised": "#e0a040"}


def _cell(row: dict) -> str:
    return f"{row['collectives']} / {format_bytes(row['bytes'])} / {format_time(row['time_s'])}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _header(d: dict) -> list[str]:
    groups = d["groups"]
    n = len(d["candidates"])
    lines = [
        f"advice: create {len(groups)} flattened group(s) (at most {d['max_new_groups']}; "
        f"{d['search']} search over {n} candidate group(s); cost model {', '.join(d['cost_models'])})",
    ]
    if groups:
        lines.append("")
        lines.append("add after building the mesh (`mesh` is your DeviceMesh with these dim names):")
        for g in groups:
            lines.append(
                f"    {g['code']}    # {g['label']} on mesh {g['mesh_shape']}, layout {g['layout']}, "
                f"creation {format_time(g['creation_time_s'])}/step amortized"
            )
    else:
        lines.append("no new group lowers the step's modelled communication time")
    return lines


def format_text(d: dict) -> str:
    """Flatten lines to paste, then per call site and in total: collectives / bytes per
    rank / modelled time per step for torch, the existing groups and the advised ones."""
    lines = _header(d)
    lines += ["", "per call site, per step: collectives / bytes per rank / modelled time"]
    rows = [["site", "calls"] + [h for _, h in COLUMNS]]
    for s in d["sites"]:
        rows.append([s["site"], str(s["calls"])] + [_cell(s["rows"][k]) for k, _ in COLUMNS])
    total = d["total"]
    rows.append(["total", str(sum(s["calls"] for s in d["sites"]))] + [_cell(total[k]) for k, _ in COLUMNS])
    lines += ["  " + line for line in _table(rows)]
    creation = total["advised"].get("group_creation_s", 0.0)
    if d["groups"]:
        lines.append(f"  (advised total excludes group creation: {format_time(creation)}/step amortized)")
    lines += ["", "redistributions per site:"]
    for s in d["sites"]:
        lines.append(f"  {s['site']}")
        lines += [f"    {r}" for r in s["redistributions"]]
    if d["candidates"]:
        lines += ["", "candidate groups (modelled step time with that group alone, creation included):"]
        for c in d["candidates"]:
            lines.append(
                f"  {c['label']:<16} mesh {c['mesh_shape']:<10} layout {c['layout']:<16} "
                f"{format_time(c['step_time_alone_s'])}"
            )
    return "\n".join(lines) + "\n"


def render_svg(d: dict) -> str:
    """Horizontal bars of modelled time per call site: torch, existing, advised."""
    # Imported here: `import redist_opt` (Advice) loads the text report, not the SVG writer.
    from redist_opt.debug.svg import FONT, LINE_H, svg_open, text, text_w

    sites = list(d["sites"]) + [{"site": "total", "rows": d["total"]}]
    label_w = max(text_w(s["site"]) for s in sites) + 16
    bar_w, bar_h, gap = 360.0, 12.0, 10.0
    top = 2 * LINE_H + 12
    block = bar_h * len(COLUMNS) + gap
    width = label_w + bar_w + 110
    height = top + block * len(sites) + LINE_H * (len(COLUMNS) + 1)
    out = svg_open(width, height, "redist_opt advise: modelled time per call site")
    groups = ", ".join(g["label"] for g in d["groups"]) or "none"
    out.append(
        text(8, LINE_H, f"modelled communication time per step; advised groups: {groups}", weight="bold")
    )
    for idx, s in enumerate(sites):
        peak = max([r["time_s"] for r in s["rows"].values() if isinstance(r, dict)] + [1e-12])
        if s["site"] != "total":
            peak = max(r["time_s"] for t in d["sites"] for r in t["rows"].values()) or 1e-12
        y = top + idx * block
        out.append(text(8, y + bar_h * 2, s["site"], weight="bold" if s["site"] == "total" else None))
        for j, (key, _) in enumerate(COLUMNS):
            t = s["rows"][key]["time_s"]
            w = bar_w * t / peak
            yy = y + j * bar_h
            out.append(
                f'<rect class="{key}" x="{label_w:.1f}" y="{yy:.1f}" width="{w:.1f}" '
                f'height="{bar_h - 2:.1f}" fill="{_COLORS[key]}"/>'
            )
            out.append(text(label_w + w + 4, yy + bar_h - 3, format_time(t), size=FONT - 2))
    y = top + block * len(sites) + 4
    for j, (key, heading) in enumerate(COLUMNS):
        yy = y + j * LINE_H
        out.append(f'<rect x="8" y="{yy:.1f}" width="10" height="10" fill="{_COLORS[key]}"/>')
        out.append(text(24, yy + 9, heading))
    out.append("</svg>")
    return "\n".join(out) + "\n"
