"""Quality benchmark: redist_opt against torch 2.13's shipped redistribute on a corpus.

For every case of ``fixtures/corpus.json`` (real parallelism layouts: FSDP/HSDP,
TP/SP, CP, 4-D torchtitan meshes, EP, grad-norm clipping, loss reductions,
jagged meshes, uneven shapes) the benchmark reports collectives, bytes per rank
and modelled time of

* **torch**: ``DTensor.redistribute`` as shipped (its transform-merge pass ON),
  run under ``LocalTensorMode`` on the ``fake`` backend over a DeviceMesh that has
  the case's flattened groups (``DeviceMesh._flatten``), every collective recorded
  by a ``CommDebugMode`` subclass (kind, process group -> mesh dims, bytes each
  rank feeds in);
* **existing**: ``redist_opt.optimize(plan, groups="existing")``;
* **create**: ``redist_opt.optimize(plan, groups="create")``.

Comparison rule ("worse"): a policy is worse than torch on a case when it issues
more collectives, OR more bytes per rank, OR more modelled time (the same
:class:`~redist_opt.ir.cost.CostModel` prices both sides: ``collective_time`` summed
over the collectives; the one-off cost of creating a group is left out).

Scaling. LocalTensorMode keeps every rank's tensors in this process, so torch
runs on a *simulation shape*: each tensor dim that no mesh dim shards (in src or
dst) becomes 1, each evenly sharded dim becomes the product M of the mesh sizes
sharding it, and unevenly sharded dims keep their real size. Every local chunk
of every collective then scales by the same integer factor (chunk sizes are L/n
with n | M on scaled dims and identical on kept dims), and torch's decisions
(which depend only on divisibility) are unchanged, so torch's bytes at the real
shape are the recorded bytes times that factor. Our numbers come from plans of
the real shape (planning is rank-free); with ``verify=True`` our plans of the
simulation shape are also executed and must issue exactly the collectives and
bytes they claim, which checks that plan bytes and recorded bytes count alike.

Modules, one job each: :mod:`~redist_opt.tools.corpus` (the corpus and its
simulation shapes), :mod:`~redist_opt.tools.quality_torch` (torch's side, run and
recorded), :mod:`~redist_opt.tools.quality_ours` (our side),
:mod:`~redist_opt.tools.quality_compare` (the rule and totals),
:mod:`~redist_opt.tools.quality_report` (the markdown report); this module runs
them over the corpus and is the command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from redist_opt.ir.cost import CostModel
from redist_opt.tools.args import CliError, load_profile, with_devices_per_host
from redist_opt.tools.corpus import CATEGORIES, DEFAULT_CORPUS, CorpusCase, load_corpus
from redist_opt.tools.quality_compare import COMPARISON_RULE, find_worse, totals
from redist_opt.tools.quality_ours import POLICIES, run_ours
from redist_opt.tools.quality_report import cell, format_quality
from redist_opt.tools.quality_torch import ensure_fake_pg, run_torch
from redist_opt.tools.spawn import quiet_torch_logs

__all__ = [
    "CATEGORIES",
    "CorpusCase",
    "DEFAULT_CORPUS",
    "POLICIES",
    "load_corpus",
    "quality_bench",
    "format_quality",
    "find_worse",
    "add_quality_arguments",
    "cmd_quality",
]

RESULT_FORMAT = "redist_opt.tools.quality/1"


def quality_bench(
    cases: Sequence[CorpusCase],
    *,
    cost_model=None,
    verify: bool = True,
    progress=None,
) -> dict:
    """Run torch and both of our policies on ``cases``; returns a JSON-able dict.

    ``cost_model``: a :class:`~redist_opt.ir.cost.CostModel` (default: NCCL-like).
    ``verify``: also execute our plans of the simulation shape and check they issue
    the collectives and bytes they claim. ``progress``: called with each finished row.
    """
    model = cost_model or CostModel.default()
    ensure_fake_pg()
    t_start = time.perf_counter()
    with quiet_torch_logs():
        rows = [_case_row(case, model, verify, progress) for case in cases]
    result = dict(
        format=RESULT_FORMAT,
        torch_version=torch.__version__,
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


def _case_row(case: CorpusCase, model: CostModel, verify: bool, progress) -> dict:
    """One case: our plans at the real shape, torch's run at the simulation shape."""
    world = dist.get_world_size()
    t0 = time.perf_counter()
    sim, scale = case.sim_shape()
    row = dict(
        id=case.id, category=case.category, mesh=case.mesh, flatten=list(case.flatten),
        src=case.src, dst=case.dst, shape=list(case.shape), dtype=case.dtype,
        sim_shape=list(sim), scale=scale,
    )
    row.update(run_ours(case, model))
    if case.num_ranks > world:
        reason = f"mesh has {case.num_ranks} ranks > process group world {world}"
        row["torch"] = dict(status="skipped", reason=reason)
        checks = {}
    else:
        row["torch"], checks = run_torch(case, model, verify)
    if case.num_ranks == world:
        row["note"] = "the mesh is the whole (fake) world: the world group also exists for ours"
    if checks:
        row["verify"] = checks
    row["seconds"] = time.perf_counter() - t0
    if progress is not None:
        progress(row)
    return row


# -- the command -----------------------------------------------------------------------


def add_quality_arguments(parser: argparse.ArgumentParser, *, common: bool = True) -> None:
    """Arguments of ``redist-opt bench --part quality``.

    The quality-only options have names of their own (``--corpus-case``, since the
    bench's ``--case`` takes SRC->DST). ``common``: also add ``--profile`` and
    ``--json``; ``redist-opt bench`` has its own and passes ``common=False``.
    """
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, metavar="FILE",
                        help="quality: the corpus JSON (default fixtures/corpus.json)")
    parser.add_argument("--corpus-case", action="append", metavar="ID",
                        help="quality: only this corpus case (repeatable)")
    parser.add_argument("--category", action="append", metavar="NAME", choices=CATEGORIES,
                        help="quality: only this corpus category (repeatable)")
    if common:
        parser.add_argument("--profile", metavar="PROFILE",
                            help="cost profile: nccl (default), gloo, or a JSON file from `redist-opt calibrate`")
    parser.add_argument("--devices-per-host", type=int, metavar="N",
                        help="quality: ranks per host for the cost model (consecutive ranks share a host)")
    parser.add_argument("--no-verify", action="store_true",
                        help="quality: skip executing our simulation-shape plans (faster)")
    if common:
        parser.add_argument("--json", metavar="FILE", help="also write the results to this JSON file")
    parser.add_argument("--report", metavar="FILE", help="quality: write the markdown report here (default stdout)")


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


def cmd_quality(args) -> int:
    """``redist-opt bench --part quality``: exit 0, 1 when ours is worse on some case, 2 on bad input."""
    try:
        cases = _selected_cases(args)
        model = with_devices_per_host(load_profile("--profile", args.profile or "nccl"), args.devices_per_host)
    except (OSError, ValueError, CliError) as e:
        print(f"redist-opt bench: error: {e}", file=sys.stderr)
        return 2
    result = quality_bench(cases, cost_model=model, verify=not args.no_verify, progress=_print_progress)
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


def main(argv=None) -> int:
    """``python -m redist_opt.tools.quality`` (the same as ``redist-opt bench --part quality``)."""
    parser = argparse.ArgumentParser(prog="redist-opt bench --part quality", description=__doc__.splitlines()[0])
    add_quality_arguments(parser)
    return cmd_quality(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
