"""One rank's peak memory over one training step, and the statistic that compares steps
by it (the method and what it misses: ``docs/memory.md``).

A step's *peak* is the most bytes its rank's allocator held during the step above what it
held when the step began: the step's own working set (activations, gradients, collective
buffers, temporaries), the same for every variant of a step that shares one model and
optimizer, so torch's step and ours compare by it.

- **CPU**: the CPU allocator's allocations and frees, in order, as ``torch.profiler``
  records them (``profile_memory=True``, on every thread: gloo's work threads too), read
  by :mod:`redist_opt.torch_api.profiler`; the peak is the highest running total of their
  sizes inside the measured step. The allocator has no cache, so these are exact bytes.
  The profiler knows a block's size only if it was allocated while it recorded; a step
  frees what the step before it left (``zero_grad`` at its start frees the last step's
  gradients), so the window records one *lead-in* step of the same variant first, and the
  measured step's frees of what the lead-in allocated are counted. Blocks older than the
  lead-in (parameters, optimizer state) are never freed by a step.
- **CUDA**: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus
  ``memory_allocated`` at the step's start (the caching allocator's blocks handed to
  tensors, not what it reserved from the driver), after the same lead-in step.

Before the measured step: ``gc.collect()`` (garbage of earlier steps freed by a collection
inside the window would lower the peak at random) and the caller's ``before`` (the rounds
loop's barrier, so every rank runs the measured step at once). The profiler costs time:
a measured step is never a timed one (:func:`redist_opt.measure.rounds.interleaved_memory_rounds`
runs memory rounds of their own).

The statistic (:func:`peak_statistic`): per rank the least peak over the rounds, then the
most over ranks. A step's program fixes its allocations; what varies from step to step
adds to them (a gloo work thread's buffer alive at once with a compute temporary in one
step and not in the next, a lazily built cache): the least over rounds is the step's own
floor, which repeats; the most over ranks is the job's, whose largest rank runs out first.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Sequence

import torch

from redist_opt.measure.clock import step_device
from redist_opt.torch_api import profiler

__all__ = ["step_peak", "peak_above_start", "peak_statistic", "peak_summary", "MARK", "RULE"]

# The profiler range around the measured step (the lead-in runs outside it).
MARK = "redist_opt.measure.step"

RULE = (
    "per rank the least peak over the memory rounds (bytes held above the step's start; "
    "each round: a lead-in step, gc.collect(), a barrier, the measured step), then the most over ranks"
)


def peak_above_start(sizes: Iterable[int]) -> int:
    """The highest running total of ``sizes`` (allocations > 0, frees < 0, in order), and 0
    when nothing was held above the start: the most bytes held above the start."""
    total = peak = 0
    for nbytes in sizes:
        total += nbytes
        peak = max(peak, total)
    return peak


def step_peak(
    step: Callable, device: torch.device | str | None = None, before: Callable | None = None
) -> int:
    """This rank's peak bytes over one call of ``step`` (module docstring): ``step`` runs
    twice, a lead-in and the measured step; ``before`` runs just before the measured one.
    ``device``: whose allocator (default :func:`~redist_opt.measure.clock.step_device`)."""
    device = torch.device(device) if device is not None else step_device()
    if device.type == "cuda":
        return _cuda_peak(step, device, before)
    if device.type != "cpu":
        raise ValueError(f"step_peak: no allocator counter for device {device} (cpu or cuda)")
    with profiler.memory_profile() as prof:
        step()
        gc.collect()
        if before is not None:
            before()
        with profiler.marked(MARK):
            step()
    return peak_above_start(profiler.allocations_in(prof, MARK))


def _cuda_peak(step: Callable, device: torch.device, before: Callable | None) -> int:
    step()
    gc.collect()
    if before is not None:
        before()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def peak_statistic(per_rank: Sequence[Sequence[int]]) -> int:
    """The step's peak from every rank's peaks per round: the least over rounds per rank,
    then the most over ranks (module docstring)."""
    return max(min(rounds) for rounds in per_rank)


def peak_summary(per_rank: Sequence[Sequence[int]]) -> dict:
    """The statistic, its spread and the peaks it came from, as JSON: ``bytes``
    (:func:`peak_statistic`); ``spread``: the largest (most - least) / least over rounds of
    any rank, how much one step's figure can move; ``per_rank``: the peaks per rank, per round."""
    spread = max((max(r) - min(r)) / min(r) if min(r) else 0.0 for r in per_rank)
    return {"bytes": peak_statistic(per_rank), "spread": spread, "per_rank": [list(r) for r in per_rank]}
