"""One rank of the wall benchmark: torch's step and ours, interleaved on one model.

A *variant* is a compiler and a side:
- ``eager``: torch's step, and the same step inside ``with redist_opt.enabled():``, entered
  once per step around the whole step, as the README shows it;
- ``inductor``: every TransformerBlock compiled with ``torch.compile`` (Inductor), and with
  ``torch.compile(backend=redist_opt.backend())`` (its default inner compiler, Inductor);
- ``aot_eager``: the same with ``backend="aot_eager"`` and ``redist_opt.backend("aot_eager")``.

All variants share one model, optimizer and rank processes: a block runs the compiled
callable of the step's variant (``nn.Module.compile`` keeps it in ``_compiled_call_impl``;
None runs the block eagerly). Dynamo keeps the two backends' graphs apart (its
backend-match guard); Inductor's FX graph cache and AOTAutograd's cache are turned off
(``torch_api.inductor.separate_compiles``) so that the two compiles can never share an
artifact. Every variant first runs its warm-up steps (the compiles happen there); then
rounds of one step per variant (:func:`redist_opt.measure.interleaved_rounds`, the loop
``redist_opt.tune`` times its variants with), each step after a barrier; then
``memory_rounds`` rounds of each variant's peak bytes
(:func:`redist_opt.measure.interleaved_memory_rounds`: a lead-in step, a collection, a
barrier and the measured step under the allocator's counter; rounds of their own, since the
profiler costs time; docs/memory.md).
Afterwards every variant runs one step under the collective counter (the count shows
each side ran its own graphs) and a few steps under the profiler (the communication share).

With ``ablate`` naming rewrite kinds (:data:`ABLATIONS`), each compiled compiler gets one
more side per kind, ``without <kind>``: ``redist_opt.backend`` with that one rewrite off,
timed in the same rounds, so what each rewrite does to the step is measured inside it.

With ``tune_rounds`` > 0 each compiled compiler gets a third side, ``tuned``: after the
warm-up, ``redist_opt.tune`` (the shipped workflow, ``docs/tune.md``) times the step with each
rewrite on and off over ``tune_rounds`` interleaved rounds and writes its decisions as a
profile, and ``backend(cost=that profile)`` compiles the blocks again. Like the ``ours`` side,
only the compiled blocks are ours (``route_outside_compiled=False``). What tuning cost
(seconds, steps, compiles) and what it decided are reported.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time
import warnings

import torch
import torch.distributed as dist

import redist_opt
from benchmarks.step_bench import model as M
from benchmarks.step_bench import wire
from benchmarks.step_bench.worker import build_training, train_step
from redist_opt.graph.backend import INNER_COMPILERS
from redist_opt.graph_pass import GraphRewrites
from redist_opt.measure import format_result, interleaved_memory_rounds, interleaved_rounds, wall_stats
from redist_opt.passes import DEFAULT_PIPELINE
from redist_opt.torch_api import inductor

COMPILERS = ("eager", *INNER_COMPILERS)
SIDES = ("torch", "ours")
PROFILE_STEPS = 3
# what the profiler names a gloo collective's work, on the thread that runs it
_COLLECTIVE_EVENT = "gloo:"


# Rewrite kinds a ``without <kind>`` side turns off: each pass of the default pipeline (by
# its name), the graph pass's own rewrites, and the whole graph pass.
ABLATIONS = (
    *(p.name for p in DEFAULT_PIPELINE),
    "reassociate",
    "combine",
    "graph-pass",
)


def variant_names(compilers, ablate=()) -> list[str]:
    """``eager/torch``, ``eager/ours``, ... in the order the rounds start with; the
    ``without <kind>`` sides of the compiled compilers after their ``ours``."""
    names = []
    for c in compilers:
        names += [f"{c}/{side}" for side in SIDES]
        if c != "eager":
            names += [f"{c}/without {kind}" for kind in ablate]
    return names


def run_wall(
    rank: int,
    world: int,
    cfg: M.StepConfig,
    compilers: tuple,
    rounds: int,
    warmup: int,
    tune_rounds: int = 0,
    ablate: tuple = (),
    memory_rounds: int = 0,
) -> dict:
    """Spawned target: this rank's step times and peak bytes per variant, collectives per
    step, and the communication share of profiled steps."""
    stubbed = M.import_torchtitan()
    logging.getLogger("redist_opt").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="DTensor random operators")
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op. is deprecated")
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
    # The two sides compile the same blocks in one process: no cache may serve one side's
    # artifact to the other (Inductor's FX graph cache keys on the graph before custom
    # passes). Compile in this process (no worker pool per rank), with one Dynamo cache
    # entry per block and variant.
    with inductor.separate_compiles(compile_threads=1):
        model, opt, dims, batches = build_training(cfg, world, steps=4)
        blocks = list(model.layers.children())
        impls = {name: _compiled_impls(blocks, name) for name in variant_names(compilers, ablate)}
        out: dict = {
            "rank": rank,
            "stubbed": stubbed,
            "errors": {},
            "walls": {},
            "peaks": {},
            "collectives": {},
            "comm": {},
            "tuning": {},
        }
        step_no = 0

        def run_with(block_impls: list, name: str = "") -> float:
            nonlocal step_no
            for block, impl in zip(blocks, block_impls, strict=True):
                block._compiled_call_impl = impl
            route = redist_opt.enabled() if name == "eager/ours" else contextlib.nullcontext()
            data = batches[step_no % len(batches)]
            step_no += 1
            t0 = time.perf_counter()
            with route:
                train_step(model, opt, dims, *data)
            return time.perf_counter() - t0

        def step(name: str) -> float:
            return run_with(impls[name], name)

        live = []
        for name in variant_names(compilers, ablate):
            try:
                for _ in range(warmup):
                    step(name)
                live.append(name)
            except Exception as e:  # noqa: BLE001 - a compile that fails on every rank alike is a result
                out["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        for compiler in compilers if tune_rounds > 0 else ():
            if compiler != "eager" and {f"{compiler}/torch", f"{compiler}/ours"} <= set(live):
                name = f"{compiler}/tuned"
                impls[name], out["tuning"][compiler] = _tuned_impls(
                    blocks, compiler, run_with, cfg, tune_rounds
                )
                for _ in range(warmup):
                    step(name)
                live.append(name)
        out["order"] = wall_stats.interleaved_order(live, rounds)
        steps = {name: functools.partial(step, name) for name in live}
        out["walls"] = interleaved_rounds(steps, rounds)
        if memory_rounds:
            out["peaks"] = interleaved_memory_rounds(steps, memory_rounds)
        for name in live:
            counter = wire.WireCounter()
            with counter:
                step(name)
            out["collectives"][name] = wire.summarize(counter.calls)
            out["comm"][name] = [_profiled_share(step, name) for _ in range(PROFILE_STEPS)]
        return out


def _compiled_impls(blocks: list, name: str) -> list:
    """Per block, what ``nn.Module.compile`` would keep for the variant ``name`` (None: eager)."""
    compiler, side = name.split("/")
    if compiler == "eager":
        return [None] * len(blocks)
    if side == "torch":
        backend = compiler
    else:
        backend = redist_opt.backend(compiler, **ablation_arguments(side.removeprefix("without ")))
    return [torch.compile(block._call_impl, backend=backend) for block in blocks]


def ablation_arguments(kind: str) -> dict:
    """``redist_opt.backend`` arguments that turn the rewrite ``kind`` off ("ours": none)."""
    if kind == "ours":
        return {}
    if kind == "graph-pass":
        return {"graph_pass": False}
    if kind in ("reassociate", "combine"):
        return {"rewrites": GraphRewrites(**{kind: False})}
    if kind not in ABLATIONS:
        raise ValueError(f"ablate={kind!r}: expected one of {', '.join(ABLATIONS)}")
    # ``without`` leaves this one pass out and keeps the rest of the default planning,
    # the collective cap included (a ``passes=[...]`` list would switch the cap off too)
    return {"without": (kind,)}


def _tuned_impls(blocks: list, compiler: str, run_with, cfg: M.StepConfig, tune_rounds: int) -> tuple:
    """``redist_opt.tune`` on this step (every rank writes the same profile), then the blocks
    compiled with ``backend(cost=that profile)``; and what tuning took and decided."""
    # The ranks share the parent's pid, so they name the same file.
    path = os.path.join(
        tempfile.gettempdir(), f"step_wall_{cfg.label.replace(' ', '_')}_{compiler}_{os.getppid()}.json"
    )

    def make_step(backend):
        block_impls = [torch.compile(block._call_impl, backend=backend) for block in blocks]
        return functools.partial(run_with, block_impls)

    result = redist_opt.tune(
        make_step, path, compiler=compiler, rounds=tune_rounds, warmup=1, route_outside_compiled=False
    )
    if dist.get_rank() == 0:
        print(format_result(result), flush=True)
    backend = redist_opt.backend(compiler, cost=path)
    tuning = {
        "seconds": result.seconds,
        "steps": result.steps,
        "compiles": result.compiles,
        "decisions": [d.record() for d in result.decisions],
        "slower_in_steps": list(result.model.slower_in_steps),
    }
    return [torch.compile(block._call_impl, backend=backend) for block in blocks], tuning


def _profiled_share(step, name: str) -> float:
    """The share of one step during which a collective is in flight: the union of the gloo
    work intervals the profiler records (on gloo's threads) over the step's wall."""
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = step(name)
    spans = [
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.name.startswith(_COLLECTIVE_EVENT)
    ]
    return min(1.0, union_length(spans) * 1e-6 / wall)  # profiler times are in us


def union_length(intervals) -> float:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total
