"""Command-line values shared by ``redist-opt`` and the quality bench: meshes, shapes,
dtypes, cost profiles and byte sizes, each checked with an error naming its flag.

Every bad value raises :class:`CliError` (one line, the command exits 2). Byte sizes
are written as people write them (``64KiB``, ``1KiB..4MiB*4``); printing goes through
the one byte formatter, :func:`redist_opt.debug.units.format_bytes`, and
:func:`format_size` is its exact spelling, which :func:`parse_size` reads back.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import torch

from redist_opt.debug.units import format_bytes
from redist_opt.ir import cost
from redist_opt.ir.cost import CostModel, resolve
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError

__all__ = [
    "CliError",
    "parse_mesh",
    "parse_shape",
    "parse_dtype",
    "parse_size",
    "parse_sizes",
    "parse_size_list",
    "format_size",
    "mesh_spec",
    "cost_model",
    "check_samples",
    "DEFAULT_BENCH_SIZES",
    "DEFAULT_CALIBRATE_SIZES",
]

# ``--sizes`` defaults. 4 bytes is a loss or grad-norm scalar: gloo's ring leaves most
# chunks empty there, so it does not lie on the line through the larger sizes.
DEFAULT_CALIBRATE_SIZES = "4,64,1KiB..1MiB*4"
DEFAULT_BENCH_SIZES = "1KiB..4MiB*8"


class CliError(ValueError):
    """A bad command-line value; the message names the flag."""


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``--mesh``: ``dp=2,tp=4``, ``2,4`` or ``2x4`` (dims named d0, d1, ...) -> (sizes, names)."""
    if "=" not in text:
        text = text.replace("x", ",")
    sizes, names = [], []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        name, size = part.split("=", 1) if "=" in part else (f"d{i}", part)
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


# Aligned by prefix (bytes, then SI, then binary): easier to check than one per line.
_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
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


_RANGE = re.compile(r"(?P<lo>.+?)\.\.(?P<hi>[^*]+)(?:\*(?P<factor>.*))?")


def parse_sizes(text: str) -> list[int]:
    """``"1KiB,64KiB"`` (a list) or ``"1KiB..4MiB"`` (doubling) or ``"1KiB..4MiB*4"`` (x4 steps)."""
    out: set[int] = set()
    for part in (p for p in text.split(",") if p.strip()):
        m = _RANGE.fullmatch(part)
        if m is None:
            out.add(parse_size(part))
            continue
        lo, hi, factor = parse_size(m["lo"]), parse_size(m["hi"]), (m["factor"] or "2").strip()
        if not factor.isdigit() or int(factor) < 2:
            raise ValueError(f"size range {part!r}: step factor {factor!r} must be an integer >= 2")
        if lo > hi:
            raise ValueError(f"size range {part!r} is empty ({lo} > {hi} bytes)")
        out.update(
            itertools.takewhile(lambda s, hi=hi: s <= hi, (lo * int(factor) ** k for k in itertools.count()))
        )
    if not out:
        raise ValueError(f"no sizes in {text!r}")
    return sorted(out)


def format_size(n: int) -> str:
    """``65536`` -> ``"64KiB"``, ``1000`` -> ``"1000B"``: a whole number of the largest unit that
    divides ``n``."""
    return format_bytes(n, sep="", exact=True)


def parse_size_list(text: str) -> list[int]:
    """``--sizes``: a list or range of byte sizes (see :func:`parse_sizes`)."""
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise CliError(f"--sizes: {e}") from None


def mesh_spec(text: str, flatten: list[str]) -> MeshSpec:
    """``--mesh`` and ``--flatten`` -> a rank-free MeshSpec with those flattened groups."""
    sizes, names = parse_mesh(text)
    for name in names:
        if not name:
            raise CliError(f"--mesh: {text!r} has a dim without a name (give name=size)")
        if not name.isidentifier():
            raise CliError(f"--mesh: dim name {name!r} must be an identifier such as dp or tp")
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


def cost_model(
    flag: str, profile: str | None, devices_per_host: int | None, spec=None
) -> tuple[CostModel, str]:
    """(model, where it came from): the profile given with ``flag`` (a built-in name or a
    file from ``redist-opt calibrate``), else ``$REDIST_OPT_COST_PROFILE`` or the backend
    of ``spec``; then ``--devices-per-host``."""
    try:
        model, source = (
            resolve(spec) if profile is None else (cost.load_profile(profile), f"{flag} {profile}")
        )
    except OSError as e:
        raise CliError(f"{flag}: cannot read {profile!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise CliError(f"{flag}: {e}" if profile is not None else str(e)) from None
    if devices_per_host is not None:
        if devices_per_host < 1:
            raise CliError(f"--devices-per-host: {devices_per_host} must be >= 1")
        model = dataclasses.replace(model, devices_per_host=devices_per_host)
        source += f", --devices-per-host {devices_per_host}"
    return model, source


def check_samples(iters: int, warmup: int) -> None:
    """``--iters`` and ``--warmup`` of the measuring commands."""
    if iters < 1 or warmup < 0:
        raise CliError("--iters must be >= 1 and --warmup >= 0")
