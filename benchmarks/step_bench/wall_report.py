"""The wall benchmark, driven from the checkout: spawn the ranks per config, then one
markdown table of step-time ratios with their intervals."""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.step_bench.model import StepConfig
from benchmarks.step_bench.wall import COMPILERS, PROFILE_STEPS, run_wall
from redist_opt.measure import memory, wall_stats

# Where communication is a real share of the step: 4 ranks (2 per core). TP's share falls as
# the hidden size grows (its collectives carry activations, ~dim, its matmuls cost ~dim^2);
# FSDP's gathers carry parameters (~dim^2), so its share hardly moves (docs/step_wall.md).
# SimpleFSDP + TP at two widths: at 256 most of its collectives are latency-bound (the
# combining pass runs them together), at 1024 most are not.
WALL_CONFIGS = (
    StepConfig("tp_classic", 1, 1, 4, dim=512),
    StepConfig("fsdp2_tp", 1, 2, 2, dim=1024),
    StepConfig("simplefsdp_tp", 1, 2, 2, dim=256),
    StepConfig("simplefsdp_tp", 1, 2, 2, dim=1024),
)


def run_wall_bench(
    configs,
    compilers=COMPILERS,
    *,
    rounds: int,
    warmup: int,
    timeout: float,
    tune_rounds: int = 0,
    ablate: tuple = (),
    memory_rounds: int = 0,
    log=print,
) -> list:
    """Every config's :func:`summarize` result, one spawned job per config."""
    from redist_opt.tools.spawn import run_ranks

    results = []
    for cfg in configs:
        t0 = time.monotonic()
        log(f"running {cfg.label} on {cfg.world} gloo ranks: {', '.join(compilers)}, {rounds} rounds ...")
        ranks = run_ranks(
            run_wall,
            cfg.world,
            (cfg, tuple(compilers), rounds, warmup, tune_rounds, tuple(ablate), memory_rounds),
            timeout=timeout,
        )
        results.append(summarize(cfg, ranks))
        log(f"  done in {time.monotonic() - t0:.0f}s")
    return results


def summarize(cfg: StepConfig, ranks: list) -> dict:
    """Per compiler: both sides' median step (slowest rank per step), the ratio torch/ours
    with its bootstrap interval and verdict, the communication share of each side, the
    collectives per step, and (with memory rounds) each side's peak bytes
    (:func:`redist_opt.measure.memory.peak_summary`)."""
    r0 = ranks[0]
    rows = []
    compilers = dict.fromkeys(name.split("/")[0] for name in [*r0["walls"], *r0["errors"]])
    # ours, then the tuned and ``without <kind>`` sides, each against torch
    names = [*r0["walls"], *r0["errors"]]
    sides = [(c, "ours") for c in compilers] + [
        (c, side)
        for c in compilers
        for side in dict.fromkeys(n.split("/", 1)[1] for n in names if n.startswith(f"{c}/"))
        if side not in ("torch", "ours")
    ]
    for compiler, side in sides:
        t_name, o_name = f"{compiler}/torch", f"{compiler}/{side}"
        errors = {n: r0["errors"][n] for n in (t_name, o_name) if n in r0["errors"]}
        label = compiler if side == "ours" else f"{compiler}, {side}"
        row: dict = {"config": cfg.label, "compiler": label, "errors": errors}
        rows.append(row)
        if errors:
            continue
        t = wall_stats.per_step_max([r["walls"][t_name] for r in ranks])
        o = wall_stats.per_step_max([r["walls"][o_name] for r in ranks])
        row.update(
            torch_ms=1e3 * statistics.median(t),
            ours_ms=1e3 * statistics.median(o),
            **wall_stats.compare(t, o),
            rounds=len(t),
            comm_torch=_share(ranks, t_name),
            comm_ours=_share(ranks, o_name),
            collectives_torch=r0["collectives"][t_name]["count"],
            collectives_ours=r0["collectives"][o_name]["count"],
            walls={"torch": t, "ours": o},
        )
        if o_name in r0.get("peaks", {}):
            row["peaks"] = {
                side_name: memory.peak_summary([r["peaks"][name] for r in ranks])
                for side_name, name in (("torch", t_name), ("ours", o_name))
            }
        if side == "tuned" and f"{compiler}/ours" in r0["walls"]:
            # the tuned profile against the untuned default, from the same rounds
            untuned = wall_stats.per_step_max([r["walls"][f"{compiler}/ours"] for r in ranks])
            row["against_untuned"] = wall_stats.compare(untuned, o)
    return {"config": cfg.label, "stubbed": r0["stubbed"], "rows": rows, "tuning": r0.get("tuning", {})}


def _share(ranks: list, name: str) -> float:
    return statistics.median(s for r in ranks for s in r["comm"][name])


