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
import timeit
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api.planning import plans_for
from redist_opt.ir.cost import CostModel
from redist_opt.measure import wall_stats
from redist_opt.tools.args import CliError, check_samples, cost_model, format_size, parse_size_list
from redist_opt.tools.spawn import SpawnError, run_ranks
from redist_opt.tools.timing import Stat, loadavg, note_load, timed_samples, wait
from redist_opt.torch_api import mesh as torch_mesh
from redist_opt.torch_api.dtensor import local_tensor_of, reference_semantics

__all__ = [
    "planning_bench",
    "format_planning",
    "exact_input",
    "run_variants",
    "VARIANTS",
    "wall_bench",
    "format_wall",
    "bench_shape",
    "WALL_CASES",
    "WALL_MESH",
    "cmd_bench",
]


# -- bench: planning speed ---------------------------------------------------------------

# A 4-D job of 131,072 ranks: (mesh dims, flattened dims, src, dst, global shape).
PLANNING_CASE = (
    dict(pp=8, dp=16, cp=32, tp=32),
    (("dp", "cp"), ("cp", "tp")),
    "P,P,S(0),R",
    "R,S(0),R,R",
    (4096, 1024),
)


def _cached_times(fn, n: int) -> list[float]:
    """Seconds per call of ``fn``, ``n`` calls, after untimed ones that fill the caches and allocate."""
    for _ in range(min(n, 200)):
        fn()
    return timeit.repeat(fn, number=1, repeat=n)


def _timing_row(what: str, mode: str, ts: Sequence[float]) -> dict:
    deciles = statistics.quantiles(ts, n=10, method="inclusive") if len(ts) > 1 else list(ts) * 9
    us = dict(median_us=statistics.median(ts) * 1e6, p10_us=deciles[0] * 1e6, p90_us=deciles[-1] * 1e6)
    return dict(what=what, mode=mode, runs=len(ts), **us)


def planning_bench(*, runs: int = 100, cached_runs: int = 2500, cost: CostModel | None = None) -> dict:
    """Microseconds per ``plan`` and ``plan`` + ``optimize`` call, uncached and cached."""
    dims, flattened, src, dst, shape = PLANNING_CASE
    spec = redist_opt.MeshSpec(sizes=tuple(dims.values()), names=tuple(dims), flattened=flattened)

    def do_plan():
        return redist_opt.plan(spec, src, dst, shape=shape)

    def do_both():
        return redist_opt.optimize(do_plan(), groups="existing", cost=cost)

    def uncached(fn):  # timeit runs the setup, clearing every cache, before each timed call
        return timeit.repeat(fn, setup=redist_opt.clear_caches, number=1, repeat=runs)

    # Uncached optimize alone: planned once, then every cache cleared before each
    # call (the plan is given, so clearing the plan cache does not touch it).
    p = do_plan()
    rows = [
        ("plan", "uncached", uncached(do_plan)),
        ("optimize", "uncached", uncached(lambda: redist_opt.optimize(p, groups="existing", cost=cost))),
        ("plan+optimize", "uncached", uncached(do_both)),
    ]
    do_both()
    # The eager hot path: what redist_opt.redistribute does per call once planned
    # (Placement objects in, one dictionary lookup for the naive and optimized plans).
    placements = [redist_opt.parse_placements(text) for text in (src, dst)]
    hot_key = (spec, *placements, shape, torch.float32, redist_opt.PlanOptions(cost=cost))
    rows += [
        ("plan", "cached", _cached_times(do_plan, cached_runs)),
        ("plan+optimize", "cached", _cached_times(do_both, cached_runs)),
        ("redistribute hot path", "cached", _cached_times(lambda: plans_for(*hot_key), cached_runs)),
    ]
    return {
        "case": dict(
            src=src,
            dst=dst,
            mesh=spec.shape_str,
            flattened=["+".join(f) for f in flattened],
            shape=list(shape),
            ranks=spec.num_ranks,
        ),
        "cost_profile_used": cost is not None,
        "collectives": do_both().num_collectives,
        "timings": {f"{what} {mode}": _timing_row(what, mode, ts) for what, mode, ts in rows},
    }


