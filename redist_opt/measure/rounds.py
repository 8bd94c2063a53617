"""Steps timed in interleaved rounds on every rank: the one measuring loop of
``redist_opt.tune``, the step bench's wall part and ``examples/tune_tp.py``.

A round runs each step once, consecutive rounds in opposite orders
(:func:`~redist_opt.measure.wall_stats.interleaved_order`), so slow drift of the machine
hits every step alike; each step starts after a barrier of the default group, so every
rank times the same step at once, and is timed by :func:`~redist_opt.measure.clock.step_clock`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from redist_opt.measure import wall_stats
from redist_opt.measure.clock import Clock, step_clock

__all__ = ["interleaved_rounds", "interleaved_step_times"]


def interleaved_rounds(
    steps: dict[str, Callable], rounds: int, clock: Clock | None = None
) -> dict[str, list[float]]:
    """This rank's time of each of ``steps`` (name -> a step already warmed up) per round, in
    seconds, over ``rounds`` rounds; ``clock``: default :func:`step_clock`. Every rank calls
    it with the same names."""
    clock = clock or step_clock()
    mine: dict[str, list[float]] = {name: [] for name in steps}
    for order in wall_stats.interleaved_order(list(steps), rounds):
        for name in order:
            dist.barrier()
            start = clock.start()
            steps[name]()
            mine[name].append(clock.stop(start))
    return mine


def interleaved_step_times(steps: dict[str, Callable], rounds: int) -> dict[str, list[float]]:
    """:func:`interleaved_rounds`, then the slowest rank's time per round and name, the same
    on every rank (one ``all_gather_object`` at the end)."""
    mine = interleaved_rounds(steps, rounds)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {name: wall_stats.per_step_max([g[name] for g in gathered]) for name in steps}
