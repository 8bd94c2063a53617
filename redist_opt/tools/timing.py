"""Timing collectives on ranks, and the conditions a measurement was taken under.

How a time is measured (``calibrate`` and ``bench``): every rank runs the same
schedule; a sample is a world barrier followed by ``reps`` back-to-back calls
(each waited for), divided by ``reps``, where ``reps`` is chosen from a warm-up so
a sample lasts a couple of milliseconds (that amortizes the barrier's exit skew
at small sizes) and agreed on by all ranks. A sample's time is the slowest
rank's; a measurement is the median over samples. Its noise is the standard
error of that median estimated from the samples' median absolute deviation.

Where the time is read is a :class:`~redist_opt.measure.clock.Clock` on the timed
tensors' device; :func:`select_device` picks backend and clock for a launched job.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from redist_opt.ir.c10d_backends import launch_backend
from redist_opt.measure.clock import Clock
from redist_opt.torch_api.c10d import AsyncCollectiveTensor

__all__ = [
    "Stat",
    "timed_samples",
    "wait",
    "loadavg",
    "note_load",
    "select_device",
]


def select_device(local_rank: int = 0) -> tuple[str, Clock]:
    """(process-group backend, clock) of a launched job: NCCL and events on the local
    rank's CUDA device where CUDA is this process's accelerator, else gloo and the host
    clock (:func:`~redist_opt.ir.c10d_backends.launch_backend`)."""
    backend = launch_backend()
    return backend, Clock(torch.device("cuda", local_rank)) if backend == "nccl" else Clock()


# A sample lasts about this long (seconds): long enough that the barrier's exit skew
# is small next to it, short enough to keep the default runs quick.
SAMPLE_TARGET = 2e-3
MAX_REPS = 64


def _agree_reps(single: float, device=None) -> int:
    """``reps`` from this rank's warm-up time of one call, agreed on by all ranks (max)."""
    t = torch.tensor([single], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return max(1, min(MAX_REPS, int(SAMPLE_TARGET / max(float(t.item()), 1e-7))))


def _time_once(fn: Callable, clock: Clock) -> float:
    token = clock.start()
    fn()
    return clock.stop(token)


def timed_samples(
    fns: Sequence[Callable], iters: int, warmup: int, clock: Clock | None = None
) -> list[list[float]]:
    """Per-call sample times of each fn, the fns interleaved sample by sample.

    Interleaving (A B C, A B C, ...) makes slow drift of the machine hit every
    variant alike, so ratios between them stay meaningful. ``clock``: where times
    are read (default: the host's, on CPU).
    """
    clock = clock or Clock()
    for fn in fns:
        for _ in range(warmup):
            fn()
    reps = [_agree_reps(min(_time_once(fn, clock) for _ in range(2)), clock.device) for fn in fns]
    samples: list[list[float]] = [[] for _ in fns]
    for i in range(iters):
        for j in range(len(fns)):
            k = (i + j) % len(fns)  # rotate the order too
            fn, n = fns[k], reps[k]
            dist.barrier()
            token = clock.start()
            for _ in range(n):
                fn()
            samples[k].append(clock.stop(token) / n)
    return samples


def wait(x):
    if isinstance(x, AsyncCollectiveTensor):
        return x.wait()
    return x


@dataclasses.dataclass(frozen=True)
class Stat:
    """A measurement: median of per-sample slowest-rank times, and its noise."""

    median: float
    stderr: float  # standard error of the median, from the MAD
    samples: tuple[float, ...]

    @classmethod
    def of(cls, per_rank: Sequence[Sequence[float]]) -> Stat:
        samples = tuple(max(ts) for ts in zip(*per_rank))
        med = statistics.median(samples)
        mad = statistics.median(abs(s - med) for s in samples)
        # sigma ~ 1.4826 MAD; the median's standard error ~ 1.2533 sigma / sqrt(n).
        stderr = 1.2533 * 1.4826 * mad / math.sqrt(len(samples))
        return cls(med, stderr, samples)


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def note_load(end: str = "\n") -> None:
    """Print a note when other processes load the machine (the times will be noisier)."""
    load = loadavg()
    cpus = os.cpu_count() or 1
    if load and load[0] > 0.5 * cpus:
        print(
            f"note: load average {load[0]:.1f} on {cpus} cpus: other processes share the "
            "machine, so times include scheduling delays and are noisier",
            end=end,
            flush=True,
        )
