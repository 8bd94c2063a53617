"""``redist-opt advise step.json [more.json ...]``: which flattened groups to create for a
recorded step (``redist_opt.record()``), as text, JSON and an SVG bar chart.

Several files (one per rank) are merged first (``Recording.merge``). The arguments
are defined with the other commands' in :mod:`redist_opt.tools.cli`.
"""

from __future__ import annotations

import json

from redist_opt.api.advice import mesh_spec_of_record
from redist_opt.api.recording import Recording
from redist_opt.tools.args import CliError, cost_model

__all__ = ["cmd_advise"]


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
        from redist_opt.debug.svg import write_text

        write_text(args.svg, advice.to_svg())
    return 0


def _first_spec(rec: Recording):
    return mesh_spec_of_record(rec.meshes[0]) if rec.meshes else None
