"""``redist-opt bench --part quality``: redist_opt against torch 2.13's shipped redistribute
on the shipped corpus of real layouts (:mod:`~redist_opt.tools.corpus`): collectives,
bytes per rank and modelled time of torch and of both our groups policies (method:
docs/quality.md; the comparison rule and the report: :mod:`~redist_opt.tools.quality_report`).

torch's side is its shipped plan as :func:`~redist_opt.ir.torch_merge.torch_merged_plan`
models it at the case's real shape. The harness ``python -m benchmarks.quality`` (in a
checkout) runs torch itself instead; it builds its result with :func:`case_fields` and
:func:`quality_result` and uses :func:`quality_request`, :func:`print_progress` and
:func:`write_report`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

import torch

import redist_opt
from redist_opt.debug.units import format_bytes
from redist_opt.ir.cost import CostModel
from redist_opt.ir.placements import RedistributeError
from redist_opt.ir.torch_merge import torch_merged_plan
from redist_opt.tools.args import CliError
from redist_opt.tools.args import cost_model as flag_cost_model
from redist_opt.tools.corpus import CorpusCase, load_corpus
from redist_opt.tools.quality_report import (
    COMPARISON_RULE,
    POLICIES,
    SIDES,
    cell,
    find_worse,
    format_quality,
    totals,
)

__all__ = [
    "quality_bench",
    "case_fields",
    "quality_result",
    "op_str",
    "run_ours",
    "run_torch_model",
    "quality_request",
    "print_progress",
    "write_report",
    "cmd_quality",
]

RESULT_FORMAT = "redist_opt.tools.quality/3"
MODELLED = "torch_merged_plan: torch 2.13's merge pass replayed on its greedy plan, at the real shape"


# -- the plans of both sides: at the case's real shape ------------------------------------

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


# -- the bench ----------------------------------------------------------------------------


def quality_bench(cases: Sequence[CorpusCase], *, cost_model=None, progress=None) -> dict:
    """Run torch (modelled) and both of our policies on ``cases``; returns a JSON-able dict.

    ``cost_model``: a :class:`~redist_opt.ir.cost.CostModel` (default: NCCL-like).
    ``progress``: called with each finished row.
    """
    model = cost_model or CostModel.default()
    t_start = time.perf_counter()
    rows = []
    for case in cases:
        t0 = time.perf_counter()
        row = case_fields(case) | run_ours(case, model)
        row["torch"] = run_torch_model(case, model)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        if progress is not None:
            progress(row)
    return quality_result(rows, model, MODELLED, time.perf_counter() - t_start)


def case_fields(case: CorpusCase) -> dict:
    """What a row of the result starts with: the case."""
    return dict(
        id=case.id,
        category=case.category,
        mesh=case.mesh,
        flatten=list(case.flatten),
        src=case.src,
        dst=case.dst,
        shape=list(case.shape),
        dtype=case.dtype,
    )


def quality_result(rows: list[dict], model: CostModel, torch_side: str, seconds: float) -> dict:
    """The result of a run over ``rows``: how torch's side was found, the rule, the
    totals, the worse cases and the sides that did not run."""
    return dict(
        format=RESULT_FORMAT,
        torch_version=torch.__version__,
        torch_side=torch_side,
        cost_model=model.to_dict(),
        rule=COMPARISON_RULE,
        cases=rows,
        seconds=seconds,
        totals=totals(rows),
        worse=find_worse(rows),
        unsupported=[
            dict(id=r["id"], side=side, status=r[side]["status"], reason=r[side].get("reason", ""))
            for r in rows
            for side in SIDES
            if r[side]["status"] != "ok"
        ],
    )


# -- the command -----------------------------------------------------------------------


def quality_request(args) -> tuple[list[CorpusCase], CostModel]:
    """The corpus, narrowed by ``--corpus-case`` and ``--category``, and the cost model
    (``--profile``, ``--devices-per-host``); bad input raises :class:`CliError`."""
    try:
        cases = load_corpus(args.corpus)
    except (OSError, ValueError) as e:
        raise CliError(str(e)) from None
    if args.corpus_case:
        unknown = sorted(set(args.corpus_case) - {c.id for c in cases})
        if unknown:
            raise CliError(f"--corpus-case: unknown case id(s) {unknown}")
        cases = [c for c in cases if c.id in args.corpus_case]
    if args.category:
        cases = [c for c in cases if c.category in args.category]
    return cases, flag_cost_model("--profile", args.profile or "nccl", args.devices_per_host)[0]


def print_progress(row: dict) -> None:
    cells = "  ".join(f"{s}={cell(row[s])}" for s in SIDES)
    print(f"[{row['seconds']:5.1f}s] {row['id']}: {cells}", file=sys.stderr, flush=True)


def write_report(args, result: dict, text: str) -> None:
    """The markdown ``text`` to ``--report`` (default stdout), and ``result`` to ``--json``."""
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
        print(f"redist-opt bench: wrote {args.report}", file=sys.stderr)
    else:
        print(text, end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


def cmd_quality(args) -> int:
    """``redist-opt bench --part quality``: exit 0, 1 when ours is worse on some case, 2 on
    bad input (a :class:`CliError`, which the command line reports)."""
    cases, model = quality_request(args)
    result = quality_bench(cases, cost_model=model, progress=print_progress)
    write_report(args, result, format_quality(result))
    return 1 if result["worse"] else 0
