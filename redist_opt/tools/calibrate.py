"""``redist-opt calibrate``: measure collectives on gloo ranks and fit the cost model.

Spawns N gloo processes on 127.0.0.1, times all_reduce, reduce_scatter,
all_gather and all_to_all through ``torch.distributed._functional_collectives``
on each mesh dim's groups and on the flattened whole-mesh group over a range of
message sizes (see :mod:`redist_opt.tools.timing` for how a time is taken), and fits
the alpha-beta parameters of :class:`redist_opt.ir.cost.CostModel` (launch,
per-step alpha, bandwidth, and whichever algorithm -- ring or tree -- fits
better) by least squares. The profile is written as JSON (``CostModel.load``
reads it).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

from redist_opt.ir.cost import KINDS, CostModel, steps_and_bytes
from redist_opt.ir.mesh import MeshSpec
from redist_opt.tools.spawn import run_ranks
from redist_opt.tools.timing import Stat, loadavg, timed_samples, torch_version, wait
from redist_opt.tools.units import format_size, parse_sizes

__all__ = ["calibrate", "fit_alpha_beta", "FitResult", "format_calibration", "DEFAULT_CALIBRATE_SIZES"]

DEFAULT_CALIBRATE_SIZES = "1KiB..4MiB*4"


def _calibrate_worker(rank: int, world: int, mesh_sizes, names, sizes, iters: int, warmup: int) -> dict:
    start = time.perf_counter()
    mesh = init_device_mesh("cpu", tuple(mesh_sizes), mesh_dim_names=tuple(names))
    groups = [(names[d], (d,), mesh.get_group(d)) for d in range(len(mesh_sizes)) if mesh_sizes[d] > 1]
    # Creating a communicator: the flattened whole mesh (what groups="create" does), then
    # a plain new_group over the world twice more for a median.
    creation = []
    if len(groups) > 1:
        dist.barrier()
        t0 = time.perf_counter()
        flat = mesh._flatten()
        creation.append(time.perf_counter() - t0)
        groups.append(("+".join(names), tuple(range(len(mesh_sizes))), flat.get_group()))
    for _ in range(2):
        dist.barrier()
        t0 = time.perf_counter()
        dist.new_group(list(range(world)))
        creation.append(time.perf_counter() - t0)

    def op(kind: str, x: torch.Tensor, pg) -> Callable:
        if kind == "all_reduce":
            return lambda: wait(funcol.all_reduce(x, "sum", pg))
        if kind == "reduce_scatter":
            return lambda: wait(funcol.reduce_scatter_single(x, "sum", 0, pg))
        if kind == "all_gather":
            return lambda: wait(funcol.all_gather_single(x, 0, pg))
        if kind == "all_to_all":
            return lambda: wait(funcol.all_to_all_single(x, None, None, pg))
        raise AssertionError(kind)

    out = []
    for label, dims, pg in groups:
        p = dist.get_world_size(pg)
        for nbytes in sizes:
            numel = max(p, nbytes // 4 // p * p)  # float32, divisible by the group size
            x = torch.randn(numel)
            fns = [op(kind, x, pg) for kind in KINDS]
            samples = timed_samples(fns, iters, warmup)
            for kind, s in zip(KINDS, samples):
                out.append(dict(kind=kind, group=label, dims=list(dims), p=p, nbytes=numel * 4, samples=s))
    return {"measurements": out, "creation": creation, "worker_s": time.perf_counter() - start}


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

    def model(self, name: str = "calibrated", **extra) -> CostModel:
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


def calibrate(
    nprocs: int = 4,
    mesh_sizes: Sequence[int] = (2, 2),
    names: Sequence[str] | None = None,
    sizes: Sequence[int] = (),
    *,
    iters: int = 7,
    warmup: int = 2,
    timeout: float = 180.0,
) -> tuple[CostModel, dict]:
    """Measure on ``nprocs`` gloo ranks and fit; returns (model, calibration record)."""
    mesh_sizes = tuple(int(s) for s in mesh_sizes)
    names = tuple(names or (f"d{i}" for i in range(len(mesh_sizes))))
    if math.prod(mesh_sizes) != nprocs:
        raise ValueError(f"mesh {mesh_sizes} has {math.prod(mesh_sizes)} ranks but --nprocs is {nprocs}")
    if all(s == 1 for s in mesh_sizes):
        raise ValueError(f"mesh {mesh_sizes} has no dim with 2+ ranks: nothing to measure")
    sizes = list(sizes) or parse_sizes(DEFAULT_CALIBRATE_SIZES)
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _calibrate_worker, nprocs, (mesh_sizes, names, list(sizes), iters, warmup), timeout=timeout
    )
    wall = time.perf_counter() - t0
    measurements = []
    for i, m in enumerate(per_rank[0]["measurements"]):
        stat = Stat.of([r["measurements"][i]["samples"] for r in per_rank])
        measurements.append(
            {k: v for k, v in m.items() if k != "samples"} | {"time": stat.median, "stderr": stat.stderr}
        )
    creation = [max(ts) for ts in zip(*(r["creation"] for r in per_rank))]
    fit = fit_alpha_beta(measurements)
    model = fit.model(name=f"gloo-calibrated-{nprocs}", create_group=statistics.median(creation))
    spec = MeshSpec(sizes=mesh_sizes, names=names)
    for m in measurements:
        m["model"] = model.collective_time(m["kind"], spec.group(tuple(m["dims"])), m["nbytes"], spec)
    record = {
        "backend": "gloo",
        "nprocs": nprocs,
        "mesh": {"sizes": list(mesh_sizes), "names": list(names)},
        "sizes": list(sizes),
        "iters": iters,
        "warmup": warmup,
        "host": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "torch": torch_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall,
        "measuring_s": max(r["worker_s"] for r in per_rank),
        "load_average": loadavg(),
        "fit": {
            "algorithm": fit.algorithm,
            "reduce_scatter_as_all_reduce": fit.reduce_scatter_as_all_reduce,
            "rms_rel_error": fit.errors,
            "launch_s": fit.launch,
            "alpha_s": fit.alpha,
            "bw_bytes_per_s": fit.bw,
        },
        "group_creation_s": creation,
        "measurements": measurements,
    }
    return model, record


def format_calibration(model: CostModel, record: dict) -> str:
    """The fit, then two small matrices (collective x group by size): measured, model/measured."""
    fit = record["fit"]
    errs = ", ".join(f"{a} {e * 100:.1f}%" for a, e in fit["rms_rel_error"].items())
    lines = [
        f"fit over {len(record['measurements'])} points ({record['nprocs']} gloo ranks, mesh "
        f"{'x'.join(map(str, record['mesh']['sizes']))}); RMS relative error by variant: {errs}",
        f"  chosen: algorithm={model.algorithm}, reduce_scatter_as_all_reduce="
        f"{model.reduce_scatter_as_all_reduce}",
        f"  launch={model.launch * 1e6:.1f} us  alpha={model.alpha_intra * 1e6:.1f} us/step  "
        f"bandwidth={model.bw_intra / 1e9:.3f} GB/s  create_group={model.create_group * 1e3:.1f} ms",
    ]
    rows: dict[tuple, dict[int, dict]] = {}
    for m in record["measurements"]:
        rows.setdefault((m["kind"], m["group"], m["p"]), {})[m["nbytes"]] = m
    sizes = sorted({m["nbytes"] for m in record["measurements"]})
    head = f"{'collective':<15} {'group':<8} {'p':>2}" + "".join(f"{format_size(n):>9}" for n in sizes)

    def table(title: str, cell) -> None:
        lines.extend(["", title, head])
        for (kind, group, p), by_size in rows.items():
            cells = "".join(f"{cell(by_size[n]) if n in by_size else '-':>9}" for n in sizes)
            lines.append(f"{kind:<15} {group:<8} {p:>2}" + cells)

    table("measured ms (median over samples of the slowest rank):", lambda m: f"{m['time'] * 1e3:.3f}")
    table("modelled ms:", lambda m: f"{m['model'] * 1e3:.3f}")
    table(
        "model / measured:",
        lambda m: f"{m['model'] / m['time']:.2f}" if m["time"] > 0 else "nan",
    )
    return "\n".join(lines)
