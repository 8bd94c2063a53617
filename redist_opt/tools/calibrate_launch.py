"""``redist-opt calibrate``: on spawned local gloo ranks, or inside a launched job
(``torchrun --nproc_per_node=N -m redist_opt calibrate``).

torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``)
started this process as one rank of the job: the measurement runs on the job's own
backend and device rather than on local gloo processes. :func:`select_device` picks
NCCL with CUDA tensors and CUDA-event timing where CUDA is present, gloo on CPU with the
wall clock otherwise; both go through one :class:`~redist_opt.tools.timing.Clock`
interface and the same :func:`~redist_opt.tools.calibrate.measure_collectives`.
``LOCAL_WORLD_SIZE`` is the profile's ``devices_per_host``: with 2+ hosts the ranks also
measure a host's group (intra) and the groups across hosts (inter). Every rank sends
its samples to rank 0, which fits and writes the profile; the others write nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence

import sympy
import torch
import torch.distributed as dist

from redist_opt.ir.cost import KINDS, CostModel
from redist_opt.tools.args import CliError, check_samples, format_size, parse_mesh, parse_size_list
from redist_opt.ir.cost_fit import fit_profile
from redist_opt.tools.calibrate import calibrate, calibration_record, format_calibration
from redist_opt.tools.calibrate import measure_collectives, summarize, validate_request
from redist_opt.tools.spawn import SpawnError, quiet_torch_logs
from redist_opt.tools.timing import DeviceChoice, load_warning, select_device

__all__ = ["Launch", "launched", "calibrate_launched", "default_mesh", "cmd_calibrate"]


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
        raise ValueError(f"launcher environment: {e} (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE must be integers)") from None
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


def _init(launch: Launch, choice: DeviceChoice, timeout: float) -> bool:
    """Initialize the default process group on the chosen backend (unless one is up);
    whether we did (and so must destroy it)."""
    if dist.is_initialized():
        return False
    if choice.device.type != "cpu":
        torch.accelerator.set_device_index(choice.device.index)
    dist.init_process_group(
        choice.backend, rank=launch.rank, world_size=launch.world,
        timeout=datetime.timedelta(seconds=timeout),
    )  # fmt: skip
    return True


def calibrate_launched(
    launch: Launch,
    mesh_sizes: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    sizes: Sequence[int] = (),
    *,
    iters: int = 7,
    warmup: int = 2,
    timeout: float = 240.0,
    choice: DeviceChoice | None = None,
) -> tuple[CostModel, dict] | None:
    """Measure on the launched job's ranks; (model, record) on rank 0, None elsewhere.

    ``mesh_sizes`` default: :func:`default_mesh` of the world. ``choice`` overrides
    :func:`select_device`.
    """
    mesh_sizes, names = validate_request(launch.world, mesh_sizes or default_mesh(launch.world), names, "WORLD_SIZE")
    choice = choice or select_device(launch.local_rank)
    t0 = time.perf_counter()
    owned = _init(launch, choice, timeout)
    try:
        with quiet_torch_logs():
            mine = measure_collectives(
                mesh_sizes, names, list(sizes), iters, warmup, device=choice.device, clock=choice.clock,
                devices_per_host=launch.devices_per_host,
            )  # fmt: skip
        per_rank = [None] * launch.world if launch.rank == 0 else None
        dist.gather_object(mine, per_rank, dst=0)
    finally:
        if owned:
            dist.destroy_process_group()
    if launch.rank != 0:
        return None
    measurements, creation = summarize(per_rank)
    name = f"{choice.backend}-calibrated-{launch.world}"
    model, fit = fit_profile(measurements, creation, name, launch.devices_per_host)
    record = calibration_record(
        choice.backend, str(choice.device.type), launch.world, mesh_sizes, names, sizes, iters, warmup, fit,
        creation, measurements, time.perf_counter() - t0, max(r["worker_s"] for r in per_rank),
        mode="launched", devices_per_host=launch.devices_per_host, local_world_size=launch.local_world,
    )  # fmt: skip
    return model, record


# -- the command ---------------------------------------------------------------------


def cmd_calibrate(args) -> int:
    """``redist-opt calibrate``: spawned gloo ranks, or the ranks a launcher started."""
    launch = launched()
    mesh_sizes, names = parse_mesh(args.mesh) if args.mesh else (default_mesh(launch.world) if launch else (2, 2), None)
    sizes = parse_size_list(args.sizes)
    check_samples(args.iters, args.warmup)
    if launch is not None:
        if args.nprocs is not None and args.nprocs != launch.world:
            raise CliError(f"--nprocs {args.nprocs}: the launcher started {launch.world} ranks (WORLD_SIZE)")
        try:
            result = calibrate_launched(launch, mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup,
                                        timeout=args.timeout)  # fmt: skip
        except ValueError as e:
            raise CliError(str(e)) from None
        if result is None:  # not rank 0: rank 0 reports and writes
            return 0
        return _report_calibration(args, *result)
    nprocs = args.nprocs if args.nprocs is not None else math.prod(mesh_sizes)
    print(
        f"calibrating: {nprocs} gloo ranks, mesh {'x'.join(map(str, mesh_sizes))}, "
        f"{len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}, "
        f"{len(KINDS)} collectives, {args.iters} samples each ...",
        flush=True,
    )
    warning = load_warning()
    if warning:
        print(warning, flush=True)
    try:
        model, record = calibrate(
            nprocs, mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup, timeout=args.timeout
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
