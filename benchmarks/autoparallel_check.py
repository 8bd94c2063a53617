"""``python -m benchmarks.autoparallel_check``: autoparallel's example ``Block`` with redist_opt.

Runs :mod:`benchmarks.autoparallel_block` (three builds: autoparallel as
shipped, ``compiler_fn`` only, ``enabled()`` + ``compiler_fn``) in two settings:

- ``fake``: one process in a fake process group (rank 0 of 8) on a 2x4 (dp, tp)
  mesh, the example's sizes (dim 6144, bf16 parameters); graphs only (fake
  collectives carry no data);
- ``gloo``: 4 gloo ranks on a 2x2 mesh, small sizes; one training step and one
  inference forward per build, outputs and gradients compared with autoparallel's own.

It prints, per graph autoparallel compiles (training forward, training backward,
inference forward), the collectives by kind before and after the graph pass for
each build, the routed calls, the reasons for chains the pass kept, and the value
comparison. autoparallel is not on the package registry (the PyPI package of that
name is another project); without it this prints how to install it and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import sys
import traceback
from collections import Counter

from benchmarks.autoparallel_block import BUILDS, REFERENCE, BlockDims, check_rank, example_path
from redist_opt.tools.spawn import SpawnError, quiet_torch_logs, run_ranks

__all__ = [
    "INSTALL_STEPS",
    "SETTINGS",
    "autoparallel_missing",
    "run_setting",
    "format_report",
    "cmd_autoparallel",
]

INSTALL_STEPS = """\
autoparallel is not installed. It is not the PyPI package of that name; install it from its repository
without letting pip touch torch (tested at commit a54c2529 with torch 2.13):
    git clone https://github.com/meta-pytorch/autoparallel /path/to/autoparallel
    git -C /path/to/autoparallel checkout a54c2529
    pip install --no-deps -e /path/to/autoparallel
    pip install -c constraints.txt pulp filecheck
The runner reads examples/example_autoparallel.py from that checkout (or the file
$REDIST_OPT_AUTOPARALLEL_EXAMPLE names)."""

# setting: (backend, mesh shape, sizes, run a step)
SETTINGS = {
    "fake": ("fake", (2, 4), BlockDims(), False),
    # dim 1024 makes the ILP choose tensor parallelism for some weights, as at the example's sizes
    "gloo": ("gloo", (2, 2), BlockDims(batch=2, seq=32, nheads=8, dim=1024, dtype="float32"), True),
    # the fake setting's 2x4 mesh on 8 real ranks: its constant-index slices get agreed
    "gloo8": ("gloo", (2, 4), BlockDims(batch=2, seq=32, nheads=8, dim=1024, dtype="float32"), True),
}

BUILD_TITLES = {
    "torch": "autoparallel as shipped",
    "pass": "compiler_fn only",
    "enabled": "enabled() + compiler_fn",
    "priced": "as shipped, ILP priced by redist_opt",
    "costs": "enabled() + compiler_fn, ILP priced by redist_opt",
}
# the builds that run the graph pass / route autoparallel's redistribute
PASS_BUILDS = ("pass", "enabled", "costs")
ROUTED_BUILDS = ("enabled", "costs")


def autoparallel_missing() -> str | None:
    """Why the check cannot run here (None: it can). Looks the packages up without
    importing them; an installed autoparallel that fails to import fails the run."""
    try:
        for name in ("autoparallel", "pulp"):
            if importlib.util.find_spec(name) is None:
                raise ImportError(f"No module named {name!r}")
        path = example_path()
    except (ImportError, ValueError) as e:  # find_spec raises ValueError for a None entry in sys.modules
        return f"{INSTALL_STEPS}\n({type(e).__name__}: {e})"
    if not path.is_file():
        return f"{INSTALL_STEPS}\n(no example at {path})"
    return None


def _fake_entry(queue, world: int, mesh_shape, dims, groups) -> None:
    try:
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        with quiet_torch_logs():
            queue.put((check_rank(0, world, mesh_shape, dims, groups, False), None))
    except BaseException:
        queue.put((None, traceback.format_exc()))


def _run_fake(mesh_shape, dims, groups, timeout: float) -> list[dict]:
    """Rank 0 of a fake process group, in a fresh process (the group is process-wide)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    world = mesh_shape[0] * mesh_shape[1]
    proc = ctx.Process(target=_fake_entry, args=(queue, world, mesh_shape, dims, groups))
    proc.start()
    try:
        result, error = queue.get(timeout=timeout)
    except Exception:
        raise SpawnError(f"the fake-process-group run did not report within {timeout:.0f}s") from None
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if error is not None:
        raise SpawnError(f"the fake-process-group run failed:\n{error.rstrip()}")
    return [result]


