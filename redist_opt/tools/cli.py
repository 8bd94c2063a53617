"""The ``redist-opt`` command: ``demo``, ``explain``, ``advise``, ``calibrate``, ``bench`` and ``tune``.

Errors are one line naming the offending argument, exit code 2, no traceback.
Values shared by the commands are parsed in :mod:`redist_opt.tools.args`. ``explain``
and ``advise`` run here (they need no module the parser does not load already); every
other command runs in its own module, imported when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys

import redist_opt
from redist_opt.api.advice import mesh_spec_of_record
from redist_opt.api.recording import Recording
from redist_opt.debug import dump, explain, visualize
from redist_opt.graph.backend import INNER_COMPILERS
from redist_opt.ir.cost import BUILTIN_PROFILES
from redist_opt.ir.placements import RedistributeError, normalize_placements
from redist_opt.tools.args import (
    DEFAULT_BENCH_SIZES,
    DEFAULT_CALIBRATE_SIZES,
    CliError,
    cost_model,
    mesh_spec,
    parse_dtype,
    parse_shape,
)
from redist_opt.tools.corpus import CATEGORIES

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """A usage error is one line naming the argument, exit 2, like every other bad value
    (argparse would print the whole usage first). Subcommands' parsers are of this class too."""

    def error(self, message: str):
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
            naive,
            groups=args.groups,
            cost=given,
            prefer=args.prefer,
            dump_dir=args.dump_dir,
            max_collectives=args.max_collectives,
        )
    except ValueError as e:
        if isinstance(e, RedistributeError) or dump.DUMP_PASSES_ENV in str(e):
            raise CliError(str(e)) from None
        raise


def _write_file(flag: str, path: str, render) -> None:
    try:
        text = render()
    except ValueError as e:
        raise CliError(f"{flag}: {e}") from None
    try:
        visualize.write_text(path, text)
    except OSError as e:
        raise CliError(f"{flag}: cannot write {path!r}: {e.strerror or e}") from None
    print(f"redist-opt: wrote {path}", file=sys.stderr)


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
        _write_file("--svg", args.svg, lambda: visualize.plan_graph_svg(plans))
    if args.mesh_svg:
        _write_file("--mesh-svg", args.mesh_svg, lambda: visualize.mesh_svg(spec, plans))

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


# -- advise ------------------------------------------------------------------------------


def cmd_advise(args) -> int:
    """``redist-opt advise step.json [more.json ...]``: the flattened groups to create for a
    step recorded with ``redist_opt.record()`` (several files, one per rank, are merged)."""
    try:
        rec = Recording.merge(args.recording)
    except OSError as e:
        raise CliError(f"cannot read {e.filename!r}: {e.strerror or e}") from None
    model, source = None, "given"
    if args.profile is not None or args.devices_per_host is not None:
        spec = mesh_spec_of_record(rec.meshes[0]) if rec.meshes else None
        model, source = cost_model("--profile", args.profile, args.devices_per_host, spec)
    advice = rec.advise(max_new_groups=args.max_new_groups, cost=model, cost_source=source)
    if args.svg:
        _write_file("--svg", args.svg, advice.to_svg)
    if args.format == "json":
        print(json.dumps(advice.to_dict(), indent=1))
    else:
        print(advice, end="")
    return 0


def _command(target: str):
    """The function ``module:name`` that runs a command, imported when the command runs:
    ``redist-opt explain`` never loads the gloo spawner, the calibrator or the benches."""
    module, name = target.split(":")

    def run(args) -> int:
        return getattr(importlib.import_module(module), name)(args)

    return run


# -- the parser --------------------------------------------------------------------------


