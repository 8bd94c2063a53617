"""Where an eager step's redistribution time goes: torch's calls against ours, in the step.

``python -m benchmarks.step_bench.routed_calls [NAME:RxSxT[:DIM] ...] [--rounds N]`` (default
``tp_classic:1x1x4:512`` and ``fsdp2_tp:1x2x2:1024``, the configs whose eager wall interval lay
below 1 in a run) runs the eager step on gloo ranks, torch's and inside ``redist_opt.enabled()``
(entered once per step, as the wall bench does), interleaved round by round after warm-up
steps. Every call of ``redistribute_local_tensor`` is timed where the step makes it:

* torch: torch's function, at every binding its callers use (installed through
  ``redist_opt.runtime.bindings``, which is how ``enabled()`` itself routes the calls);
* ours: ``redist_opt``'s routed function, which ``enabled()`` installs in those bindings.

Funcol collectives are asynchronous, so a call's time is its planning, its local copies and
the issue of its collectives, not the wait for them (the wait is where the result is first
used, the same on both sides where the plans are equal). It prints, per side, the step's
median (slowest rank), the calls per step, and the time inside them per step and per call
(median over steps of the mean over ranks), with the calling thread's CPU time inside them
(``time.thread_time``: planning, layout and issue, without the waits for peers and gloo's
transfer threads).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time


def run_routed_calls(rank: int, world: int, cfg, rounds: int, warmup: int) -> dict:
    """Spawned target: per side, this rank's step walls and, per step, its redistribution
    calls and the seconds inside them."""
    import torch

    import redist_opt
    from benchmarks.step_bench import model as M
    from benchmarks.step_bench.first_step import quiet_rank
    from benchmarks.step_bench.worker import build_training, train_step
    from redist_opt.api import routing
    from redist_opt.ir.placements import placements_str
    from redist_opt.runtime import bindings

    M.import_torchtitan()
    quiet_rank()
    model, opt, dims, batches = build_training(cfg, world, steps=4)
    # calls, wall seconds and this thread's CPU seconds inside them, in the current step
    inside = {"torch": [0, 0.0, 0.0], "ours": [0, 0.0, 0.0]}
    by_kind: dict = {"torch": {}, "ours": {}}  # placements -> the same, over the recorded steps
    recording = [False]

    def timed(fn, side: str):
        def call(local_tensor, current_spec, target_spec, *args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(local_tensor, current_spec, target_spec, *args, **kwargs)
            finally:
                took = (1, time.perf_counter() - t0, time.thread_time() - c0)
                inside[side][:] = [a + b for a, b in zip(inside[side], took)]
                if recording[0]:
                    src, dst = (placements_str(spec.placements) for spec in (current_spec, target_spec))
                    kind = f"{src} -> {dst} {tuple(local_tensor.shape)}"
                    total = by_kind[side].setdefault(kind, [0, 0.0, 0.0])
                    total[:] = [a + b for a, b in zip(total, took)]

        return call

    # ours: enabled() installs whatever routing's function is when the first block enters
    routing.routed_redistribute_local_tensor = timed(routing.routed_redistribute_local_tensor, "ours")
    # torch: its function at every binding its callers read (enabled() puts these back on leaving)
    bindings.install_redistribute_local(timed(bindings.TORCH_REDISTRIBUTE_LOCAL, "torch"))
    out: dict = {side: {"wall": [], "calls": [], "inside": [], "cpu": []} for side in inside}
    step_no = 0

    def step(side: str, record: bool) -> None:
        nonlocal step_no
        data = batches[step_no % len(batches)]
        step_no += 1
        inside[side][:] = [0, 0.0, 0.0]
        recording[0] = record
        torch.distributed.barrier()
        t0 = time.perf_counter()
        with redist_opt.enabled() if side == "ours" else contextlib.nullcontext():
            train_step(model, opt, dims, *data)
        wall = time.perf_counter() - t0
        if record:
            out[side]["by_kind"] = by_kind[side]
            out[side]["wall"].append(wall)
            out[side]["calls"].append(inside[side][0])
            out[side]["inside"].append(inside[side][1])
            out[side]["cpu"].append(inside[side][2])

    for side in ("torch", "ours"):
        for _ in range(warmup):
            step(side, record=False)
    for r in range(rounds):
        for side in ("torch", "ours") if r % 2 == 0 else ("ours", "torch"):
            step(side, record=True)
    return out


def summarize(ranks: list[dict]) -> dict:
    """Per side: median step (its slowest rank), calls per step, and the median over steps of
    the mean over ranks of the milliseconds inside the calls (per step and per call)."""
    result = {}
    for side in ("torch", "ours"):
        steps = len(ranks[0][side]["wall"])
        wall = [max(r[side]["wall"][i] for r in ranks) for i in range(steps)]
        inside = [statistics.mean(r[side]["inside"][i] for r in ranks) for i in range(steps)]
        cpu = [statistics.mean(r[side]["cpu"][i] for r in ranks) for i in range(steps)]
        calls = [statistics.mean(r[side]["calls"][i] for r in ranks) for i in range(steps)]
        result[side] = {
            "step_ms": 1e3 * statistics.median(wall),
            "calls": statistics.median(calls),
            "inside_ms": 1e3 * statistics.median(inside),
            "cpu_ms": 1e3 * statistics.median(cpu),
            "per_call_us": 1e6 * statistics.median(i / c for i, c in zip(inside, calls) if c),
            "cpu_per_call_us": 1e6 * statistics.median(i / c for i, c in zip(cpu, calls) if c),
        }
    return result


def main(argv=None) -> int:
    import argparse

    from benchmarks.step_bench.runner import parse_config
    from redist_opt.tools.spawn import run_ranks

    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_bench.routed_calls")
    parser.add_argument("configs", nargs="*", default=["tp_classic:1x1x4:512", "fsdp2_tp:1x2x2:1024"])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--by-placements", action="store_true", help="also list rank 0's calls per placement change"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(
        "| config | side | step ms | redistribute calls per step | ms inside them per step "
        "(their CPU ms) | us per call (CPU us) |"
    )
    print("|---|---|---|---|---|---|")
    for text in args.configs:
        cfg = parse_config(text)
        ranks = run_ranks(run_routed_calls, cfg.world, (cfg, args.rounds, args.warmup), timeout=1800)
        for side, s in summarize(ranks).items():
            print(
                f"| {cfg.label} | {side} | {s['step_ms']:.1f} | {s['calls']:.0f} | "
                f"{s['inside_ms']:.2f} ({s['cpu_ms']:.2f}) | "
                f"{s['per_call_us']:.0f} ({s['cpu_per_call_us']:.0f}) |",
                flush=True,
            )
        if args.by_placements:
            steps = len(ranks[0]["torch"]["wall"])
            kinds = sorted(set(ranks[0]["torch"]["by_kind"]) | set(ranks[0]["ours"]["by_kind"]))
            print(f"\n{cfg.label}, rank 0, per step: calls, ms inside, CPU ms (torch / ours)")
            for kind in kinds:
                t, o = (ranks[0][side]["by_kind"].get(kind, [0, 0.0, 0.0]) for side in ("torch", "ours"))
                print(
                    f"  {kind}: {t[0] / steps:g} / {o[0] / steps:g} calls, "
                    f"{1e3 * t[1] / steps:.2f} / {1e3 * o[1] / steps:.2f} ms, "
                    f"{1e3 * t[2] / steps:.2f} / {1e3 * o[2] / steps:.2f} CPU ms"
                )
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
