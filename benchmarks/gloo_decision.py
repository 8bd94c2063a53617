"""Regenerate the built-in ``gloo`` profile's ``slower_in_steps`` from ``redist_opt.tune``.

The built-in decision is what the shipped tuning workflow measured on the step bench's
SimpleFSDP + TP step, not a list edited by hand::

    python -m benchmarks.step_bench --wall --wall-compiler inductor \\
        --step-config simplefsdp_tp:1x2x2:1024 --tune-rounds 20 --json step_wall.json
    python -m benchmarks.gloo_decision step_wall.json

The second command rewrites the ``SLOWER_IN_STEPS`` block at the end of
``redist_opt/gloo_step_decision.py``: the rewrites ``redist_opt.tune`` dropped on that step (the
measured ones only), with both commands, the commit, torch's version and the decisions' ratios
and intervals in its comment. ``--check`` only says whether the file already holds that block.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import textwrap

GLOO_STEP_DECISION = pathlib.Path(__file__).resolve().parents[1] / "redist_opt" / "gloo_step_decision.py"
_BLOCK = re.compile(r"\n# Passes whose rewrites made .*\Z", re.S)


def decision_block(run: dict, config: str, compiler: str, commit: str) -> str:
    """The comment and the ``SLOWER_IN_STEPS`` tuple for one tuned config of a wall run."""
    res = next((r for r in run["results"] if r["config"] == config), None)
    if res is None:
        known = [r["config"] for r in run["results"]]
        raise SystemExit(f"gloo_decision: no config {config!r} in the run (it has {known})")
    tuning = res.get("tuning", {}).get(compiler)
    if tuning is None:
        raise SystemExit(f"gloo_decision: {config!r} was not tuned with {compiler} (run with --tune-rounds)")
    dropped = sorted(d["rewrite"] for d in tuning["decisions"] if not d["keep"])
    command = run.get("command", "(the wall run did not record its command)")
    lines = [
        "",
        "# Passes whose rewrites made a training step slower on gloo ranks of the development machine,",
        "# decided by the shipped tuning workflow (redist_opt.tune, docs/tune.md) inside the step bench's",
        f"# {config} step ({compiler}), not edited by hand. Regenerate with:",
        *textwrap.wrap(command, 96, initial_indent="#   ", subsequent_indent="#       "),
        f"#   python -m benchmarks.gloo_decision <that run's --json file> --config {json.dumps(config)}",
        f"# (commit {commit}, torch {run.get('torch', '?')}; {tuning['steps']} steps and "
        f"{tuning['compiles']} compiles in {tuning['seconds']:.0f} s). Per rewrite: step without / with",
        "# it, slowest rank per step, paired-bootstrap 95% interval, and the rule's decision",
        "# (a measurement changes the base profile's decision only where it is confident):",
    ]
    for d in tuning["decisions"]:
        lo, hi = d["interval"]
        reason = d.get("reason") or ("kept" if d["keep"] else "dropped")
        lines.append(f"#   {d['rewrite']}: {d['ratio']:.3f}x [{lo:.3f}, {hi:.3f}], {reason}")
    if not tuning["decisions"]:
        lines.append("#   (no rewrite changed the step's redistributions)")
    body = "".join(f"{json.dumps(name)}, " for name in dropped).rstrip(", ")
    lines.append(f"SLOWER_IN_STEPS = ({body}{',' if len(dropped) == 1 else ''})")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="the --json file of a step bench wall run with --tune-rounds")
    parser.add_argument("--config", default="simplefsdp_tp 1x2x2 dim 1024", help="the tuned config's label")
    parser.add_argument("--compiler", default="inductor")
    parser.add_argument("--check", action="store_true", help="only check that the file holds this block")
    args = parser.parse_args(argv)
    with open(args.run) as f:
        run = json.load(f)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=GLOO_STEP_DECISION.parent
    ).stdout.strip()
    block = decision_block(run, args.config, args.compiler, run.get("commit") or commit or "?")
    text = GLOO_STEP_DECISION.read_text()
    if not _BLOCK.search(text):
        raise SystemExit(f"gloo_decision: no SLOWER_IN_STEPS block found in {GLOO_STEP_DECISION}")
    new = _BLOCK.sub(lambda _: block, text)
    if args.check:
        print("up to date" if new == text else "differs")
        return 0 if new == text else 1
    GLOO_STEP_DECISION.write_text(new)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
