"""SVG building blocks shared by the plan graph and the mesh diagram (monospace text,
the document's opening lines) and writing a picture to a file."""

from __future__ import annotations

import math
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["FONT", "CHAR_W", "LINE_H", "text_w", "svg_open", "text", "write_text"]

FONT = 12
CHAR_W = 7.2  # monospace advance at FONT px, for sizing boxes
LINE_H = 15


def text_w(text: str, size: float = FONT) -> float:
    """Width of ``text`` in monospace at ``size`` px."""
    return len(text) * CHAR_W * size / FONT


def svg_open(width: float, height: float, title: str) -> list[str]:
    """The opening lines of an SVG document: XML header, root, title and a white background."""
    w, h = math.ceil(width), math.ceil(height)
    return [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="monospace" font-size="{FONT}">',
        f"<title>{escape(title)}</title>",
        f'<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>',
    ]


def text(x, y, s, *, size=FONT, anchor="start", weight=None, fill="#222222", cls=None) -> str:
    """One ``<text>`` element; attributes at their defaults are left out."""
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
