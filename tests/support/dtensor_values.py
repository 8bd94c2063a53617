"""Small-integer DTensors and bitwise comparison of their per-rank locals
(under LocalTensorMode), for the API and routing tests."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor


def locals_of(dt) -> dict:
    """{rank: local tensor} of a DTensor built under LocalTensorMode."""
    return {r: t for r, t in dt._local_tensor._local_tensors.items()}


def partial_input(lm, mesh, placements, shape, dtype=torch.float64):
    """A DTensor with ``placements`` over small integers (sums are exact in any
    order, so optimized plans compare bitwise); a Partial's ranks hold different
    values. Inside ``lm``."""
    g = torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape) % 7
    base = [Replicate() if p.is_partial() else p for p in placements]
    dt = distribute_tensor(g, mesh, base, src_data_rank=None)
    if any(p.is_partial() for p in placements):
        lt = dt._local_tensor + lm.rank_map(lambda r: torch.full((), float(r % 3), dtype=dtype))
        dt = DTensor.from_local(lt, mesh, placements, run_check=False, shape=g.shape, stride=g.stride())
    return dt


def assert_same_locals(a, b) -> None:
    """Every rank's local tensor of ``a`` and ``b``: same shape, dtype and values (bitwise)."""
    la, lb = locals_of(a), locals_of(b)
    assert la.keys() == lb.keys()
    for r in la:
        assert la[r].shape == lb[r].shape and la[r].dtype == lb[r].dtype, r
        assert torch.equal(la[r], lb[r]), r
