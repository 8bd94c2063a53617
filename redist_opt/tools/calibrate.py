"""``redist-opt calibrate``: measure collectives and fit the cost model, on spawned local
gloo ranks or inside a launched job (``torchrun --nproc_per_node=N -m redist_opt calibrate``).

The ranks time all_reduce, reduce_scatter, all_gather and all_to_all (funcol) over a
range of sizes on each mesh dim's groups, the flattened sets of dims and, with 2+
hosts (``LOCAL_WORLD_SIZE`` is the profile's ``devices_per_host``), a host's ranks and
the ranks across hosts; :func:`redist_opt.ir.cost_fit.fit_profile` fits the profile,
which rank 0 writes as JSON. A launched job measures on its own backend and device
(:func:`~redist_opt.tools.timing.select_device`). Method: docs/design.md, "Cost profiles".
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import sympy
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from redist_opt.ir.cost import BUILTIN_PROFILES, KINDS, CostModel
from redist_opt.ir.cost_fit import fit_profile
from redist_opt.ir.mesh import MeshSpec
from redist_opt.measure.clock import Clock
from redist_opt.tools.args import CliError, check_samples, format_size, parse_mesh, parse_size_list
from redist_opt.tools.spawn import SpawnError, quiet_torch_logs, run_ranks
from redist_opt.tools.timing import Stat, loadavg, note_load, select_device, timed_samples, wait
from redist_opt.torch_api import c10d as funcol
from redist_opt.torch_api import mesh as torch_mesh

__all__ = [
    "calibrate",
    "calibrate_launched",
    "measure_collectives",
    "summarize",
    "format_calibration",
    "Launch",
    "launched",
    "default_mesh",
    "cmd_calibrate",
]


def _calibrate_worker(rank: int, world: int, mesh_sizes, names, sizes, iters: int, warmup: int) -> dict:
    """One spawned gloo rank of the local mode: CPU tensors, the wall clock, one host."""
    return measure_collectives(mesh_sizes, names, sizes, iters, warmup)


_SPLITTING = ("reduce_scatter", "all_to_all")
_OPS = {
    "all_reduce": lambda x, pg: funcol.all_reduce(x, "sum", pg),
    "reduce_scatter": lambda x, pg: funcol.reduce_scatter_single(x, "sum", 0, pg),
    "all_gather": lambda x, pg: funcol.all_gather_single(x, 0, pg),
    "all_to_all": lambda x, pg: funcol.all_to_all_single(x, None, None, pg),
}


def _op(kind: str, x: torch.Tensor, pg) -> Callable:
    return lambda: wait(_OPS[kind](x, pg))


def _host_groups(world: int, devices_per_host: int | None) -> list[tuple[str, int, str, object]]:
    """(label, size, link, this rank's group) of the ranks of this host and of this
    local rank's peers on the other hosts, when the job spans 2+ hosts (every rank
    creates every group, as ``new_subgroups_by_enumeration`` does, in the same order)."""
    if not devices_per_host or devices_per_host >= world or world % devices_per_host:
        return []
    d, hosts = devices_per_host, world // devices_per_host
    host, _ = dist.new_subgroups_by_enumeration([list(range(h * d, (h + 1) * d)) for h in range(hosts)])
    peers, _ = dist.new_subgroups_by_enumeration([list(range(local, world, d)) for local in range(d)])
    return ([("host", d, "intra", host)] if d > 1 else []) + [("hosts", hosts, "inter", peers)]


def measure_collectives(
    mesh_sizes,
    names,
    sizes,
    iters: int,
    warmup: int,
    *,
    clock: Clock | None = None,
    devices_per_host: int | None = None,
) -> dict:
    """Time every collective kind over the mesh's groups (each dim, the flattened whole
    mesh, and with ``devices_per_host`` below the world, a host's and across hosts) on
    the calling rank of an initialized process group; samples per point, this rank's."""
    start = time.perf_counter()
    clock = clock or Clock()
    device = clock.device
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
        flat = torch_mesh.flatten(mesh)
        creation.append(time.perf_counter() - t0)
        # Every other set of 2+ dims too (a 2x2x2 mesh has groups of 4 as well as 2 and 8).
        real = [d for d in range(len(mesh_sizes)) if mesh_sizes[d] > 1]
        subsets = [c for k in range(2, len(real)) for c in itertools.combinations(real, k)]
        for dims in subsets:
            groups.append(
                (
                    "+".join(names[d] for d in dims),
                    dims,
                    torch_mesh.flatten(mesh[tuple(names[d] for d in dims)]).get_group(),
                )
            )
        groups.append(("+".join(names), tuple(range(len(mesh_sizes))), flat.get_group()))
    for _ in range(2):
        dist.barrier()
        t0 = time.perf_counter()
        dist.new_group(list(range(world)))
        creation.append(time.perf_counter() - t0)
    labelled = [
        (label, dist.get_world_size(pg), where.link(spec.group(dims), spec), dims, pg)
        for label, dims, pg in groups
    ]
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
                points.append(
                    dict(
                        kind=kind,
                        group=label,
                        dims=None if dims is None else list(dims),
                        p=p,
                        link=link,
                        nbytes=numel * 4,
                    )
                )
        for point, s in zip(points, timed_samples(fns, iters, warmup, clock)):
            out.append(point | {"samples": s})
    return {"measurements": out, "creation": creation, "worker_s": time.perf_counter() - start}