def _add_explain_arguments(ex) -> None:
    ex.add_argument("--mesh", required=True, help="dims as name=size,... e.g. dp=2,cp=2,tp=2")
    ex.add_argument(
        "--flatten",
        action="append",
        metavar="DIMS",
        help="a flattened group that exists, e.g. dp+cp (repeatable)",
    )
    ex.add_argument("--src", required=True, help='source placements, e.g. "P,P,S(0)"')
    ex.add_argument("--dst", required=True, help='target placements, e.g. "R,S(0),R"')
    ex.add_argument("--shape", required=True, help="global tensor shape, e.g. 8,4")
    ex.add_argument("--dtype", default="float32", help="torch dtype name (default float32)")
    ex.add_argument(
        "--groups",
        default="existing",
        choices=["existing", "create"],
        help="communicators merged collectives may use (default existing)",
    )
    _add_devices_per_host(ex)
    ex.add_argument(
        "--backend",
        metavar="NAME",
        help="process-group backend the plan is for (gloo, nccl, fake): picks the cost "
        "profile when --cost-model is not given",
    )
    ex.add_argument(
        "--cost-model",
        default=None,
        metavar="PROFILE",
        help="nccl, gloo, or a JSON profile written by `redist-opt calibrate` (default: "
        "$REDIST_OPT_COST_PROFILE, else the --backend's profile, else nccl)",
    )
    ex.add_argument(
        "--prefer",
        default="time",
        choices=["time", "consistency"],
        help="time (default: merge where the cost model says it pays) or consistency "
        "(merge every reduction a group allows: bitwise-equal replicas)",
    )
    ex.add_argument(
        "--max-collectives",
        default="torch",
        choices=["torch", "any"],
        help="torch (default: never more collectives than torch 2.13's shipped plan) or "
        "any (the cost model may trade launches for bytes)",
    )
    ex.add_argument(
        "--format",
        default="text",
        choices=["text", "json", "dot"],
        help="text (default), json (schema redist_opt.explain/1) or dot (plan graph)",
    )
    ex.add_argument(
        "--rank-lists",
        type=int,
        default=2,
        metavar="K",
        help="rank lists shown per collective (first K groups; default 2)",
    )
    ex.add_argument("--no-ir", action="store_true", help="text format: leave out the IR listings")
    ex.add_argument(
        "--dump-dir",
        metavar="DIR",
        help="write the IR before the pipeline and after each pass that changed it",
    )
    ex.add_argument("--svg", metavar="FILE", help="write the plan graph (naive | optimized) as SVG")
    ex.add_argument("--mesh-svg", metavar="FILE", help="write the mesh diagram (ranks per collective) as SVG")


def _add_calibrate_arguments(p) -> None:
    p.add_argument(
        "--mesh",
        default=None,
        help="mesh sizes, e.g. 2,2, 2x2 or a=2,b=2: one gloo process per rank (default: 2,2 spawned "
        "locally; under torchrun the world in its prime factors, 4 -> 2x2, 8 -> 2x2x2)",
    )
    _add_measuring_arguments(p, DEFAULT_CALIBRATE_SIZES, "message sizes per rank", iters=7)
    p.add_argument("--out", default="profile.json", help="where to write the profile (default profile.json)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds before giving up on the ranks")


def _add_measuring_arguments(p, sizes: str, what: str, *, iters: int) -> None:
    """``--sizes``, ``--iters`` and ``--warmup`` of the commands that time collectives."""
    p.add_argument(
        "--sizes",
        default=sizes,
        help=f"{what}: a list (1KiB,64KiB), a doubling range (1KiB..4MiB) or a range with a step factor "
        f"(1KiB..4MiB*4); default {sizes}",
    )
    p.add_argument("--iters", type=int, default=iters, help=f"timed samples per point (default {iters})")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")


def _add_devices_per_host(p, prefix: str = "") -> None:
    p.add_argument(
        "--devices-per-host",
        type=int,
        metavar="N",
        help=f"{prefix}ranks per host for the cost model (consecutive ranks share a host)",
    )


def _add_bench_arguments(p) -> None:
    p.add_argument(
        "--part",
        default="all",
        choices=["all", "planning", "wall", "quality"],
        help="which part to run (default all = planning + wall; quality: the corpus of real layouts "
        "against torch's shipped redistribute, see docs/quality.md)",
    )
    _add_measuring_arguments(p, DEFAULT_BENCH_SIZES, "global tensor sizes", iters=15)
    p.add_argument("--case", action="append", help="a redistribution SRC->DST on the 2x2 mesh (repeatable)")
    p.add_argument("--plan-runs", type=int, default=100, help="uncached planning runs (cached: 25x)")
    p.add_argument(
        "--profile",
        help="the optimizer's cost profile: a JSON file from `redist-opt calibrate`, or a built-in "
        f"profile name ({', '.join(BUILTIN_PROFILES)}); default: redist_opt's default model",
    )
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds before giving up on the ranks")
    _add_quality_arguments(p)


def _add_quality_arguments(p) -> None:
    """``--part quality``'s own options (``--corpus-case``: the bench's ``--case`` takes SRC->DST)."""
    p.add_argument(
        "--corpus",
        default=None,
        metavar="FILE",
        help="quality: a corpus JSON (default: the corpus shipped with redist_opt)",
    )
    p.add_argument(
        "--corpus-case", action="append", metavar="ID", help="quality: only this corpus case (repeatable)"
    )
    p.add_argument(
        "--category",
        action="append",
        metavar="NAME",
        choices=CATEGORIES,
        help="quality: only this corpus category (repeatable)",
    )
    _add_devices_per_host(p, "quality: ")
    p.add_argument(
        "--report", metavar="FILE", help="quality: write the markdown report here (default stdout)"
    )