def format_markdown(results: list) -> str:
    head = (
        "| config | compiler | torch ms | ours ms | torch/ours [95% CI] | verdict | comm share torch / ours "
        "| collectives torch -> ours | peak KiB torch / ours |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for res in results:
        for r in res["rows"]:
            if r["errors"]:
                failed = "; ".join(f"{n}: {e[:100]}" for n, e in r["errors"].items())
                lines.append(f"| {r['config']} | {r['compiler']} | | | FAILED | {failed} | | | |")
                continue
            lo, hi = r["interval"]
            lines.append(
                f"| {r['config']} | {r['compiler']} | {r['torch_ms']:.1f} | {r['ours_ms']:.1f} "
                f"| {r['ratio']:.3f}x [{lo:.3f}, {hi:.3f}] | {r['verdict']} "
                f"| {r['comm_torch']:.0%} / {r['comm_ours']:.0%} "
                f"| {r['collectives_torch']} -> {r['collectives_ours']} | {_peaks(r)} |"
            )
    return "\n".join(lines)


def _peaks(row: dict) -> str:
    """Both sides' peak (KiB) and the larger spread between rounds; blank without memory rounds."""
    if "peaks" not in row:
        return ""
    torch_peak, ours_peak = row["peaks"]["torch"], row["peaks"]["ours"]
    spread = max(torch_peak["spread"], ours_peak["spread"])
    return f"{torch_peak['bytes'] / 1024:,.0f} / {ours_peak['bytes'] / 1024:,.0f} (spread {spread:.0%})"


def _commit() -> str | None:
    """The checkout's commit, with "+changes" when its tracked files differ from it."""
    import subprocess

    def git(*argv) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def cmd_wall(args, configs: list) -> int:
    from redist_opt.tools.spawn import SpawnError
    from redist_opt.tools.timing import note_load

    compilers = tuple(args.wall_compiler) if args.wall_compiler else COMPILERS
    commit = _commit()  # the code the ranks run: read before they start
    note_load(end="\n\n")
    try:
        results = run_wall_bench(
            configs,
            compilers,
            rounds=args.rounds,
            warmup=args.warmup,
            timeout=args.timeout,
            tune_rounds=args.tune_rounds,
            ablate=tuple(args.ablate or ()),
            memory_rounds=args.memory_rounds,
            log=lambda s: print(s, flush=True),
        )
    except SpawnError as e:
        print(f"step bench --wall: {e}", file=sys.stderr)
        return 1
    print(
        f"\nStep wall, {args.rounds} interleaved rounds after {args.warmup} warm-up steps per variant; "
        "a step's time is its slowest rank's; ratio = median(torch) / median(ours), > 1: ours faster; "
        f"interval: paired bootstrap ({wall_stats.BOOTSTRAP_SAMPLES} resamples of rounds); "
        "comm share: time with a gloo collective in flight / step, "
        f"median of {PROFILE_STEPS} profiled steps on every rank; peak: {memory.RULE} "
        f"({args.memory_rounds} memory rounds; docs/memory.md).\n"
    )
    print(format_markdown(results))
    for res in results:
        for r in res["rows"]:
            if "against_untuned" in r:
                c = r["against_untuned"]
                lo, hi = c["interval"]
                print(
                    f"\n{r['config']} {r['compiler']}: untuned/tuned {c['ratio']:.3f}x [{lo:.3f}, {hi:.3f}] "
                    f"({c['verdict'].replace('ours', 'tuned')})"
                )
    for res in results:
        for compiler, t in res["tuning"].items():
            decided = ", ".join(
                f"{d['rewrite']} {d['reason']} ({d['ratio']:.3f}x "
                f"[{d['interval'][0]:.3f}, {d['interval'][1]:.3f}])"
                for d in t["decisions"]
            )
            print(
                f"\ntuning {res['config']} {compiler}: {t['seconds']:.1f} s, {t['steps']} steps, "
                f"{t['compiles']} compiles; {decided or 'no rewrite to decide'}; "
                f"left out: {', '.join(t['slower_in_steps']) or 'none'}"
            )
    stubbed = sorted({s for res in results for s in res["stubbed"]})
    if stubbed:
        print(f"\nstubbed in the ranks (not installed, unused on CPU): {', '.join(stubbed)}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            import torch

            json.dump(
                {
                    "part": "wall",
                    "command": "python -m benchmarks.step_bench " + " ".join(sys.argv[1:]),
                    "commit": commit or None,
                    "torch": torch.__version__,
                    "rounds": args.rounds,
                    "warmup": args.warmup,
                    "memory_rounds": args.memory_rounds,
                    "results": results,
                },
                f,
                indent=1,
            )
            f.write("\n")
        print(f"\nwrote {args.json}")
    return 0
