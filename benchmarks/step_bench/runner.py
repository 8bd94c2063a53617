"""``python -m benchmarks.step_bench``: the matrix of configs and modes, on 4 or 8 gloo ranks."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import time

from benchmarks.step_bench import report
from benchmarks.step_bench.model import StepConfig
from benchmarks.step_bench.worker import MODES, run_config
from redist_opt.tools.spawn import SpawnError, run_ranks

WORLDS = (4, 8)
TORCHTITAN_VERSION = "0.3.0"
INSTALL_HINT = 'pip install -c constraints.txt -e ".[frameworks]"'
CONFIG_NAMES = ("fsdp2_tp", "simplefsdp_tp", "full_dtensor", "tp_classic")
MESHES = ((2, 2, 2), (1, 4, 2))  # dp_replicate x dp_shard x tp
# tp_classic is tensor parallelism alone (torch's parallelize_module plan on the tp mesh)
CONFIGS = tuple(StepConfig(n, *m) for n in CONFIG_NAMES[:-1] for m in MESHES) + (
    StepConfig("tp_classic", 1, 1, 8),
)


def torchtitan_missing() -> str | None:
    """Why the step bench cannot run here (with what to install), or None."""
    if importlib.util.find_spec("torchtitan") is None:
        return f"torchtitan is not installed; install it with: {INSTALL_HINT}"
    version = importlib.metadata.version("torchtitan")
    if version != TORCHTITAN_VERSION:
        return f"torchtitan {version} is installed, the step bench needs {TORCHTITAN_VERSION}: {INSTALL_HINT}"
    return None


def parse_config(text: str) -> StepConfig:
    """``fsdp2_tp:2x2x2`` (name:dp_replicate x dp_shard x tp), optionally ``:DIM``, the hidden
    size (default 128): ``fsdp2_tp:1x2x2:1024``."""
    name, _, rest = text.partition(":")
    mesh, _, dim = rest.partition(":")
    if name not in CONFIG_NAMES:
        raise ValueError(f"unknown step config {name!r}; expected one of {', '.join(CONFIG_NAMES)}")
    try:
        sizes = tuple(int(x) for x in (mesh or ("1x1x8" if name == "tp_classic" else "2x2x2")).split("x"))
    except ValueError:
        raise ValueError(f"mesh {mesh!r}: expected dp_replicate x dp_shard x tp, e.g. 2x2x2") from None
    if len(sizes) != 3 or min(sizes) < 1 or sizes[0] * sizes[1] * sizes[2] not in WORLDS:
        raise ValueError(f"mesh {mesh!r}: expected dp_replicate x dp_shard x tp with 4 or 8 ranks")
    if name == "tp_classic" and sizes[:2] != (1, 1):
        raise ValueError(f"tp_classic is tensor parallelism alone: mesh 1x1xT, not {mesh!r}")
    if not dim:
        return StepConfig(name, *sizes)
    if not dim.isdigit() or int(dim) % (8 * sizes[2]):
        raise ValueError(f"hidden size {dim!r}: expected a multiple of 8 heads x tp = {8 * sizes[2]}")
    return StepConfig(name, *sizes, dim=int(dim))


def run_step_bench(
    configs,
    modes=MODES,
    *,
    steps: int = 4,
    warmup: int = 1,
    save: bool = False,
    timeout: float = 1800.0,
    log=print,
):
    """Every mode of every config on its mesh's gloo ranks; a list of :func:`report.summarize` results.

    ``save``: after the steps, gather every parameter as a full checkpoint does (the "save" column).
    """
    results = []
    for cfg in configs:
        t0 = time.monotonic()
        log(f"running {cfg.label}: {', '.join(modes)}, {steps} steps each, on {cfg.world} gloo ranks ...")
        ranks = run_ranks(run_config, cfg.world, (cfg, tuple(modes), steps, warmup, save), timeout=timeout)
        results.append(report.summarize(cfg, ranks))
        log(f"  done in {time.monotonic() - t0:.0f}s")
    return results


def add_step_arguments(p) -> None:
    p.add_argument(
        "--step-config",
        action="append",
        help=f"a config NAME:RxSxT[:DIM] (repeatable; names {', '.join(CONFIG_NAMES)}; RxSxT: "
        "dp_replicate x dp_shard x tp on 4 or 8 ranks; DIM: hidden size, default 128); "
        "default all on 2x2x2 and 1x4x2 (--wall: the 4-rank wall configs)",
    )
    p.add_argument("--step-mode", action="append", choices=MODES, help="a mode (repeatable; default all)")
    p.add_argument("--steps", type=int, default=4, help="training steps per mode (default 4)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default 2; --wall: 3 per variant)"
    )
    p.add_argument(
        "--step-save",
        action="store_true",
        help="after the steps, gather every parameter as a full checkpoint save does "
        "(counted in its own 'save' column)",
    )
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before giving up on the ranks")


def configs_from(args, default) -> list[StepConfig]:
    """The ``--step-config`` values, or ``default``; a bad one raises ValueError."""
    return [parse_config(c) for c in args.step_config] if args.step_config else list(default)


def cmd_step(args) -> int:
    missing = torchtitan_missing()
    if missing:
        print(f"step bench: {missing}", file=sys.stderr)
        return 2
    try:
        configs = configs_from(args, CONFIGS)
    except ValueError as e:
        print(f"step bench: {e}", file=sys.stderr)
        return 2
    modes = tuple(args.step_mode) if args.step_mode else MODES
    warmup = min(2 if args.warmup is None else args.warmup, max(0, args.steps - 1))
    try:
        results = run_step_bench(
            configs,
            modes,
            steps=args.steps,
            warmup=warmup,
            save=args.step_save,
            timeout=args.timeout,
            log=lambda s: print(s, flush=True),
        )
    except SpawnError as e:
        print(f"step bench: {e}", file=sys.stderr)
        return 1
    print(_header(results, args.steps, warmup))
    print(report.format_table(results))
    details = report.format_details(results)
    if details:
        print("\n" + details)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"part": "step", "steps": args.steps, "warmup": warmup, "results": results}, f, indent=1
            )
            f.write("\n")
        print(f"\nwrote {args.json}")
    return 0


def _header(results: list, steps: int, warmup: int) -> str:
    stubbed = sorted({s for res in results for r in res["rows"] for s in r["stubbed"]})
    lines = [
        "",
        f"torchtitan {TORCHTITAN_VERSION} llama3 debug model shrunk (dim 128 unless the config says, "
        "2 layers, seq 64, SDPA), "
        "gloo ranks as the mesh says; per step: collectives counted on the wire (last step), "
        f"wall = median of steps {warmup + 1}..{steps}; loss vs base: every step on every rank "
        "(base: plain for eager and torch compiled, compiled_inductor for compiled_ours, "
        "compiled for compiled_ours_aot_eager)",
    ]
    if stubbed:
        lines.append(f"stubbed in the ranks (not installed, unused on CPU): {', '.join(stubbed)}")
    return "\n".join(lines) + "\n"