def _add_advise_arguments(p) -> None:
    p.add_argument(
        "recording", nargs="+", help="JSON file(s) written by Recording.save (one per rank: merged)"
    )
    p.add_argument(
        "--max-new-groups", type=int, default=1, metavar="K", help="at most this many new groups (default 1)"
    )
    p.add_argument(
        "--profile",
        help="cost profile: a JSON file from `redist-opt calibrate` or a built-in name (nccl, gloo); "
        "default: $REDIST_OPT_COST_PROFILE or the recorded mesh's backend's profile",
    )
    _add_devices_per_host(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument("--svg", metavar="FILE", help="also write a bar chart of modelled time per call site")


def _add_tune_arguments(p) -> None:
    p.add_argument("step", metavar="FILE.py:FUNCTION", help="the job's make_step(backend) factory")
    p.add_argument("--out", required=True, metavar="PROFILE", help="the cost profile to write (JSON)")
    p.add_argument(
        "--compiler",
        choices=("eager", *INNER_COMPILERS),
        default="eager",
        help="eager: the step as it is, ours inside enabled(); inductor / aot_eager: torch.compile with "
        "that backend, ours with redist_opt.backend(...) (default eager)",
    )
    p.add_argument(
        "--rounds", type=int, default=20, help="interleaved rounds of one step per variant (default 20)"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default 2)")
    p.add_argument(
        "--memory-rounds",
        type=int,
        default=3,
        help="rounds of each variant's peak bytes after the timed ones, 0: none (default 3; docs/memory.md)",
    )
    p.add_argument(
        "--base",
        metavar="PROFILE",
        help="the profile whose decisions are tuned (a file or a built-in name); default: "
        "$REDIST_OPT_COST_PROFILE, else the backend's",
    )
    p.add_argument(
        "--groups",
        choices=("existing", "create"),
        default="existing",
        help="ours may use existing flattened groups only, or create them (default existing)",
    )
    p.add_argument(
        "--compiled-region-only",
        action="store_true",
        help="with a compiler: ours is redist_opt.backend(...) alone, the rest of the step torch's "
        "(default: the whole step also runs inside redist_opt.enabled(...))",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="redist-opt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="plan, explain and run a 3-D redistribution over 8 gloo processes")
    demo.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    demo.set_defaults(func=_command("redist_opt.tools.demo:cmd_demo"))

    ex = sub.add_parser(
        "explain",
        help="show the naive and optimized plans of one redistribution",
        description="Show the naive and optimized plans of one redistribution: collectives, "
        "groups (dim names, layout, ranks), bytes per rank, modelled time, and why merges were "
        "or were not made.",
    )
    _add_explain_arguments(ex)
    ex.set_defaults(func=cmd_explain)

    cal = sub.add_parser(
        "calibrate",
        help="measure collectives and fit a cost profile (JSON): on local gloo processes, or under torchrun "
        "on the job's backend and devices",
    )
    _add_calibrate_arguments(cal)
    cal.set_defaults(func=_command("redist_opt.tools.calibrate:cmd_calibrate"))

    be = sub.add_parser(
        "bench",
        help="planning speed, wall clock vs torch over 4 gloo processes, quality on a corpus of real layouts",
    )
    _add_bench_arguments(be)
    be.set_defaults(func=_command("redist_opt.tools.bench:cmd_bench"))

    tu = sub.add_parser(
        "tune",
        help="time the job's own step with each rewrite on and off and write the decisions as a cost "
        "profile (under torchrun, every rank)",
        description="Run the job's step (FILE.py:FUNCTION, a make_step(backend) factory; see "
        "redist_opt.tune) with each rewrite on and off, interleaved, on every rank; keep a rewrite "
        "unless the slowest rank's step is measured slower with it; write the decisions, ratios and "
        "intervals as a cost profile for backend(cost=...) and enabled(cost=...).",
    )
    _add_tune_arguments(tu)
    tu.set_defaults(func=_command("redist_opt.tools.tune:cmd_tune"))

    adv = sub.add_parser(
        "advise",
        help="which flattened groups to create for a step recorded with redist_opt.record()",
        description="Choose the at most K new flattened groups (DeviceMesh._flatten) that minimize a "
        "recorded step's modelled communication time; print the lines to add, and per call site the "
        "collectives, bytes and modelled time per step with torch, the existing groups and the advised ones.",
    )
    _add_advise_arguments(adv)
    adv.set_defaults(func=cmd_advise)
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
