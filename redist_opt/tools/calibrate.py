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
from redist_opt.tools.args import DEFAULT_CALIBRATE_SIZES
from redist_opt.tools.spawn import run_ranks
from redist_opt.tools.timing import Clock, Stat, loadavg, timed_samples, torch_version, wait
from redist_opt.tools.units import format_size, parse_sizes

__all__ = ["calibrate", "measure_collectives", "fit_per_kind", "fit_profile", "summarize", "fit_alpha_beta", "FitResult", "format_calibration"]


def _calibrate_worker(rank: int, world: int, mesh_sizes, names, sizes, iters: int, warmup: int) -> dict:
    """One spawned gloo rank of the local mode: CPU tensors, the wall clock, one host."""
    return measure_collectives(mesh_sizes, names, sizes, iters, warmup)


_SPLITTING = ("reduce_scatter", "all_to_all")


def _op(kind: str, x: torch.Tensor, pg) -> Callable:
    if kind == "all_reduce":
        return lambda: wait(funcol.all_reduce(x, "sum", pg))
    if kind == "reduce_scatter":
        return lambda: wait(funcol.reduce_scatter_single(x, "sum", 0, pg))
    if kind == "all_gather":
        return lambda: wait(funcol.all_gather_single(x, 0, pg))
    if kind == "all_to_all":
        return lambda: wait(funcol.all_to_all_single(x, None, None, pg))
    raise AssertionError(kind)


def _host_groups(world: int, devices_per_host: int | None) -> list[tuple[str, int, str, object]]:
    """(label, size, link, this rank's group) of the ranks of this host and of this
    local rank's peers on the other hosts, when the job spans 2+ hosts. Every rank
    creates every group (``new_group`` is collective), in the same order."""
    if not devices_per_host or devices_per_host >= world or world % devices_per_host:
        return []
    me, hosts = dist.get_rank(), world // devices_per_host
    out = []
    mine = None
    for h in range(hosts):
        pg = dist.new_group(list(range(h * devices_per_host, (h + 1) * devices_per_host)))
        if me // devices_per_host == h:
            mine = pg
    if devices_per_host > 1:
        out.append(("host", devices_per_host, "intra", mine))
    for local in range(devices_per_host):
        pg = dist.new_group(list(range(local, world, devices_per_host)))
        if me % devices_per_host == local:
            mine = pg
    out.append(("hosts", hosts, "inter", mine))
    return out


