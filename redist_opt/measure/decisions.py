"""What :func:`redist_opt.tune` measured and decided: a rewrite's decision from the step's
times (the rule, :func:`decide`), the result of a tuning run, and that result in words.

A pure function of the times: every rank decides the same from the same gathered times
(``wall_stats.compare`` bootstraps with a seed).
"""

from __future__ import annotations

import dataclasses

from redist_opt.ir.cost import CostModel
from redist_opt.measure import memory, wall_stats

__all__ = ["Decision", "TuneResult", "decide", "format_result", "TORCH", "OURS", "WITHOUT"]

# The variants' names: torch's step, ours with every candidate on, ours without one.
TORCH, OURS = "torch", "ours"
WITHOUT = "ours without "


@dataclasses.dataclass(frozen=True)
class Decision:
    """One rewrite (a pass of the default pipeline) judged by the step's times.

    ``ratio``: median(step without it) / median(step with it), > 1 when the rewrite made the
    step faster; ``interval``: its paired-bootstrap 95% interval; ``keep``: the rule's decision
    (the base profile's own, unless the whole interval lies on the other side of 1)."""

    rewrite: str
    keep: bool
    ratio: float
    interval: tuple[float, float]
    left_out_before: bool = False  # the base profile left it out

    @property
    def reason(self) -> str:
        """The decision in words."""
        if self.left_out_before:
            return "back in (measured faster)" if self.keep else "left out, as the base (not measured faster)"
        return "keep" if self.keep else "drop (the step is slower with it)"

    @property
    def verdict(self) -> str:
        """In the words of the wall bench, "ours" being the step with the rewrite."""
        return wall_stats.verdict(self.interval)

    def record(self) -> dict:
        """The decision as JSON: what the profile's tuning record and the step bench's
        results hold of it."""
        return {
            "rewrite": self.rewrite,
            "keep": self.keep,
            "ratio": self.ratio,
            "interval": list(self.interval),
            "left_out_before": self.left_out_before,
            "reason": self.reason,
        }


@dataclasses.dataclass
class TuneResult:
    """What :func:`tune` measured and wrote (the same on every rank)."""

    path: str
    model: CostModel
    decisions: tuple[Decision, ...]
    times: dict[str, list[float]]  # variant -> the slowest rank's time per round, seconds
    against_torch: dict[str, dict]  # variant -> wall_stats.compare(torch, variant)
    tuned_variant: str | None  # the measured variant the profile's decisions run, if any
    not_judged: tuple[str, ...]  # the base's exclusions of passes that rewrote nothing here
    steps: int
    seconds: float
    compiles: int
    # variant -> every rank's peak bytes per memory round (rank order); empty: no memory rounds
    peaks: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)

    def peak(self, variant: str) -> int | None:
        """The variant's peak bytes by :func:`~redist_opt.measure.memory.peak_statistic`
        (None: memory was not measured)."""
        return memory.peak_statistic(self.peaks[variant]) if variant in self.peaks else None


def decide(times: dict[str, list[float]], candidates, left_out_before=()) -> tuple[Decision, ...]:
    """The decisions of the rule (``redist_opt.measure.tuning``, step 5) from the slowest-rank times per
    round of ``ours`` and each ``ours without <candidate>``; ``left_out_before``: the rewrites
    the base profile leaves out. A pure function of its input."""
    out = []
    for name in sorted(candidates):
        cmp = wall_stats.compare(times[WITHOUT + name], times[OURS])
        if name in left_out_before:  # back in only when the step is measured faster with it
            keep = cmp["verdict"] == "ours faster"
        else:  # out only when the step is measured slower with it
            keep = cmp["verdict"] != "ours slower"
        out.append(
            Decision(
                name,
                keep=keep,
                ratio=cmp["ratio"],
                interval=cmp["interval"],
                left_out_before=name in left_out_before,
            )
        )
    return tuple(out)


def format_result(result: TuneResult) -> str:
    """The decisions and the variants against torch, as a readable table."""
    lines = [
        f"redist_opt.tune: {result.steps} steps, {result.compiles} compiles, {result.seconds:.1f} s; "
        f"profile {result.path} ({result.model.name})",
    ]
    if result.decisions:
        lines.append("  rewrite                                  step without/with [95% interval]   decision")
        for d in result.decisions:
            lo, hi = d.interval
            lines.append(f"  {d.rewrite:<40} {d.ratio:.3f}x [{lo:.3f}, {hi:.3f}]{'':<8}{d.reason}")
    else:
        lines.append("  no rewrite changed this step's redistributions: nothing to decide")
    lines.append("  variant                                  torch/variant [95% interval]   verdict")
    for name, c in result.against_torch.items():
        lo, hi = c["interval"]
        mark = "  <- the profile's decisions" if name == result.tuned_variant else ""
        lines.append(f"  {name:<40} {c['ratio']:.3f}x [{lo:.3f}, {hi:.3f}]{'':<8}{c['verdict']}{mark}")
    if result.tuned_variant is None:
        lines.append(
            "  (the decisions drop several rewrites together, a variant not measured here: "
            "restart with the profile and compare against torch)"
        )
    if result.peaks:
        rounds = len(next(iter(result.peaks.values()))[0])
        head = f"peak bytes (least of {rounds} memory rounds, most over ranks)   spread"
        lines.append(f"  {'variant':<40} {head}")
        for name, per_rank in result.peaks.items():
            summary = memory.peak_summary(per_rank)
            lines.append(f"  {name:<40} {summary['bytes']:>14,}{'':<39}{summary['spread']:.0%}")
    dropped = [d.rewrite for d in result.decisions if not d.keep]
    lines.append(f"  left out under the profile: {', '.join(dropped) or 'none'} (measured)")
    if result.not_judged:
        lines.append(
            f"  and, from the base profile, {', '.join(result.not_judged)} "
            "(rewrote nothing in this step: not judged here)"
        )
    return "\n".join(lines)
