"""The quality bench's markdown report: the table of cases, totals, worse and
unsupported cases, the verification summary and the collectives of every case."""

from __future__ import annotations

from redist_opt.debug.units import format_bytes
from redist_opt.tools.quality_compare import find_worse, fmt_us
from redist_opt.tools.quality_plans import POLICIES

__all__ = ["format_quality", "cell"]

SIDES = ("torch",) + POLICIES


def cell(side: dict) -> str:
    """``collectives / bytes per rank / modelled time`` of one side of a case, or its status."""
    if side.get("status") != "ok":
        return side.get("status", "?")
    return f"{side['collectives']} / {format_bytes(side['bytes'], digits='.4g')} / {fmt_us(side['time'])}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"


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
        cells = []
        for side in SIDES:
            text = cell(r[side])
            if (r["id"], side) in worse_ids:
                text = f"**{text} WORSE**"
            cells.append(text)
        lines.append(
            f"| {r['id']} | {r['category']} | {mesh} | {r['src']} -> {r['dst']} | {shape} {r['dtype']} | "
            + " | ".join(cells) + " |"
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
            rel = ", ".join(_ratio(t[k], base[k]) for k in ("collectives", "bytes", "time"))
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
        lines.append("None: on every case both policies issue at most torch's collectives, bytes and modelled time.")
    lines += ["", "## Unsupported / not run", ""]
    if unsupported:
        for u in unsupported:
            side = "torch" if u["side"] == "torch" else f"ours groups={u['side']}"
            lines.append(f"- {u['id']} ({side}): {u['status']}: {u['reason']}")
    else:
        lines.append("None.")
    return lines


def _verification_section(result: dict) -> list[str]:
    n_verified = sum(len(r.get("verify", {})) for r in result["cases"])
    if not n_verified:
        return []
    failures = result.get("verify_failures", [])
    lines = ["", "## Verification", ""]
    lines.append(
        f"{n_verified - len(failures)} of {n_verified} of our plans of the simulation shapes, executed on "
        "the simulated meshes, issued exactly the collectives (kind and ranks, in order) and bytes they claim."
    )
    for v in failures:
        lines.append(f"- {v['id']} groups={v['policy']}: executed {v['executed']}, planned {v['planned']}")
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


def format_quality(result: dict, *, details: bool = True) -> str:
    """A markdown report: the table, totals, worse cases, unsupported cases, details."""
    worse = find_worse(result)
    lines = _case_table(result, {(w["id"], w["policy"]) for w in worse})
    lines += _totals_section(result["totals"])
    lines += _worse_and_unsupported(worse, result["unsupported"])
    lines += _verification_section(result)
    if details:
        lines += _details_section(result)
    return "\n".join(lines) + "\n"
