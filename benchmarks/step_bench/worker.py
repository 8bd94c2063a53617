"""One rank of the step bench: every mode of one config, in one process group.

Modes run in this order, each on a freshly built and identically initialised model:
plain torch, ``enabled(groups="existing")``, compiled plain (aot_eager, then Inductor),
compiled with ``redist_opt.backend()`` (Inductor, then aot_eager), then ``enabled(groups="create")`` last,
because the groups it creates would otherwise be "existing" for the modes after it.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
import warnings

import torch

import redist_opt
from benchmarks.step_bench import model as M
from benchmarks.step_bench import wire
from redist_opt.graph import optimize

MODES = (
    "plain",
    "existing",
    "compiled",
    "compiled_inductor",
    "compiled_ours",
    "compiled_ours_aot_eager",
    "create",
)
# The backend each compiled mode compiles every TransformerBlock with.
COMPILE_BACKENDS = {
    "compiled": lambda: "aot_eager",
    "compiled_inductor": lambda: "inductor",
    "compiled_ours": lambda: redist_opt.backend(),
    "compiled_ours_aot_eager": lambda: redist_opt.backend("aot_eager"),
}


def run_config(
    rank: int, world: int, cfg: M.StepConfig, modes: tuple, steps: int, warmup: int, save: bool = False
) -> dict:
    """Spawned target: this rank's results for every mode of ``cfg``; ``save``: after the
    steps, gather every parameter as a full checkpoint does (counted on its own)."""
    stubbed = M.import_torchtitan()
    # Hand-back warnings are captured per call (wire.TransitionLog); not logged 8 times over.
    logging.getLogger("redist_opt").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="DTensor random operators")
    # torch's own deprecation notice, raised by an isinstance check inside torch, once per rank
    warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op. is deprecated")
    out = {"rank": rank, "stubbed": stubbed, "modes": {}}
    for mode in modes:
        try:
            out["modes"][mode] = _run_mode(cfg, world, mode, steps, warmup, save)
        except Exception as e:  # noqa: BLE001 - a mode that fails on every rank alike is a result
            # (one that fails on some ranks only hangs the others; run_ranks reports that)
            out["modes"][mode] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    return out


def _compile_backend(mode: str):
    return COMPILE_BACKENDS[mode]() if mode in COMPILE_BACKENDS else None


def _run_mode(cfg: M.StepConfig, world: int, mode: str, steps: int, warmup: int, save: bool) -> dict:
    torch._dynamo.reset()
    redist_opt.clear_caches()
    model, dims = M.build(cfg, world, compile_backend=_compile_backend(mode))
    force_sum_reduction(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    counter = wire.WireCounter()
    log = wire.TransitionLog(counter)
    graph_results: list = []
    routed = mode in ("existing", "create", "compiled_ours", "compiled_ours_aot_eager")
    recorder = contextlib.ExitStack()
    if mode != "existing" and mode != "create":  # torch's own calls (compiled_ours: outside the graphs)
        recorder.enter_context(wire.record_torch_transitions(log))
    if routed:  # entered after: enabled() and the backend install what is patched at their entry
        recorder.enter_context(wire.record_routed_transitions(log))
    route = redist_opt.enabled(groups=mode) if mode in ("existing", "create") else contextlib.nullcontext()
    data = batches_for(dims, steps)
    res = {"losses": [], "walls": [], "steps": []}
    with _capture_graph_pass(graph_results), recorder, route:
        for step in range(steps):
            window, gnorm = wire.Window(counter, log), wire.Window(counter, log)
            t0 = time.perf_counter()
            with counter, window:
                loss = train_step(model, opt, dims, *data[step], gnorm=gnorm)
            res["walls"].append(time.perf_counter() - t0)
            res["losses"].append(_local_value(loss))
            res["steps"].append({**window.summary(), "gnorm": gnorm.summary()})
        if save:
            res["save"] = _save(model, wire.Window(counter, log))
    timed = res["walls"][warmup:] or res["walls"]
    res["wall_median"] = statistics.median(timed)
    res["graph_pass"] = graph_results
    res["graphs_compiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return res


def build_training(cfg: M.StepConfig, world: int, *, steps: int, compile_backend=None):
    """This rank's model (its blocks compiled by ``compile_backend``, eager without one), its
    AdamW optimizer, its parallel dims and ``steps`` batches: one training side of a bench."""
    model, dims = M.build(cfg, world, compile_backend=compile_backend)
    force_sum_reduction(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, opt, dims, batches_for(dims, steps)


def force_sum_reduction(model) -> None:
    """gloo has no PREMUL_SUM: FSDP2 must divide after a SUM reduce-scatter."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)


