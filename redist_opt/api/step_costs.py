"""``redist_opt.profile_steps()``: what each collective costs inside a real step.

The cost profiles (``nccl``, ``gloo``, ``redist-opt calibrate``) price a collective run
alone. Inside a training step a collective also waits for the slowest member of its group
to arrive, and may stall compute it used to overlap with: a rewrite that is cheaper alone
can make the step slower. This module measures the collectives of real steps and fits
what it measured into a cost profile, which the job loads like a calibration profile::

    with redist_opt.profile_steps("in_step.json"):
        for _ in range(5):
            train_step()        # eager, enabled(), or compiled with backend()
    # the next start plans with the step's own costs:
    model = torch.compile(model, backend=redist_opt.backend(cost="in_step.json"))

What a collective costs here is what its rank's main thread spends on it: the call that
issues it plus the ``wait_tensor`` that waits for it (the time the step is held up, which
includes waiting for late peers and leaves out what overlapped with compute). It is read
per (kind, group size, bytes each rank feeds in), which is how the cost model prices a
collective, so the collectives a rewrite makes and the ones it replaces are priced from
the same table when both were measured: profile the step once with the rewrites (ours)
and once without (torch's, or ``backend(passes=())``) into the same file; a block adds
to the file it names.

Every rank leaves the block with the same profile: the ranks exchange their medians over
the default group (one ``all_gather_object`` at the end of the block, outside the steps)
and each key takes the slowest rank's median (a step waits for its slowest rank). A rank
that measured differently therefore cannot make a different decision; a profile file
that later differs by rank is the existing compile-time check's fault (every rank
raises, naming it).

Clocks: on CPU tensors (gloo) the host's clock, which sees the whole collective. On an
accelerator the host sees only a collective's launch and a stream wait, so a collective on a
device tensor is timed by device events on the issuing stream: one recorded before the
issue, one after ``wait_tensor`` (which makes that stream wait for the collective's), read
at the end of the block. Both span the same thing: from the issue until the step can use
the result.

Collectives issued through c10d rather than funcol (``dist.all_gather_into_tensor`` and the
like, as FSDP2 issues them) are not in the fitted curves: their wait is a ``Work.wait()``
outside the dispatcher, so only their issue is seen. They are counted and their issue time
summed as "other communication" (``StepCosts.other_communication``, the profile's record),
so a step whose time goes there shows it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from redist_opt.ir import cost_fit
from redist_opt.ir.c10d_backends import world_backend
from redist_opt.ir.cost import CostModel, load_profile, resolve
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError
from redist_opt.torch_api import c10d
from redist_opt.torch_api.tracing import InfraDispatchMode

__all__ = ["profile_steps", "StepCosts", "IN_STEP_KEY", "world_profile"]

# The key of the measurements in the profile file's "calibration" record.
IN_STEP_KEY = "in_step"

# functional collective -> (cost-model kind, index of its group-name argument)
_COLLECTIVES = {
    c10d.ALL_REDUCE: ("all_reduce", 2),
    c10d.ALL_REDUCE_INPLACE: ("all_reduce", 2),
    c10d.REDUCE_SCATTER: ("reduce_scatter", 3),
    c10d.ALL_GATHER: ("all_gather", 2),
    c10d.ALL_TO_ALL: ("all_to_all", 3),
}
_WAIT = c10d.WAIT


def _buffer(t: torch.Tensor) -> int:
    """The collective's result buffer: eager funcol hands back an AsyncCollectiveTensor
    wrapping it (no storage of its own), compiled code the buffer itself."""
    return getattr(t, "elem", t).untyped_storage().data_ptr()


class _CollectiveTimer(InfraDispatchMode):
    """Times each functional collective this rank issues: the issuing call plus the wait
    on its result, per (kind, group size, bytes fed in). Sees eager and compiled code
    alike (Inductor's wrapper calls the same ops through the dispatcher): an infra mode,
    which Dynamo does not skip compiled frames for (an ordinary dispatch mode would
    make every compiled step run eagerly under the timer)."""

    def __init__(self):
        super().__init__()
        self.times: dict[tuple[str, int, int], list[float]] = {}
        self._pending: dict[int, tuple[tuple[str, int, int], object]] = {}
        self._sizes: dict[str, int] = {}
        self._device_spans: list[tuple[tuple[str, int, int], object, object]] = []
        # c10d (not funcol) collectives: op name -> [calls, seconds spent issuing them]
        self.other: dict[str, list] = {}

    def _group_size(self, name: str) -> int:
        if name not in self._sizes:
            self._sizes[name] = len(c10d.process_group_ranks(name))
        return self._sizes[name]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor dispatches to local ops, which we see
        if func in _COLLECTIVES:
            kind, group_arg = _COLLECTIVES[func]
            x = args[0]
            key = (kind, self._group_size(str(args[group_arg])), x.numel() * x.element_size())
            if x.device.type != "cpu":  # device events on the issuing stream
                start = torch.Event(x.device, enable_timing=True)
                start.record()
                out = func(*args, **kwargs)
                self._pending[_buffer(out)] = (key, start)
                return out
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            self._pending[_buffer(out)] = (key, time.perf_counter() - t0)
            return out
        if func is _WAIT:
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            waited = time.perf_counter() - t0
            issued = self._pending.pop(_buffer(args[0]), None)
            if issued is not None:
                key, start = issued
                if isinstance(start, float):
                    self.times.setdefault(key, []).append(start + waited)
                else:
                    end = torch.Event(args[0].device, enable_timing=True)
                    end.record()
                    self._device_spans.append((key, start, end))
            return out
        if func.namespace == "c10d":  # a c10d collective (FSDP2's): its issue only
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            entry = self.other.setdefault(func.__name__, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0
            return out
        return func(*args, **kwargs)

    def read_device_spans(self) -> None:
        """Add the device-timed collectives to ``times`` (waits for their end events)."""
        for key, start, end in self._device_spans:
            end.synchronize()
            self.times.setdefault(key, []).append(start.elapsed_time(end) / 1e3)  # ms -> s
        self._device_spans.clear()


@dataclasses.dataclass
class StepCosts:
    """What a :func:`profile_steps` block measured and the profile it wrote (the same on
    every rank): ``measurements`` are ``{"kind", "p", "nbytes", "time", "calls",
    "rank_medians"}`` dicts, ``time`` the slowest rank's median in seconds."""

    path: str
    measurements: list[dict] = dataclasses.field(default_factory=list)
    model: CostModel | None = None
    # c10d collectives outside funcol, per op: {"calls", "issue_s"} of the slowest rank
    other_communication: dict = dataclasses.field(default_factory=dict)


def _rank_medians(times: dict) -> dict:
    return {key: (statistics.median(ts), len(ts)) for key, ts in times.items()}


def agree(per_rank: list[dict]) -> list[dict]:
    """One measurement per key from every rank's ``{(kind, p, nbytes): (median, calls)}``:
    the slowest rank's median. A pure function of the gathered list, so every rank that
    holds the same list gets the same answer."""
    keys = sorted({key for medians in per_rank for key in medians})
    out = []
    for kind, p, nbytes in keys:
        seen = [m[(kind, p, nbytes)] for m in per_rank if (kind, p, nbytes) in m]
        out.append(
            {
                "kind": kind,
                "p": p,
                "nbytes": nbytes,
                "time": max(t for t, _ in seen),
                "calls": max(n for _, n in seen),
                "rank_medians": [
                    m[(kind, p, nbytes)][0] if (kind, p, nbytes) in m else None for m in per_rank
                ],
            }
        )
    return out


def agree_other(per_rank: list[dict]) -> dict:
    """The c10d collectives outside funcol: per op, the most calls and the longest issue
    time of any rank (a pure function of the gathered list, like :func:`agree`)."""
    ops = sorted({op for other in per_rank for op in other})
    return {
        op: {
            "calls": max(other.get(op, [0, 0.0])[0] for other in per_rank),
            "issue_s": max(other.get(op, [0, 0.0])[1] for other in per_rank),
        }
        for op in ops
    }


def merge(earlier: list[dict], new: list[dict]) -> list[dict]:
    """Measurements of two blocks: a key measured in both keeps the later block's."""
    by_key = {(m["kind"], m["p"], m["nbytes"]): m for m in earlier}
    by_key |= {(m["kind"], m["p"], m["nbytes"]): m for m in new}
    return [by_key[k] for k in sorted(by_key)]


def _single_size_rows(base: CostModel, measurements: list[dict]) -> list[tuple]:
    """Rows for a (kind, group size) measured at one size only: the base model's per-byte
    slope through the measured point (one point gives a level, not a slope)."""
    sizes: dict = {}
    for m in measurements:
        sizes.setdefault((m["kind"], m["p"]), []).append(m)
    rows = []
    for (kind, p), ms in sorted(sizes.items()):
        if len({m["nbytes"] for m in ms}) != 1:
            continue
        n, t = ms[0]["nbytes"], ms[0]["time"]
        per_byte = max(
            0.0, (base.time_of(kind, p, "intra", 2 * n + 1) - base.time_of(kind, p, "intra", n)) / (n + 1)
        )
        rows.append((kind, p, "intra", cost_fit.BEYOND, max(0.0, t - per_byte * n), per_byte))
    return rows


def fit(base: CostModel, measurements: list[dict]) -> CostModel:
    """``base`` with the measured (kind, group size) curves in place of its own."""
    # As measured, not made non-decreasing in size: the loss's scalar all_reduce waits for
    # the slowest rank's whole forward, which says nothing about a 4 KiB gradient's.
    rows = list(cost_fit.fit_per_kind([{**m, "link": "intra"} for m in measurements], monotone=False))
    rows += _single_size_rows(base, measurements)
    measured = {(kind, p) for kind, p, *_ in rows}
    kept = [r for r in base.fitted if (r[0], r[1]) not in measured]
    name = base.name if base.name.startswith("in-step ") else f"in-step {base.name}"
    return dataclasses.replace(base, name=name, fitted=tuple(sorted(kept + rows)))


def _read_earlier(path: str) -> tuple[CostModel | None, list[dict]]:
    """The profile at ``path`` and its in-step measurements, or (None, []) without one."""
    if not os.path.exists(path):
        return None, []
    model = CostModel.load(path)
    with open(path) as f:
        record = json.load(f).get("calibration") or {}
    return model, list(record.get(IN_STEP_KEY, {}).get("measurements", []))


def _base_model(base, earlier: CostModel | None, backend: str) -> CostModel:
    if base is not None:
        return base if isinstance(base, CostModel) else load_profile(base)
    if earlier is not None:
        return earlier
    return world_profile(backend)


def world_profile(backend: str) -> CostModel:
    """What a plan on the world's ranks resolves to when no ``cost=`` is given:
    ``$REDIST_OPT_COST_PROFILE``, else the profile of ``backend``
    (:func:`~redist_opt.ir.c10d_backends.world_backend`)."""
    return resolve(MeshSpec((dist.get_world_size(),), backend=backend))[0]


@contextlib.contextmanager
def profile_steps(path: str | os.PathLike, *, base: CostModel | str | None = None):
    """Measure the collectives of the steps run inside the block and write, on every
    rank, the same cost profile to ``path`` (see the module docstring). ``base``: the
    profile whose curves the measured ones replace (default: the profile already at
    ``path``, else the one the default group's backend resolves to). Yields a
    :class:`StepCosts` filled in when the block ends. Run it around steps that are
    already compiled (after a warm-up step): it times collectives through a dispatch
    mode, which is not meant to be traced."""
    if not dist.is_initialized():
        raise RedistributeError("profile_steps: no process group: call init_process_group first")
    backend = world_backend()
    if backend == "fake":
        raise RedistributeError(
            "profile_steps: the 'fake' backend moves no data, so there is no time to measure"
        )
    path = os.fspath(path)
    earlier_model, earlier = _read_earlier(path)
    base_model = _base_model(base, earlier_model, backend)
    result = StepCosts(path)
    timer = _CollectiveTimer()
    with timer:
        yield result
    timer.read_device_spans()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (_rank_medians(timer.times), earlier, base_model, timer.other))
    # Every rank must start from the same file and base: a profile that differs by rank
    # would make ranks decide differently. Each rank checks the same gathered list, so
    # they all raise or all go on.
    first = gathered[0][1:3]
    differing = [r for r, (_, e, b, _) in enumerate(gathered) if (e, b) != first]
    if differing:
        raise RedistributeError(
            f"profile_steps({path!r}): ranks {differing} read another profile or base than rank 0 "
            "(a file that differs by host, or a different REDIST_OPT_COST_PROFILE): nothing written"
        )
    result.measurements = merge(earlier, agree([medians for medians, _, _, _ in gathered]))
    result.other_communication = agree_other([other for _, _, _, other in gathered])
    if not all(math.isfinite(m["time"]) for m in result.measurements):
        raise RedistributeError(f"profile_steps({path!r}): a measured time is not finite: nothing written")
    result.model = fit(base_model, result.measurements)
    result.model.save(
        path,
        calibration={
            IN_STEP_KEY: {
                "measurements": result.measurements,
                "other_communication": result.other_communication,
                "backend": backend,
            }
        },
    )
    dist.barrier()  # no rank reads the file (a next block, a compile) before every rank wrote it
