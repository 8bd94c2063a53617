"""``redist-opt bench --part quality``: redist_opt against torch 2.13's shipped
redistribute on a corpus of real layouts.

For every case of the shipped corpus (:mod:`~redist_opt.tools.corpus`: FSDP/HSDP,
TP/SP, CP, 4-D torchtitan meshes, EP, grad-norm clipping, loss reductions, jagged
meshes, uneven shapes) the bench reports collectives, bytes per rank and modelled
time of

* **torch**: ``DTensor.redistribute`` as shipped (its transform-merge pass on), by
  default as :func:`~redist_opt.ir.torch_merge.torch_merged_plan` models it on the
  case's real shape. The harness ``python -m benchmarks.quality`` (in a checkout)
  runs torch itself instead, under ``LocalTensorMode``, and records its collectives;
  on the shipped corpus the two agree on every case;
* **existing**: ``redist_opt.optimize(plan, groups="existing")``;
* **create**: ``redist_opt.optimize(plan, groups="create")``.

Comparison rule ("worse"): a policy is worse than torch on a case when it issues
more collectives, OR more bytes per rank, OR more modelled time (the same
:class:`~redist_opt.ir.cost.CostModel` prices both sides: ``collective_time`` summed
over the collectives; the one-off cost of creating a group is left out).

Modules, one job each: :mod:`~redist_opt.tools.corpus` (the corpus),
:mod:`~redist_opt.tools.quality_plans` (the plans of both sides),
:mod:`~redist_opt.tools.quality_compare` (the rule and totals),
:mod:`~redist_opt.tools.quality_report` (the markdown report); this module runs
them over the corpus and is the command.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence

import torch

from redist_opt.ir.cost import CostModel
from redist_opt.tools.args import CliError, load_profile, with_devices_per_host
from redist_opt.tools.corpus import CATEGORIES, DEFAULT_CORPUS, CorpusCase, load_corpus
from redist_opt.tools.quality_compare import COMPARISON_RULE, find_worse, totals
from redist_opt.tools.quality_plans import POLICIES, run_ours, run_torch_model
from redist_opt.tools.quality_report import cell, format_quality

__all__ = [
    "CATEGORIES",
    "CorpusCase",
    "DEFAULT_CORPUS",
    "POLICIES",
    "TorchSide",
    "load_corpus",
    "quality_bench",
    "format_quality",
    "find_worse",
    "cmd_quality",
]

RESULT_FORMAT = "redist_opt.tools.quality/2"

# torch's side of a case: (case, model) -> (torch's row, fields added to the case's row).
TorchSide = Callable[[CorpusCase, CostModel], tuple[dict, dict]]
MODELLED = "torch_merged_plan: torch 2.13's merge pass replayed on its greedy plan, at the real shape"


def quality_bench(
    cases: Sequence[CorpusCase],
    *,
    cost_model=None,
    torch_side: TorchSide = run_torch_model,
    torch_side_name: str = MODELLED,
    progress=None,
) -> dict:
    """Run torch and both of our policies on ``cases``; returns a JSON-able dict.

    ``cost_model``: a :class:`~redist_opt.ir.cost.CostModel` (default: NCCL-like).
    ``torch_side``: how torch's row of a case is found (default: modelled; the
    harness in benchmarks/ runs torch). ``progress``: called with each finished row.
    """
    model = cost_model or CostModel.default()
    t_start = time.perf_counter()
    rows = [_case_row(case, model, torch_side, progress) for case in cases]
    result = dict(
        format=RESULT_FORMAT,
        torch_version=torch.__version__,
        torch_side=torch_side_name,
        cost_model=model.to_dict(),
        rule=COMPARISON_RULE,
        cases=rows,
        seconds=time.perf_counter() - t_start,
    )
    result["totals"] = totals(rows)
    result["worse"] = find_worse(result)
    result["unsupported"] = [
        dict(id=r["id"], side=side, status=r[side]["status"], reason=r[side].get("reason", ""))
        for r in rows for side in ("torch",) + POLICIES if r[side]["status"] != "ok"
    ]
    result["verify_failures"] = [
        dict(id=r["id"], policy=p, **c) for r in rows for p, c in r.get("verify", {}).items() if not c["ok"]
    ]
    return result


def _case_row(case: CorpusCase, model: CostModel, torch_side: TorchSide, progress) -> dict:
    t0 = time.perf_counter()
    row = dict(
        id=case.id, category=case.category, mesh=case.mesh, flatten=list(case.flatten),
        src=case.src, dst=case.dst, shape=list(case.shape), dtype=case.dtype,
    )
    row.update(run_ours(case, model))
    row["torch"], extra = torch_side(case, model)
    row.update(extra)
    row["seconds"] = time.perf_counter() - t0
    if progress is not None:
        progress(row)
    return row


# -- the command -----------------------------------------------------------------------


def _selected_cases(args) -> list[CorpusCase]:
    """The corpus, narrowed by ``--corpus-case`` and ``--category``."""
    cases = load_corpus(args.corpus)
    if args.corpus_case:
        unknown = sorted(set(args.corpus_case) - {c.id for c in cases})
        if unknown:
            raise CliError(f"--corpus-case: unknown case id(s) {unknown}")
        cases = [c for c in cases if c.id in args.corpus_case]
    if args.category:
        cases = [c for c in cases if c.category in args.category]
    return cases


def _print_progress(row: dict) -> None:
    cells = "  ".join(f"{s}={cell(row[s])}" for s in ("torch",) + POLICIES)
    print(f"[{row['seconds']:5.1f}s] {row['id']}: {cells}", file=sys.stderr, flush=True)


def cmd_quality(args, **bench_options) -> int:
    """``redist-opt bench --part quality``: exit 0, 1 when ours is worse on some case (or a
    verification failed), 2 on bad input. ``bench_options`` go to :func:`quality_bench`."""
    try:
        cases = _selected_cases(args)
        model = with_devices_per_host(load_profile("--profile", args.profile or "nccl"), args.devices_per_host)
    except (OSError, ValueError, CliError) as e:
        print(f"redist-opt bench: error: {e}", file=sys.stderr)
        return 2
    result = quality_bench(cases, cost_model=model, progress=_print_progress, **bench_options)
    text = format_quality(result)
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
    return 1 if result["worse"] or result["verify_failures"] else 0

