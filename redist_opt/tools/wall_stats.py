"""The wall benchmark's statistics: the order steps run in, the ratio and its interval.

Torch's step and ours run in rounds on the same ranks and model: every round runs
each variant once, and consecutive rounds run them in opposite orders (ABBA ABBA ...),
so neither side is always the one that follows the other. A ratio compares the
rounds' step times: median(torch) / median(ours), > 1 when ours is faster. Its 95%
interval comes from a paired bootstrap: rounds are resampled with replacement, each
keeping its torch and ours step together, so slow drifts of the machine (load from
other jobs) move both sides of a round alike and stay out of the ratio.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95


def interleaved_order(variants: Sequence[str], rounds: int) -> list[list[str]]:
    """Each round runs every variant once: rounds 0, 2, 4 ... in the given order, rounds
    1, 3, 5 ... reversed. With two variants: A B, B A, A B, ..."""
    forward = list(variants)
    return [forward if r % 2 == 0 else forward[::-1] for r in range(rounds)]


def median_ratio(torch_times: Sequence[float], ours_times: Sequence[float]) -> float:
    """median(torch) / median(ours): > 1 when ours is faster."""
    return statistics.median(torch_times) / statistics.median(ours_times)


def bootstrap_interval(
    torch_times: Sequence[float],
    ours_times: Sequence[float],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of :func:`median_ratio`, resampling rounds in pairs
    (``torch_times[i]`` and ``ours_times[i]`` ran in the same round). Seeded: the same
    times give the same interval."""
    if len(torch_times) != len(ours_times) or not torch_times:
        raise ValueError(
            f"paired step times expected: {len(torch_times)} torch, {len(ours_times)} ours (one of each per round)"
        )
    rng = random.Random(seed)
    n = len(torch_times)
    ratios = []
    for _ in range(samples):
        picks = [rng.randrange(n) for _ in range(n)]
        ratios.append(median_ratio([torch_times[i] for i in picks], [ours_times[i] for i in picks]))
    ratios.sort()
    tail = (1.0 - confidence) / 2
    lo = ratios[int(tail * samples)]
    hi = ratios[min(samples - 1, int((1.0 - tail) * samples))]
    return lo, hi


def verdict(interval: tuple[float, float]) -> str:
    """ "no change" when the interval contains 1; otherwise "ours faster" or "ours slower"."""
    lo, hi = interval
    if lo <= 1.0 <= hi:
        return "no change"
    return "ours faster" if lo > 1.0 else "ours slower"


def per_step_max(walls_by_rank: Sequence[Sequence[float]]) -> list[float]:
    """A step takes as long as its slowest rank: the per-step maximum over ranks."""
    return [max(step) for step in zip(*walls_by_rank, strict=True)]


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total
