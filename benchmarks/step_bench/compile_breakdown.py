"""Where the first step's time goes, compile included: per phase, torch against ours.

``python -m benchmarks.step_bench.compile_breakdown [NAME:RxSxT[:DIM]]`` (default
``simplefsdp_tp:2x2x2``) runs one cold job per side, as ``--first-step`` does, with each
phase below wrapped in a timer, and prints the per-rank mean of its CPU seconds
(``time.process_time``) and wall seconds. With more ranks than cores the wall of a phase
includes waiting for the CPU, so the CPU column is the one to compare: a CPU second of each
of 8 ranks on 2 cores is about 4 s of the job's wall. The timers wrap module globals, so a
phase counts only where it is called through its module (nested calls count once).
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time

# (module or module.Class, function): the phases, torch's and ours.
PHASES = (
    ("torch._dynamo.convert_frame", "_compile"),
    ("torch._functorch._aot_autograd.graph_compile", "_aot_stage2a_partition"),
    ("torch._functorch._aot_autograd.graph_compile", "_aot_stage2b_fw_compile"),
    ("torch._inductor.compile_fx", "_recursive_joint_graph_passes"),
    ("torch._inductor.compile_fx", "_compile_fx_inner"),
    ("torch._inductor.compile_fx", "fx_codegen_and_compile"),
    ("torch._inductor.graph.GraphLowering", "codegen"),
    ("redist_opt.api.routing", "routed_redistribute_local_tensor"),
    ("redist_opt.graph.backend", "run_graph_pass"),
    ("redist_opt.graph.optimize", "mesh_contexts"),
    ("redist_opt.graph.optimize", "combine_collectives"),
)


def _wrap(owner, name: str, label: str, totals: dict) -> None:
    fn = getattr(owner, name)
    depth = [0]

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        depth[0] += 1
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                t = totals.setdefault(label, [0.0, 0.0])
                t[0] += time.process_time() - cpu
                t[1] += time.perf_counter() - wall

    setattr(owner, name, timed)


def _owner(path: str):
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, cls = path.rsplit(".", 1)
        return getattr(importlib.import_module(module), cls)


def run_timed_first_step(rank: int, world: int, cfg, side: str, cache_dir: str) -> dict:
    """Spawned target: this rank's first step with :data:`PHASES` timed; label -> (cpu, wall)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch.distributed as dist

    import redist_opt.graph.backend  # noqa: F401 - imported before its functions are wrapped
    from benchmarks.step_bench import model as M
    from benchmarks.step_bench.first_step import build_side, quiet_rank
    from benchmarks.step_bench.worker import train_step

    M.import_torchtitan()
    quiet_rank()
    totals: dict = {}
    for path, name in PHASES:
        _wrap(_owner(path), name, f"{path.rsplit('.', 1)[-1]}.{name}", totals)
    model, opt, dims, (batch,) = build_side(cfg, world, side, steps=1)
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    train_step(model, opt, dims, *batch)
    totals["whole first step"] = [time.process_time() - cpu, time.perf_counter() - wall]
    return totals


def main(argv=None) -> int:
    from benchmarks.step_bench.model import StepConfig
    from benchmarks.step_bench.runner import parse_config
    from redist_opt.tools.spawn import run_ranks

    args = sys.argv[1:] if argv is None else argv
    cfg = parse_config(args[0]) if args else StepConfig("simplefsdp_tp", 2, 2, 2)
    means = {}
    for side in ("torch", "ours"):
        cache_dir = tempfile.mkdtemp(prefix=f"compile_breakdown_{side}_")
        try:
            ranks = run_ranks(run_timed_first_step, cfg.world, (cfg, side, cache_dir), timeout=1800)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        labels = {k for r in ranks for k in r}
        means[side] = {
            k: [statistics.mean(r.get(k, (0.0, 0.0))[i] for r in ranks) for i in (0, 1)] for k in labels
        }
    print(f"{cfg.label}, {cfg.world} ranks, per-rank mean seconds\n")
    print("| phase | torch CPU | ours CPU | ours - torch CPU | torch wall | ours wall |")
    print("|---|---|---|---|---|---|")
    for label in sorted(set(means["torch"]) | set(means["ours"])):
        t, o = means["torch"].get(label, [0.0, 0.0]), means["ours"].get(label, [0.0, 0.0])
        print(f"| {label} | {t[0]:.2f} | {o[0]:.2f} | {o[0] - t[0]:+.2f} | {t[1]:.2f} | {o[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
