"""The ``redist-opt`` command: ``demo``, ``explain``, ``calibrate`` and ``bench``.

Errors are one line naming the offending argument, exit code 2, no traceback.
Values shared with the quality bench are parsed in :mod:`redist_opt.tools.args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

import redist_opt
from redist_opt.debug import dump, explain, visualize
from redist_opt.ir.cost import BUILTIN_PROFILES, KINDS
from redist_opt.ir.placements import RedistributeError, normalize_placements
from redist_opt.tools import autoparallel_check, bench, decisions, quality
from redist_opt.tools.advise import add_advise_command
from redist_opt.tools.args import CliError, cost_model, load_profile, mesh_spec, parse_dtype, parse_mesh
from redist_opt.tools.args import parse_shape, parse_size_list
from redist_opt.tools.calibrate import DEFAULT_CALIBRATE_SIZES, calibrate, format_calibration
from redist_opt.tools.calibrate_launch import calibrate_launched, default_mesh, launched
from redist_opt.tools.demo import run_demo
from redist_opt.tools.spawn import SpawnError
from redist_opt.tools.timing import load_warning, loadavg, torch_version
from redist_opt.tools.units import format_size

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """``one_line_errors``: a usage error is one line naming the argument, exit 2
    (``explain``); otherwise argparse's usage and error."""

    def __init__(self, *args, one_line_errors: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.one_line_errors = one_line_errors

    def error(self, message: str):
        if not self.one_line_errors:
            super().error(message)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


# -- explain -----------------------------------------------------------------------------


def _explain_request(args):
    """(mesh spec, naive plan) of ``explain``'s arguments; every bad one raises CliError naming it."""
    spec = mesh_spec(args.mesh, args.flatten or [])
    if args.backend:
        spec = dataclasses.replace(spec, backend=args.backend)
    shape = parse_shape(args.shape)
    if any(s < 0 for s in shape):
        raise CliError(f"--shape: {args.shape!r} has a negative size")
    dtype = parse_dtype(args.dtype)
    for flag, text, role in (("--src", args.src, "source"), ("--dst", args.dst, "target")):
        try:
            normalize_placements(text, mesh_shape=spec.sizes, tensor_ndim=len(shape), role=role)
        except RedistributeError as e:
            raise CliError(f"{flag}: {e}") from None
    try:
        naive = redist_opt.plan(spec, args.src, args.dst, shape=shape, dtype=dtype)
    except RedistributeError as e:
        raise CliError(f"--src/--dst: {e}") from None
    return spec, naive


def _explain_optimize(args, naive, model):
    """The optimized plan; with ``--dump-dir``, the pipeline writes its per-pass dumps there."""
    if args.dump_dir is not None:
        try:
            os.makedirs(args.dump_dir, exist_ok=True)
        except OSError as e:
            raise CliError(f"--dump-dir: cannot create {args.dump_dir!r}: {e.strerror or e}") from None
    try:
        dump.dump_pass_filter_from_env()
        # Without --cost-model / --devices-per-host the pipeline resolves the same
        # model itself, and records where it came from in the plan (and the dumps).
        given = None if args.cost_model is None and args.devices_per_host is None else model
        return redist_opt.optimize(
            naive, groups=args.groups, cost=given, prefer=args.prefer, dump_dir=args.dump_dir,
            max_collectives=args.max_collectives,
        )
    except ValueError as e:
        if isinstance(e, RedistributeError) or dump.DUMP_PASSES_ENV in str(e):
            raise CliError(str(e)) from None
        raise


def _explain_write(flag: str, path: str, render) -> None:
    try:
        text = render()
    except ValueError as e:
        raise CliError(f"{flag}: {e}") from None
    try:
        visualize.write_text(path, text)
    except OSError as e:
        raise CliError(f"{flag}: cannot write {path!r}: {e.strerror or e}") from None
    print(f"redist-opt explain: wrote {path}", file=sys.stderr)


def cmd_explain(args) -> int:
    """``redist-opt explain``: the naive and optimized plans, their cost, and why.

    Every bad argument becomes a :class:`CliError` naming it (one line, exit 2).
    """
    spec, naive = _explain_request(args)
    model, source = cost_model("--cost-model", args.cost_model, args.devices_per_host, spec)
    if args.rank_lists < 0:
        raise CliError(f"--rank-lists: {args.rank_lists} must be >= 0")
    optimized = _explain_optimize(args, naive, model)

    # Files first: an error there must not leave half the output on stdout.
    plans = [("naive", naive), ("optimized", optimized)]
    if args.svg:
        _explain_write("--svg", args.svg, lambda: visualize.plan_graph_svg(plans))
    if args.mesh_svg:
        _explain_write("--mesh-svg", args.mesh_svg, lambda: visualize.mesh_svg(spec, plans))

    kwargs = dict(cost_model=model, groups=args.groups, rank_limit=args.rank_lists, cost_source=source)
    if args.format == "json":
        print(json.dumps(explain.explain_data(naive, optimized, **kwargs), indent=2))
    elif args.format == "dot":
        print(visualize.plans_to_dot(plans, name="explain"), end="")
    else:
        print(explain.format_explain(naive, optimized, show_ir=not args.no_ir, **kwargs))
    if args.dump_dir is not None:
        n = len([f for f in os.listdir(args.dump_dir) if f.endswith(".txt")])
        print(f"redist-opt explain: {n} pass dump(s) (.txt + .dot) in {args.dump_dir}", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    return run_demo(timeout=args.timeout)


# -- calibrate and bench ----------------------------------------------------------------


def _check_samples(args) -> None:
    if args.iters < 1 or args.warmup < 0:
        raise CliError("--iters must be >= 1 and --warmup >= 0")


def cmd_calibrate(args) -> int:
    if args.check:  # decision accuracy of a profile on live gloo ranks (tools/decisions.py)
        return decisions.cmd_decisions(args)
    launch = launched()
    mesh_sizes, names = parse_mesh(args.mesh) if args.mesh else (default_mesh(launch.world) if launch else (2, 2), None)
    sizes = parse_size_list(args.sizes)
    _check_samples(args)
    if launch is not None:
        if args.nprocs is not None and args.nprocs != launch.world:
            raise CliError(f"--nprocs {args.nprocs}: the launcher started {launch.world} ranks (WORLD_SIZE)")
        try:
            result = calibrate_launched(launch, mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup,
                                        timeout=args.timeout)  # fmt: skip
        except ValueError as e:
            raise CliError(str(e)) from None
        if result is None:  # not rank 0: rank 0 reports and writes
            return 0
        return _report_calibration(args, *result)
    nprocs = args.nprocs if args.nprocs is not None else math.prod(mesh_sizes)
    print(
        f"calibrating: {nprocs} gloo ranks, mesh {'x'.join(map(str, mesh_sizes))}, "
        f"{len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}, "
        f"{len(KINDS)} collectives, {args.iters} samples each ...",
        flush=True,
    )
    warning = load_warning()
    if warning:
        print(warning, flush=True)
    try:
        model, record = calibrate(
            nprocs, mesh_sizes, names, sizes, iters=args.iters, warmup=args.warmup, timeout=args.timeout
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    except SpawnError as e:
        print(f"redist-opt calibrate: {e}", file=sys.stderr)
        return 1
    return _report_calibration(args, model, record)


def _report_calibration(args, model, record) -> int:
    print(format_calibration(model, record))
    model.save(args.out, calibration=record)
    print(
        f"\nwrote {args.out} ({record['wall_s']:.1f} s: {record['measuring_s']:.1f} s measuring; "
        f"{record['mode']} mode, {record['nprocs']} {record['backend']} ranks on {record['device']})"
    )
    return 0


def _parse_case(text: str) -> tuple[str, str]:
    """``--case SRC->DST`` on the wall benchmark's 2-D mesh."""
    if "->" not in text:
        raise CliError(f"--case {text!r}: expected SRC->DST, e.g. 'P,P->R,S(0)'")
    src, dst = (s.strip() for s in text.split("->", 1))
    for s in (src, dst):
        ps = redist_opt.parse_placements(s)
        if len(ps) != len(bench.WALL_MESH[0]):
            raise CliError(f"--case {text!r}: {s!r} has {len(ps)} placements for a 2-D mesh")
    return src, dst


def _run_wall(args, sizes, cases, cost, result: dict) -> int | None:
    """The wall-clock part into ``result["wall"]``: 0, 1 when a result differs from
    torch's, or None when the ranks failed (nothing to report)."""
    print(
        f"running {len(cases)} cases x {len(sizes)} sizes on {math.prod(bench.WALL_MESH[0])} gloo ranks ...",
        flush=True,
    )
    try:
        res = bench.wall_bench(sizes, cases, iters=args.iters, warmup=args.warmup, cost=cost, timeout=args.timeout)
    except SpawnError as e:
        print(f"redist-opt bench: {e}", file=sys.stderr)
        return None
    result["wall"] = res
    print(bench.format_wall(res))
    if not all(r["equal"] for r in res["rows"]):
        print("MISMATCH: some results differ from torch's (beyond rtol=atol=1e-5)", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args) -> int:
    if args.part == "autoparallel":  # autoparallel's example Block (tools/autoparallel_check.py)
        return autoparallel_check.cmd_autoparallel(args)
    if args.part == "quality":  # the corpus against torch's shipped redistribute (tools/quality.py)
        return quality.cmd_quality(args)
    if args.part == "decisions":  # the cost model's choices against measured times (tools/decisions.py)
        return decisions.cmd_decisions(args)
    sizes = parse_size_list(args.sizes)
    cases = [_parse_case(c) for c in args.case] if args.case else list(bench.WALL_CASES)
    _check_samples(args)
    cost = load_profile("--profile", args.profile) if args.profile else None
    result: dict = {"torch": torch_version(), "cost_profile_path": args.profile, "load_average": loadavg()}
    warning = load_warning()
    if warning:
        print(warning + "\n", flush=True)
    exit_code = 0
    if args.part in ("all", "planning"):
        res = bench.planning_bench(runs=args.plan_runs, cached_runs=args.plan_runs * 25, cost=cost)
        result["planning"] = res
        print(bench.format_planning(res))
        print(flush=True)
    if args.part in ("all", "wall"):
        exit_code = _run_wall(args, sizes, cases, cost, result)
        if exit_code is None:
            return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"\nwrote {args.json}")
    return exit_code


# -- the parser --------------------------------------------------------------------------


def _add_explain_arguments(ex) -> None:
    ex.add_argument("--mesh", required=True, help="dims as name=size,... e.g. dp=2,cp=2,tp=2")
    ex.add_argument(
        "--flatten", action="append", metavar="DIMS", help="a flattened group that exists, e.g. dp+cp (repeatable)"
    )
    ex.add_argument("--src", required=True, help='source placements, e.g. "P,P,S(0)"')
    ex.add_argument("--dst", required=True, help='target placements, e.g. "R,S(0),R"')
    ex.add_argument("--shape", required=True, help="global tensor shape, e.g. 8,4")
    ex.add_argument("--dtype", default="float32", help="torch dtype name (default float32)")
    ex.add_argument("--groups", default="existing", choices=["existing", "create"],
                    help="communicators merged collectives may use (default existing)")
    ex.add_argument("--devices-per-host", type=int, metavar="N",
                    help="ranks per host for the cost model (consecutive ranks share a host)")
    ex.add_argument("--backend", metavar="NAME",
                    help="process-group backend the plan is for (gloo, nccl, fake): picks the cost "
                         "profile when --cost-model is not given")
    ex.add_argument("--cost-model", default=None, metavar="PROFILE",
                    help="nccl, gloo, or a JSON profile written by `redist-opt calibrate` (default: "
                         "$REDIST_OPT_COST_PROFILE, else the --backend's profile, else nccl)")
    ex.add_argument("--prefer", default="time", choices=["time", "consistency"],
                    help="time (default: merge where the cost model says it pays) or consistency "
                    "(merge every reduction a group allows: bitwise-equal replicas)")
    ex.add_argument("--max-collectives", default="torch", choices=["torch", "any"],
                    help="torch (default: never more collectives than torch 2.13's shipped plan) or "
                    "any (the cost model may trade launches for bytes)")
    ex.add_argument("--format", default="text", choices=["text", "json", "dot"],
                    help="text (default), json (schema redist_opt.explain/1) or dot (plan graph)")
    ex.add_argument("--rank-lists", type=int, default=2, metavar="K",
                    help="rank lists shown per collective (first K groups; default 2)")
    ex.add_argument("--no-ir", action="store_true", help="text format: leave out the IR listings")
    ex.add_argument("--dump-dir", metavar="DIR",
                    help="write the IR before the pipeline and after each pass that changed it")
    ex.add_argument("--svg", metavar="FILE", help="write the plan graph (naive | optimized) as SVG")
    ex.add_argument("--mesh-svg", metavar="FILE", help="write the mesh diagram (ranks per collective) as SVG")


def _add_calibrate_arguments(p) -> None:
    p.add_argument("--nprocs", type=int, default=None, help="gloo processes (default: the mesh's size)")
    p.add_argument("--mesh", default=None,
                   help="mesh sizes, e.g. 2,2, 2x2 or a=2,b=2 (default: 2,2 spawned locally; under torchrun "
                   "the world in its prime factors, 4 -> 2x2, 8 -> 2x2x2)")
    p.add_argument("--check", action="store_true",
                   help="measure instead how often --profile's choices between alternative plans are the "
                   "measured faster ones, on 8 gloo ranks (see docs/decisions.md)")
    p.add_argument("--profile", action="append",
                   help="with --check: the profile(s) to judge (nccl, gloo or a JSON file; repeatable; "
                   "default gloo)")
    p.add_argument("--json", help="with --check: also write the results to this JSON file")
    p.add_argument(
        "--sizes", default=DEFAULT_CALIBRATE_SIZES,
        help=f"message sizes per rank: a list (1KiB,64KiB), a doubling range (1KiB..4MiB) "
        f"or a range with a step factor (1KiB..4MiB*4); default {DEFAULT_CALIBRATE_SIZES}",
    )  # fmt: skip
    p.add_argument("--iters", type=int, default=7, help="timed samples per point (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")
    p.add_argument("--out", default="profile.json", help="where to write the profile (default profile.json)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds before giving up on the ranks")


def _add_bench_arguments(p) -> None:
    p.add_argument(
        "--part", default="all", choices=["all", "planning", "wall", "quality", "decisions", "autoparallel"],
        help="which part to run (default all = planning + wall; quality: the corpus of real layouts "
        "against torch's shipped redistribute, see docs/quality.md; autoparallel: its example Block with "
        "compiler_fn and enabled(), see docs/autoparallel.md)",
    )  # fmt: skip
    p.add_argument(
        "--sizes", default=bench.DEFAULT_BENCH_SIZES,
        help=f"global tensor sizes (list or range as for calibrate); default {bench.DEFAULT_BENCH_SIZES}",
    )  # fmt: skip
    p.add_argument("--case", action="append", help="a redistribution SRC->DST on the 2x2 mesh (repeatable)")
    p.add_argument("--iters", type=int, default=15, help="timed samples per point (default 15)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")
    p.add_argument("--plan-runs", type=int, default=100, help="uncached planning runs (cached: 25x)")
    p.add_argument(
        "--profile",
        help="the optimizer's cost profile: a JSON file from `redist-opt calibrate`, or a built-in "
        f"profile name ({', '.join(BUILTIN_PROFILES)}); default: redist_opt's default model",
    )
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds before giving up on the ranks")
    # --corpus, --corpus-case, --category, --devices-per-host, --no-verify, --report
    quality.add_quality_arguments(p, common=False)
    autoparallel_check.add_autoparallel_arguments(p)  # --ap-setting, --ap-groups


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="redist-opt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="plan, explain and run a 3-D redistribution over 8 gloo processes")
    demo.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    demo.set_defaults(func=cmd_demo)

    ex = sub.add_parser(
        "explain",
        help="show the naive and optimized plans of one redistribution",
        description="Show the naive and optimized plans of one redistribution: collectives, "
        "groups (dim names, layout, ranks), bytes per rank, modelled time, and why merges were "
        "or were not made.",
        one_line_errors=True,
    )
    _add_explain_arguments(ex)
    ex.set_defaults(func=cmd_explain)

    cal = sub.add_parser(
        "calibrate",
        help="measure collectives and fit a cost profile (JSON): on local gloo processes, or under torchrun "
        "on the job's backend and devices; --check: the profile's decision accuracy",
    )
    _add_calibrate_arguments(cal)
    cal.set_defaults(func=cmd_calibrate)

    be = sub.add_parser(
        "bench", help="planning speed, wall clock vs torch over 4 gloo processes, quality on a corpus of real layouts"
    )
    _add_bench_arguments(be)
    be.set_defaults(func=cmd_bench)

    add_advise_command(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CliError, RedistributeError) as e:
        print(f"redist-opt {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