def validate_request(
    mesh_sizes: Sequence[int], names: Sequence[str] | None, world: int | None = None
) -> tuple:
    """(mesh sizes, names), checked against a launched job's ``world``; ValueError names the problem."""
    mesh_sizes = tuple(int(s) for s in mesh_sizes)
    names = tuple(names or (f"d{i}" for i in range(len(mesh_sizes))))
    if world is not None and math.prod(mesh_sizes) != world:
        raise ValueError(f"mesh {mesh_sizes} has {math.prod(mesh_sizes)} ranks but WORLD_SIZE is {world}")
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


def _fit(
    per_rank: Sequence[dict],
    backend: str,
    device: str,
    mesh_sizes,
    names,
    sizes,
    iters: int,
    warmup: int,
    t0: float,
    **extra,
) -> tuple[CostModel, dict]:
    """(model, calibration record) fitted to every rank's samples; ``t0``: when the
    calibration started. ``extra`` (the mode, and a launched job's ``devices_per_host``,
    which the fit uses too) goes to the record."""
    measurements, creation = summarize(per_rank)
    model, fit = fit_profile(
        measurements, creation, f"{backend}-calibrated-{len(per_rank)}", extra.get("devices_per_host")
    )
    # Calibration measures collectives alone; the decisions measured inside training
    # steps (which rewrites made steps slower) are not re-measured here, so the profile
    # keeps the backend's built-in ones rather than silently letting those rewrites back in.
    base = CostModel.profile(backend) if backend in BUILTIN_PROFILES else CostModel.default()
    model = dataclasses.replace(model, slower_in_steps=base.slower_in_steps)
    record = {
        "backend": backend,
        "device": device,
        "nprocs": len(per_rank),
        "mesh": {"sizes": list(mesh_sizes), "names": list(names)},
        "sizes": list(sizes),
        "iters": iters,
        "warmup": warmup,
        "host": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - t0,
        "measuring_s": max(r["worker_s"] for r in per_rank),
        "load_average": loadavg(),
        "fit": fit,
        "slower_in_steps_from": f"the built-in {base.name!r} profile (in-step decisions are not re-measured)",
        "group_creation_s": list(creation),
        "measurements": measurements,
        **extra,
    }
    return model, record


def calibrate(
    mesh_sizes: Sequence[int],
    names: Sequence[str] | None,
    sizes: Sequence[int],
    *,
    iters: int,
    warmup: int,
    timeout: float,
) -> tuple[CostModel, dict]:
    """Measure on one spawned gloo rank per mesh position and fit; returns (model, calibration record)."""
    mesh_sizes, names = validate_request(mesh_sizes, names)
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _calibrate_worker,
        math.prod(mesh_sizes),
        (mesh_sizes, names, list(sizes), iters, warmup),
        timeout=timeout,
    )
    return _fit(per_rank, "gloo", "cpu", mesh_sizes, names, sizes, iters, warmup, t0, mode="spawn")


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
        f"  per-call + per-byte terms fitted for {len({r[:3] for r in model.fitted})} "
        "(collective, group size, "
        f"link) curves (devices_per_host={model.devices_per_host}); the modelled tables below use them",
        f"  rewrites left out as slower inside training steps: {list(model.slower_in_steps) or 'none'}, "
        f"kept from {record.get('slower_in_steps_from', 'the base profile')}",
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


