"""Whether ours is faster than torch: the one rule of every wall-clock comparison
(``redist_opt.tune``, ``redist-opt bench --part wall`` and the step bench,
``benchmarks/step_bench``).

The two sides run in rounds on the same ranks: every round runs each variant once,
and consecutive rounds run them in opposite orders (:func:`interleaved_order`, ABBA
ABBA ...), so neither side is always the one that follows the other. A time is the
slowest rank's (:func:`per_step_max`). The ratio compares the rounds' times:
median(torch) / median(ours), > 1 when ours is faster. Its 95% interval comes from a
paired bootstrap: rounds are resampled with replacement, each keeping its torch and
ours time together, so slow drifts of the machine (load from other jobs) move both
sides of a round alike and stay out of the ratio. The verdict is "no change" while
the interval contains 1.

Why this rule and not "the medians differ by more than 3 combined standard errors and
5%", which the wall bench used: that rule treats the two sides as independent samples
(it adds their standard errors), so drift that both sides of a round share counts as
noise and hides real differences on a loaded machine; its standard errors come from
the median absolute deviation as if the times were normal, which step and collective
times (long right tails) are not; and its 3 and 5% are hand-set. The paired bootstrap
uses the pairing the interleaving creates, assumes no distribution, and gives an
interval of the very ratio reported, at a stated confidence.
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
            f"paired step times expected: {len(torch_times)} torch, {len(ours_times)} ours "
            "(one of each per round)"
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


def compare(torch_times: Sequence[float], ours_times: Sequence[float]) -> dict:
    """The ratio torch/ours, its interval and verdict, of paired times (one of each per round)."""
    interval = bootstrap_interval(torch_times, ours_times)
    return dict(ratio=median_ratio(torch_times, ours_times), interval=interval, verdict=verdict(interval))