def format_planning(res: dict) -> str:
    c = res["case"]
    lines = [
        f"planning speed: {c['src']} -> {c['dst']}, shape {tuple(c['shape'])}, mesh {c['mesh']} "
        f"({c['ranks']} ranks), flattened {', '.join(c['flattened'])}",
        f"{'call':<21} {'mode':<9} {'runs':>6} {'median us':>10} {'p10 us':>9} {'p90 us':>9}",
    ]
    for t in res["timings"].values():
        lines.append(
            f"{t['what']:<21} {t['mode']:<9} {t['runs']:>6} {t['median_us']:>10.1f} "
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
    dt = distribute_tensor(
        full, mesh, [Replicate() if p.is_partial() else p for p in src_p], src_data_rank=None
    )
    if any(p.is_partial() for p in src_p):
        dt = DTensor.from_local(
            dt.to_local() + rank % 3, mesh, src_p, run_check=False, shape=full.shape, stride=full.stride()
        )
    return dt


def run_variants(mesh, src: str, dst: str, shape, rank: int, *, iters: int, warmup: int, cost=None) -> dict:
    """torch's redistribute as shipped (merge pass on), torch with its merge pass off (the
    reference) and ``redist_opt.redistribute``, on one input: whether each result equals
    the reference bit for bit, the collectives each issues, and each one's per-call
    samples (:func:`~redist_opt.tools.timing.timed_samples`, interleaved)."""
    src_p, dst_p = redist_opt.parse_placements(src), redist_opt.parse_placements(dst)
    dt = exact_input(mesh, src_p, shape, rank)

    def f_torch():
        return wait(local_tensor_of(dt.redistribute(mesh, dst_p)))

    def f_nomerge():
        with reference_semantics():
            return f_torch()

    def f_ours():
        return wait(local_tensor_of(redist_opt.redistribute(dt, dst_p, groups="existing", cost=cost)))

    fns = (f_torch, f_nomerge, f_ours)
    ref, equal, counts = f_nomerge(), {}, {}
    for name, f in zip(VARIANTS, fns):
        with CommDebugMode() as mode:
            out = f()
        equal[name], counts[name] = (
            bool(out.shape == ref.shape and torch.equal(out, ref)),
            mode.get_total_counts(),
        )
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


def _wall_worker(rank: int, world: int, mesh_dims, flatten, points, iters: int, warmup: int, cost) -> list:
    mesh = init_device_mesh("cpu", mesh_dims[0], mesh_dim_names=mesh_dims[1])
    for dims in flatten:  # so torch's merge pass (and our groups="existing") can merge
        torch_mesh.flatten(mesh[dims])
    return [
        run_variants(mesh, src, dst, shape, rank, iters=iters, warmup=warmup, cost=cost)
        for src, dst, shape in points
    ]


def wall_bench(
    points: Sequence[tuple[str, str, tuple[int, ...]]],
    *,
    mesh=WALL_MESH,
    flatten=(WALL_MESH[1],),
    iters: int = 15,
    warmup: int = 2,
    cost: CostModel | None = None,
    timeout: float = 300.0,
) -> dict:
    """Each (src, dst, global shape) of ``points`` run three ways (:func:`run_variants`) on
    one gloo rank per position of ``mesh`` (sizes, names), with the ``flatten`` dims'
    flattened meshes created: per point the medians, ours/torch, its interval and verdict."""
    world = math.prod(mesh[0])
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _wall_worker, world, (mesh, flatten, list(points), iters, warmup, cost), timeout=timeout
    )
    wall = time.perf_counter() - t0
    rows = []
    for i, (src, dst, shape) in enumerate(points):
        stats = {v: Stat.of([r[i]["samples"][k] for r in per_rank]) for k, v in enumerate(VARIANTS)}
        # torch's and our sample i ran in the same round: compared pairwise (wall_stats)
        faster = wall_stats.compare(stats["torch"].samples, stats["ours"].samples)
        lo, hi = faster["interval"]
        rows.append(
            dict(
                case=f"{src} -> {dst}",
                src=src,
                dst=dst,
                shape=list(shape),
                nbytes=math.prod(shape) * 4,
                equal=all(r[i]["equal"]["ours"] for r in per_rank),
                torch_equal=all(r[i]["equal"]["torch"] for r in per_rank),
                collectives=per_rank[0][i]["collectives"],
                **{f"{v}_ms": stats[v].median * 1e3 for v in VARIANTS},
                **{f"{v}_stderr_ms": stats[v].stderr * 1e3 for v in VARIANTS},
                # ours/torch, as the table's times read (the rule's torch/ours, inverted)
                ratio=1.0 / faster["ratio"],
                interval=[1.0 / hi, 1.0 / lo],
                verdict=faster["verdict"],
                slower=faster["verdict"] == "ours slower",
                samples_ms={v: [s * 1e3 for s in stats[v].samples] for v in VARIANTS},
            )
        )
    return {
        "mesh": {"sizes": list(mesh[0]), "names": list(mesh[1]), "flattened": ["+".join(f) for f in flatten]},
        "ranks": world,
        "iters": iters,
        "warmup": warmup,
        "cost_profile": cost.name if cost is not None else None,
        "cost_profile_used": cost is not None,
        "wall_s": wall,
        "rows": rows,
    }


