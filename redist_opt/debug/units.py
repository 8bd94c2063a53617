"""Bytes and seconds as people read them: the one byte formatter and the time formatter.

``explain``, the quality report and the command line's size lists all print bytes
through :func:`format_bytes`; they differ only in the digits shown and in whether
a size must read back exactly (``redist_opt.tools.args.parse_size``).
"""

from __future__ import annotations

__all__ = ["format_bytes", "format_time"]

# Binary units, largest first.
_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: int | None, *, digits: str = ".1f", sep: str = " ", exact: bool = False) -> str:
    """``n`` bytes in the largest binary unit it reaches: ``1023 B``, ``1.5 KiB``, ``16.0 MiB``.

    ``digits`` formats the number in that unit (``".4g"``: ``16 MiB``, ``1.234 GiB``).
    ``exact``: only a unit that divides ``n``, as a whole number (with ``sep=""``:
    ``64KiB``, ``1000B``, the spelling a command line's size list reads back).
    ``None`` (no size) prints as ``-``.
    """
    if n is None:
        return "-"
    for unit, size in _UNITS:
        if n >= size and (not exact or n % size == 0):
            return f"{n // size}{sep}{unit}" if exact else f"{n / size:{digits}}{sep}{unit}"
    return f"{n}{sep}B"


def format_time(seconds: float | None) -> str:
    """``12.3 us``, ``4.56 ms`` or ``1.234 s``; ``None`` (no model) prints as ``-``."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"