def run_setting(
    name: str, *, groups: str = "existing", dims: BlockDims | None = None, timeout: float = 1800.0
):
    """One setting (a key of :data:`SETTINGS`); each rank's result dict, by rank."""
    backend, mesh_shape, default_dims, step = SETTINGS[name]
    dims = dims or default_dims
    if backend == "fake":
        ranks = _run_fake(mesh_shape, dims, groups, timeout)
    else:
        ranks = run_ranks(
            check_rank, mesh_shape[0] * mesh_shape[1], (mesh_shape, dims, groups, step), timeout=timeout
        )
    return {
        "setting": name,
        "backend": backend,
        "mesh": list(mesh_shape),
        "dims": dims.__dict__,
        "groups": groups,
        "ranks": ranks,
    }


# -- the report ---------------------------------------------------------------------------


def _kinds(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _total(counts: dict) -> int:
    return sum(counts.values())


def graph_rows(result: dict) -> list[dict]:
    """Per graph: the collectives of each build (rank 0's graphs; every rank's must agree)."""
    ranks = result["ranks"]
    first = ranks[0]["builds"]
    for r in ranks[1:]:
        for build, entry in r["builds"].items():
            counts = [(g["graph"], g["before"], g["after"]) for g in entry["graphs"]]
            if counts != [(g["graph"], g["before"], g["after"]) for g in first[build]["graphs"]]:
                raise AssertionError(
                    f"rank {r['rank']} compiled different graphs than rank 0 in build {build!r}"
                )
    rows = []
    for i, g in enumerate(first["torch"]["graphs"]):
        row = {"graph": g["graph"], "torch": g["after"]}
        for build in BUILDS[1:]:
            if build in first:
                other = first[build]["graphs"][i]
                row[build] = (other["before"], other["after"])
        rows.append(row)
    return rows


def kept_reasons(result: dict, build: str) -> Counter:
    """Why the pass kept chains (reason text without the chain's sizes), over rank 0's graphs."""
    reasons: Counter = Counter()
    for g in result["ranks"][0]["builds"][build]["graphs"]:
        for line in g["pass"]["kept"]:
            reasons[_reason_of(line)] += 1
        if g["pass"]["failed"]:
            reasons["the pass failed (graph compiled as traced; see the warning)"] += 1
    return reasons


def _reason_of(line: str) -> str:
    if ": kept: " in line:
        head, _, reason = line.partition(": kept: ")
        placements = head.split(" (")[0]
        return f"{placements}: {reason.split(' (')[0]}" + (
            "; " + reason.split("; ", 1)[1] if "; " in reason else ""
        )
    return line.split("]: ", 1)[-1] if line.startswith("not raised") else line


def format_report(result: dict) -> str:
    dims = result["dims"]
    lines = [
        f"## {result['setting']}: {result['backend']} process group, "
        f"mesh {'x'.join(map(str, result['mesh']))} (dp, tp), "
        f"batch {dims['batch']}/dp rank, seq {dims['seq']}, {dims['nheads']} heads, dim {dims['dim']}, "
        f"{dims['dtype']} parameters, groups={result['groups']!r}",
        "",
        "| graph | as shipped | "
        + " | ".join(f"{BUILD_TITLES[b]}: traced -> after pass" for b in BUILDS[1:])
        + " |",
        "|---" * (len(BUILDS) + 1) + "|",
    ]
    for row in graph_rows(result):
        cells = [f"{_kinds(row['torch'])} ({_total(row['torch'])})"]
        for build in BUILDS[1:]:
            before, after = row[build]
            cells.append(f"{_kinds(before)} ({_total(before)}) -> {_kinds(after)} ({_total(after)})")
        lines.append(f"| {row['graph']} | " + " | ".join(cells) + " |")
    rank0 = result["ranks"][0]["builds"]
    lines.append("")
    for build in (b for b in ROUTED_BUILDS if b in rank0):
        entry = rank0[build]
        handed = sum(entry["torch_only"].values())
        lines.append(
            f"- {BUILD_TITLES[build]}: autoparallel's binding routed: {entry['binding_routed']}; "
            f"{entry['routed_calls']} calls reached redist_opt on rank 0, {handed} handed back to torch"
            + "".join(f"; {n}x {reason}" for reason, n in entry["torch_only"].items())
        )
    lines += _placement_lines(result)
    lines += _comparison_lines(result)
    for build in (b for b in PASS_BUILDS if b in rank0):
        rewritten = Counter(line for g in rank0[build]["graphs"] for line in g["pass"]["rewritten"])
        if rewritten:
            lines.append(f"- chains rewritten by the pass ({BUILD_TITLES[build]}):")
            lines += [f"  - {n}x {line}" for line, n in rewritten.most_common()]
        reasons = kept_reasons(result, build)
        if reasons:
            lines.append(f"- chains kept by the pass ({BUILD_TITLES[build]}):")
            lines += [f"  - {n}x {reason}" for reason, n in reasons.most_common()]
    return "\n".join(lines)


def _placement_lines(result: dict) -> list[str]:
    """The parameters the ILP placed differently when priced by redist_opt."""
    rank0 = result["ranks"][0]
    theirs, ours = rank0.get("placements"), rank0["builds"].get("priced", {}).get("placements")
    if theirs is None or ours is None:
        return []
    changed = [f"{name} {theirs[name]} -> {ours[name]}" for name in theirs if ours.get(name) != theirs[name]]
    return [
        "- ILP priced by redist_opt: "
        + ("; ".join(changed) if changed else "every parameter placed as shipped")
    ]


def _comparison_lines(result: dict) -> list[str]:
    ranks = result["ranks"]
    if "compare" not in ranks[0]["builds"]["pass"]:
        return ["- values: not compared (fake collectives carry no data)"]
    lines = []
    for build in (b for b in BUILDS[1:] if b in ranks[0]["builds"]):
        cmp = [r["builds"][build]["compare"] for r in ranks]
        bitwise = all(c["bitwise"] for c in cmp)
        worst = max(c["max_abs_diff"] for c in cmp)
        rel = max(c.get("max_rel_diff", float("nan")) for c in cmp)
        lines.append(
            f"- values ({BUILD_TITLES[build]} vs {BUILD_TITLES[REFERENCE[build]]}, "
            "output, inference output and "
            "every gradient, "
            f"{len(ranks)} ranks): "
            + (
                "bitwise equal"
                if bitwise
                else f"max abs diff {worst:.3g}, {rel:.3g} of the largest magnitude"
            )
        )
    return lines


def cmd_autoparallel(args) -> int:
    """``python -m benchmarks.autoparallel_check``: exit 0, 1 when the ranks failed, 2 without
    autoparallel."""
    missing = autoparallel_missing()
    if missing:
        print(f"benchmarks.autoparallel_check: {missing}", file=sys.stderr)
        return 2
    settings = args.ap_setting or ["fake", "gloo"]
    results = []
    for name in settings:
        print(f"running {name} ...", flush=True)
        try:
            result = run_setting(name, groups=args.ap_groups, timeout=max(args.timeout, 1800.0))
        except SpawnError as e:
            print(f"benchmarks.autoparallel_check: {e}", file=sys.stderr)
            return 1
        results.append(result)
        print(format_report(result) + "\n", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.autoparallel_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--ap-setting",
        action="append",
        choices=list(SETTINGS),
        help="fake (2x4, the example's sizes, graphs only), gloo (4 ranks, 2x2, a real step) or "
        "gloo8 (8 ranks, 2x4, a real step); repeatable, default fake and gloo",
    )
    parser.add_argument(
        "--ap-groups",
        default="existing",
        choices=["existing", "create"],
        help="compiler_fn/enabled groups (default existing)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before giving up on the ranks")
    parser.add_argument("--json", help="also write the results to this JSON file")
    return cmd_autoparallel(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
