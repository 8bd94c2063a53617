"""Measuring collectives: ``redist-opt calibrate`` and ``redist-opt bench``.

``calibrate`` spawns N gloo processes on 127.0.0.1, times all_reduce,
reduce_scatter, all_gather and all_to_all through
``torch.distributed._functional_collectives`` on each mesh dim's groups and on
the flattened whole-mesh group over a range of message sizes, and fits the
alpha-beta parameters of :class:`redist_opt.cost.CostModel` (launch, per-step
alpha, bandwidth, and whichever algorithm -- ring or tree -- fits better) by
least squares. The profile is written as JSON (``CostModel.load`` reads it).

``bench`` has two parts:

* planning speed: ``redist_opt.plan`` + ``redist_opt.optimize`` on a 4-D mesh,
  uncached (caches cleared before every call) and cached, in microseconds;
* wall clock over 4 real gloo processes on a 2x2 mesh: torch's
  ``DTensor.redistribute`` (merge pass on, a flattened group present), torch with
  its merge pass off, and ``redist_opt.redistribute(groups="existing")``.

How a time is measured (both commands): every rank runs the same schedule; a
sample is a world barrier followed by ``reps`` back-to-back calls (each waited
for), divided by ``reps``, where ``reps`` is chosen from a warm-up so a sample
lasts a couple of milliseconds (that amortizes the barrier's exit skew at small
sizes) and agreed on by all ranks. A sample's time is the slowest rank's; a
measurement is the median over samples. Its noise is the standard error of that
median estimated from the samples' median absolute deviation.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import queue as queue_mod
import re
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import torch

from .cost import KINDS, CostModel, steps_and_bytes

__all__ = [
    "parse_size",
    "parse_sizes",
    "format_size",
    "run_ranks",
    "SpawnError",
    "fit_alpha_beta",
    "FitResult",
    "calibrate",
    "planning_bench",
    "wall_bench",
    "cmd_calibrate",
    "cmd_bench",
    "WALL_CASES",
]

# -- sizes --------------------------------------------------------------------------

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
}  # fmt: skip


def parse_size(text: str) -> int:
    """``"64KiB"`` -> 65536; ``"1M"`` -> 1048576; ``"4096"`` -> 4096 (bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r} is not a byte count like 4096, 64KiB or 4MiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value) or value <= 0:
        raise ValueError(f"size {text!r} must be a positive whole number of bytes")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """``"1KiB,64KiB"`` (a list) or ``"1KiB..4MiB"`` (doubling) or ``"1KiB..4MiB*4"`` (x4 steps)."""
    out: list[int] = []
    for part in (p for p in text.split(",") if p.strip()):
        if ".." in part:
            lo_text, hi_text = part.split("..", 1)
            factor = 2
            if "*" in hi_text:
                hi_text, f_text = hi_text.split("*", 1)
                try:
                    factor = int(f_text)
                except ValueError:
                    raise ValueError(f"size range {part!r}: step factor {f_text!r} is not an integer") from None
                if factor < 2:
                    raise ValueError(f"size range {part!r}: step factor must be >= 2")
            lo, hi = parse_size(lo_text), parse_size(hi_text)
            if lo > hi:
                raise ValueError(f"size range {part!r} is empty ({lo} > {hi} bytes)")
            s = lo
            while s <= hi:
                out.append(s)
                s *= factor
        else:
            out.append(parse_size(part))
    if not out:
        raise ValueError(f"no sizes in {text!r}")
    return sorted(set(out))


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def parse_mesh_sizes(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``"2,2"`` -> ((2, 2), ("d0", "d1")); ``"a=2,b=2"`` names the dims."""
    sizes, names = [], []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        name, _, size = part.rpartition("=")
        try:
            sizes.append(int(size))
        except ValueError:
            raise ValueError(f"mesh size {size!r} is not an integer") from None
        if sizes[-1] < 1:
            raise ValueError(f"mesh size {sizes[-1]} must be >= 1")
        names.append(name.strip() or f"d{i}")
    if not sizes:
        raise ValueError(f"no mesh sizes in {text!r}")
    return tuple(sizes), tuple(names)


# -- spawning ranks -------------------------------------------------------------------


class SpawnError(RuntimeError):
    """A rank failed (its traceback is in the message) or the ranks timed out."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet_torch_logs() -> None:
    # torch warns on every rank that gloo's alltoall falls back to all_gather + chunk,
    # and that a merge was not possible; neither is news in a benchmark.
    for name in ("torch.distributed.tensor._collective_utils", "torch.distributed.tensor._redistribute"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _rank_entry(rank: int, target: Callable, world: int, port: int, queue, timeout: float, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    _quiet_torch_logs()
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
        )
        result = target(rank, world, *args)
        queue.put((rank, result, None))
    except BaseException:
        queue.put((rank, None, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_ranks(target: Callable, nprocs: int, args: tuple = (), *, timeout: float = 120.0) -> list:
    """Run ``target(rank, world, *args)`` on ``nprocs`` spawned gloo ranks; their results by rank.

    ``target`` must be a module-level function. A rank that raises makes this raise
    :class:`SpawnError` with that rank's traceback; ranks that do not report within
    ``timeout`` seconds are terminated and reported.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    # Collectives time out a little before we give up on the ranks, so a hang
    # surfaces as a child traceback rather than a kill.
    pg_timeout = max(10.0, timeout - 5.0)
    pc = mp.start_processes(
        _rank_entry,
        args=(target, nprocs, port, queue, pg_timeout, args),
        nprocs=nprocs,
        join=False,
        start_method="spawn",
    )
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < nprocs:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, result, err = queue.get(timeout=min(1.0, remaining))
            except queue_mod.Empty:
                exited = [
                    i for i, p in enumerate(pc.processes)
                    if p.exitcode is not None and i not in results and i not in errors
                ]  # fmt: skip
                if exited:
                    # Give an exiting rank's report a moment to arrive through the pipe.
                    try:
                        rank, result, err = queue.get(timeout=2.0)
                    except queue_mod.Empty:
                        for i in exited:
                            errors[i] = (
                                f"rank {i} exited with code {pc.processes[i].exitcode} without a "
                                "report (killed, or its result could not be pickled)"
                            )
                        break
                else:
                    continue
            if err is not None:
                errors[rank] = err
                # One failure makes the others hang in their next collective: stop now.
                break
            results[rank] = result
    finally:
        _stop(pc, graceful=not errors and len(results) == nprocs)
    if errors:
        first = next(iter(errors))  # the first report is the cause; later ones are fallout
        raise SpawnError(f"rank {first} of {nprocs} failed:\n{errors[first].rstrip()}")
    if len(results) < nprocs:
        missing = sorted(set(range(nprocs)) - set(results))
        raise SpawnError(f"ranks {missing} of {nprocs} did not report within {timeout:.0f}s")
    return [results[r] for r in range(nprocs)]


def _stop(pc, *, graceful: bool) -> None:
    """Join our processes; terminate (then kill) any that are still running."""
    deadline = time.monotonic() + (30.0 if graceful else 2.0)
    for p in pc.processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in pc.processes:
        if p.is_alive():
            p.terminate()
    for p in pc.processes:
        p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


# -- timing on ranks -------------------------------------------------------------------

# A sample lasts about this long (seconds): long enough that the barrier's exit skew
# is small next to it, short enough to keep the default runs quick.
SAMPLE_TARGET = 2e-3
MAX_REPS = 64


def _agree_reps(single: float) -> int:
    """``reps`` from this rank's warm-up time of one call, agreed on by all ranks (max)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([single], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return max(1, min(MAX_REPS, int(SAMPLE_TARGET / max(float(t.item()), 1e-7))))


def _time_once(fn: Callable) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_samples(fns: Sequence[Callable], iters: int, warmup: int) -> list[list[float]]:
    """Per-call sample times of each fn, the fns interleaved sample by sample.

    Interleaving (A B C, A B C, ...) makes slow drift of the machine hit every
    variant alike, so ratios between them stay meaningful.
    """
    import torch.distributed as dist

    for fn in fns:
        for _ in range(warmup):
            fn()
    reps = [_agree_reps(min(_time_once(fn) for _ in range(2))) for fn in fns]
    samples: list[list[float]] = [[] for _ in fns]
    for i in range(iters):
        for j in range(len(fns)):
            k = (i + j) % len(fns)  # rotate the order too
            fn, n = fns[k], reps[k]
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[k].append((time.perf_counter() - t0) / n)
    return samples


def _wait(x):
    import torch.distributed._functional_collectives as funcol

    if isinstance(x, funcol.AsyncCollectiveTensor):
        return x.wait()
    return x


@dataclasses.dataclass(frozen=True)
class Stat:
    """A measurement: median of per-sample slowest-rank times, and its noise."""

    median: float
    stderr: float  # standard error of the median, from the MAD
    samples: tuple[float, ...]

    @classmethod
    def of(cls, per_rank: Sequence[Sequence[float]]) -> "Stat":
        samples = tuple(max(ts) for ts in zip(*per_rank))
        med = statistics.median(samples)
        mad = statistics.median(abs(s - med) for s in samples)
        # sigma ~ 1.4826 MAD; the median's standard error ~ 1.2533 sigma / sqrt(n).
        stderr = 1.2533 * 1.4826 * mad / math.sqrt(len(samples))
        return cls(med, stderr, samples)

    def to_dict(self) -> dict:
        return {"median_s": self.median, "stderr_s": self.stderr, "samples_s": list(self.samples)}


# -- calibrate -------------------------------------------------------------------------


def _calibrate_worker(rank: int, world: int, mesh_sizes, names, sizes, iters: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

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
            return lambda: _wait(funcol.all_reduce(x, "sum", pg))
        if kind == "reduce_scatter":
            return lambda: _wait(funcol.reduce_scatter_single(x, "sum", 0, pg))
        if kind == "all_gather":
            return lambda: _wait(funcol.all_gather_single(x, 0, pg))
        if kind == "all_to_all":
            return lambda: _wait(funcol.all_to_all_single(x, None, None, pg))
        raise AssertionError(kind)

    out = []
    for label, dims, pg in groups:
        p = dist.get_world_size(pg)
        for nbytes in sizes:
            numel = max(p, nbytes // 4 // p * p)  # float32, divisible by the group size
            x = torch.randn(numel)
            fns = [op(kind, x, pg) for kind in KINDS]
            samples = _timed_samples(fns, iters, warmup)
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
    import itertools

    import numpy as np

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
    from .mesh import MeshSpec

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
        "torch": _torch_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall,
        "measuring_s": max(r["worker_s"] for r in per_rank),
        "load_average": _loadavg(),
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


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _load_warning() -> str | None:
    load = _loadavg()
    cpus = os.cpu_count() or 1
    if load and load[0] > 0.5 * cpus:
        return (
            f"note: load average {load[0]:.1f} on {cpus} cpus: other processes share the "
            "machine, so times include scheduling delays and are noisier"
        )
    return None


def _torch_version() -> str:
    import torch

    return torch.__version__


DEFAULT_CALIBRATE_SIZES = "1KiB..4MiB*4"


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


def cmd_calibrate(args) -> int:
    try:
        mesh_sizes, names = parse_mesh_sizes(args.mesh)
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        return _usage_error("calibrate", e)
    nprocs = args.nprocs if args.nprocs is not None else math.prod(mesh_sizes)
    if args.iters < 1 or args.warmup < 0:
        return _usage_error("calibrate", "--iters must be >= 1 and --warmup >= 0")
    print(
        f"calibrating: {nprocs} gloo ranks, mesh {'x'.join(map(str, mesh_sizes))}, "
        f"{len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}, "
        f"{len(KINDS)} collectives, {args.iters} samples each ...",
        flush=True,
    )
    warning = _load_warning()
    if warning:
        print(warning, flush=True)
    try:
        model, record = calibrate(
            nprocs, mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup, timeout=args.timeout
        )
    except ValueError as e:
        return _usage_error("calibrate", e)
    except SpawnError as e:
        print(f"redist-opt calibrate: {e}", file=sys.stderr)
        return 1
    print(format_calibration(model, record))
    model.save(args.out, calibration=record)
    print(
        f"\nwrote {args.out} ({record['wall_s']:.1f} s: {record['measuring_s']:.1f} s measuring, "
        f"the rest starting {nprocs} processes)"
    )
    return 0


def _usage_error(command: str, e) -> int:
    print(f"redist-opt {command}: error: {e}", file=sys.stderr)
    return 2


# -- bench: planning speed ---------------------------------------------------------------

PLANNING_CASE = dict(
    sizes=(8, 16, 32, 32),
    names=("pp", "dp", "cp", "tp"),
    flattened=(("dp", "cp"), ("cp", "tp")),
    src="P,P,S(0),R",
    dst="R,S(0),R,R",
    shape=(4096, 1024),
)


def _optimize_kwargs(cost: CostModel | None) -> dict:
    """``cost=`` for ``redist_opt.optimize`` when it takes one (else the profile is not used)."""
    import inspect

    import redist_opt

    if cost is not None and "cost" in inspect.signature(redist_opt.optimize).parameters:
        return {"cost": cost}
    return {}


def planning_bench(*, runs: int = 100, cached_runs: int = 2500, cost: CostModel | None = None) -> dict:
    """Microseconds per ``plan`` and ``plan`` + ``optimize`` call, uncached and cached."""
    import importlib

    import redist_opt

    # ``redist_opt.plan`` is the function; the module defines the cache.
    plan_mod = importlib.import_module("redist_opt.plan")
    pipeline = importlib.import_module("redist_opt.pipeline")

    c = PLANNING_CASE
    spec = redist_opt.MeshSpec(sizes=c["sizes"], names=c["names"], flattened=c["flattened"])
    kw = _optimize_kwargs(cost)

    def clear():
        plan_mod._make_plan_cached.cache_clear()
        pipeline._run_cached.cache_clear()

    def do_plan():
        return redist_opt.plan(spec, c["src"], c["dst"], shape=c["shape"])

    def do_both():
        return redist_opt.optimize(do_plan(), groups="existing", **kw)

    def per_call(fn, n, uncached):
        if not uncached:
            for _ in range(min(n, 200)):  # warm: first calls after a clear allocate
                fn()
        ts = []
        for _ in range(n):
            if uncached:
                clear()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return ts

    out = {}
    # Uncached optimize alone: plan once (cached), clear only the pipeline cache.
    p = do_plan()
    opt_ts = []
    for _ in range(runs):
        pipeline._run_cached.cache_clear()
        t0 = time.perf_counter()
        redist_opt.optimize(p, groups="existing", **kw)
        opt_ts.append(time.perf_counter() - t0)
    rows = [
        ("plan", "uncached", per_call(do_plan, runs, True)),
        ("optimize", "uncached", opt_ts),
        ("plan+optimize", "uncached", per_call(do_both, runs, True)),
    ]
    do_both()
    # The eager hot path: what redist_opt.redistribute does per call once planned
    # (Placement objects in, one dictionary lookup for the naive and optimized plans).
    from redist_opt.api import _plans_for

    hot_key = (
        spec,
        redist_opt.parse_placements(c["src"]),
        redist_opt.parse_placements(c["dst"]),
        tuple(c["shape"]),
        torch.float32,
        ("existing", None, kw.get("cost"), "time"),
    )
    rows += [
        ("plan", "cached", per_call(do_plan, cached_runs, False)),
        ("plan+optimize", "cached", per_call(do_both, cached_runs, False)),
        ("redistribute hot path", "cached", per_call(lambda: _plans_for(*hot_key), cached_runs, False)),
    ]
    for what, mode, ts in rows:
        out[f"{what} {mode}"] = {
            "what": what,
            "mode": mode,
            "runs": len(ts),
            "median_us": statistics.median(ts) * 1e6,
            "p10_us": _quantile(ts, 0.1) * 1e6,
            "p90_us": _quantile(ts, 0.9) * 1e6,
        }
    final = do_both()
    return {
        "case": {
            "mesh": spec.shape_str,
            "flattened": ["+".join(f) for f in c["flattened"]],
            "src": c["src"],
            "dst": c["dst"],
            "shape": list(c["shape"]),
            "ranks": spec.num_ranks,
        },
        "cost_profile_used": bool(kw),
        "collectives": final.num_collectives,
        "timings": out,
    }


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def format_planning(res: dict) -> str:
    c = res["case"]
    lines = [
        f"planning speed: {c['src']} -> {c['dst']}, shape {tuple(c['shape'])}, mesh {c['mesh']} "
        f"({c['ranks']} ranks), flattened {', '.join(c['flattened'])}",
        f"{'call':<16} {'mode':<9} {'runs':>6} {'median us':>10} {'p10 us':>9} {'p90 us':>9}",
    ]
    for t in res["timings"].values():
        lines.append(
            f"{t['what']:<16} {t['mode']:<9} {t['runs']:>6} {t['median_us']:>10.1f} "
            f"{t['p10_us']:>9.1f} {t['p90_us']:>9.1f}"
        )
    return "\n".join(lines)


# -- bench: wall clock on gloo ------------------------------------------------------------

WALL_MESH = ((2, 2), ("a", "b"))
WALL_CASES = [
    ("P,P", "R,R"),
    ("P,P", "S(0),R"),
    ("P,P", "R,S(0)"),
    ("S(0),S(0)", "R,R"),
    ("S(0),S(1)", "S(1),S(0)"),
]
DEFAULT_BENCH_SIZES = "1KiB..4MiB*8"
VARIANTS = ("torch", "torch_nomerge", "ours")


def bench_shape(nbytes: int, itemsize: int = 4) -> tuple[int, int]:
    """A near-square 2-D float32 shape of ``nbytes`` (global), dims divisible where possible."""
    numel = max(1, nbytes // itemsize)
    rows = 1 << max(0, (numel.bit_length() - 1 + 1) // 2)
    while rows > 1 and numel % rows:
        rows //= 2
    return rows, numel // rows


def _wall_worker(rank: int, world: int, cases, sizes, iters: int, warmup: int, cost_dict) -> list:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization
    from torch.distributed.tensor.debug import CommDebugMode

    import redist_opt

    sizes_, names = WALL_MESH
    mesh = init_device_mesh("cpu", sizes_, mesh_dim_names=names)
    # A flattened a+b group, so torch's merge pass (and our groups="existing") can merge.
    mesh[names]._flatten()
    cost = CostModel.from_dict(cost_dict) if cost_dict is not None else None
    ours_kw = _redistribute_kwargs(cost)

    def sync(dt):
        _wait(dt._local_tensor)
        return dt

    rows = []
    for src, dst in cases:
        src_p = redist_opt.parse_placements(src)
        dst_p = redist_opt.parse_placements(dst)
        for nbytes in sizes:
            shape = bench_shape(nbytes)
            torch.manual_seed(0)
            full = torch.randn(shape)
            base = [redist_opt.parse_placement("R") if p.is_partial() else p for p in src_p]
            dt = distribute_tensor(full, mesh, base, src_data_rank=None)
            if any(p.is_partial() for p in src_p):
                dt = DTensor.from_local(
                    dt.to_local() * (rank + 1), mesh, src_p, run_check=False,
                    shape=full.shape, stride=full.stride(),
                )  # fmt: skip

            def f_torch(dt=dt, dst_p=dst_p):
                with disable_redistribute_transform_optimization(False):
                    return sync(dt.redistribute(mesh, dst_p))

            def f_nomerge(dt=dt, dst_p=dst_p):
                with disable_redistribute_transform_optimization():
                    return sync(dt.redistribute(mesh, dst_p))

            def f_ours(dt=dt, dst_p=dst_p):
                return sync(redist_opt.redistribute(dt, dst_p, groups="existing", **ours_kw))

            # Merged reductions sum in another order: compare with a tolerance, and
            # record whether the results are also bitwise equal.
            ref = f_nomerge().to_local()
            outs = [f_ours().to_local(), f_torch().to_local()]
            equal = all(o.shape == ref.shape and torch.allclose(o, ref, rtol=1e-5, atol=1e-5) for o in outs)
            bitwise = all(o.shape == ref.shape and torch.equal(o, ref) for o in outs)
            counts = []
            for f in (f_torch, f_nomerge, f_ours):
                with CommDebugMode() as mode:
                    f()
                counts.append(mode.get_total_counts())
            samples = _timed_samples([f_torch, f_nomerge, f_ours], iters, warmup)
            rows.append(
                dict(case=f"{src} -> {dst}", src=src, dst=dst, nbytes=nbytes, shape=list(shape),
                     equal=equal, bitwise=bitwise, collectives=counts, samples=samples)
            )  # fmt: skip
    return rows


def _redistribute_kwargs(cost: CostModel | None) -> dict:
    import inspect

    import redist_opt

    if cost is not None and "cost" in inspect.signature(redist_opt.redistribute).parameters:
        return {"cost": cost}
    return {}


def wall_bench(
    sizes: Sequence[int],
    cases: Sequence[tuple[str, str]] = tuple(WALL_CASES),
    *,
    iters: int = 15,
    warmup: int = 2,
    cost: CostModel | None = None,
    timeout: float = 300.0,
) -> dict:
    world = math.prod(WALL_MESH[0])
    cost_dict = cost.to_dict() if cost is not None else None
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _wall_worker, world, (list(cases), list(sizes), iters, warmup, cost_dict), timeout=timeout
    )
    wall = time.perf_counter() - t0
    rows = []
    for i, r0 in enumerate(per_rank[0]):
        stats = {
            v: Stat.of([r[i]["samples"][k] for r in per_rank]) for k, v in enumerate(VARIANTS)
        }
        t, o = stats["torch"], stats["ours"]
        noise = 3.0 * math.hypot(t.stderr, o.stderr)
        ratio = o.median / t.median if t.median > 0 else float("nan")
        rows.append(
            dict(
                case=r0["case"],
                src=r0["src"],
                dst=r0["dst"],
                nbytes=r0["nbytes"],
                shape=r0["shape"],
                equal=all(r[i]["equal"] for r in per_rank),
                bitwise_equal=all(r[i]["bitwise"] for r in per_rank),
                collectives=dict(zip(VARIANTS, r0["collectives"])),
                **{f"{v}_ms": stats[v].median * 1e3 for v in VARIANTS},
                **{f"{v}_stderr_ms": stats[v].stderr * 1e3 for v in VARIANTS},
                ratio=ratio,
                noise_ms=noise * 1e3,
                slower=bool(o.median - t.median > noise and ratio > 1 + MIN_FLAG_RATIO),
                samples_ms={v: [s * 1e3 for s in stats[v].samples] for v in VARIANTS},
            )
        )
    return {
        "mesh": {"sizes": list(WALL_MESH[0]), "names": list(WALL_MESH[1]), "flattened": ["a+b"]},
        "ranks": world,
        "iters": iters,
        "warmup": warmup,
        "cost_profile": cost.name if cost is not None else None,
        "cost_profile_used": bool(cost is not None and _redistribute_kwargs(cost)),
        "wall_s": wall,
        "rows": rows,
    }


BUILTIN_PROFILES = ("nccl", "gloo")

# Differences below this fraction are never flagged, however tight the samples.
MIN_FLAG_RATIO = 0.05


def format_wall(res: dict) -> str:
    profile = res["cost_profile"] or "default (redist_opt's default model)"
    if res["cost_profile"] and not res["cost_profile_used"]:
        profile += " (not used: redistribute takes no cost=)"
    lines = [
        f"wall clock: {res['ranks']} gloo ranks, mesh a=2,b=2 with a+b flattened, "
        f"median of {res['iters']} samples (slowest rank), ms per redistribute; "
        f"ours: groups=existing, cost profile {profile}",
        f"{'case':<24} {'size':>7} {'torch':>8} {'no merge':>9} {'ours':>8} {'ours/torch':>10} "
        f"{'noise':>7} {'colls':>5} {'eq':>3}  flag",
    ]
    for r in res["rows"]:
        lines.append(
            f"{r['case']:<24} {format_size(r['nbytes']):>7} {r['torch_ms']:>8.3f} "
            f"{r['torch_nomerge_ms']:>9.3f} {r['ours_ms']:>8.3f} {r['ratio']:>10.2f} "
            f"{r['noise_ms']:>7.3f} {'/'.join(str(r['collectives'][v]) for v in VARIANTS):>5} "
            f"{'ok' if r['equal'] else 'NO':>3}  {'SLOWER' if r['slower'] else ''}"
        )
    lines.append(
        "colls = collectives issued by torch / torch no merge / ours; eq = every rank's result "
        "matches torch's (rtol=atol=1e-5)\n"
        "noise = 3 x combined standard error of the two medians (from the samples' MAD); "
        f"SLOWER = ours - torch > noise and ours/torch > {1 + MIN_FLAG_RATIO:.2f}"
    )
    return "\n".join(lines)


def cmd_bench(args) -> int:
    try:
        sizes = parse_sizes(args.sizes)
        cases = [_parse_case(c) for c in args.case] if args.case else list(WALL_CASES)
    except ValueError as e:
        return _usage_error("bench", e)
    if args.iters < 1 or args.warmup < 0:
        return _usage_error("bench", "--iters must be >= 1 and --warmup >= 0")
    cost = None
    if args.profile:
        try:
            if args.profile in BUILTIN_PROFILES and not os.path.exists(args.profile):
                cost = CostModel.profile(args.profile)
            else:
                cost = CostModel.load(args.profile)
        except (OSError, ValueError) as e:
            return _usage_error("bench", f"--profile: {e}")
    result: dict = {"torch": _torch_version(), "cost_profile_path": args.profile, "load_average": _loadavg()}
    warning = _load_warning()
    if warning:
        print(warning + "\n", flush=True)
    exit_code = 0
    if args.part in ("all", "planning"):
        res = planning_bench(runs=args.plan_runs, cached_runs=args.plan_runs * 25, cost=cost)
        result["planning"] = res
        print(format_planning(res))
        if cost is not None and not res["cost_profile_used"]:
            print("note: redist_opt.optimize takes no cost= keyword yet; the profile was not used")
        print(flush=True)
    if args.part in ("all", "wall"):
        print(
            f"running {len(cases)} cases x {len(sizes)} sizes on {math.prod(WALL_MESH[0])} gloo ranks ...",
            flush=True,
        )
        try:
            res = wall_bench(sizes, cases, iters=args.iters, warmup=args.warmup, cost=cost, timeout=args.timeout)
        except SpawnError as e:
            print(f"redist-opt bench: {e}", file=sys.stderr)
            return 1
        result["wall"] = res
        print(format_wall(res))
        if cost is not None and not res["cost_profile_used"]:
            print("note: redist_opt.redistribute takes no cost= keyword yet; the profile was not used")
        if not all(r["equal"] for r in res["rows"]):
            print("MISMATCH: some results differ from torch's (beyond rtol=atol=1e-5)", file=sys.stderr)
            exit_code = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"\nwrote {args.json}")
    return exit_code


def _parse_case(text: str) -> tuple[str, str]:
    if "->" not in text:
        raise ValueError(f"--case {text!r}: expected SRC->DST, e.g. 'P,P->R,S(0)'")
    src, dst = (s.strip() for s in text.split("->", 1))
    import redist_opt

    for s in (src, dst):
        ps = redist_opt.parse_placements(s)
        if len(ps) != len(WALL_MESH[0]):
            raise ValueError(f"--case {text!r}: {s!r} has {len(ps)} placements for a 2-D mesh")
    return src, dst


# -- argparse wiring (called from redist_opt.cli.build_parser) -----------------------------


def add_calibrate_arguments(p) -> None:
    p.add_argument("--nprocs", type=int, default=None, help="gloo processes (default: the mesh's size)")
    p.add_argument("--mesh", default="2,2", help="mesh sizes, e.g. 2,2 or a=2,b=2 (default 2,2)")
    p.add_argument(
        "--sizes", default=DEFAULT_CALIBRATE_SIZES,
        help=f"message sizes per rank: a list (1KiB,64KiB), a doubling range (1KiB..4MiB) "
        f"or a range with a step factor (1KiB..4MiB*4); default {DEFAULT_CALIBRATE_SIZES}",
    )  # fmt: skip
    p.add_argument("--iters", type=int, default=7, help="timed samples per point (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")
    p.add_argument("--out", default="profile.json", help="where to write the profile (default profile.json)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds before giving up on the ranks")


def add_bench_arguments(p) -> None:
    p.add_argument("--part", default="all", choices=["all", "planning", "wall"], help="which part to run (default all)")
    p.add_argument(
        "--sizes", default=DEFAULT_BENCH_SIZES,
        help=f"global tensor sizes (list or range as for calibrate); default {DEFAULT_BENCH_SIZES}",
    )  # fmt: skip
    p.add_argument("--case", action="append", help="a redistribution SRC->DST on the 2x2 mesh (repeatable)")
    p.add_argument("--iters", type=int, default=15, help="timed samples per point (default 15)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")
    p.add_argument("--plan-runs", type=int, default=100, help="uncached planning runs (cached: 25x)")
    p.add_argument(
        "--profile",
        help="the optimizer's cost profile: a JSON file from `redist-opt calibrate`, or a built-in "
        f"profile name ({', '.join(BUILTIN_PROFILES)}); default: redist_opt's default model",
    )
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds before giving up on the ranks")
