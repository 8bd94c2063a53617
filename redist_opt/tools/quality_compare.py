"""The quality bench's comparison rule: when ours is worse than, equal to or better than torch.

A policy is worse than torch on a case when it issues more collectives, OR more
bytes per rank, OR more modelled time (the same cost model prices both sides).
"""

from __future__ import annotations

import math
from collections import Counter

from redist_opt.debug.units import format_bytes
from redist_opt.tools.quality_plans import POLICIES

__all__ = ["COMPARISON_RULE", "find_worse", "totals", "verdict", "fmt_us"]

COMPARISON_RULE = (
    "ours is worse than torch on a case when it issues more collectives, or feeds more bytes per rank "
    "into collectives (the largest input any rank sends, summed over the collectives), or has a larger "
    "modelled time (the same cost model's collective_time summed over the collectives, group creation "
    "not counted); cases where a side is unsupported are listed and left out of the totals"
)


def fmt_us(t: float) -> str:
    """A modelled time in microseconds, as the report prints every time."""
    return f"{t * 1e6:.1f} us"


_REL = 1e-9  # modelled times closer than this (relative) are equal


def _worse_reasons(ours: dict, torch_row: dict) -> list[str]:
    reasons = []
    if ours["collectives"] > torch_row["collectives"]:
        reasons.append(f"collectives {ours['collectives']} > {torch_row['collectives']}")
    if ours["bytes"] > torch_row["bytes"]:
        mine, theirs = (format_bytes(r["bytes"], digits=".4g") for r in (ours, torch_row))
        reasons.append(f"bytes/rank {mine} > {theirs}")
    if ours["time"] > torch_row["time"] * (1 + _REL):
        reasons.append(f"modelled time {fmt_us(ours['time'])} > {fmt_us(torch_row['time'])}")
    return reasons


def verdict(ours: dict, torch_row: dict) -> str:
    """"worse" (see _worse_reasons), "equal" (same count, bytes and time) or "better"."""
    if _worse_reasons(ours, torch_row):
        return "worse"
    same = (ours["collectives"], ours["bytes"]) == (torch_row["collectives"], torch_row["bytes"])
    if same and math.isclose(ours["time"], torch_row["time"], rel_tol=_REL):
        return "equal"
    return "better"


def find_worse(result: dict) -> list[dict]:
    """Every (case, policy) where ours is worse than torch; re-derived from the rows."""
    worse = []
    for row in result["cases"]:
        t = row["torch"]
        if t.get("status") != "ok":
            continue
        for policy in POLICIES:
            ours = row[policy]
            if ours.get("status") != "ok":
                continue
            reasons = _worse_reasons(ours, t)
            if reasons:
                worse.append(dict(id=row["id"], policy=policy, reasons=reasons))
    return worse


def totals(rows: list[dict]) -> dict:
    """Sums of collectives, bytes and modelled time per side over the cases every side ran,
    and per policy how many cases are better, equal and worse than torch."""
    comparable = [
        r for r in rows if r["torch"]["status"] == "ok" and all(r[p]["status"] == "ok" for p in POLICIES)
    ]
    tot = {"cases": len(rows), "compared": len(comparable)}
    for side in ("torch",) + POLICIES:
        tot[side] = {
            k: sum(r[side][k] for r in comparable) for k in ("collectives", "bytes", "time")
        }
    for policy in POLICIES:
        verdicts = Counter(verdict(r[policy], r["torch"]) for r in comparable)
        tot[policy]["better_cases"] = verdicts["better"]
        tot[policy]["equal_cases"] = verdicts["equal"]
        tot[policy]["worse_cases"] = verdicts["worse"]
    return tot
