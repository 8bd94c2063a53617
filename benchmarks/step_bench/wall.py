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
so that the two compiles can never share an artifact. Every variant first runs its
warm-up steps (the compiles happen there); then rounds of one step per variant, in
:func:`redist_opt.tools.wall_stats.interleaved_order`, each step after a barrier.
Afterwards every variant runs one step under the collective counter (the count shows
each side ran its own graphs) and a few steps under the profiler (the communication share).

With ``ablate`` naming rewrite kinds (:data:`ABLATIONS`), each compiled compiler gets one
more side per kind, ``without <kind>``: ``redist_opt.backend`` with that one rewrite off,
timed in the same rounds, so what each rewrite does to the step is measured inside it.

With ``tune_steps`` > 0 each compiled compiler gets a third side, ``tuned``: after the
warm-up, ``redist_opt.profile_steps`` measures ``tune_steps`` steps of torch's variant (the
collectives as traced, which our rewrites replace) and as many of ours (the rewritten ones)
into one in-step profile, and ``backend(cost=that profile)`` compiles the blocks again:
the decisions the step's own times make. What tuning costs (seconds, steps) is reported.
"""

from __future__ import annotations

import contextlib
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
from redist_opt.graph_pass import GraphRewrites
from redist_opt.passes import DEFAULT_PIPELINE
from redist_opt.tools import wall_stats

COMPILERS = ("eager", "inductor", "aot_eager")
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
    tune_steps: int = 0,
    ablate: tuple = (),
) -> dict:
    """Spawned target: this rank's step times per variant, collectives per step, and the
    communication share of profiled steps."""
    stubbed = M.import_torchtitan()
    logging.getLogger("redist_opt").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="DTensor random operators")
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op. is deprecated")
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
    _separate_compile_caches()
    model, opt, dims, batches = build_training(cfg, world, steps=4)
    blocks = list(model.layers.children())
    impls = {name: _compiled_impls(blocks, name) for name in variant_names(compilers, ablate)}
    out: dict = {
        "rank": rank,
        "stubbed": stubbed,
        "errors": {},
        "walls": {},
        "collectives": {},
        "comm": {},
        "tuning": {},
    }
    step_no = 0

    def step(name: str) -> float:
        nonlocal step_no
        for block, impl in zip(blocks, impls[name], strict=True):
            block._compiled_call_impl = impl
        route = redist_opt.enabled() if name == "eager/ours" else contextlib.nullcontext()
        data = batches[step_no % len(batches)]
        step_no += 1
        t0 = time.perf_counter()
        with route:
            train_step(model, opt, dims, *data)
        return time.perf_counter() - t0

    live = []
    for name in variant_names(compilers, ablate):
        try:
            for _ in range(warmup):
                step(name)
            live.append(name)
        except Exception as e:  # noqa: BLE001 - a compile that fails on every rank alike is a result
            out["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    for compiler in compilers if tune_steps > 0 else ():
        if compiler != "eager" and {f"{compiler}/torch", f"{compiler}/ours"} <= set(live):
            name = f"{compiler}/tuned"
            t0 = time.perf_counter()
            impls[name] = _tuned_impls(blocks, compiler, step, cfg, tune_steps)
            for _ in range(warmup):
                step(name)
            out["tuning"][compiler] = {"seconds": time.perf_counter() - t0, "steps": 2 * tune_steps + warmup}
            live.append(name)
    out["walls"] = {name: [] for name in live}
    out["order"] = wall_stats.interleaved_order(live, rounds)
    for order in out["order"]:
        for name in order:
            dist.barrier()
            out["walls"][name].append(step(name))
    for name in live:
        counter = wire.WireCounter()
        with counter:
            step(name)
        out["collectives"][name] = wire.summarize(counter.calls)
        out["comm"][name] = [_profiled_share(step, name) for _ in range(PROFILE_STEPS)]
    return out


def _separate_compile_caches() -> None:
    """The two sides compile the same blocks in one process: no cache may serve one side's
    artifact to the other (Inductor's FX graph cache keys on the graph before custom passes).
    Compile in this process (no worker pool per rank) and allow one cache entry per block
    and variant."""
    import torch._dynamo
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.compile_threads = 1
    torch._functorch.config.enable_autograd_cache = False
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 1024


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


def _tuned_impls(blocks: list, compiler: str, step, cfg: M.StepConfig, tune_steps: int) -> list:
    """Measure ``tune_steps`` steps of torch's variant and of ours into one in-step profile
    (the same file and contents on every rank), then compile the blocks with it."""
    # The ranks share the parent's pid, so they name the same file.
    path = os.path.join(
        tempfile.gettempdir(), f"step_wall_{cfg.label.replace(' ', '_')}_{compiler}_{os.getppid()}.json"
    )
    if dist.get_rank() == 0 and os.path.exists(path):
        os.remove(path)
    dist.barrier()
    for side in ("torch", "ours"):
        with redist_opt.profile_steps(path):
            for _ in range(tune_steps):
                step(f"{compiler}/{side}")
    backend = (
        redist_opt.backend(cost=path) if compiler == "inductor" else redist_opt.backend(compiler, cost=path)
    )
    return [torch.compile(block._call_impl, backend=backend) for block in blocks]


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
