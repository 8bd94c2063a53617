"""``redist-opt bench``: planning speed, and wall clock against torch on gloo ranks.

* planning speed: ``redist_opt.plan`` + ``redist_opt.optimize`` on a 4-D mesh,
  uncached (caches cleared before every call) and cached, in microseconds;
* wall clock over 4 real gloo processes on a 2x2 mesh: torch's
  ``DTensor.redistribute`` (merge pass on, a flattened group present), torch with
  its merge pass off, and ``redist_opt.redistribute(groups="existing")``
  (see :mod:`redist_opt.tools.timing` for how a time is taken).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api.planning import plans_for
from redist_opt.ir.cost import CostModel
from redist_opt.runtime.torch_dtensor import reference_semantics
from redist_opt.tools.args import CliError, check_samples, format_size, load_profile, parse_size_list
from redist_opt.tools.spawn import SpawnError, run_ranks
from redist_opt.tools.timing import Stat, loadavg, note_load, timed_samples, wait

__all__ = ["planning_bench", "format_planning", "exact_input", "run_variants", "VARIANTS", "wall_bench", "format_wall",
           "bench_shape", "WALL_CASES", "WALL_MESH", "cmd_bench"]


# -- bench: planning speed ---------------------------------------------------------------

PLANNING_CASE = dict(
    sizes=(8, 16, 32, 32),
    names=("pp", "dp", "cp", "tp"),
    flattened=(("dp", "cp"), ("cp", "tp")),
    src="P,P,S(0),R",
    dst="R,S(0),R,R",
    shape=(4096, 1024),
)


def _times(fn, n: int, *, before=None, warm: bool = False) -> list[float]:
    """Seconds per call of ``fn``, ``n`` calls; ``before()`` runs untimed before each call
    (clearing caches), ``warm``: a few untimed calls first (the first calls after a clear allocate)."""
    for _ in range(min(n, 200) if warm else 0):
        fn()
    ts = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def _timing_row(what: str, mode: str, ts: Sequence[float]) -> dict:
    deciles = statistics.quantiles(ts, n=10, method="inclusive") if len(ts) > 1 else list(ts) * 9
    us = dict(median_us=statistics.median(ts) * 1e6, p10_us=deciles[0] * 1e6, p90_us=deciles[-1] * 1e6)
    return dict(what=what, mode=mode, runs=len(ts), **us)


def planning_bench(*, runs: int = 100, cached_runs: int = 2500, cost: CostModel | None = None) -> dict:
    """Microseconds per ``plan`` and ``plan`` + ``optimize`` call, uncached and cached."""
    c = PLANNING_CASE
    spec = redist_opt.MeshSpec(sizes=c["sizes"], names=c["names"], flattened=c["flattened"])

    def do_plan():
        return redist_opt.plan(spec, c["src"], c["dst"], shape=c["shape"])

    def do_both():
        return redist_opt.optimize(do_plan(), groups="existing", cost=cost)

    # Uncached optimize alone: planned once, then every cache cleared before each
    # call (the plan is given, so clearing the plan cache does not touch it).
    p = do_plan()
    rows = [
        ("plan", "uncached", _times(do_plan, runs, before=redist_opt.clear_caches)),
        ("optimize", "uncached",
         _times(lambda: redist_opt.optimize(p, groups="existing", cost=cost), runs, before=redist_opt.clear_caches)),
        ("plan+optimize", "uncached", _times(do_both, runs, before=redist_opt.clear_caches)),
    ]  # fmt: skip
    do_both()
    # The eager hot path: what redist_opt.redistribute does per call once planned
    # (Placement objects in, one dictionary lookup for the naive and optimized plans).
    placements = [redist_opt.parse_placements(c[k]) for k in ("src", "dst")]
    hot_key = (spec, *placements, tuple(c["shape"]), torch.float32, redist_opt.PlanOptions(cost=cost))
    rows += [
        ("plan", "cached", _times(do_plan, cached_runs, warm=True)),
        ("plan+optimize", "cached", _times(do_both, cached_runs, warm=True)),
        ("redistribute hot path", "cached", _times(lambda: plans_for(*hot_key), cached_runs, warm=True)),
    ]
    case = {k: c[k] for k in ("src", "dst")} | dict(
        mesh=spec.shape_str, flattened=["+".join(f) for f in c["flattened"]], shape=list(c["shape"]),
        ranks=spec.num_ranks,
    )  # fmt: skip
    return {
        "case": case,
        "cost_profile_used": cost is not None,
        "collectives": do_both().num_collectives,
        "timings": {f"{what} {mode}": _timing_row(what, mode, ts) for what, mode, ts in rows},
    }


def format_planning(res: dict) -> str:
    c = res["case"]
    lines = [
        f"planning speed: {c['src']} -> {c['dst']}, shape {tuple(c['shape'])}, mesh {c['mesh']} "
        f"({c['ranks']} ranks), flattened {', '.join(c['flattened'])}",
        f"{'call':<16} {'mode':<9} {'runs':>6} {'median us':>10} {'p10 us':>9} {'p90 us':>9}",
    ]
    for t in res["timings"].values():
        lines.append(
            f"{t['what']:<16} {t['mode']:<9} {t['runs']:>6} {t['median_us']:>10.1f} "
            f"{t['p10_us']:>9.1f} {t['p90_us']:>9.1f}"
        )
    return "\n".join(lines)


# -- one redistribution three ways on every rank (the wall bench and the demo) -------------

VARIANTS = ("torch", "torch_nomerge", "ours")


def exact_input(mesh, src_p, shape, rank: int) -> DTensor:
    """A DTensor of ``shape`` placed as ``src_p`` (each rank holds a different partial
    value), of small integers: every summation order gives the same bits, so results
    compare exactly however the optimizer regrouped the sums."""
    full = (torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) * 7) % 11
    dt = distribute_tensor(full, mesh, [Replicate() if p.is_partial() else p for p in src_p], src_data_rank=None)
    if any(p.is_partial() for p in src_p):
        dt = DTensor.from_local(
            dt.to_local() + rank % 3, mesh, src_p, run_check=False, shape=full.shape, stride=full.stride()
        )  # fmt: skip
    return dt


def run_variants(mesh, src: str, dst: str, shape, rank: int, *, iters: int, warmup: int, cost=None) -> dict:
    """torch's redistribute as shipped (merge pass on), torch with its merge pass off (the
    reference) and ``redist_opt.redistribute``, on one input: whether each result equals
    the reference bit for bit, the collectives each issues, and each one's per-call
    samples (:func:`~redist_opt.tools.timing.timed_samples`, interleaved)."""
    src_p, dst_p = redist_opt.parse_placements(src), redist_opt.parse_placements(dst)
    dt = exact_input(mesh, src_p, shape, rank)

    def f_torch():
        return wait(dt.redistribute(mesh, dst_p)._local_tensor)

    def f_nomerge():
        with reference_semantics():
            return f_torch()

    def f_ours():
        return wait(redist_opt.redistribute(dt, dst_p, groups="existing", cost=cost)._local_tensor)

    fns = (f_torch, f_nomerge, f_ours)
    ref, equal, counts = f_nomerge(), {}, {}
    for name, f in zip(VARIANTS, fns):
        with CommDebugMode() as mode:
            out = f()
        equal[name], counts[name] = bool(out.shape == ref.shape and torch.equal(out, ref)), mode.get_total_counts()
    return dict(equal=equal, collectives=counts, samples=timed_samples(fns, iters, warmup))


# -- bench: wall clock on gloo ------------------------------------------------------------

WALL_MESH = ((2, 2), ("a", "b"))
WALL_CASES = [
    ("P,P", "R,R"),
    ("P,P", "S(0),R"),
    ("P,P", "R,S(0)"),
    ("S(0),S(0)", "R,R"),
    ("S(0),S(1)", "S(1),S(0)"),
]


def bench_shape(nbytes: int, itemsize: int = 4) -> tuple[int, int]:
    """A near-square 2-D float32 shape of ``nbytes`` (global), dims divisible where possible."""
    numel = max(1, nbytes // itemsize)
    rows = 1 << max(0, (numel.bit_length() - 1 + 1) // 2)
    while rows > 1 and numel % rows:
        rows //= 2
    return rows, numel // rows


def _wall_worker(rank: int, world: int, cases, sizes, iters: int, warmup: int, cost_dict) -> list:
    sizes_, names = WALL_MESH
    mesh = init_device_mesh("cpu", sizes_, mesh_dim_names=names)
    # A flattened a+b group, so torch's merge pass (and our groups="existing") can merge.
    mesh[names]._flatten()
    cost = CostModel.from_dict(cost_dict) if cost_dict is not None else None
    return [
        run_variants(mesh, src, dst, bench_shape(nbytes), rank, iters=iters, warmup=warmup, cost=cost)
        for src, dst in cases for nbytes in sizes
    ]  # fmt: skip


def wall_bench(
    sizes: Sequence[int],
    cases: Sequence[tuple[str, str]] = tuple(WALL_CASES),
    *,
    iters: int = 15,
    warmup: int = 2,
    cost: CostModel | None = None,
    timeout: float = 300.0,
) -> dict:
    world = math.prod(WALL_MESH[0])
    cost_dict = cost.to_dict() if cost is not None else None
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _wall_worker, world, (list(cases), list(sizes), iters, warmup, cost_dict), timeout=timeout
    )
    wall = time.perf_counter() - t0
    rows = []
    points = [(src, dst, nbytes) for src, dst in cases for nbytes in sizes]
    for i, (src, dst, nbytes) in enumerate(points):
        stats = {v: Stat.of([r[i]["samples"][k] for r in per_rank]) for k, v in enumerate(VARIANTS)}
        t, o = stats["torch"], stats["ours"]
        noise = 3.0 * math.hypot(t.stderr, o.stderr)
        ratio = o.median / t.median if t.median > 0 else float("nan")
        rows.append(
            dict(
                case=f"{src} -> {dst}", src=src, dst=dst, nbytes=nbytes, shape=list(bench_shape(nbytes)),
                equal=all(all(r[i]["equal"].values()) for r in per_rank),
                collectives=per_rank[0][i]["collectives"],
                **{f"{v}_ms": stats[v].median * 1e3 for v in VARIANTS},
                **{f"{v}_stderr_ms": stats[v].stderr * 1e3 for v in VARIANTS},
                ratio=ratio,
                noise_ms=noise * 1e3,
                slower=bool(o.median - t.median > noise and ratio > 1 + MIN_FLAG_RATIO),
                samples_ms={v: [s * 1e3 for s in stats[v].samples] for v in VARIANTS},
            )
        )  # fmt: skip
    return {
        "mesh": {"sizes": list(WALL_MESH[0]), "names": list(WALL_MESH[1]), "flattened": ["a+b"]},
        "ranks": world,
        "iters": iters,
        "warmup": warmup,
        "cost_profile": cost.name if cost is not None else None,
        "cost_profile_used": cost is not None,
        "wall_s": wall,
        "rows": rows,
    }


# Differences below this fraction are never flagged, however tight the samples.
MIN_FLAG_RATIO = 0.05


def format_wall(res: dict) -> str:
    profile = res["cost_profile"] or "default (redist_opt's default model)"
    lines = [
        f"wall clock: {res['ranks']} gloo ranks, mesh a=2,b=2 with a+b flattened, "
        f"median of {res['iters']} samples (slowest rank), ms per redistribute; "
        f"ours: groups=existing, cost profile {profile}",
        f"{'case':<24} {'size':>7} {'torch':>8} {'no merge':>9} {'ours':>8} {'ours/torch':>10} "
        f"{'noise':>7} {'colls':>5} {'eq':>3}  flag",
    ]
    for r in res["rows"]:
        lines.append(
            f"{r['case']:<24} {format_size(r['nbytes']):>7} {r['torch_ms']:>8.3f} "
            f"{r['torch_nomerge_ms']:>9.3f} {r['ours_ms']:>8.3f} {r['ratio']:>10.2f} "
            f"{r['noise_ms']:>7.3f} {'/'.join(str(r['collectives'][v]) for v in VARIANTS):>5} "
            f"{'ok' if r['equal'] else 'NO':>3}  {'SLOWER' if r['slower'] else ''}"
        )
    lines.append(
        "colls = collectives issued by torch / torch no merge / ours; eq = every rank's result of "
        "torch and of ours equals torch's with its merge pass off, bit for bit\n"
        "noise = 3 x combined standard error of the two medians (from the samples' MAD); "
        f"SLOWER = ours - torch > noise and ours/torch > {1 + MIN_FLAG_RATIO:.2f}"
    )
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------


def _parse_case(text: str) -> tuple[str, str]:
    """``--case SRC->DST`` on the wall benchmark's 2-D mesh."""
    if "->" not in text:
        raise CliError(f"--case {text!r}: expected SRC->DST, e.g. 'P,P->R,S(0)'")
    src, dst = (s.strip() for s in text.split("->", 1))
    for s in (src, dst):
        ps = redist_opt.parse_placements(s)
        if len(ps) != len(WALL_MESH[0]):
            raise CliError(f"--case {text!r}: {s!r} has {len(ps)} placements for a 2-D mesh")
    return src, dst


