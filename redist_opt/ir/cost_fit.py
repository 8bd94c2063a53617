"""Fitting a :class:`~redist_opt.ir.cost.CostModel` to measured collective times.

``redist-opt calibrate`` measures (:mod:`redist_opt.tools.calibrate`); this module
turns the measurements into a model: the alpha-beta terms (launch, per-step alpha,
bandwidth and whichever algorithm, ring or tree, fits better) by non-negative least
squares on relative error, and per (kind, group size, link) piecewise-linear curves
through the measured medians. It is pure arithmetic over dicts of measurements, so it
lives with the model it builds, not with the command that measures.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence

import numpy as np

from redist_opt.ir.cost import CostModel, steps_and_bytes

__all__ = ["fit_per_kind", "fit_alpha_beta", "fit_profile", "FitResult", "BEYOND"]


def _monotone(ys: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): a bigger message never
    takes less time, so a dip between neighbouring sizes is noise."""
    blocks: list[list[float]] = []  # [mean, weight]
    for y in ys:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return [m for m, w in blocks for _ in range(int(w))]


def fit_per_kind(measurements: Sequence[dict], *, monotone: bool = True) -> tuple:
    """``CostModel.fitted`` rows: per (kind, group size, link), the measured medians made
    non-decreasing in size, then one ``t = per_call + per_byte * nbytes`` segment between
    each two neighbouring sizes, valid up to the larger (the last one beyond it too).
    A linear fit over the whole range misses small sizes: on gloo a 4-byte all_reduce
    over 8 ranks takes a third of a 1 KiB one. Points with one size get no row.

    ``monotone=False`` keeps every measured median as it is (a segment that would fall is
    flat at its larger size's time), so each measured size costs what was measured there:
    for costs measured inside a step, where a collective's time is mostly the wait for
    its peers and depends on where it sits in the step, not on its size."""
    by_key: dict[tuple, dict[int, list[float]]] = {}
    for m in measurements:
        if m["p"] > 1:
            key = (m["kind"], m["p"], m.get("link", "intra"))
            by_key.setdefault(key, {}).setdefault(m["nbytes"], []).append(m["time"])
    rows = []
    for (kind, p, link), points in sorted(by_key.items()):
        sizes = sorted(points)
        if len(sizes) < 2:
            continue
        # Groups of one size and link (a 2x2x2 mesh's three dims) share a curve: their mean.
        times = [statistics.fmean(points[n]) for n in sizes]
        if monotone:
            times = _monotone(times)
        for (n0, t0), (n1, t1) in zip(zip(sizes, times), zip(sizes[1:], times[1:])):
            if t1 < t0:  # kept as measured (monotone=False): n0 at its own time, then flat
                rows += [(kind, p, link, n0, t0, 0.0), (kind, p, link, n1, t1, 0.0)]
                continue
            per_byte = (t1 - t0) / (n1 - n0)
            rows.append((kind, p, link, n1, max(0.0, t1 - per_byte * n1), per_byte))
        # Beyond the largest size: the slope over the largest three sizes (one
        # neighbouring pair is too noisy to extrapolate by orders of magnitude).
        top_n, top_t = sizes[-3:], times[-3:]
        mean_n, mean_t = statistics.fmean(top_n), statistics.fmean(top_t)
        var = sum((n - mean_n) ** 2 for n in top_n)
        per_byte = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in zip(top_n, top_t)) / var)
        rows.append((kind, p, link, BEYOND, max(0.0, top_t[-1] - per_byte * top_n[-1]), per_byte))
    return tuple(rows)


# The ``up_to_nbytes`` of the segment that extrapolates past the largest measured size.
BEYOND = 1 << 62


@dataclasses.dataclass(frozen=True)
class FitResult:
    algorithm: str
    reduce_scatter_as_all_reduce: bool
    launch: float
    alpha: float
    bw: float
    rms_rel_error: float  # of the chosen variant's fit
    errors: dict  # variant label ("ring", "tree", "ring, rs=ar", ...) -> rms relative error

    @property
    def label(self) -> str:
        return _variant_label(self.algorithm, self.reduce_scatter_as_all_reduce)

    def model(self, name: str = "calibrated", **extra) -> CostModel:  # noqa: D102
        return CostModel(
            name=name,
            launch=self.launch,
            alpha_intra=self.alpha,
            alpha_inter=self.alpha,
            bw_intra=self.bw,
            bw_inter=self.bw,
            devices_per_host=None,
            algorithm=self.algorithm,
            reduce_scatter_as_all_reduce=self.reduce_scatter_as_all_reduce,
            **extra,
        )


def _variant_label(algorithm: str, rs_as_ar: bool) -> str:
    return f"{algorithm}, rs=ar" if rs_as_ar else algorithm


