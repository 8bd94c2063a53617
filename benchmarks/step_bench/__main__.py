"""``python -m benchmarks.step_bench``: torchtitan's training step, torch against redist_opt.

Without ``--wall``: collectives, bytes, losses and hand-backs per mode (docs/step_bench.md).
With ``--wall``: step-time ratios with bootstrap intervals, modes interleaved (docs/step_wall.md).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.step_bench import runner, wall, wall_report


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
        "--rounds", type=int, default=30, help="--wall: timed rounds, one step per variant each (default 30)"
    )
    p.add_argument(
        "--tune-steps",
        type=int,
        default=0,
        help="--wall: also time a 'tuned' side per compiled compiler, compiled with the in-step profile "
        "that redist_opt.profile_steps measures over this many steps of each side (default 0: off)",
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


if __name__ == "__main__":
    sys.exit(main())
