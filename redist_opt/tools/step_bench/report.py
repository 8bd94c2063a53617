"""The step bench's results: one summary per (config, mode), printed as a table."""

from __future__ import annotations

from collections import Counter

COMPILED = ("compiled", "compiled_ours")
BASELINE = {"existing": "plain", "create": "plain", "compiled": "plain", "compiled_ours": "compiled", "plain": None}


def _loss_match(ranks: list, mode: str, base: str | None) -> str:
    if base is None:
        return "-"
    worst = 0.0
    for r in ranks:
        ours, theirs = r["modes"][mode]["losses"], r["modes"][base]["losses"]
        worst = max([worst] + [abs(a - b) for a, b in zip(ours, theirs, strict=True)])
    return "bitwise" if worst == 0.0 else f"max|d|={worst:.1e}"


def _transitions(mode_result: dict, mode: str) -> list[dict]:
    """Eager: the last step's transitions. Compiled: all of them (they happen while tracing)."""
    steps = mode_result["steps"]
    if mode in COMPILED:
        return [t for s in steps for t in s["transitions"]]
    return steps[-1]["transitions"]


def _changed(base_tr: list[dict], tr: list[dict]) -> list[str]:
    """Transitions whose collectives differ from the baseline's for the same transition."""
    before: dict[str, Counter] = {}
    after: dict[str, Counter] = {}
    for table, rows in ((before, base_tr), (after, tr)):
        for t in rows:
            table.setdefault(t["key"], Counter())[" ".join(t["collectives"]) or "none"] += 1
    out = []
    for key in sorted(set(before) & set(after)):
        if before[key] != after[key]:
            b = ", ".join(f"{n}x[{c}]" for c, n in before[key].items())
            a = ", ".join(f"{n}x[{c}]" for c, n in after[key].items())
            out.append(f"{key}: {b} -> {a}")
    return out


def summarize(cfg, ranks: list) -> dict:
    """One config's results (all ranks) -> rows of the table plus details."""
    r0 = ranks[0]
    rows = []
    for mode, res in r0["modes"].items():
        if "error" in res:
            rows.append({"config": cfg.label, "mode": mode, "error": res["error"], "stubbed": r0["stubbed"]})
            continue
        base = BASELINE.get(mode)
        if base in r0["modes"] and "error" in r0["modes"][base]:
            base = None
        tr = _transitions(res, mode)
        routes = Counter(t["route"] for t in tr)
        reasons = Counter(t["reason"] for t in tr if t["route"] == "handed back")
        base_tr = _transitions(r0["modes"][base], base) if base in r0["modes"] else []
        last = res["steps"][-1]["wire"]
        rows.append(
            {
                "config": cfg.label,
                "mode": mode,
                "collectives": last["count"],
                "by_kind": last["by_kind"],
                "bytes": last["bytes"],
                "wall_ms": 1e3 * res["wall_median"],
                "losses": res["losses"],
                "loss_vs_baseline": _loss_match(ranks, mode, base) if base in r0["modes"] else "-",
                "baseline": base,
                "transitions": len(tr),
                "routed": routes.get("routed", 0),
                "handed_back": routes.get("handed back", 0),
                "hand_back_reasons": dict(reasons),
                "changed": _changed(base_tr, tr) if base_tr and mode not in COMPILED else [],
                "graph_pass": res.get("graph_pass", []),
                "stubbed": r0["stubbed"],
            }
        )
    return {"config": cfg.label, "rows": rows}


def _kinds(by_kind: dict) -> str:
    return " ".join(f"{k}:{n}" for k, n in by_kind.items())


def _graph_pass_cell(gp: list) -> str:
    if not gp:
        return ""
    chains = sum(g["chains"] for g in gp)
    rewritten = sum(g["rewritten"] for g in gp)
    refused = sum(len(g["not_raised"]) for g in gp)
    return f"graphs {len(gp)}, chains {chains}, rewritten {rewritten}, not raised {refused}"


def format_table(results: list[dict]) -> str:
    head = (
        f"{'config':<20} {'mode':<13} {'coll':>4} {'KiB':>7} {'wall ms':>8} {'loss vs base':<14} "
        f"{'routed':>6} {'back':>5}  by kind (kind@group size)"
    )
    lines = [head, "-" * len(head)]
    for res in results:
        for r in res["rows"]:
            if "error" in r:
                lines.append(f"{r['config']:<20} {r['mode']:<13} FAILED: {r['error'][:120]}")
                continue
            lines.append(
                f"{r['config']:<20} {r['mode']:<13} {r['collectives']:>4} {r['bytes'] / 1024:>7.1f} "
                f"{r['wall_ms']:>8.1f} {r['loss_vs_baseline']:<14} {r['routed']:>6} {r['handed_back']:>5}  "
                f"{_kinds(r['by_kind'])}"
            )
    return "\n".join(lines)


def format_details(results: list[dict]) -> str:
    lines = []
    for res in results:
        for r in res["rows"]:
            if "error" in r:
                lines.append(f"{r['config']} / {r['mode']}:\n  failed: {r['error']}")
                continue
            notes = []
            for reason, n in r["hand_back_reasons"].items():
                notes.append(f"  handed back x{n}: {reason}")
            for c in r["changed"]:
                notes.append(f"  changed: {c}")
            gp = _graph_pass_cell(r["graph_pass"])
            if gp:
                notes.append(f"  graph pass: {gp}")
                reasons = Counter(n for g in r["graph_pass"] for n in g["not_raised"])
                for reason, n in reasons.most_common(3):
                    notes.append(f"    not raised x{n}: {reason}")
            if notes:
                lines.append(f"{r['config']} / {r['mode']}:")
                lines.extend(notes)
    return "\n".join(lines)