def batches_for(dims, steps: int) -> list:
    """Token batches: one per data-parallel rank (the same on its tensor-parallel ranks)."""
    batch_rank = dims.get_mesh("batch").get_local_rank() if dims.dp_enabled else 0
    g = torch.Generator().manual_seed(1000 + batch_rank)
    return [
        (
            torch.randint(0, M.VOCAB, (1, M.SEQ), generator=g),
            torch.randint(0, M.VOCAB, (1, M.SEQ), generator=g),
        )
        for _ in range(steps)
    ]


def train_step(model, opt, dims, inputs, labels, gnorm=None):
    """torchtitan's train step: token count over the batch mesh, forward, loss, backward,
    ``clip_grad_norm_`` (inside ``gnorm``, which counts its collectives) and the optimizer step."""
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed import full_dtensor
    from torchtitan.distributed import utils as dist_utils

    opt.zero_grad()
    local_tokens = torch.tensor(labels.numel(), dtype=torch.int64)
    if dims.dp_enabled:
        global_tokens = dist_utils.dist_sum_tensor(local_tokens, dims.get_mesh("batch"))
    else:
        global_tokens = local_tokens
    kwargs: dict = {}
    if dims.spmd_backend == "full_dtensor":
        inputs, labels, kwargs = full_dtensor.parallelize_inputs(dims, inputs, labels, kwargs)
    pred = model(inputs, **kwargs)
    loss = cross_entropy_loss(pred, labels) / global_tokens
    del pred
    loss.backward()
    with gnorm if gnorm is not None else contextlib.nullcontext():
        dist_utils.clip_grad_norm_(list(model.parameters()), 1.0, foreach=True)
    opt.step()
    return loss.detach()


def _save(model, window) -> dict:
    """What a full (consolidated) checkpoint does with every parameter: gather it to a
    replicated tensor (``full_tensor()``, as torch.distributed.checkpoint's full state dict
    and FSDP2 + TP's ``[_StridedShard(0), Shard(0)] -> [R, R]`` do); collectives and
    transitions of the gather only."""
    from torch.distributed.tensor import DTensor

    with window.counter, window, torch.no_grad():
        for p in model.parameters():
            if isinstance(p, DTensor):
                p.full_tensor()
    return window.summary()


def _local_value(loss) -> float:
    from torch.distributed.tensor import DTensor

    if isinstance(loss, DTensor):
        loss = loss.to_local()
    return float(loss)


@contextlib.contextmanager
def _capture_graph_pass(results: list):
    """Record what the compiled-graph pass did to each graph it saw."""
    original = optimize.optimize_graph

    def recorded(gm, *args, **kwargs):
        r = original(gm, *args, **kwargs)
        results.append(
            {
                "chains": len(r.chains),
                "rewritten": sum(1 for c in r.chains if c.rewritten),
                "before": r.collectives_before,
                "after": r.collectives_after,
                "reassociated": r.all_reduces_reassociated,
                "combined": r.collectives_combined,
                "not_raised": sorted({str(n) for n in r.not_raised}),
            }
        )
        return r

    optimize.optimize_graph = recorded
    try:
        yield
    finally:
        optimize.optimize_graph = original
