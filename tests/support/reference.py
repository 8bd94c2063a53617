"""The independent reference: the global value an input DTensor represents,
computed in plain high-precision torch from its locals, and ``oracle_sanity``,
which checks a redistributed DTensor against it, so that a harness bug shows
up as an ORACLE SANITY failure rather than a silent pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from support.inputs import Input, local_slice, local_tensors, normalize

_REDUCE = {
    "sum": lambda s: s.sum(0),
    "avg": lambda s: s.mean(0),
    "max": lambda s: s.amax(0),
    "min": lambda s: s.amin(0),
}


def global_reference(inp: Input, shape: Sequence[int]) -> torch.Tensor | None:
    """The global value the input DTensor represents, computed in high precision."""
    mesh_shape = tuple(inp.mesh.shape)
    src = inp.src
    partial_dims = [i for i, p in enumerate(src) if p.is_partial()]
    ops = {src[i].reduce_op for i in partial_dims}
    if len(ops) > 1 and ops != {"sum", "avg"}:
        return None
    locals_ = inp.dt._local_tensor._local_tensors
    sample = next(iter(locals_.values()))
    hi = torch.complex128 if sample.dtype.is_complex else torch.float64
    contribs: dict[tuple[int, ...], torch.Tensor] = {}
    for r, c in inp.coords.items():
        if any(c[i] != 0 for i, p in enumerate(src) if isinstance(p, Replicate)):
            continue
        pkey = tuple(c[i] for i in partial_dims)
        buf = contribs.setdefault(pkey, torch.full(tuple(shape), float("nan"), dtype=hi))
        buf[local_slice(shape, src, mesh_shape, c)] = locals_[r].to(hi)
    stacked = torch.stack(list(contribs.values()))
    if not partial_dims:
        return stacked[0]
    if len(ops) > 1:  # sum and avg mixed: a sum, divided by the sizes of the avg dims
        scale = 1
        for i in partial_dims:
            if src[i].reduce_op == "avg":
                scale *= mesh_shape[i]
        return stacked.sum(0) / scale
    out = _REDUCE[ops.pop()](stacked)
    # bool: a sum is a logical or (bool + bool is True, as c10d's bool sum)
    return (out != 0).to(hi) if sample.dtype == torch.bool else out


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return {
        torch.float64: (1e-12, 1e-12),
        torch.float32: (1e-5, 1e-5),
        torch.complex64: (1e-5, 1e-5),
        torch.bfloat16: (0.05, 0.05),
        torch.float16: (5e-3, 5e-3),
        torch.int64: (0, 0),
        torch.int32: (0, 0),
        torch.bool: (0, 0),
    }[dtype]


def oracle_sanity(inp: Input, out: DTensor, shape, dst: Sequence[Placement]) -> None:
    """The oracle's result must match the independently computed reference."""
    dst_n = tuple(normalize(p, len(shape)) for p in dst)
    if any(p.is_partial() for p in dst_n):
        return
    if any(type(p) not in (Replicate, Shard, Partial) for p in (*inp.src, *dst_n)):
        return  # e.g. _StridedShard: local_slice models default-order Shard only
    out_dtype = out._local_tensor.dtype
    in_dtype = inp.dt._local_tensor.dtype
    if not (in_dtype.is_floating_point or in_dtype.is_complex) and any(
        p.is_partial() and p.reduce_op == "avg" for p in inp.src
    ):
        # integer avg truncates at its all_reduces: no exact global reference (torch 2.11 /
        # 2.12 under LocalTensorMode return float32 after a reduce_scatter avg, not cast back)
        return
    ref = global_reference(inp, shape)
    if ref is None:
        return
    exact = not any(p.is_partial() for p in inp.src)
    mesh_shape = tuple(inp.mesh.shape)
    for r, c in inp.coords.items():
        got = local_tensors(out)[r]
        want = ref[local_slice(shape, dst_n, mesh_shape, c)]
        assert tuple(got.shape) == tuple(want.shape), (
            f"ORACLE SANITY: rank {r} local shape {tuple(got.shape)} != reference {tuple(want.shape)}"
        )
        if exact and out_dtype == inp.dt._local_tensor.dtype:
            ok = torch.equal(got, want.to(got.dtype))
        else:
            rtol, atol = tolerance(out_dtype)
            ok = torch.allclose(got.to(want.dtype), want, rtol=rtol, atol=atol)
        assert ok, f"ORACLE SANITY: rank {r} local value differs from reference"
