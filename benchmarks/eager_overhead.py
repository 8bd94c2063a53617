"""What redist_opt's eager path costs on top of torch's: a benchmark, not a test.

    python benchmarks/eager_overhead.py [--part enter|calls|handback|sympy|all] [--rounds N] [--json PATH]

Four measurements, each in a fresh process (so one part's imports do not load
another's):

1. ``enter``: entering and leaving an empty ``with redist_opt.enabled():`` block,
   median of 200, with torch alone, with torchtitan's models imported (the step
   bench's torchtitan modules: llama3 and its parallelize, loss, distributed
   utils; triton/datasets/wandb stubbed for the import if missing), and with
   transformers' Llama (``transformers.models.llama.modeling_llama``). Target:
   <= 0.05 ms with the frameworks imported.
2. ``calls``: the per-call time of ``DTensor.redistribute`` on a 2x2x2 mesh (dims
   a, b, c; a+c flattened) on the ``fake`` backend, one process as rank 0 of 8
   (collectives cost nothing, so what is left is the Python around them), every
   plan cached by warm-up calls: inside ``enabled()`` (routed) vs outside (torch).
   The modes alternate (ABAB) over ``--rounds`` rounds of ``--batch`` calls per
   transition; each round gives one ratio (ours / torch), and the median ratio is
   reported with a bootstrap 95% interval, separately for transitions where our
   plan issues as many collectives as torch's (target <= 1.05x) and where it
   issues fewer (target <= 1.0x). "no change" when the interval contains 1.
3. ``handback``: the same interleaved per-call timing for calls redist_opt hands
   back to torch's own function (``redistribute_local_tensor`` called as torch's
   test helpers call it: the graph-based planner requested, a non-default shard
   order, and an uneven gather pair that torch 2.13 merges wrongly, run with its
   merge pass off). Target: the ratio routed / torch is 1 (no change), or below 1
   where the merge pass is turned off.
4. ``sympy``: Python calls into sympy during 200 cached routed calls (target 0).

The numbers depend on the machine's load: run it on a quiet machine. It runs
against whichever redist_opt is first on ``sys.path`` (``PYTHONPATH=<checkout>``),
so two checkouts can be compared.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import time

ENTER_SETTINGS = ("torch", "torchtitan", "transformers")


# -- 1. entering and leaving enabled() ---------------------------------------------------


def _import_frameworks(setting: str) -> str:
    """Import what ``setting`` names; returns a note (what was stubbed, or why not)."""
    if setting == "torchtitan":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script too
        from benchmarks.step_bench.model import import_torchtitan

        stubbed = import_torchtitan()
        return f"stubbed for the import: {stubbed}" if stubbed else ""
    if setting == "transformers":
        import transformers.models.llama.modeling_llama  # noqa: F401
    return ""


def measure_enter(setting: str, n: int = 200) -> dict:
    import torch  # noqa: F401

    import redist_opt

    note = _import_frameworks(setting)
    with redist_opt.enabled():  # the first block of the process scans every module once
        pass
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with redist_opt.enabled():
            pass
        times.append(time.perf_counter() - t0)
    return {
        "setting": setting,
        "modules": len(sys.modules),
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": sorted(times)[int(0.9 * n)] * 1e3,
        "note": note,
    }


# -- 2. per-call time on the fake backend -------------------------------------------------


def _setup():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=8)
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    mesh["a", "c"]._flatten("a_c")
    R, P, S0, S1 = Replicate(), Partial(), Shard(0), Shard(1)
    shape = (64, 32)
    transitions = [
        ((S0, R, R), (R, R, R)),
        ((R, S0, R), (R, R, R)),
        ((R, R, S1), (R, R, R)),
        ((P, R, R), (R, R, R)),
        ((R, P, R), (R, S0, R)),
        ((S0, R, S0), (R, R, R)),
        ((P, P, P), (R, R, R)),
        ((P, P, P), (R, S0, R)),
        ((P, R, P), (R, R, R)),
        ((P, P, R), (S0, R, R)),
    ]
    cases = []
    for src, dst in transitions:
        full = torch.randn(shape)
        local = full
        for d, p in enumerate(src):  # rank 0's piece: chunk 0 of every sharded dim
            if p.is_shard():
                local = local.chunk(mesh.size(d), p.dim)[0]
        dt = DTensor.from_local(
            local.contiguous(), mesh, list(src), run_check=False, shape=full.shape, stride=full.stride()
        )
        cases.append((f"{_placements(src)} -> {_placements(dst)}", dt, list(dst)))
    return mesh, cases


def _placements(ps) -> str:
    return ",".join("R" if p.is_replicate() else "P" if p.is_partial() else f"S({p.dim})" for p in ps)


def _counts(mesh, dt, dst, routed: bool) -> int:
    import contextlib

    from torch.distributed.tensor.debug import CommDebugMode

    import redist_opt

    with redist_opt.enabled() if routed else contextlib.nullcontext(), CommDebugMode() as c:
        dt.redistribute(mesh, dst)
    return c.get_total_counts()


def _batch(mesh, dt, dst, n: int) -> float:
    redistribute = dt.redistribute
    t0 = time.perf_counter()
    for _ in range(n):
        redistribute(mesh, dst)
    return time.perf_counter() - t0


def _bootstrap(ratios: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(reps))
    return meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def _interleaved(run_batch, rounds: int, batch: int) -> tuple[list, list, list]:
    """``run_batch()`` (seconds for ``batch`` calls) timed as torch's and inside ``enabled()``
    (entered outside the timed loop), in rounds that alternate which goes first, after one
    warm-up batch of each (plans, programs and torch's caches built): per round the ratio
    ours/torch, and the seconds per call of each side."""
    import redist_opt

    with redist_opt.enabled():
        run_batch()
    run_batch()
    ratios, t_torch, t_ours = [], [], []
    for r in range(rounds):
        times = {}
        for mode in ("torch", "ours") if r % 2 == 0 else ("ours", "torch"):
            if mode == "ours":
                with redist_opt.enabled():
                    times[mode] = run_batch()
            else:
                times[mode] = run_batch()
        ratios.append(times["ours"] / times["torch"])
        t_torch.append(times["torch"] / batch)
        t_ours.append(times["ours"] / batch)
    return ratios, t_torch, t_ours


def measure_calls(rounds: int, batch: int) -> dict:

    mesh, cases = _setup()
    rows = []
    for label, dt, dst in cases:
        theirs, ours = _counts(mesh, dt, dst, False), _counts(mesh, dt, dst, True)
        ratios, t_torch, t_ours = _interleaved(functools.partial(_batch, mesh, dt, dst, batch), rounds, batch)
        group = "equal" if ours == theirs else ("fewer" if ours < theirs else "more")
        rows.append(
            {
                "transition": label,
                "group": group,
                "collectives": [theirs, ours],
                "ratios": ratios,
                "torch_us": statistics.median(t_torch) * 1e6,
                "ours_us": statistics.median(t_ours) * 1e6,
            }
        )
    groups = {}
    for g in ("equal", "fewer", "more"):
        pooled = [x for row in rows if row["group"] == g for x in row["ratios"]]
        if pooled:
            lo, hi = _bootstrap(pooled)
            groups[g] = {
                "median": statistics.median(pooled),
                "ci95": [lo, hi],
                "verdict": "no change" if lo <= 1.0 <= hi else ("slower" if lo > 1 else "faster"),
            }
    for row in rows:
        row["median"] = statistics.median(row["ratios"])
        del row["ratios"]
    return {"rows": rows, "groups": groups, "rounds": rounds, "batch": batch}


# -- 3. calls handed back to torch ---------------------------------------------------------


def _handback_setup():
    """(label, local tensor, current spec, target spec, use_graph_based_transform) of
    calls redist_opt hands back, on _setup's mesh (rank 0 of 8, a+c flattened)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta

    mesh, _ = _setup()
    R, S0, S1 = Replicate(), Shard(0), Shard(1)
    rows = [
        ("S(0),S(0),S(0) -> R,R,R graph-based", (64, 32), (S0, S0, S0), None, True),
        ("S(0)[b]S(0)[a],R -> R,R,R order", (64, 32), (S0, S0, R), (ShardOrderEntry(0, (1, 0)),), None),
        ("S(1),R,S(1) -> R,R,R uneven merge", (64, 30), (S1, R, S1), None, True),
    ]
    cases = []
    for label, shape, src, order, graph_based in rows:
        meta = TensorMeta(torch.Size(shape), (shape[1], 1), torch.float32)
        current = DTensorSpec(mesh, src, meta, shard_order=order)
        target = DTensorSpec(mesh, (R, R, R), meta)
        local = torch.randn(shape)
        for d, p in enumerate(src):  # rank 0's piece: chunk 0 of every sharded dim
            if p.is_shard():
                local = local.chunk(mesh.size(d), p.dim)[0]
        cases.append((label, local.contiguous(), current, target, graph_based))
    return cases


def _handback_batch(local, current, target, graph_based, n: int) -> float:
    import torch.distributed.tensor._redistribute as torch_redistribute

    t0 = time.perf_counter()
    for _ in range(n):  # looked up per call, as torch's callers do: routed inside enabled()
        torch_redistribute.redistribute_local_tensor(
            local, current, target, use_graph_based_transform=graph_based
        )
    return time.perf_counter() - t0


def measure_handback(rounds: int, batch: int) -> dict:
    import warnings

    warnings.simplefilter("ignore")  # the one-time "using torch's redistribute" warnings
    rows = []
    for label, local, current, target, graph_based in _handback_setup():
        run_batch = functools.partial(_handback_batch, local, current, target, graph_based, batch)
        ratios, t_torch, t_ours = _interleaved(run_batch, rounds, batch)
        lo, hi = _bootstrap(ratios)
        rows.append(
            {
                "transition": label,
                "torch_us": statistics.median(t_torch) * 1e6,
                "ours_us": statistics.median(t_ours) * 1e6,
                "median": statistics.median(ratios),
                "ci95": [lo, hi],
                "spread": [min(ratios), max(ratios)],
            }
        )
    return {"rows": rows, "rounds": rounds, "batch": batch}


# -- 4. sympy calls on cached calls ---------------------------------------------------------


def measure_sympy(calls: int = 200) -> dict:
    import redist_opt

    mesh, cases = _setup()
    counted = [0]

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if "/sympy/" in name or name.startswith("<lambdifygenerated"):
                counted[0] += 1

    with redist_opt.enabled():
        for _, dt, dst in cases:
            dt.redistribute(mesh, dst)  # first calls plan (sympy is expected here)
        sys.setprofile(profile)
        try:
            for i in range(calls):
                _, dt, dst = cases[i % len(cases)]
                dt.redistribute(mesh, dst)
        finally:
            sys.setprofile(None)
    return {"cached_calls": calls, "sympy_calls": counted[0]}


# -- driver ---------------------------------------------------------------------------------


def _in_subprocess(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args, "--child"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:] or ["failed"]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _report(results: dict) -> None:
    for r in results.get("enter", []):
        if "error" in r:
            print(f"enter/exit enabled() [{r.get('setting')}]: not measured: {r['error']}")
            continue
        print(
            f"enter/exit enabled() [{r['setting']:12}] {r['modules']:5d} modules: "
            f"median {r['median_ms']:.4f} ms"
            f" (p90 {r['p90_ms']:.4f})  {r['note']}"
        )
    calls = results.get("calls")
    if calls and "error" not in calls:
        print(
            f"\nper call on the fake backend, 2x2x2 (a+c flattened), {calls['rounds']} interleaved rounds "
            f"x {calls['batch']} calls:"
        )
        for row in calls["rows"]:
            print(
                f"  {row['transition']:22} collectives torch {row['collectives'][0]} "
                f"ours {row['collectives'][1]}"
                f"  torch {row['torch_us']:7.1f} us  ours {row['ours_us']:7.1f} us  ratio {row['median']:.3f}"
                f"  [{row['group']}]"
            )
        for g, s in calls["groups"].items():
            print(
                f"  {g:6} plans: median ratio {s['median']:.3f}, 95% CI [{s['ci95'][0]:.3f}, "
                f"{s['ci95'][1]:.3f}] ({s['verdict']})"
            )
    elif calls:
        print(f"per call: not measured: {calls['error']}")
    handback = results.get("handback")
    if handback and "error" not in handback:
        print(
            f"\nhanded-back calls, {handback['rounds']} interleaved rounds x {handback['batch']} calls"
            " (ratio routed / torch, median [bootstrap 95% CI] (min-max of rounds)):"
        )
        for row in handback["rows"]:
            print(
                f"  {row['transition']:36} torch {row['torch_us']:7.1f} us  ours {row['ours_us']:7.1f} us"
                f"  ratio {row['median']:.3f} [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]"
                f" ({row['spread'][0]:.2f}-{row['spread'][1]:.2f})"
            )
    elif handback:
        print(f"handed-back calls: not measured: {handback['error']}")
    sym = results.get("sympy")
    if sym:
        print(
            f"\nsympy calls in {sym.get('cached_calls')} cached routed calls: {sym.get('sympy_calls', sym)}"
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=["enter", "calls", "handback", "sympy", "all"])
    ap.add_argument("--setting", default="torch", choices=ENTER_SETTINGS, help="imports for --part enter")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # one measurement in this fresh process, JSON on the last line
        if args.part == "enter":
            res = measure_enter(args.setting)
        elif args.part == "calls":
            res = measure_calls(args.rounds, args.batch)
        elif args.part == "handback":
            res = measure_handback(args.rounds, args.batch)
        else:
            res = measure_sympy()
        print(json.dumps(res))
        return
    results: dict = {}
    if args.part in ("enter", "all"):
        results["enter"] = [
            dict(_in_subprocess(["--part", "enter", "--setting", s]), setting=s) for s in ENTER_SETTINGS
        ]
    if args.part in ("calls", "all"):
        results["calls"] = _in_subprocess(
            ["--part", "calls", "--rounds", str(args.rounds), "--batch", str(args.batch)]
        )
    if args.part in ("handback", "all"):
        results["handback"] = _in_subprocess(
            ["--part", "handback", "--rounds", str(args.rounds), "--batch", str(args.batch)]
        )
    if args.part in ("sympy", "all"):
        results["sympy"] = _in_subprocess(["--part", "sympy"])
    _report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