def measure_collectives(
    mesh_sizes, names, sizes, iters: int, warmup: int, *, device=None, clock: Clock | None = None,
    devices_per_host: int | None = None,
) -> dict:
    """Time every collective kind over the mesh's groups (each dim, the flattened whole
    mesh, and with ``devices_per_host`` below the world, a host's and across hosts) on
    the calling rank of an initialized process group; samples per point, this rank's."""
    start = time.perf_counter()
    device = torch.device(device or "cpu")
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, tuple(mesh_sizes), mesh_dim_names=tuple(names))
    spec = MeshSpec(sizes=tuple(mesh_sizes), names=tuple(names))
    where = CostModel(devices_per_host=devices_per_host)
    groups = [(names[d], (d,), mesh.get_group(d)) for d in range(len(mesh_sizes)) if mesh_sizes[d] > 1]
    # Creating a communicator: the flattened whole mesh (what groups="create" does), then
    # a plain new_group over the world twice more for a median.
    creation = []
    if len(groups) > 1:
        dist.barrier()
        t0 = time.perf_counter()
        flat = mesh._flatten()
        creation.append(time.perf_counter() - t0)
        # Every other set of 2+ dims too (a 2x2x2 mesh has groups of 4 as well as 2 and 8).
        real = [d for d in range(len(mesh_sizes)) if mesh_sizes[d] > 1]
        subsets = [c for k in range(2, len(real)) for c in itertools.combinations(real, k)]
        for dims in subsets:
            groups.append(("+".join(names[d] for d in dims), dims, mesh[tuple(names[d] for d in dims)]._flatten().get_group()))
        groups.append(("+".join(names), tuple(range(len(mesh_sizes))), flat.get_group()))
    for _ in range(2):
        dist.barrier()
        t0 = time.perf_counter()
        dist.new_group(list(range(world)))
        creation.append(time.perf_counter() - t0)
    labelled = [(label, dist.get_world_size(pg), where.link(spec.group(dims), spec), dims, pg)
                for label, dims, pg in groups]  # fmt: skip
    labelled += [(label, p, link, None, pg) for label, p, link, pg in _host_groups(world, devices_per_host)]
    out = []
    for nbytes in sizes:
        # Every group's collectives of one size interleaved: load that drifts over the
        # run hits every group size alike, so their ratios (what plans are chosen by) hold.
        points, fns = [], []
        for label, p, link, dims, pg in labelled:
            for kind in KINDS:
                # float32; reduce_scatter and all_to_all split it, so divisible by the group size.
                numel = max(p, nbytes // 4 // p * p) if kind in _SPLITTING else max(1, nbytes // 4)
                fns.append(_op(kind, torch.randn(numel, device=device), pg))
                points.append(dict(kind=kind, group=label, dims=None if dims is None else list(dims), p=p,
                                   link=link, nbytes=numel * 4))  # fmt: skip
        for point, s in zip(points, timed_samples(fns, iters, warmup, clock)):
            out.append(point | {"samples": s})
    return {"measurements": out, "creation": creation, "worker_s": time.perf_counter() - start}


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


def fit_per_kind(measurements: Sequence[dict]) -> tuple:
    """``CostModel.fitted`` rows: per (kind, group size, link), the measured medians made
    non-decreasing in size, then one ``t = per_call + per_byte * nbytes`` segment between
    each two neighbouring sizes, valid up to the larger (the last one beyond it too).
    A linear fit over the whole range misses small sizes: on gloo a 4-byte all_reduce
    over 8 ranks takes a third of a 1 KiB one. Points with one size get no row."""
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
        times = _monotone([statistics.fmean(points[n]) for n in sizes])
        for (n0, t0), (n1, t1) in zip(zip(sizes, times), zip(sizes[1:], times[1:])):
            per_byte = (t1 - t0) / (n1 - n0)
            rows.append((kind, p, link, n1, max(0.0, t0 - per_byte * n0), per_byte))
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


def validate_request(nprocs: int, mesh_sizes: Sequence[int], names: Sequence[str] | None,
                     count: str = "--nprocs") -> tuple:
    """(mesh sizes, names) checked against the rank count (``count`` names where it came
    from); ValueError names the problem."""
    mesh_sizes = tuple(int(s) for s in mesh_sizes)
    names = tuple(names or (f"d{i}" for i in range(len(mesh_sizes))))
    if math.prod(mesh_sizes) != nprocs:
        raise ValueError(f"mesh {mesh_sizes} has {math.prod(mesh_sizes)} ranks but {count} is {nprocs}")
    if all(s == 1 for s in mesh_sizes):
        raise ValueError(f"mesh {mesh_sizes} has no dim with 2+ ranks: nothing to measure")
    return mesh_sizes, names


def summarize(per_rank: Sequence[dict]) -> tuple[list[dict], list[float]]:
    """(measurements with the median over samples of the slowest rank, creation times)."""
    measurements = []
    for i, m in enumerate(per_rank[0]["measurements"]):
        stat = Stat.of([r["measurements"][i]["samples"] for r in per_rank])
        measurements.append(
            {k: v for k, v in m.items() if k != "samples"} | {"time": stat.median, "stderr": stat.stderr}
        )
    creation = [max(ts) for ts in zip(*(r["creation"] for r in per_rank))]
    return measurements, creation


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
            record["inter"] = {"alpha_s": across.alpha, "bw_bytes_per_s": across.bw, "launch_s": across.launch}
        model = dataclasses.replace(model, **changes)
    for m in measurements:
        m["model"] = model.time_of(m["kind"], m["p"], m.get("link", "intra"), m["nbytes"])
    return model, record


def calibration_record(backend: str, device: str, nprocs: int, mesh_sizes, names, sizes, iters, warmup,
                       fit: dict, creation, measurements, wall: float, measuring: float, **extra) -> dict:
    return {
        "backend": backend,
        "device": device,
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
        "measuring_s": measuring,
        "load_average": loadavg(),
        "fit": fit,
        "group_creation_s": list(creation),
        "measurements": measurements,
        **extra,
    }


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
    """Measure on ``nprocs`` spawned gloo ranks and fit; returns (model, calibration record)."""
    mesh_sizes, names = validate_request(nprocs, mesh_sizes, names)
    sizes = list(sizes) or parse_sizes(DEFAULT_CALIBRATE_SIZES)
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _calibrate_worker, nprocs, (mesh_sizes, names, list(sizes), iters, warmup), timeout=timeout
    )
    wall = time.perf_counter() - t0
    measurements, creation = summarize(per_rank)
    model, fit = fit_profile(measurements, creation, f"gloo-calibrated-{nprocs}")
    record = calibration_record(
        "gloo", "cpu", nprocs, mesh_sizes, names, sizes, iters, warmup, fit, creation, measurements,
        wall, max(r["worker_s"] for r in per_rank), mode="spawn",
    )
    return model, record


def format_calibration(model: CostModel, record: dict) -> str:
    """The fit, then two small matrices (collective x group by size): measured, model/measured."""
    fit = record["fit"]
    errs = ", ".join(f"{a} {e * 100:.1f}%" for a, e in fit["rms_rel_error"].items())
    lines = [
        f"fit over {len(record['measurements'])} points ({record['nprocs']} {record.get('backend', 'gloo')} "
        f"ranks on {record.get('device', 'cpu')}, mesh "
        f"{'x'.join(map(str, record['mesh']['sizes']))}); RMS relative error by variant: {errs}",
        f"  chosen: algorithm={model.algorithm}, reduce_scatter_as_all_reduce="
        f"{model.reduce_scatter_as_all_reduce}",
        f"  launch={model.launch * 1e6:.1f} us  alpha={model.alpha_intra * 1e6:.1f} us/step  "
        f"bandwidth={model.bw_intra / 1e9:.3f} GB/s  create_group={model.create_group * 1e3:.1f} ms",
        f"  per-call + per-byte terms fitted for {len({r[:3] for r in model.fitted})} (collective, group size, "
        f"link) curves (devices_per_host={model.devices_per_host}); the modelled tables below use them",
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