def _nnls(rows: list[list[float]], rhs: list[float]) -> tuple[list[float], float]:
    """Non-negative least squares by enumerating active sets (few unknowns): (x, residual)."""
    A = np.asarray(rows, dtype=float)
    b = np.asarray(rhs, dtype=float)
    n = A.shape[1]
    best: tuple[list[float], float] | None = None
    for k in range(n, 0, -1):
        for cols in itertools.combinations(range(n), k):
            sub = A[:, cols]
            sol, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(sol < 0):
                continue
            x = [0.0] * n
            for c, v in zip(cols, sol):
                x[c] = float(v)
            res = float(np.sum((A @ np.asarray(x) - b) ** 2))
            if best is None or res < best[1] - 1e-15:
                best = (x, res)
    assert best is not None  # a single non-negative column always fits (b > 0)
    return best


def fit_alpha_beta(
    measurements: Sequence[dict],
    algorithms: Sequence[str] = ("ring", "tree"),
    rs_modes: Sequence[bool] = (False, True),
) -> FitResult:
    """Fit ``t = launch + steps*alpha + bytes_moved/bw`` to measured times.

    ``measurements``: dicts with ``kind``, ``p`` (group size), ``nbytes`` (bytes each
    rank feeds in) and ``time`` (seconds). Least squares on *relative* error (each row
    divided by its time) so 1 KiB and 4 MiB weigh alike, with every parameter kept
    non-negative. Each variant -- algorithm ring or tree, reduce_scatter native or run
    as an all_reduce (``rs_modes``) -- is fitted; the smallest RMS relative error wins
    (ties go to the earlier, simpler variant).
    """
    ms = [m for m in measurements if m["p"] > 1]
    if len(ms) < 3:
        raise ValueError(f"need at least 3 measurements over groups of 2+ ranks to fit, got {len(ms)}")
    if not any(m["kind"] == "reduce_scatter" for m in ms):
        rs_modes = (False,)
    fits = {}
    for algo, rs_as_ar in ((a, r) for r in rs_modes for a in algorithms):
        rows, rhs = [], []
        for m in ms:
            kind = "all_reduce" if (rs_as_ar and m["kind"] == "reduce_scatter") else m["kind"]
            steps, moved = steps_and_bytes(kind, m["p"], m["nbytes"], algo)
            t = m["time"]
            # Unknowns: launch [s], alpha [s], inverse bandwidth in ns/byte (well scaled).
            rows.append([1.0 / t, steps / t, moved * 1e-9 / t])
            rhs.append(1.0)
        (launch, alpha, inv_bw_ns), res = _nnls(rows, rhs)
        rms = math.sqrt(res / len(ms))
        fits[(algo, rs_as_ar)] = (rms, launch, alpha, inv_bw_ns)
    best = min(fits, key=lambda v: (round(fits[v][0], 12), list(fits).index(v)))
    rms, launch, alpha, inv_bw_ns = fits[best]
    bw = 1e9 / inv_bw_ns if inv_bw_ns > 0 else 1e15  # no measurable bandwidth term
    return FitResult(
        algorithm=best[0],
        reduce_scatter_as_all_reduce=best[1],
        launch=launch,
        alpha=alpha,
        bw=bw,
        rms_rel_error=rms,
        errors={_variant_label(*v): fits[v][0] for v in fits},
    )


def fit_profile(measurements: list[dict], creation: Sequence[float], name: str, devices_per_host=None):
    """(model, fit record): the alpha-beta terms over the groups within a host (and, when
    some were measured, across hosts), plus the per-kind, per-group-size terms."""
    intra = [m for m in measurements if m.get("link", "intra") == "intra"]
    inter = [m for m in measurements if m.get("link", "intra") == "inter"]
    fit = fit_alpha_beta(intra or inter)
    model = fit.model(name=name, create_group=statistics.median(creation), fitted=fit_per_kind(measurements))
    record = {
        "algorithm": fit.algorithm,
        "reduce_scatter_as_all_reduce": fit.reduce_scatter_as_all_reduce,
        "rms_rel_error": fit.errors,
        "launch_s": fit.launch,
        "alpha_s": fit.alpha,
        "bw_bytes_per_s": fit.bw,
    }
    if devices_per_host:
        changes: dict = {"devices_per_host": devices_per_host}
        if inter and intra:
            across = fit_alpha_beta(inter, (fit.algorithm,), (fit.reduce_scatter_as_all_reduce,))
            changes |= {"alpha_inter": across.alpha, "bw_inter": across.bw}
            record["inter"] = {
                "alpha_s": across.alpha,
                "bw_bytes_per_s": across.bw,
                "launch_s": across.launch,
            }
        model = dataclasses.replace(model, **changes)
    for m in measurements:
        m["model"] = model.time_of(m["kind"], m["p"], m.get("link", "intra"), m["nbytes"])
    return model, record
