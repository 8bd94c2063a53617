"""The step bench's results: one summary per (config, mode), printed as a table."""

from __future__ import annotations

from collections import Counter

COMPILED = ("compiled", "compiled_inductor", "compiled_ours", "compiled_ours_aot_eager")
BASELINE = {
    "existing": "plain",
    "create": "plain",
    "compiled": "plain",
    "compiled_inductor": "plain",
    "compiled_ours": "compiled_inductor",
    "compiled_ours_aot_eager": "compiled",
    "plain": None,
}


LOSS_RTOL = 1e-6  # sums regrouped (reassociation, merged reductions) may round differently
# placements that must be lowered, never handed back (as the transition key prints them)
MUST_ROUTE = ("P(norm", "_MaskPartial")


def _loss_match(ranks: list, mode: str, base: str | None) -> tuple[str, float]:
    """("bitwise" | "rel=..", worst relative difference) of every step's loss on every rank."""
    if base is None:
        return "-", 0.0
    worst = 0.0
    for r in ranks:
        ours, theirs = r["modes"][mode]["losses"], r["modes"][base]["losses"]
        for a, b in zip(ours, theirs, strict=True):
            if a != b:
                worst = max(worst, abs(a - b) / max(abs(b), 1e-30))
    return ("bitwise" if worst == 0.0 else f"rel={worst:.1e}"), worst


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
        base_tr = _transitions(r0["modes"][base], base) if base in r0["modes"] else []
        last = res["steps"][-1]["wire"]
        loss, rel = _loss_match(ranks, mode, base) if base in r0["modes"] else ("-", 0.0)
        rows.append(
            {
                "config": cfg.label,
                "mode": mode,
                "collectives": last["count"],
                "by_kind": last["by_kind"],
                "bytes": last["bytes"],
                "wall_ms": 1e3 * res["wall_median"],
                "losses": res["losses"],
                "loss_vs_baseline": loss,
                "loss_rel": rel,
                "baseline": base,
                "transitions": len(tr),
                "routed": routes.get("routed", 0),
                "handed_back": routes.get("handed back", 0),
                "hand_back_reasons": _reasons(tr),
                "changed": _changed(base_tr, tr) if base_tr and mode not in COMPILED else [],
                "gnorm": _phase(res["steps"][-1].get("gnorm")),
                "save": _phase(res.get("save")),
                "graph_pass": res.get("graph_pass", []),
                "stubbed": r0["stubbed"],
            }
        )
    for row in rows:
        row["violations"] = _violations(row, {r["mode"]: r for r in rows})
    return {"config": cfg.label, "rows": rows}


def _reasons(tr: list[dict]) -> dict:
    return dict(Counter(f"{t['key']}: {t['reason']}" for t in tr if t["route"] == "handed back"))


def _phase(phase: dict | None) -> dict | None:
    """A counted window of the step (clip_grad_norm_) or after it (the checkpoint gather)."""
    if phase is None:
        return None
    routes = Counter(t["route"] for t in phase["transitions"])
    return {
        "collectives": phase["wire"]["count"],
        "by_kind": phase["wire"]["by_kind"],
        "bytes": phase["wire"]["bytes"],
        "transitions": len(phase["transitions"]),
        "routed": routes.get("routed", 0),
        "handed_back": routes.get("handed back", 0),
        "hand_back_reasons": _reasons(phase["transitions"]),
    }


def _violations(row: dict, by_mode: dict) -> list[str]:
    """Where a row misses the bar: more collectives than torch (the step, the grad norm, the
    save), a loss off by more than LOSS_RTOL, or a Partial subclass handed back."""
    if "error" in row:
        return []
    out = []
    base = by_mode.get(row["baseline"])
    if base is not None and "error" not in base:
        for what, ours, theirs in (
            ("step", row["collectives"], base["collectives"]),
            ("gnorm", (row["gnorm"] or {}).get("collectives"), (base["gnorm"] or {}).get("collectives")),
            ("save", (row["save"] or {}).get("collectives"), (base["save"] or {}).get("collectives")),
        ):
            if ours is not None and theirs is not None and ours > theirs:
                out.append(f"{what}: {ours} collectives > {theirs} of {row['baseline']}")
    if row["loss_rel"] > LOSS_RTOL:
        out.append(f"loss: relative difference {row['loss_rel']:.1e} > {LOSS_RTOL:.0e}")
    backs = [*row["hand_back_reasons"], *((row["save"] or {}).get("hand_back_reasons") or {})]
    for key in backs:
        if any(p in key for p in MUST_ROUTE):
            out.append(f"handed back: {key}")
    return out


def _kinds(by_kind: dict) -> str:
    return " ".join(f"{k}:{n}" for k, n in by_kind.items())


def _graph_pass_cell(gp: list) -> str:
    if not gp:
        return ""
    chains = sum(g["chains"] for g in gp)
    rewritten = sum(g["rewritten"] for g in gp)
    refused = sum(len(g["not_raised"]) for g in gp)
    folded = sum(g.get("reassociated", 0) for g in gp)
    combined = sum(g.get("combined", 0) for g in gp)
    return (
        f"graphs {len(gp)}, chains {chains}, rewritten {rewritten}, not raised {refused}, "
        f"all_reduces removed by reassociation {folded}, collectives removed by combining {combined}"
    )


def _phase_cell(phase: dict | None) -> str:
    """``coll[/back]`` of a phase: its collectives, and its hand-backs if any."""
    if phase is None:
        return "-"
    return f"{phase['collectives']}" + (f"/{phase['handed_back']}b" if phase["handed_back"] else "")


def format_table(results: list[dict]) -> str:
    head = (
        f"{'config':<20} {'mode':<13} {'coll':>4} {'KiB':>7} {'wall ms':>8} {'loss vs base':<14} "
        f"{'routed':>6} {'back':>5} {'gnorm':>5} {'save':>7}  by kind (kind@group size)"
    )
    lines = [head, "-" * len(head)]
    for res in results:
        for r in res["rows"]:
            if "error" in r:
                lines.append(f"{r['config']:<20} {r['mode']:<13} FAILED: {r['error'][:120]}")
                continue
            lines.append(
                f"{r['config']:<20} {r['mode']:<13} {r['collectives']:>4} {r['bytes'] / 1024:>7.1f} "
                f"{r['wall_ms']:>8.1f} {r['loss_vs_baseline']:<14} {r['routed']:>6} {r['handed_back']:>5} "
                f"{_phase_cell(r['gnorm']):>5} {_phase_cell(r['save']):>7}  {_kinds(r['by_kind'])}"
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
            for name in ("gnorm", "save"):
                phase = r.get(name)
                if phase and phase["collectives"]:
                    notes.append(
                        f"  {name}: {phase['collectives']} collectives ({_kinds(phase['by_kind'])}), "
                        f"routed {phase['routed']}, handed back {phase['handed_back']}"
                    )
                    for reason, n in (phase["hand_back_reasons"] or {}).items():
                        notes.append(f"    {name} handed back x{n}: {reason}")
            for v in r.get("violations", []):
                notes.append(f"  VIOLATION {v}")
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
