"""Command-line values shared by ``redist-opt`` and the quality bench: meshes, shapes,
dtypes, cost profiles and size lists, each checked with an error naming its flag.

Every bad value raises :class:`CliError` (one line, the command exits 2).
"""

from __future__ import annotations

import dataclasses
import os

import torch

from redist_opt.ir.cost import BUILTIN_PROFILES, CostModel, resolve
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError
from redist_opt.tools.units import parse_sizes

__all__ = [
    "CliError",
    "parse_mesh",
    "parse_shape",
    "parse_dtype",
    "parse_size_list",
    "mesh_spec",
    "load_profile",
    "cost_model",
    "with_devices_per_host",
    "check_samples",
    "DEFAULT_BENCH_SIZES",
    "DEFAULT_CALIBRATE_SIZES",
]

# ``--sizes`` defaults. 4 bytes is a loss or grad-norm scalar: gloo's ring leaves most
# chunks empty there, so it does not lie on the line through the larger sizes.
DEFAULT_CALIBRATE_SIZES = "4,64,1KiB..1MiB*4"
DEFAULT_BENCH_SIZES = "1KiB..4MiB*8"


class CliError(Exception):
    """A bad command-line value; the message names the flag."""


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``--mesh``: ``dp=2,tp=4``, ``2,4`` or ``2x4`` (dims named d0, d1, ...) -> (sizes, names)."""
    if "=" not in text:
        text = text.replace("x", ",")
    sizes, names = [], []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        if "=" in part:
            name, size = part.split("=", 1)
        else:
            name, size = f"d{i}", part
        try:
            sizes.append(int(size))
        except ValueError:
            raise CliError(f"--mesh: size {size!r} of dim {name!r} is not an integer") from None
        if sizes[-1] < 1:
            raise CliError(f"--mesh: size {sizes[-1]} of dim {name!r} must be >= 1")
        names.append(name.strip())
    if not sizes:
        raise CliError("--mesh: give dims as name=size,... (e.g. dp=2,cp=2,tp=2)")
    return tuple(sizes), tuple(names)


def parse_shape(text: str) -> tuple[int, ...]:
    """``--shape``: ``8,4`` -> (8, 4)."""
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise CliError(f"--shape: {text!r} is not a comma-separated list of integers") from None


def parse_dtype(text: str) -> torch.dtype:
    """``--dtype``: a torch dtype name such as ``float32`` or ``bfloat16``."""
    dt = getattr(torch, text, None)
    if not isinstance(dt, torch.dtype):
        raise CliError(f"--dtype: unknown dtype {text!r} (e.g. float32, bfloat16)")
    return dt


def parse_size_list(text: str) -> list[int]:
    """``--sizes``: a list or range of byte sizes (see :func:`redist_opt.tools.units.parse_sizes`)."""
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise CliError(f"--sizes: {e}") from None


def mesh_spec(text: str, flatten: list[str]) -> MeshSpec:
    """``--mesh`` and ``--flatten`` -> a rank-free MeshSpec with those flattened groups."""
    sizes, names = parse_mesh(text)
    for name, size in zip(names, sizes):
        if not name:
            raise CliError(f"--mesh: {text!r} has a dim without a name (give name=size)")
        if not name.isidentifier():
            raise CliError(f"--mesh: dim name {name!r} must be an identifier such as dp or tp")
        if size < 1:
            raise CliError(f"--mesh: dim {name!r} has size {size}; sizes must be >= 1")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CliError(f"--mesh: dim name {dup[0]!r} is given twice")
    try:
        spec = MeshSpec(sizes=sizes, names=names)
    except RedistributeError as e:
        raise CliError(f"--mesh: {e}") from None
    groups = []
    for g in flatten:
        try:
            dims = spec.dims_of(g)
        except RedistributeError as e:
            raise CliError(f"--flatten {g}: {e}") from None
        if not dims:
            raise CliError(f"--flatten {g!r}: give mesh dims joined by '+', e.g. dp+cp")
        groups.append(g)
    return spec.with_flattened(groups) if groups else spec


def load_profile(flag: str, profile: str) -> CostModel:
    """A built-in cost profile by name, or one written by ``redist-opt calibrate``."""
    try:
        if profile in BUILTIN_PROFILES and not os.path.exists(profile):
            return CostModel.profile(profile)
        return CostModel.load(profile)
    except OSError as e:
        raise CliError(f"{flag}: cannot read {profile!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise CliError(f"{flag}: {e}") from None


def with_devices_per_host(model: CostModel, devices_per_host: int | None) -> CostModel:
    """``--devices-per-host N`` applied to ``model`` (unchanged when not given)."""
    if devices_per_host is None:
        return model
    if devices_per_host < 1:
        raise CliError(f"--devices-per-host: {devices_per_host} must be >= 1")
    return dataclasses.replace(model, devices_per_host=devices_per_host)


def cost_model(flag: str, profile: str | None, devices_per_host: int | None, spec=None) -> tuple[CostModel, str]:
    """(model, where it came from): the profile given with ``flag``, else
    ``$REDIST_OPT_COST_PROFILE`` or the backend of ``spec``; then ``--devices-per-host``."""
    if profile is None:
        try:
            model, source = resolve(spec)
        except ValueError as e:
            raise CliError(str(e)) from None
    else:
        model, source = load_profile(flag, profile), f"{flag} {profile}"
    if devices_per_host is not None:
        model = with_devices_per_host(model, devices_per_host)
        source += f", --devices-per-host {devices_per_host}"
    return model, source


def check_samples(iters: int, warmup: int) -> None:
    """``--iters`` and ``--warmup`` of the measuring commands."""
    if iters < 1 or warmup < 0:
        raise CliError("--iters must be >= 1 and --warmup >= 0")
