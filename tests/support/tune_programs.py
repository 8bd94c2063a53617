"""Programs for the tuning tests: 4 gloo ranks (``redist_opt.tools.spawn.run_ranks``) tune a
small DTensor step with ``redist_opt.tune``. Kept free of pytest imports.

The step reduces a ``Partial, Partial`` DTensor on a 2x2 mesh: torch runs two all_reduces
(it merges only over a flattened mesh the user made, and there is none), and redist_opt's
merge-reductions pass, allowed to create the flattened group (``groups="create"``), makes
them one over both dims: the rewrite the tests see decided."""

from __future__ import annotations

import hashlib
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api import routing

MERGE = "merge-reductions"


GROUPS = "create"


def _mesh():
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))


def _merge_is_on() -> bool:
    """Whether the innermost ``enabled()`` block plans with merge-reductions (eager variants)."""
    options = routing.active_options()
    return options is not None and MERGE not in options.cost.slower_in_steps and MERGE not in options.without


def make_step_factory(mesh, *, late_rank: int = -1, late_s: float = 0.0, merged_costs_s: float = 0.0):
    """``make_step(backend)`` for ``redist_opt.tune``. ``late_rank`` sleeps ``late_s`` in
    every step (a skewed rank); ``merged_costs_s``: eager steps planned with the merge
    sleep that long on every rank, a rewrite that makes the step slower."""
    rank = dist.get_rank()

    def reduce(local):
        x = DTensor.from_local(local, mesh, [Partial(), Partial()], run_check=False)
        return x.redistribute(mesh, [Replicate(), Replicate()]).to_local()

    def make_step(backend):
        fn = reduce if backend is None else torch.compile(reduce, backend=backend, fullgraph=True)

        def step():
            if rank == late_rank:
                time.sleep(late_s)
            if merged_costs_s and _merge_is_on():
                time.sleep(merged_costs_s)
            return fn(torch.full((16, 8), float(rank + 1)))

        return step

    return make_step


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _collectives_after(mesh, path: str) -> dict:
    """The collectives one eager step issues planned with the written profile."""
    make_step = make_step_factory(mesh)
    step = make_step(None)
    with CommDebugMode() as comm, redist_opt.enabled(GROUPS, cost=path):
        out = step()
    counts = {str(k): v for k, v in comm.get_comm_counts().items()}
    return {"counts": counts, "out": out.tolist()}


def tune_eager(
    rank: int, world: int, path: str, late_rank: int, late_s: float, merged_costs_s: float
) -> dict:
    """Tune the eager step; what this rank decided, wrote and then runs."""
    mesh = _mesh()
    make_step = make_step_factory(mesh, late_rank=late_rank, late_s=late_s, merged_costs_s=merged_costs_s)
    result = redist_opt.tune(make_step, path, rounds=8, warmup=1, groups=GROUPS)
    return {
        "decisions": [(d.rewrite, d.keep, d.ratio, d.interval) for d in result.decisions],
        "slower_in_steps": result.model.slower_in_steps,
        "steps": result.steps,
        "times": result.times,
        "digest": _digest(path),
        "after": _collectives_after(mesh, path),
        "summary": redist_opt.measure.format_result(result),
    }


def tune_compiled(rank: int, world: int, path: str) -> dict:
    """Tune the step compiled with aot_eager; then restart-style: compile with the profile."""
    mesh = _mesh()
    make_step = make_step_factory(mesh)
    result = redist_opt.tune(make_step, path, compiler="aot_eager", rounds=4, warmup=1, groups=GROUPS)
    restarted = make_step(redist_opt.backend("aot_eager", groups=GROUPS, cost=path))()
    reference = make_step(None)()  # torch's eager step
    return {
        "decisions": [(d.rewrite, d.keep) for d in result.decisions],
        "compiles": result.compiles,
        "steps": result.steps,
        "digest": _digest(path),
        "equal_to_torch": torch.equal(restarted, reference),
        "out": restarted.tolist(),
    }


def tune_each(rank: int, world: int, folder: str) -> dict:
    """The three tunings of test_tune_gloo.py one after the other on one process group
    (starting 4 gloo ranks costs more than a tuning): the eager step, the eager step with
    rank 2 late by 10 ms and the merge costing 30 ms, and the compiled step, each writing
    its own profile in ``folder``. Each builds its own mesh and step; their results by name."""
    return {
        "eager": tune_eager(rank, world, f"{folder}/eager.json", -1, 0.0, 0.0),
        "skewed": tune_eager(rank, world, f"{folder}/skewed.json", 2, 0.01, 0.03),
        "compiled": tune_compiled(rank, world, f"{folder}/compiled.json"),
    }