def _run_wall(args, sizes, cases, cost, result: dict) -> int | None:
    """The wall-clock part into ``result["wall"]``: 0, 1 when a result differs from
    torch's, or None when the ranks failed (nothing to report)."""
    print(
        f"running {len(cases)} cases x {len(sizes)} sizes on {math.prod(WALL_MESH[0])} gloo ranks ...",
        flush=True,
    )
    try:
        res = wall_bench(sizes, cases, iters=args.iters, warmup=args.warmup, cost=cost, timeout=args.timeout)
    except SpawnError as e:
        print(f"redist-opt bench: {e}", file=sys.stderr)
        return None
    result["wall"] = res
    print(format_wall(res))
    if not all(r["equal"] for r in res["rows"]):
        print("MISMATCH: some results differ from torch's with its merge pass off", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args) -> int:
    """``redist-opt bench``: exit 0, 1 when a result differs from torch's (``--part quality``:
    when ours is worse on some case, see :mod:`redist_opt.tools.quality`)."""
    if args.part == "quality":
        from redist_opt.tools.quality import cmd_quality

        return cmd_quality(args)
    sizes = parse_size_list(args.sizes)
    cases = [_parse_case(c) for c in args.case] if args.case else list(WALL_CASES)
    check_samples(args.iters, args.warmup)
    cost = load_profile("--profile", args.profile) if args.profile else None
    result: dict = {"torch": torch.__version__, "cost_profile_path": args.profile, "load_average": loadavg()}
    note_load(end="\n\n")
    exit_code = 0
    if args.part in ("all", "planning"):
        res = planning_bench(runs=args.plan_runs, cached_runs=args.plan_runs * 25, cost=cost)
        result["planning"] = res
        print(format_planning(res))
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
