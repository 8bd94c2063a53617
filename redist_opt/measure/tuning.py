"""``redist_opt.tune``: each rewrite decided by the job's own steps (``redist-opt tune``
runs it on a job's step factory: :mod:`redist_opt.tools.tune`).

The cost profiles price a collective run alone; inside a training step a rewrite that is
cheaper alone can still make the step slower (a collective over more ranks waits for all of
them to be scheduled; a merged collective can stall compute that used to overlap). Which
rewrites pay is a property of the job, its devices and its backend, so the job measures
itself. The shape is XLA's profile-guided latency estimator: run the real program, measure,
and compile again with what was measured::

    def make_step(backend):                  # None: the eager step; else a compile backend
        compiled = model if backend is None else torch.compile(model, backend=backend)

        def step():
            loss = compiled(x).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        return step

    redist_opt.tune(make_step, "tuned.json", compiler="inductor")   # every rank calls it
    # the next start plans with the decisions:
    model = torch.compile(model, backend=redist_opt.backend(cost="tuned.json"))

With a compiler, ours also runs the whole step inside ``enabled(groups, cost=...)``
(``route_outside_compiled=True``): what the restarted job runs with ``enabled(cost=path)``
around its step and ``backend(cost=path)`` for its model. ``route_outside_compiled=False``
tunes a job that compiles with ``backend()`` alone.

``make_step(backend)`` must build its step around the callable it compiles with that
backend (``torch.compile(model, backend=backend)`` returns a new one each time;
``model.compile(...)`` replaces the model's own, which would make every variant run the
last one compiled). With ``compiler=None`` the step is built once, with ``backend=None``,
and each variant runs it outside ``enabled()`` (torch) or inside ``enabled(cost=...)``.

What it runs, on every rank, in this order:

1. **Candidates.** The step with every rewrite on (the base profile's ``slower_in_steps``
   lifted), ``warmup`` times, compiled with the compile caches off so that every
   redistribution is planned where it can be seen: the passes named in the plans of those
   steps (``Plan.applied_passes``) are the candidates. The ranks agree on their union
   before any rank builds a variant, so every rank compiles and runs the same variants.
2. **Variants**: torch's step (``torch``), ours with every candidate on (``ours``), and
   ours without each candidate (``ours without <pass>``), each warmed up ``warmup`` steps
   (the compiles happen there).
3. **Rounds**: ``rounds`` rounds of one step per variant, consecutive rounds in opposite
   orders (:func:`~redist_opt.measure.rounds.interleaved_step_times`); each step starts
   after a barrier and is timed by :func:`~redist_opt.measure.clock.step_clock` (host
   clock on CPU; events on the current stream, synchronized, on a GPU, which sees NCCL's
   kernels where the host sees launches).
4. **Memory rounds**: ``memory_rounds`` rounds (default 3, 0: none), interleaved the same
   way, of each variant's peak bytes (:func:`~redist_opt.measure.rounds.interleaved_step_peaks`:
   a lead-in step, ``gc.collect()``, a barrier, the measured step under the allocator's
   counter, docs/memory.md). Rounds of their own: the profiler the CPU figure is read from
   costs time, so no timed step is a profiled one. The peaks are recorded and printed beside
   the times; they decide nothing yet.
5. **The rule** (:func:`~redist_opt.measure.decisions.decide`, over ``wall_stats``): the
   ranks gather their times; a step takes as long as its slowest rank; per candidate, the
   ratio median(step without it) / median(step with it) and its paired-bootstrap 95%
   interval. A measurement changes the base profile's
   decision only where it is confident: a rewrite the base keeps is dropped when the step
   is measured slower with it (the whole interval below 1); one the base leaves out comes
   back only when the step is measured faster with it (the whole interval above 1). Inside
   the noise the base's decision stands, so a short tuning run cannot overturn a decision
   measured with more rounds. Every rank computes this from the same gathered times with a
   seeded bootstrap, so every rank decides the same, however differently its own clock ran.
6. **The profile**: the base profile with ``slower_in_steps`` = the dropped rewrites, plus
   the base's exclusions of passes that rewrote nothing in this step (the step cannot
   judge them), and under ``calibration["tune"]`` the measurements: per variant the step
   times and peak bytes, per candidate the ratio, interval and decision, the torch version, backend,
   world size, meshes, rounds, steps and seconds. ``backend(cost=path)`` and
   ``enabled(cost=path)`` load it; the plan and compile caches key on the profile's
   contents. Every rank writes the same bytes.

Per rewrite *kind* (pass), not per instance: one variant per instance would multiply the
steps, and on the shared machines this was built on a single instance's effect is inside
the noise of a step.

What it costs: ``(2 + candidates) * (warmup + rounds + 2 * memory_rounds)`` steps (the
first ``warmup`` of them find the candidates; a memory measurement runs two), and with a
compiler ``2 + candidates`` compiles of the step (``TuneResult.steps``,
``TuneResult.compiles``, ``TuneResult.seconds``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from redist_opt import pipeline
from redist_opt.api import clear_caches, enabled
from redist_opt.api.routing import active_options
from redist_opt.api.step_costs import world_profile
from redist_opt.graph.backend import backend as redist_backend
from redist_opt.graph.backend import check_inner
from redist_opt.ir.c10d_backends import world_backend
from redist_opt.ir.cost import CostModel, load_profile
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.text import mesh_str
from redist_opt.measure import memory, wall_stats
from redist_opt.measure.clock import step_device
from redist_opt.measure.decisions import OURS, TORCH, WITHOUT, TuneResult, decide
from redist_opt.measure.rounds import interleaved_step_peaks, interleaved_step_times
from redist_opt.passes import DEFAULT_PIPELINE
from redist_opt.torch_api import inductor

__all__ = ["tune", "TUNE_KEY"]

# The key of the tuning record in the profile file's "calibration" record.
TUNE_KEY = "tune"


def tune(
    make_step: Callable,
    path: str | os.PathLike,
    *,
    compiler: str | Callable | None = None,
    rounds: int = 20,
    warmup: int = 2,
    base: CostModel | str | None = None,
    groups="existing",
    route_outside_compiled: bool = True,
    memory_rounds: int = 3,
) -> TuneResult:
    """Time the job's step with each rewrite on and off, decide, agree, and write a cost
    profile to ``path`` (see the module docstring). Every rank of the default group calls
    it with the same arguments.

    ``make_step(backend)`` returns a callable that runs one training step; ``compiler``:
    None (the eager step, built once with ``backend=None``), ``"inductor"``, ``"aot_eager"``
    or an aot_autograd ``fw_compiler`` callable (torch's side compiles with it as given, ours
    with ``redist_opt.backend(compiler, ...)``). ``base``: the profile whose decisions are
    tuned (a ``CostModel``, a built-in name or a profile file; default: what a plan on the
    world resolves to, ``$REDIST_OPT_COST_PROFILE`` else the backend's). ``groups``: the
    ``groups`` option of ours, as the job will use it. ``route_outside_compiled`` (with a
    compiler): ours runs the whole step inside ``enabled(groups, cost=...)`` as well, so the
    redistributions outside the compiled region (an eager optimizer step reducing the
    gradients, a loss's ``full_tensor``) are ours too; the restarted job then runs its step
    inside ``enabled(cost=path)`` as well as compiling with ``backend(cost=path)``. False:
    only the compiled region is ours, as in a job that compiles with ``backend()`` alone.
    ``memory_rounds``: rounds of each variant's peak bytes after the timed ones (0: none)."""
    rounds, warmup, memory_rounds = _check(make_step, compiler, rounds, warmup, memory_rounds)
    if not dist.is_initialized():
        raise RedistributeError("tune: no process group: call torch.distributed.init_process_group first")
    if active_options() is not None:
        raise RedistributeError(
            "tune: called inside redist_opt.enabled(): torch's side would be routed too; call it outside "
            "(tune enters enabled() itself for ours)"
        )
    backend_name = world_backend()
    if backend_name == "fake":
        raise RedistributeError("tune: the 'fake' backend moves no data, so there is no step time to measure")
    path = os.fspath(path)
    base_model = (
        base if isinstance(base, CostModel) else load_profile(base) if base else world_profile(backend_name)
    )
    every_rewrite = dataclasses.replace(base_model, slower_in_steps=())
    t0 = time.perf_counter()
    runs = _Runs(make_step, compiler, groups, route_outside_compiled)
    with inductor.separate_compiles() if compiler is not None else contextlib.nullcontext():
        # Plans cached from earlier steps would not be planned again where the observer
        # sees them: start from empty caches (on every rank alike, as clear_caches asks).
        clear_caches()
        seen = _Seen()
        pipeline.PLAN_OBSERVERS.append(seen)
        try:
            runs.add(OURS, every_rewrite)
            for _ in range(warmup):
                runs.run(OURS)
        finally:
            pipeline.PLAN_OBSERVERS.remove(seen)
        candidates, meshes = _agree_on_candidates(seen, base_model, path)
        runs.add(TORCH, None)
        for name in candidates:
            runs.add(WITHOUT + name, dataclasses.replace(base_model, slower_in_steps=(name,)))
        variants = [TORCH, OURS] + [WITHOUT + name for name in candidates]
        for name in variants:
            for _ in range(warmup if name != OURS else 0):
                runs.run(name)
        steps = {name: functools.partial(runs.run, name) for name in variants}
        times = interleaved_step_times(steps, rounds)
        peaks = interleaved_step_peaks(steps, memory_rounds) if memory_rounds else {}
    decisions = decide(times, candidates, base_model.slower_in_steps)
    dropped = {d.rewrite for d in decisions if not d.keep}
    unjudged = set(base_model.slower_in_steps) - set(candidates)
    model = dataclasses.replace(
        base_model,
        name=base_model.name if base_model.name.startswith("tuned ") else f"tuned {base_model.name}",
        slower_in_steps=tuple(sorted(dropped | unjudged)),
    )
    against_torch = {
        name: wall_stats.compare(times[TORCH], times[name]) for name in variants if name != TORCH
    }
    # What the record says of the run is the same on every rank (every rank writes the same
    # bytes): the slowest rank's seconds, rank 0's clock for when.
    clocks: list = [None] * dist.get_world_size()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    dist.all_gather_object(clocks, (time.perf_counter() - t0, now))
    seconds, created = max(c[0] for c in clocks), clocks[0][1]
    tuned_variant = OURS if not dropped else WITHOUT + next(iter(dropped)) if len(dropped) == 1 else None
    result = TuneResult(
        path=path,
        model=model,
        decisions=decisions,
        times=times,
        against_torch=against_torch,
        tuned_variant=tuned_variant,
        not_judged=tuple(sorted(unjudged)),
        steps=runs.steps,
        seconds=seconds,
        compiles=runs.compiles,
        peaks=peaks,
    )
    settings = {
        "compiler": compiler if compiler is None or isinstance(compiler, str) else repr(compiler),
        "groups": groups if isinstance(groups, str) else list(groups),
        "route_outside_compiled": route_outside_compiled if compiler is not None else None,
        "rounds": rounds,
        "warmup": warmup,
        "memory_rounds": memory_rounds,
    }
    record = _record(result, base_model, backend_name, meshes, settings, created)
    model.save(path, calibration={**_earlier_calibration(base), TUNE_KEY: record})
    dist.barrier()  # no rank reads the file (a restart, a compile) before every rank wrote it
    return result


def _check(make_step, compiler, rounds, warmup, memory_rounds) -> tuple[int, int, int]:
    if not callable(make_step):
        raise RedistributeError(f"tune: make_step={make_step!r} is not callable (a function of the backend)")
    try:
        check_inner(compiler, allow_none=True)  # None: the eager step
    except (TypeError, ValueError) as e:
        raise RedistributeError(f"tune: compiler={compiler!r}: {e}") from None
    for name, value, least in (
        ("rounds", rounds, 2),
        ("warmup", warmup, 1),
        ("memory_rounds", memory_rounds, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RedistributeError(f"tune: {name}={value!r}: expected an integer >= {least}")
    return rounds, warmup, memory_rounds


class _Runs:
    """The variants' steps and how many steps and compiles they took."""

    def __init__(self, make_step, compiler, groups, route_outside_compiled: bool) -> None:
        self.make_step, self.compiler, self.groups = make_step, compiler, groups
        self.route_outside_compiled = route_outside_compiled
        self.eager_step = make_step(None) if compiler is None else None
        self.variants: dict[str, Callable] = {}
        self.steps = 0
        self.compiles = 0

    def add(self, name: str, cost: CostModel | None) -> None:
        """``cost`` None: torch's step; else ours, planning with that profile."""
        if self.compiler is None:
            step = self.eager_step
        elif cost is None:
            step = self.make_step(self.compiler)
            self.compiles += 1
        else:
            step = self.make_step(redist_backend(self.compiler, groups=self.groups, cost=cost))
            self.compiles += 1
        if cost is None or (self.compiler is not None and not self.route_outside_compiled):
            self.variants[name] = step
            return

        def ours(step=step, cost=cost):
            with enabled(self.groups, cost=cost):
                return step()

        self.variants[name] = ours

    def run(self, name: str) -> None:
        self.variants[name]()
        self.steps += 1


class _Seen:
    """A pipeline observer: the passes that rewrote a plan, and the meshes planned on."""

    def __init__(self) -> None:
        self.passes: set[str] = set()
        self.meshes: set[str] = set()

    def __call__(self, plan) -> None:
        self.passes.update(plan.applied_passes)
        self.meshes.add(mesh_str(plan.mesh))


def _agree_on_candidates(seen: _Seen, base_model: CostModel, path: str) -> tuple[list[str], list[str]]:
    """The union over ranks of the passes that rewrote a plan, and of the meshes; every rank
    raises the same error when the ranks tune from different base profiles."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (sorted(seen.passes), sorted(seen.meshes), base_model))
    differing = [r for r, (_, _, b) in enumerate(gathered) if b != gathered[0][2]]
    if differing:
        raise RedistributeError(
            f"tune({path!r}): ranks {differing} tune from another base profile than rank 0 "
            "(a file that differs by host, or a different REDIST_OPT_COST_PROFILE): nothing measured"
        )
    known = {cls.name for cls in DEFAULT_PIPELINE}
    candidates = sorted({p for passes, _, _ in gathered for p in passes} & known)
    meshes = sorted({m for _, ms, _ in gathered for m in ms})
    return candidates, meshes


def _earlier_calibration(base) -> dict:
    """A base profile file's own records (a calibration, in-step measurements), kept."""
    if isinstance(base, (str, os.PathLike)) and os.path.isfile(base):
        with open(base) as f:
            return dict(json.load(f).get("calibration") or {})
    return {}


def _record(result: TuneResult, base_model, backend_name, meshes, settings: dict, created: str) -> dict:
    return {
        "command": " ".join(sys.argv),
        "created": created,
        "torch": torch.__version__,
        "backend": backend_name,
        "world_size": dist.get_world_size(),
        "meshes": meshes,
        **settings,
        "base_profile": base_model.name,
        "rule": "the slowest rank's step, median ratio (without / with) and its paired-bootstrap 95% "
        "interval: a rewrite the base keeps is dropped when the interval is below 1, one the base "
        "leaves out comes back when it is above 1; otherwise the base's decision stands",
        "steps": result.steps,
        "compiles": result.compiles,
        "seconds": round(result.seconds, 3),
        "decisions": [d.record() for d in result.decisions],
        "not_judged": list(result.not_judged),
        "against_torch": {
            name: {"ratio": c["ratio"], "interval": list(c["interval"]), "verdict": c["verdict"]}
            for name, c in result.against_torch.items()
        },
        "tuned_variant": result.tuned_variant,
        "times": result.times,
        "times_sha256": hashlib.sha256(json.dumps(result.times).encode()).hexdigest(),
        "memory_device": step_device().type,
        "memory_rule": memory.RULE,
        "peaks": {name: memory.peak_summary(per_rank) for name, per_rank in result.peaks.items()},
    }
