"""Measuring the job's own steps on its ranks, and deciding from what was measured.

``clock`` (where a step is timed), ``memory`` (a step's peak bytes), ``rounds`` (steps
timed or measured in interleaved rounds, each after a barrier), ``wall_stats`` (the paired
rule of "faster"), ``decisions`` (a rewrite judged by the step's times) and ``tuning``
(:func:`tune`, ``redist_opt.tune``). This layer sits above the compile backend
(``redist_opt.graph``), which it compiles the variants with, and below the commands
(``redist_opt.tools``).
"""

from redist_opt.measure.decisions import Decision, TuneResult, decide, format_result
from redist_opt.measure.rounds import (
    interleaved_memory_rounds,
    interleaved_rounds,
    interleaved_step_peaks,
    interleaved_step_times,
)
from redist_opt.measure.tuning import tune

__all__ = [
    "tune",
    "TuneResult",
    "Decision",
    "decide",
    "format_result",
    "interleaved_rounds",
    "interleaved_step_times",
    "interleaved_memory_rounds",
    "interleaved_step_peaks",
]
