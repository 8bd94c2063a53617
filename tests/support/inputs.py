"""Placements in short strings and the input DTensors of the differential tests.

``parse_placement`` / ``pstr`` read and print ``R``, ``S(0)``, ``P(avg)``...
independently of redist_opt; ``build_input`` makes a DTensor of random data
with given placements under ``LocalTensorMode`` (true shards of a random
global tensor, partial ranks perturbed per coordinate), using ``local_slice``,
an independent re-implementation of DTensor's shard layout; ``local_tensors``
reads every simulated rank's local tensor back.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
)

from support.meshes import rank_coordinates

_SHARD_RE = re.compile(r"^S\((-?\d+)\)$")
_PARTIAL_RE = re.compile(r"^P(?:\((sum|avg|max|min)\))?$")


def parse_placement(s: str | Placement) -> Placement:
    """Harness-local (independent of redist_opt) parser for the short strings."""
    if isinstance(s, Placement):
        return s
    s = s.strip()
    if s == "R":
        return Replicate()
    m = _SHARD_RE.match(s)
    if m:
        return Shard(int(m.group(1)))
    m = _PARTIAL_RE.match(s)
    if m:
        return Partial(m.group(1) or "sum")
    raise ValueError(f"harness cannot parse placement {s!r}")


def pstr(p: str | Placement) -> str:
    """Short string for a placement: R, S(0), S(-1), P, P(avg)..."""
    if isinstance(p, str):
        return p
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    if type(p) is Shard:
        return f"S({p.dim})"
    return repr(p)


def normalize(p: Placement, ndim: int) -> Placement:
    if type(p) is Shard and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bfloat16: "bf16",
    torch.complex64: "c64",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "bool",
}


def case_seed(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def random_tensor(shape, dtype, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g).bool()
    if not (dtype.is_floating_point or dtype.is_complex):  # integers: avg must truncate
        return torch.randint(-50, 51, tuple(shape), generator=g, dtype=dtype)
    if dtype.is_complex:
        return torch.randn(*shape, generator=g, dtype=dtype)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def local_slice(
    shape: Sequence[int],
    placements: Sequence[Placement],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
) -> tuple[slice, ...]:
    """Independent re-implementation of DTensor's (default shard order) layout:
    mesh dims applied left to right, each Shard splitting the current extent
    into ``mesh_size`` torch.chunk-style pieces (ceil-sized, trailing ones
    possibly empty)."""
    start = [0] * len(shape)
    size = list(shape)
    for i, p in enumerate(placements):
        if type(p) is Shard:
            d = p.dim
            n = mesh_shape[i]
            full = -(-size[d] // n) if size[d] else 0
            lo = min(coord[i] * full, size[d])
            hi = min((coord[i] + 1) * full, size[d])
            start[d] += lo
            size[d] = hi - lo
    return tuple(slice(s, s + z) for s, z in zip(start, size))


@dataclasses.dataclass
class Input:
    dt: DTensor
    mesh: DeviceMesh
    lm: LocalTensorMode
    coords: dict[int, tuple[int, ...]]
    src: tuple[Placement, ...]  # normalized
    snapshot: dict[int, torch.Tensor]


def build_input(
    mesh: DeviceMesh,
    lm: LocalTensorMode,
    src: Sequence[Placement],
    shape: Sequence[int],
    dtype: torch.dtype,
    seed: int,
    coords: dict[int, tuple[int, ...]] | None = None,
) -> Input:
    """A DTensor with placements ``src`` holding random data; must run in ``lm``.

    Shard dims hold true shards of a random global tensor. Where ``src`` has
    Partial dims, each rank adds a random perturbation that depends only on
    its coordinates along the non-Replicate mesh dims, so partial ranks hold
    *different* data while replicas along Replicate dims stay identical (a
    valid DTensor). ``coords`` (every rank's mesh coordinate) may be passed to
    save recomputing them."""
    ndim = len(shape)
    src_n = tuple(normalize(p, ndim) for p in src)
    with lm.disable():  # random factories are per-rank inside LocalTensorMode
        g = random_tensor(shape, dtype, seed)
    # Shard dims hold the true shards of g. The slices come from local_slice
    # (torch.chunk semantics, mesh dims left to right), which
    # test_harness.py checks against distribute_tensor; distribute_tensor
    # itself is ~100x slower under LocalTensorMode.
    base = [Replicate() if p.is_partial() else p for p in src_n]
    if coords is None:
        coords = rank_coordinates(mesh, lm)
    mesh_shape = tuple(mesh.shape)
    has_partial = any(p.is_partial() for p in src_n)

    if all(type(p) in (Replicate, Shard) for p in base):

        def base_local(r: int) -> torch.Tensor:
            return g[local_slice(shape, base, mesh_shape, coords[r])]
    else:  # e.g. _StridedShard, which local_slice does not model
        g_all = lm.rank_map(lambda r: g.clone())
        d0 = distribute_tensor(g_all, mesh, base, src_data_rank=None)
        base_local = d0._local_tensor._local_tensors.__getitem__

    def make_local(r: int) -> torch.Tensor:
        t = base_local(r).clone().contiguous()
        if has_partial:
            key = tuple(c if not isinstance(p, Replicate) else 0 for c, p in zip(coords[r], src_n))
            t = (t + random_tensor(tuple(t.shape), dtype, case_seed(seed, key))).to(dtype)
        return t

    lt = lm.rank_map(make_local)
    dt = DTensor.from_local(
        lt,
        mesh,
        list(src),
        run_check=False,
        shape=torch.Size(shape),
        stride=g.stride(),
    )
    snapshot = {r: t.clone() for r, t in dt._local_tensor._local_tensors.items()}
    return Input(dt, mesh, lm, coords, src_n, snapshot)


def local_tensors(dt: DTensor) -> dict[int, torch.Tensor]:
    """Per-rank locals of a DTensor produced under LocalTensorMode (waits on an
    AsyncCollectiveTensor first, for async_op=True)."""
    t = dt._local_tensor
    if isinstance(t, funcol.AsyncCollectiveTensor):
        t = t.wait()
    if not isinstance(t, LocalTensor):
        raise AssertionError(f"local tensor is a {type(t).__name__}, not a LocalTensor")
    return t._local_tensors
