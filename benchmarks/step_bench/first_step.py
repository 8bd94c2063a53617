"""The first training step's time, compile included, as a job (re)started by a user sees it.

For each side (``torch``: ``torch.compile`` with Inductor; ``ours``: with
``redist_opt.backend()``), fresh rank processes build the model, compile its blocks as
torchtitan does and time their first step, with Inductor's and AOTAutograd's caches on
(torch's defaults) in a cache directory of the side's own:

* ``cold``: an empty cache directory;
* ``warm``: a second job with the same directory, as a restarted job finds it.

A repeat runs torch cold, ours cold, torch warm, ours warm, each in new processes; a
step's time is its slowest rank's. The ranks also report their cache hits, so a warm run
shows what it loaded (torch 2.13 misses DTensor programs' FX graph entries in a fresh
process, torch's and ours alike: docs/inductor.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
import warnings

import torch.distributed as dist

import redist_opt
from benchmarks.step_bench import model as M
from benchmarks.step_bench.worker import build_training, train_step

SIDES = ("torch", "ours")
STARTS = ("cold", "warm")
# Cache counters of torch 2.13 (torch._dynamo.utils.counters) a warm start should move.
_CACHE_COUNTERS = (
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
)


def quiet_rank() -> None:
    """Keep a rank's output to what the bench prints: redist_opt's fallback warnings and the
    warnings torch gives for this model on every compile are known and not the measurement."""
    logging.getLogger("redist_opt").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="DTensor random operators")
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op. is deprecated")
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")


def build_side(cfg: M.StepConfig, world: int, side: str, *, steps: int):
    """This rank's model with every block compiled by ``side``'s backend ("torch": Inductor;
    "ours": ``redist_opt.backend()``), its optimizer, its dims and ``steps`` batches."""
    backend = "inductor" if side == "torch" else redist_opt.backend()
    return build_training(cfg, world, steps=steps, compile_backend=backend)


def run_first_step(rank: int, world: int, cfg: M.StepConfig, side: str, cache_dir: str) -> dict:
    """Spawned target: this rank's first step (compile included) and second step, in
    seconds, and its cache counters."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir  # read when a compile first asks
    stubbed = M.import_torchtitan()
    quiet_rank()
    from torch._dynamo.utils import counters

    model, opt, dims, batches = build_side(cfg, world, side, steps=2)
    times = []
    for data in batches:
        dist.barrier()
        t0 = time.perf_counter()
        train_step(model, opt, dims, *data)
        times.append(time.perf_counter() - t0)
    return {
        "rank": rank,
        "stubbed": stubbed,
        "first": times[0],
        "second": times[1],
        "cache": {f"{group}.{name}": int(counters[group][name]) for group, name in _CACHE_COUNTERS},
    }


def run_first_step_bench(configs, *, repeats: int, timeout: float, log=print) -> list:
    """Per config: every (side, start)'s first-step times over ``repeats`` repeats."""
    from redist_opt.tools.spawn import run_ranks

    results = []
    for cfg in configs:
        log(f"first step of {cfg.label} on {cfg.world} gloo ranks, {repeats} repeat(s) ...")
        runs: dict = {(side, start): [] for side in SIDES for start in STARTS}
        for _ in range(repeats):
            dirs = {side: tempfile.mkdtemp(prefix=f"first_step_{side}_") for side in SIDES}
            try:
                for start in STARTS:
                    for side in SIDES:
                        t0 = time.monotonic()
                        ranks = run_ranks(run_first_step, cfg.world, (cfg, side, dirs[side]), timeout=timeout)
                        job = _job(ranks)
                        runs[side, start].append(job)
                        took = time.monotonic() - t0
                        log(f"  {side} {start}: first step {job['first']:.1f} s ({took:.0f} s job)")
            finally:
                for d in dirs.values():
                    shutil.rmtree(d, ignore_errors=True)
        results.append({"config": cfg.label, "runs": {f"{s}/{t}": v for (s, t), v in runs.items()}})
    return results


def _job(ranks: list) -> dict:
    """One job: its first and second step (slowest rank) and its ranks' cache counters, summed."""
    return {
        "first": max(r["first"] for r in ranks),
        "second": max(r["second"] for r in ranks),
        "cache": {k: sum(r["cache"][k] for r in ranks) for k in ranks[0]["cache"]},
    }


def format_markdown(results: list) -> str:
    head = (
        "| config | start | torch first step s | ours first step s | ours / torch "
        "| ours' FX graph cache hits / misses |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for res in results:
        runs = res["runs"]
        for start in STARTS:
            t = statistics.median(j["first"] for j in runs[f"torch/{start}"])
            o = statistics.median(j["first"] for j in runs[f"ours/{start}"])
            cache = runs[f"ours/{start}"][-1]["cache"]
            hits = f"{cache['inductor.fxgraph_cache_hit']} / {cache['inductor.fxgraph_cache_miss']}"
            lines.append(f"| {res['config']} | {start} | {t:.1f} | {o:.1f} | {o / t:.2f}x | {hits} |")
    return "\n".join(lines)
