"""``python -m benchmarks.step_bench``: torchtitan's training step, torch against redist_opt.

Without ``--wall``: collectives, bytes, losses and hand-backs per mode (docs/step_bench.md).
With ``--wall``: step-time ratios with bootstrap intervals, modes interleaved (docs/step_wall.md).
With ``--first-step``: the first step's time, compile included, cold and warm (docs/step_wall.md).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.step_bench import first_step, runner, wall, wall_report
from benchmarks.step_bench.model import StepConfig

# The first step's time is asked for on SimpleFSDP + TP over 8 ranks and on classic TP.
FIRST_STEP_CONFIGS = (StepConfig("simplefsdp_tp", 2, 2, 2), StepConfig("tp_classic", 1, 1, 4, dim=512))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_bench", description=__doc__.splitlines()[0])
    runner.add_step_arguments(p)
    p.add_argument(
        "--wall",
        action="store_true",
        help="time the step instead: torch and redist_opt interleaved, ratios with 95%% intervals "
        "(a markdown table; default configs: the 4-rank wall configs)",
    )
    p.add_argument(
        "--first-step",
        action="store_true",
        help="time the first step instead, compile included: torch and redist_opt, each with an empty "
        "cache directory (cold) and again with the same one (warm); default configs: simplefsdp_tp:2x2x2 "
        "and tp_classic:1x1x4:512",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="--first-step: cold and warm jobs per side (default 1)"
    )
    p.add_argument(
        "--rounds", type=int, default=30, help="--wall: timed rounds, one step per variant each (default 30)"
    )
    p.add_argument(
        "--memory-rounds",
        type=int,
        default=3,
        help="--wall: rounds of each variant's peak bytes after the timed ones, 0: none (default 3; "
        "docs/memory.md)",
    )
    p.add_argument(
        "--tune-rounds",
        type=int,
        default=0,
        help="--wall: also time a 'tuned' side per compiled compiler, compiled with the profile "
        "redist_opt.tune writes after this many interleaved rounds of each rewrite on and off "
        "(default 0: off)",
    )
    p.add_argument(
        "--ablate",
        action="append",
        choices=wall.ABLATIONS,
        metavar="KIND",
        help="--wall: also time 'without KIND' per compiled compiler: redist_opt.backend with that one "
        f"rewrite off (repeatable; one of {', '.join(wall.ABLATIONS)})",
    )
    p.add_argument(
        "--wall-compiler",
        action="append",
        choices=wall.COMPILERS,
        help="--wall: eager (enabled() per step), inductor or aot_eager (repeatable; default all)",
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.first_step:
        return _cmd_first_step(args)
    if not args.wall:
        return runner.cmd_step(args)
    missing = runner.torchtitan_missing()
    if missing:
        print(f"step bench: {missing}", file=sys.stderr)
        return 2
    try:
        configs = runner.configs_from(args, wall_report.WALL_CONFIGS)
    except ValueError as e:
        print(f"step bench: {e}", file=sys.stderr)
        return 2
    args.warmup = 3 if args.warmup is None else args.warmup
    return wall_report.cmd_wall(args, configs)


def _cmd_first_step(args) -> int:
    from redist_opt.tools.spawn import SpawnError
    from redist_opt.tools.timing import note_load

    missing = runner.torchtitan_missing()
    if missing:
        print(f"step bench: {missing}", file=sys.stderr)
        return 2
    try:
        configs = runner.configs_from(args, FIRST_STEP_CONFIGS)
    except ValueError as e:
        print(f"step bench: {e}", file=sys.stderr)
        return 2
    note_load(end="\n\n")
    try:
        results = first_step.run_first_step_bench(
            configs, repeats=args.repeats, timeout=args.timeout, log=lambda s: print(s, flush=True)
        )
    except SpawnError as e:
        print(f"step bench --first-step: {e}", file=sys.stderr)
        return 1
    print(
        "\nFirst step, compile included (slowest rank; median of the repeats); each job in new "
        "processes with Inductor's and AOTAutograd's caches on in its side's own directory.\n"
    )
    print(first_step.format_markdown(results))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"part": "first_step", "results": results}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
