"""The quality bench's plans of a corpus case at its real shape: both groups policies'
optimized plans, and torch 2.13's shipped plan as :func:`~redist_opt.ir.torch_merge.torch_merged_plan`
models it (its merge pass replayed on the naive plan, which is torch's greedy plan)."""

from __future__ import annotations

import time

import redist_opt
from redist_opt.debug.units import format_bytes
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.torch_merge import torch_merged_plan
from redist_opt.tools.corpus import CorpusCase

__all__ = ["POLICIES", "op_str", "run_ours", "run_torch_model"]

POLICIES = ("existing", "create")
_SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A"}


def op_str(kind, group, nbytes, spec) -> str:
    """``AR(dp+cp) 1.5 MiB``: one collective of either side, as the report lists it."""
    return f"{_SHORT[kind]}({group.name(spec)}) {format_bytes(nbytes, digits='.4g')}"


def _naive(case: CorpusCase):
    """(naive plan, None) or (None, (status, reason)) when redist_opt does not plan the case."""
    try:
        naive = redist_opt.plan(case.spec(), *case.placements(), shape=case.shape, dtype=case.torch_dtype())
    except RedistributeError as e:
        return None, ("unsupported", str(e))
    if naive.fallback:
        return None, ("fallback", naive.fallback_reason)
    return naive, None


def _row(p, model, spec, **extra) -> dict:
    cols = p.collectives()
    return dict(
        status="ok",
        collectives=len(cols),
        bytes=p.bytes_per_rank,
        time=model.plan_time(p),
        ops=[op_str(c.kind, c.group, c.bytes_in, spec) for c in cols],
        **extra,
    )


def run_ours(case: CorpusCase, model) -> dict:
    """policy -> row (collectives, bytes per rank, modelled time, ops, planning ms) or why not run."""
    naive, why = _naive(case)
    if naive is None:
        return {p: dict(status=why[0], reason=why[1]) for p in POLICIES}
    out = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        p = redist_opt.optimize(naive, groups=policy, cost=model)
        out[policy] = _row(p, model, naive.mesh, plan_ms=(time.perf_counter() - t0) * 1e3)
    return out


def run_torch_model(case: CorpusCase, model) -> dict:
    """torch's row: its shipped plan as modelled, or why not run."""
    naive, why = _naive(case)
    if naive is None:
        return dict(status=why[0], reason=why[1])
    return _row(torch_merged_plan(naive), model, naive.mesh)
