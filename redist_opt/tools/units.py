"""Byte sizes as people write them on a command line (``64KiB``, ``1KiB..4MiB*4``).

Printing goes through the one byte formatter, :func:`redist_opt.debug.units.format_bytes`;
:func:`format_size` is its exact spelling, which :func:`parse_size` reads back.
"""

from __future__ import annotations

import re

from redist_opt.debug.units import format_bytes

__all__ = ["parse_size", "parse_sizes", "format_size"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}  # fmt: skip


def parse_size(text: str) -> int:
    """``"64KiB"`` -> 65536; ``"1M"`` -> 1048576; ``"4096"`` -> 4096 (bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r} is not a byte count like 4096, 64KiB or 4MiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value) or value <= 0:
        raise ValueError(f"size {text!r} must be a positive whole number of bytes")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """``"1KiB,64KiB"`` (a list) or ``"1KiB..4MiB"`` (doubling) or ``"1KiB..4MiB*4"`` (x4 steps)."""
    out: list[int] = []
    for part in (p for p in text.split(",") if p.strip()):
        if ".." in part:
            lo_text, hi_text = part.split("..", 1)
            factor = 2
            if "*" in hi_text:
                hi_text, f_text = hi_text.split("*", 1)
                try:
                    factor = int(f_text)
                except ValueError:
                    raise ValueError(f"size range {part!r}: step factor {f_text!r} is not an integer") from None
                if factor < 2:
                    raise ValueError(f"size range {part!r}: step factor must be >= 2")
            lo, hi = parse_size(lo_text), parse_size(hi_text)
            if lo > hi:
                raise ValueError(f"size range {part!r} is empty ({lo} > {hi} bytes)")
            s = lo
            while s <= hi:
                out.append(s)
                s *= factor
        else:
            out.append(parse_size(part))
    if not out:
        raise ValueError(f"no sizes in {text!r}")
    return sorted(set(out))


def format_size(n: int) -> str:
    """``65536`` -> ``"64KiB"``, ``1000`` -> ``"1000B"``: a whole number of the largest unit that divides ``n``."""
    return format_bytes(n, sep="", exact=True)
