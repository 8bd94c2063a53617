"""The quality bench, our side: both groups policies' plans of a corpus case at its real shape."""

from __future__ import annotations

import time

import redist_opt
from redist_opt.debug.units import format_bytes
from redist_opt.ir.placements import RedistributeError
from redist_opt.tools.corpus import CorpusCase

__all__ = ["POLICIES", "op_str", "run_ours"]

POLICIES = ("existing", "create")
_SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A"}


def op_str(kind, group, nbytes, spec) -> str:
    """``AR(dp+cp) 1.5 MiB``: one collective of either side, as the report lists it."""
    return f"{_SHORT[kind]}({group.name(spec)}) {format_bytes(nbytes, digits='.4g')}"


def run_ours(case: CorpusCase, model) -> dict:
    """policy -> row (collectives, bytes per rank, modelled time, ops, planning ms) or why not run."""
    spec = case.spec()
    src, dst = case.placements()
    try:
        naive = redist_opt.plan(spec, src, dst, shape=case.shape, dtype=case.torch_dtype())
    except RedistributeError as e:
        reason = str(e)
        return {p: dict(status="unsupported", reason=reason) for p in POLICIES}
    if naive.fallback:
        return {p: dict(status="fallback", reason=naive.fallback_reason) for p in POLICIES}
    out = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        p = redist_opt.optimize(naive, groups=policy, cost=model)
        plan_s = time.perf_counter() - t0
        cols = p.collectives()
        out[policy] = dict(
            status="ok",
            collectives=len(cols),
            bytes=p.bytes_per_rank,
            time=model.plan_time(p),
            ops=[op_str(c.kind, c.group, c.bytes_in, spec) for c in cols],
            plan_ms=plan_s * 1e3,
        )
    return out