def format_wall(res: dict) -> str:
    profile = res["cost_profile"] or "default (redist_opt's default model)"
    mesh = ",".join(f"{n}={s}" for n, s in zip(res["mesh"]["names"], res["mesh"]["sizes"]))
    lines = [
        f"wall clock: {res['ranks']} gloo ranks, mesh {mesh} "
        f"with {', '.join(res['mesh']['flattened'])} flattened, "
        f"median of {res['iters']} samples (slowest rank), ms per redistribute; "
        f"ours: groups=existing, cost profile {profile}",
        f"{'case':<28} {'shape':>9} {'size':>7} {'torch':>8} {'no merge':>9} {'ours':>8} {'ours/torch':>10} "
        f"{'95% interval':>13} {'colls':>5} {'eq':>3}  verdict",
    ]
    for r in res["rows"]:
        flags = [r["verdict"]] + ["torch WRONG"] * (not r["torch_equal"])
        shape = "x".join(map(str, r["shape"]))
        interval = "[{:.2f}, {:.2f}]".format(*r["interval"])
        colls = "/".join(str(r["collectives"][v]) for v in VARIANTS)
        lines.append(
            f"{r['case']:<28} {shape:>9} {format_size(r['nbytes']):>7} {r['torch_ms']:>8.3f} "
            f"{r['torch_nomerge_ms']:>9.3f} {r['ours_ms']:>8.3f} {r['ratio']:>10.2f} "
            f"{interval:>13} {colls:>5} "
            f"{'ok' if r['equal'] else 'NO':>3}  {' '.join(flags)}"
        )
    lines.append(
        "colls = collectives issued by torch / torch no merge / ours; "
        "eq = every rank's result of ours equals "
        "torch's with its merge pass off, bit for bit (torch WRONG: torch's own merged result does not)\n"
        "95% interval of ours/torch: paired bootstrap over the interleaved rounds "
        "(redist_opt.measure.wall_stats); verdict: no change while the interval contains 1"
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


def cmd_bench(args) -> int:
    """``redist-opt bench``: exit 0, 1 when a result differs from torch's (``--part quality``:
    when ours is worse on some case, see :mod:`redist_opt.tools.quality`)."""
    if args.part == "quality":
        from redist_opt.tools.quality import cmd_quality

        return cmd_quality(args)
    sizes = parse_size_list(args.sizes)
    cases = [_parse_case(c) for c in args.case] if args.case else list(WALL_CASES)
    check_samples(args.iters, args.warmup)
    cost = cost_model("--profile", args.profile, None)[0] if args.profile else None
    result: dict = {"torch": torch.__version__, "cost_profile_path": args.profile, "load_average": loadavg()}
    note_load(end="\n\n")
    exit_code = 0
    if args.part in ("all", "planning"):
        result["planning"] = planning_bench(runs=args.plan_runs, cached_runs=args.plan_runs * 25, cost=cost)
        print(format_planning(result["planning"]), end="\n\n", flush=True)
    if args.part in ("all", "wall"):
        ranks = math.prod(WALL_MESH[0])
        print(f"running {len(cases)} cases x {len(sizes)} sizes on {ranks} gloo ranks ...", flush=True)
        points = [(src, dst, bench_shape(n)) for src, dst in cases for n in sizes]
        try:
            result["wall"] = wall_bench(
                points, iters=args.iters, warmup=args.warmup, cost=cost, timeout=args.timeout
            )
        except SpawnError as e:
            print(f"redist-opt bench: {e}", file=sys.stderr)
            return 1
        print(format_wall(result["wall"]))
        if not all(r["equal"] for r in result["wall"]["rows"]):
            print(
                "MISMATCH: some of our results differ from torch's with its merge pass off", file=sys.stderr
            )
            exit_code = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"\nwrote {args.json}")
    return exit_code
