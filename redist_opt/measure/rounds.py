"""Steps measured in interleaved rounds on every rank: the one measuring loop of
``redist_opt.tune``, the step bench's wall part and ``examples/tune_tp.py``.

A round runs each step once, consecutive rounds in opposite orders
(:func:`~redist_opt.measure.wall_stats.interleaved_order`), so slow drift of the machine
hits every step alike. A *timed* round starts each step after a barrier of the default
group, so every rank times the same step at once, by
:func:`~redist_opt.measure.clock.step_clock`. A *memory* round measures each step's peak
bytes (:func:`~redist_opt.measure.memory.step_peak`: a lead-in step, a collection, the
barrier, the measured step); memory rounds are rounds of their own, since the profiler
they read costs time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.distributed as dist

from redist_opt.measure import memory, wall_stats
from redist_opt.measure.clock import Clock, step_clock

__all__ = [
    "interleaved_rounds",
    "interleaved_step_times",
    "interleaved_memory_rounds",
    "interleaved_step_peaks",
]


def _interleaved(steps: dict[str, Callable], rounds: int, measure: Callable) -> dict[str, list]:
    """``measure(step)`` of each of ``steps`` per round, in the interleaved order."""
    mine: dict[str, list] = {name: [] for name in steps}
    for order in wall_stats.interleaved_order(list(steps), rounds):
        for name in order:
            mine[name].append(measure(steps[name]))
    return mine


def _gathered(mine: dict[str, list]) -> list[dict[str, list]]:
    """Every rank's ``mine``, in rank order (one ``all_gather_object``)."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


def interleaved_rounds(
    steps: dict[str, Callable], rounds: int, clock: Clock | None = None
) -> dict[str, list[float]]:
    """This rank's time of each of ``steps`` (name -> a step already warmed up) per round, in
    seconds, over ``rounds`` rounds; ``clock``: default :func:`step_clock`. Every rank calls
    it with the same names."""
    clock = clock or step_clock()

    def timed(step: Callable) -> float:
        dist.barrier()
        start = clock.start()
        step()
        return clock.stop(start)

    return _interleaved(steps, rounds, timed)


def interleaved_step_times(steps: dict[str, Callable], rounds: int) -> dict[str, list[float]]:
    """:func:`interleaved_rounds`, then the slowest rank's time per round and name, the same
    on every rank (one ``all_gather_object`` at the end)."""
    gathered = _gathered(interleaved_rounds(steps, rounds))
    return {name: wall_stats.per_step_max([g[name] for g in gathered]) for name in steps}


def interleaved_memory_rounds(steps: dict[str, Callable], rounds: int) -> dict[str, list[int]]:
    """This rank's peak bytes of each of ``steps`` per round over ``rounds`` memory rounds
    (each measurement runs the step twice: a lead-in and the measured step). Every rank
    calls it with the same names."""
    return _interleaved(steps, rounds, functools.partial(memory.step_peak, before=dist.barrier))


def interleaved_step_peaks(steps: dict[str, Callable], rounds: int) -> dict[str, list[list[int]]]:
    """:func:`interleaved_memory_rounds`, then every rank's peaks per round and name (rank
    order), the same on every rank: :func:`~redist_opt.measure.memory.peak_summary` takes it."""
    gathered = _gathered(interleaved_memory_rounds(steps, rounds))
    return {name: [g[name] for g in gathered] for name in steps}
