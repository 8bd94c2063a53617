"""``redist-opt advise step.json [more.json ...]``: which flattened groups to create for a
recorded step (``redist_opt.record()``), as text, JSON and an SVG bar chart.

Several files (one per rank) are merged first (``Recording.merge``).
"""

from __future__ import annotations

import json

from redist_opt.api.advice import mesh_spec_of_record
from redist_opt.api.recording import Recording
from redist_opt.debug.svg import write_text
from redist_opt.tools.args import CliError, cost_model

__all__ = ["add_advise_command", "cmd_advise"]


def cmd_advise(args) -> int:
    try:
        rec = Recording.merge(args.recording)
    except OSError as e:
        raise CliError(f"cannot read {e.filename!r}: {e.strerror or e}") from None
    if args.max_new_groups < 0:
        raise CliError(f"--max-new-groups {args.max_new_groups}: must be >= 0")
    model, source = None, "given"
    if args.profile is not None or args.devices_per_host is not None:
        model, source = cost_model("--profile", args.profile, args.devices_per_host, _first_spec(rec))
    advice = rec.advise(max_new_groups=args.max_new_groups, cost=model, cost_source=source)
    if args.format == "json":
        print(json.dumps(advice.to_dict(), indent=1))
    else:
        print(advice, end="")
    if args.svg:
        write_text(args.svg, advice.to_svg())
    return 0


def _first_spec(rec: Recording):
    return mesh_spec_of_record(rec.meshes[0]) if rec.meshes else None


def add_advise_command(sub) -> None:
    """The ``advise`` subcommand, added to ``redist-opt``'s subparsers."""
    p = sub.add_parser(
        "advise",
        help="which flattened groups to create for a step recorded with redist_opt.record()",
        description="Choose the at most K new flattened groups (DeviceMesh._flatten) that minimize a "
        "recorded step's modelled communication time; print the lines to add, and per call site the "
        "collectives, bytes and modelled time per step with torch, the existing groups and the advised ones.",
    )
    p.add_argument("recording", nargs="+", help="JSON file(s) written by Recording.save (one per rank: merged)")
    p.add_argument("--max-new-groups", type=int, default=1, metavar="K", help="at most this many new groups (default 1)")
    p.add_argument(
        "--profile",
        help="cost profile: a JSON file from `redist-opt calibrate` or a built-in name (nccl, gloo); "
        "default: $REDIST_OPT_COST_PROFILE or the recorded mesh's backend's profile",
    )
    p.add_argument("--devices-per-host", type=int, help="ranks per host for the cost model")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument("--svg", metavar="FILE", help="also write a bar chart of modelled time per call site")
    p.set_defaults(func=cmd_advise)
