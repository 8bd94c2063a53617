"""The quality bench's comparison rule (:data:`COMPARISON_RULE`: when ours is worse than,
equal to or better than torch on a case), the totals over the corpus, and the markdown
report: the table of cases, totals, worse and unsupported cases, the collectives of each.
"""

from __future__ import annotations

import math
from collections import Counter

from redist_opt.debug.units import format_bytes

__all__ = [
    "COMPARISON_RULE",
    "POLICIES",
    "SIDES",
    "find_worse",
    "totals",
    "verdict",
    "fmt_us",
    "cell",
    "format_quality",
]

# Our groups policies, each compared with torch's plan.
POLICIES = ("existing", "create")
SIDES = ("torch",) + POLICIES

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
    """ "worse" (see _worse_reasons), "equal" (same count, bytes and time) or "better"."""
    if _worse_reasons(ours, torch_row):
        return "worse"
    same = (ours["collectives"], ours["bytes"]) == (torch_row["collectives"], torch_row["bytes"])
    if same and math.isclose(ours["time"], torch_row["time"], rel_tol=_REL):
        return "equal"
    return "better"


def find_worse(rows: list[dict]) -> list[dict]:
    """Every (case, policy) where torch and ours both ran and ours is worse, with the reasons."""
    both_ran = [
        (r, policy)
        for r in rows
        for policy in POLICIES
        if r["torch"]["status"] == r[policy]["status"] == "ok"
    ]
    return [
        dict(id=r["id"], policy=policy, reasons=reasons)
        for r, policy in both_ran
        if (reasons := _worse_reasons(r[policy], r["torch"]))
    ]


def totals(rows: list[dict]) -> dict:
    """Sums of collectives, bytes and modelled time per side over the cases every side ran,
    and per policy how many cases are better, equal and worse than torch."""
    comparable = [
        r for r in rows if r["torch"]["status"] == "ok" and all(r[p]["status"] == "ok" for p in POLICIES)
    ]
    tot = {"cases": len(rows), "compared": len(comparable)}
    for side in SIDES:
        tot[side] = {k: sum(r[side][k] for r in comparable) for k in ("collectives", "bytes", "time")}
    for policy in POLICIES:
        verdicts = Counter(verdict(r[policy], r["torch"]) for r in comparable)
        tot[policy]["better_cases"] = verdicts["better"]
        tot[policy]["equal_cases"] = verdicts["equal"]
        tot[policy]["worse_cases"] = verdicts["worse"]
    return tot


# -- the report ------------------------------------------------------------------------


def cell(side: dict) -> str:
    """``collectives / bytes per rank / modelled time`` of one side of a case, or its status."""
    if side.get("status") != "ok":
        return side.get("status", "?")
    return f"{side['collectives']} / {format_bytes(side['bytes'], digits='.4g')} / {fmt_us(side['time'])}"


def _case_table(result: dict, worse_ids: set) -> list[str]:
    model = result["cost_model"]
    lines = [
        f"torch {result['torch_version']}; cost model {model['name']!r} "
        f"(algorithm {model['algorithm']}, devices_per_host {model['devices_per_host']}); "
        f"{len(result['cases'])} cases in {result['seconds']:.0f} s",
        "",
        f"torch's side: {result['torch_side']}.",
        "",
        f"Comparison rule: {result['rule']}.",
        "",
        "Each cell: collectives / bytes per rank / modelled time.",
        "",
        "| case | category | mesh (flattened) | src -> dst | shape dtype | torch (merge on) | ours existing "
        "| ours create |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["cases"]:
        mesh = r["mesh"] + (f" ({', '.join(r['flatten'])})" if r["flatten"] else "")
        shape = "x".join(map(str, r["shape"])) or "scalar"
        cells = [
            f"**{cell(r[side])} WORSE**" if (r["id"], side) in worse_ids else cell(r[side]) for side in SIDES
        ]
        lines.append(
            f"| {r['id']} | {r['category']} | {mesh} | {r['src']} -> {r['dst']} | {shape} {r['dtype']} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def _totals_section(tot: dict) -> list[str]:
    lines = ["", f"## Totals ({tot['compared']} of {tot['cases']} cases where all three sides ran)", ""]
    lines.append(
        "| | collectives | bytes per rank | modelled time | vs torch (collectives, bytes, time) "
        "| cases better / equal |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- |")
    base = tot["torch"]
    for side in SIDES:
        t = tot[side]
        if side == "torch":
            label, rel, cases = "torch (merge on)", "1, 1, 1", "-"
        else:
            label = f"ours groups={side}"
            rel = ", ".join(
                f"{t[k] / base[k]:.3f}" if base[k] else "-" for k in ("collectives", "bytes", "time")
            )
            cases = f"{t['better_cases']} / {t['equal_cases']}"
        nbytes = format_bytes(t["bytes"], digits=".4g")
        lines.append(f"| {label} | {t['collectives']} | {nbytes} | {fmt_us(t['time'])} | {rel} | {cases} |")
    return lines


def _worse_and_unsupported(worse: list[dict], unsupported: list[dict]) -> list[str]:
    lines = ["", "## Cases where ours is worse than torch", ""]
    if worse:
        for w in worse:
            lines.append(f"- {w['id']} (groups={w['policy']}): {'; '.join(w['reasons'])}")
    else:
        lines.append(
            "None: on every case both policies issue at most torch's collectives, bytes and modelled time."
        )
    lines += ["", "## Unsupported / not run", ""]
    if unsupported:
        for u in unsupported:
            side = "torch" if u["side"] == "torch" else f"ours groups={u['side']}"
            lines.append(f"- {u['id']} ({side}): {u['status']}: {u['reason']}")
    else:
        lines.append("None.")
    return lines


def _details_section(result: dict) -> list[str]:
    lines = ["", "## Collectives per case", ""]
    for r in result["cases"]:
        sim = f" (sim shape {r['sim_shape']}, x{r['scale']})" if "sim_shape" in r else ""
        lines.append(f"- **{r['id']}**{sim}")
        for side in SIDES:
            s = r[side]
            body = "; ".join(s["ops"]) if s["status"] == "ok" else f"{s['status']}: {s.get('reason', '')}"
            lines.append(f"  - {side}: {body or '(none)'}")
    return lines


def format_quality(result: dict) -> str:
    """A markdown report: the table, totals, worse cases, unsupported cases, details."""
    worse = result["worse"]
    lines = _case_table(result, {(w["id"], w["policy"]) for w in worse})
    lines += _totals_section(result["totals"])
    lines += _worse_and_unsupported(worse, result["unsupported"])
    lines += _details_section(result)
    return "\n".join(lines) + "\n"