# -- launched jobs -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Launch:
    """This process's place in a launched job, read from the launcher's environment."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @property
    def devices_per_host(self) -> int | None:
        """Ranks per host for the cost model; None when the job is one host."""
        return self.local_world if self.local_world < self.world else None


def launched(env: Mapping[str, str] | None = None) -> Launch | None:
    """The launch this process is part of (torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_*``),
    or None when nothing launched it (the local-spawn mode)."""
    env = os.environ if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except ValueError as e:
        raise ValueError(
            f"launcher environment: {e} (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE must be integers)"
        ) from None
    if not (0 <= rank < world) or not (0 <= local_rank < local_world <= world):
        raise ValueError(
            f"launcher environment: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local_rank} "
            f"LOCAL_WORLD_SIZE={local_world} is not a valid place in a job"
        )
    return Launch(rank, world, local_rank, local_world)


def default_mesh(world: int) -> tuple[int, ...]:
    """The mesh measured when none is named: ``world`` in its prime factors, smallest
    first, the ones past the second multiplied into a third dim (4 -> 2x2, 8 -> 2x2x2,
    16 -> 2x2x4, 6 -> 2x3). Its dims and their flattened sets are groups of several
    sizes up to the world, so a plan's group sizes are measured or lie between measured
    ones; a 1-D world would measure one size only, and price a group of 2 like the world."""
    factors = [p for p, k in sorted(sympy.factorint(world).items()) for _ in range(k)]
    if len(factors) > 3:
        factors = factors[:2] + [math.prod(factors[2:])]
    return tuple(factors) or (world,)


def calibrate_launched(
    launch: Launch,
    mesh_sizes: Sequence[int],
    names: Sequence[str] | None,
    sizes: Sequence[int],
    *,
    iters: int,
    warmup: int,
    timeout: float,
) -> tuple[CostModel, dict] | None:
    """Measure on the launched job's ranks; (model, record) on rank 0, None elsewhere."""
    mesh_sizes, names = validate_request(mesh_sizes, names, launch.world)
    backend, clock = select_device(launch.local_rank)
    t0 = time.perf_counter()
    if clock.device.type != "cpu":
        torch.accelerator.set_device_index(clock.device.index)
    timeout_td = datetime.timedelta(seconds=timeout)
    dist.init_process_group(backend, rank=launch.rank, world_size=launch.world, timeout=timeout_td)
    try:
        with quiet_torch_logs():
            mine = measure_collectives(
                mesh_sizes,
                names,
                list(sizes),
                iters,
                warmup,
                clock=clock,
                devices_per_host=launch.devices_per_host,
            )
        per_rank = [None] * launch.world if launch.rank == 0 else None
        dist.gather_object(mine, per_rank, dst=0)
    finally:
        dist.destroy_process_group()
    if launch.rank != 0:
        return None
    return _fit(
        per_rank,
        backend,
        clock.device.type,
        mesh_sizes,
        names,
        sizes,
        iters,
        warmup,
        t0,
        mode="launched",
        devices_per_host=launch.devices_per_host,
        local_world_size=launch.local_world,
    )


# -- the command ---------------------------------------------------------------------


def cmd_calibrate(args) -> int:
    """``redist-opt calibrate``: spawned gloo ranks, or the ranks a launcher started."""
    launch = launched()
    mesh_sizes, names = (
        parse_mesh(args.mesh) if args.mesh else (default_mesh(launch.world) if launch else (2, 2), None)
    )
    sizes = parse_size_list(args.sizes)
    check_samples(args.iters, args.warmup)
    if launch is not None:
        try:
            result = calibrate_launched(
                launch, mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup, timeout=args.timeout
            )
        except ValueError as e:
            raise CliError(str(e)) from None
        if result is None:  # not rank 0: rank 0 reports and writes
            return 0
        return _report_calibration(args, *result)
    print(
        f"calibrating: {math.prod(mesh_sizes)} gloo ranks, mesh {'x'.join(map(str, mesh_sizes))}, "
        f"{len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}, "
        f"{len(KINDS)} collectives, {args.iters} samples each ...",
        flush=True,
    )
    note_load()
    try:
        model, record = calibrate(
            mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup, timeout=args.timeout
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    except SpawnError as e:
        print(f"redist-opt calibrate: {e}", file=sys.stderr)
        return 1
    return _report_calibration(args, model, record)


def _report_calibration(args, model, record) -> int:
    print(format_calibration(model, record))
    model.save(args.out, calibration=record)
    print(
        f"\nwrote {args.out} ({record['wall_s']:.1f} s: {record['measuring_s']:.1f} s measuring; "
        f"{record['mode']} mode, {record['nprocs']} {record['backend']} ranks on {record['device']})"
    )
    return 0
