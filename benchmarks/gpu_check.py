"""What one GPU can check of redist_opt, in one command.

``python -m benchmarks.gpu_check [--json gpu_check.json] [--parts PART,...] [--dry-run]``
(parts: ``differential``, ``inductor``, ``nccl``, ``first_step``)

Run from the checkout's root (``redist_opt`` is imported from it; nothing needs installing beyond
torch with CUDA, numpy, sympy and networkx). Four parts, each in its own process (a crash, a CUDA
error or an NCCL hang ends that part, not the check), each reported as ``pass``, ``fail`` or
``skipped`` with its reason, into the JSON file and a printed summary:

a. ``differential``: the differential cases of ``tests/support/cases.py`` (the cases of
   ``tests/runtime/test_differential.py``) with CUDA tensors, through the tests' own harness
   (``tests/support/harness.py``: torch's ``DTensor.redistribute`` with its merge pass off
   against ``redist_opt.redistribute``, every local tensor bitwise, collective counts, the
   independent reference) under ``LocalTensorMode`` on the ``fake`` backend, meshes of up to 8
   virtual ranks; a fixed sample of one case in ``--every`` (tests/support/sampling.py's hash),
   within ``--budget-s``.
b. ``inductor``: ``benchmarks/gpu_compile_check.py``'s tensor-parallel MLP step on a 4-rank
   ``fake`` group: torch's Inductor and ``redist_opt.backend()``, each alone and composed with
   Inductor's ``aten_distributed_optimizations`` (overlap scheduling, collective bucketing);
   every variant must compile and run, Inductor must generate Triton kernels for ours (on
   CUDA), and ours must issue no more collectives per step than torch.
c. ``nccl``: a 1-rank NCCL group (a (1, 1) mesh): ``redist_opt.redistribute``,
   ``redist_opt.enabled()`` (eager), and a tensor-parallel MLP compiled with
   ``redist_opt.backend()`` (Inductor; and ``aot_eager`` with ``groups="create"``) plus
   hand-written all_reduces, each equal to torch's eager result bit for bit (integer values).
   On one rank DTensor (torch's and ours) skips the size-1 mesh dims, so the NCCL collectives
   that run are the hand-written ones (counted eagerly).
d. ``first_step``: the first step (compile included) of part b's step, torch's Inductor against
   ``redist_opt.backend()``, each side in a new process with empty Inductor and Triton cache
   directories, ``--repeats`` times interleaved; the medians and their ratio (ours / torch).
   A measurement: it fails only if a side does not run.

``--dry-run`` runs the same code paths on CPU: CPU tensors, gloo instead of NCCL, tiny sizes, a
sparser sample; the overlap variants of part b need Triton and a CUDA device and are skipped
where either is missing.
CI runs the dry run (``.ci/run``), and ``tests/benchmarks/test_gpu_check.py`` runs it too.
Without CUDA and without ``--dry-run`` every part is skipped and the exit status is 2; otherwise
it is 1 when a part failed, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PARTS = ("differential", "inductor", "nccl", "first_step")
MAX_VIRTUAL_RANKS = 8


# ----------------------------------------------------------------------------
# Settings: the GPU run and the dry run
# ----------------------------------------------------------------------------


def _settings(args) -> dict:
    """The sizes each part uses; ``--dry-run`` shrinks them, explicit flags win."""
    dry = args.dry_run
    defaults = {
        "device": "cpu" if dry else "cuda",
        "every": 400 if dry else 20,
        "budget_s": 60.0 if dry else 90.0,
        "dim": 32 if dry else 512,
        "repeats": 1 if dry else 2,
        "part_timeout_s": 600.0 if dry else 300.0,
        "total_s": 1800.0 if dry else 540.0,
    }
    for k in defaults:
        v = getattr(args, k, None)
        if v is not None:
            defaults[k] = v
    defaults["dry_run"] = dry
    return defaults


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _skip(reason: str, **details) -> dict:
    return {"status": "skipped", "reason": reason, **details}


def _fail(reason: str, **details) -> dict:
    return {"status": "fail", "reason": reason, **details}


def _pass(reason: str = "", **details) -> dict:
    return {"status": "pass", "reason": reason, **details}


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:1500]


# ----------------------------------------------------------------------------
# a. The differential cases on the device
# ----------------------------------------------------------------------------


def in_sample(case_id: str, every: int) -> bool:
    """tests/support/sampling.py's sample (kept here: that module imports pytest)."""
    return zlib.crc32(case_id.encode()) % every == 0


class _TorchOnDevice:
    """``torch`` for tests/support/reference.py: its tensor factories make tensors on the
    device, so the independent reference compares device tensors with device tensors."""

    def __init__(self, torch_module, device: str):
        self._torch = torch_module
        self._device = device

    def full(self, *args, **kwargs):
        kwargs.setdefault("device", self._device)
        return self._torch.full(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def _harness_on(device: str):
    """The tests' harness with its meshes, inputs and reference on ``device`` (the same
    patches on CPU, where they change nothing). Returns (support.harness, support.meshes)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import torch
    from support import harness, inputs, meshes, reference

    init_device_mesh, device_mesh = meshes.init_device_mesh, meshes.DeviceMesh
    # The mesh recipes name "cpu"; they look these two up at call time.
    meshes.init_device_mesh = lambda _dev, *a, **k: init_device_mesh(device, *a, **k)
    meshes.DeviceMesh = lambda _dev, *a, **k: device_mesh(device, *a, **k)
    random_tensor = inputs.random_tensor  # a seeded CPU generator: same values on every device
    inputs.random_tensor = lambda shape, dtype, seed: random_tensor(shape, dtype, seed).to(device)
    reference.torch = _TorchOnDevice(torch, device)
    return harness, meshes


def part_differential(s: dict) -> dict:
    import torch
    from torch.distributed._local_tensor import LocalTensorMode

    device = s["device"]
    harness, meshes = _harness_on(device)
    from support.cases import all_cases
    from support.inputs import build_input, parse_placement

    meshes.ensure_fake_pg()
    # The harness's inputs must really live on the device.
    f = meshes.MESHES["2x2x2"]
    with LocalTensorMode(f.nranks) as lm:
        mesh = meshes.get_mesh(f, lm)
        inp = build_input(mesh, lm, [parse_placement("P")] * 3, (4, 4), torch.float32, 0)
        devices = sorted({str(t.device) for t in inp.dt._local_tensor._local_tensors.values()})
    if devices != [str(torch.device(device, 0) if device == "cuda" else torch.device(device))]:
        return _fail(f"the harness's inputs are on {devices}, not on {device}")

    groups = all_cases()
    cases = [
        c
        for cs in groups.values()
        for c in cs
        if meshes.MESHES[c.mesh].nranks <= MAX_VIRTUAL_RANKS and in_sample(c.id, s["every"])
    ]
    total = sum(len(cs) for cs in groups.values())
    ran, passed, skipped, failures = 0, 0, 0, []
    t0 = time.perf_counter()
    for case in cases:
        if time.perf_counter() - t0 > s["budget_s"]:
            break
        ran += 1
        try:
            harness.run_case(case)
            passed += 1
        except BaseException as e:  # noqa: BLE001 - each case's outcome is the result
            if type(e).__name__ == "Skipped" or (isinstance(e, ModuleNotFoundError) and e.name == "pytest"):
                skipped += 1  # the harness's pytest.skip: no independent reference on that mesh
            elif isinstance(e, KeyboardInterrupt):
                raise
            else:
                failures.append({"case": case.id, "error": _error_text(e)})
    details = {
        "device_of_inputs": devices[0],
        "cases_total": total,
        "cases_selected": len(cases),
        "cases_ran": ran,
        "passed": passed,
        "skipped": skipped,
        "failed": len(failures),
        "failures": failures[:20],
        "seconds_in_cases": round(time.perf_counter() - t0, 1),
        "meshes": sorted({c.mesh for c in cases[:ran]}),
    }
    budget = f", budget of {s['budget_s']:.0f} s reached after {ran}" if ran < len(cases) else ""
    summary = f"{passed} of {ran} cases equal torch's on {device} ({skipped} skipped{budget})"
    if not ran:
        return _fail("no case ran", **details)
    if failures:
        return _fail(f"{len(failures)} of {ran} cases differ from torch's on {device}", **details)
    return _pass(summary, **details)


# ----------------------------------------------------------------------------
# b. Inductor (Triton on CUDA) with our backend and Inductor's distributed passes
# ----------------------------------------------------------------------------


def _kernel_counts(codes: list[str]) -> dict:
    text = "\n".join(codes)
    return {
        "generated_modules": len(codes),
        "triton_kernels": text.count("@triton.jit"),
        "cpp_kernels": text.count('extern "C"'),
    }


def part_inductor(s: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch._inductor.utils import run_and_get_code
    from torch.distributed.device_mesh import init_device_mesh

    from benchmarks import gpu_compile_check as G

    device = s["device"]
    triton = _triton_available()
    dist.init_process_group("fake", rank=0, world_size=G.WORLD)
    try:
        mesh = init_device_mesh(device, (2, 2), mesh_dim_names=("dp", "tp"))
        rows = {}
        # Every variant generates its code (no FX graph cache hit), so its kernels can be counted.
        # Inductor's overlap scheduling prices compute with Triton's get_dram_gbps, which
        # needs triton and a GPU driver (PyPI's CUDA wheels bring triton to CPU-only machines).
        overlap_missing = (
            "triton is not installed"
            if not triton
            else None
            if torch.cuda.is_available()
            else "no CUDA device (triton cannot query the DRAM bandwidth)"
        )
        with torch._inductor.config.patch(fx_graph_cache=False):
            for v in G.VARIANTS:
                if v.endswith("+overlap") and overlap_missing:
                    rows[v] = {
                        "variant": v,
                        "skipped": "Inductor's overlap scheduling prices compute with Triton's "
                        f"get_dram_gbps and {overlap_missing} (docs/inductor.md)",
                    }
                    continue
                row, codes = run_and_get_code(G.run_variant, v, mesh, device, s["dim"])
                row.pop("trace", None)
                rows[v] = row | _kernel_counts(codes)
    finally:
        dist.destroy_process_group()
    details = {"dim": s["dim"], "world": G.WORLD, "triton": triton, "variants": rows}
    ran = {v: r for v, r in rows.items() if "skipped" not in r}
    bad = [f"{v}: {r['error'][:300]}" for v, r in ran.items() if not r.get("ok")]
    if bad:
        return _fail("; ".join(bad), **details)
    problems = []
    for v, r in ran.items():
        if v.startswith("ours"):
            twin = ran.get(v.replace("ours", "torch", 1))
            if twin is not None and r["collectives"] > twin["collectives"]:
                problems.append(f"{v} issues {r['collectives']} collectives, torch {twin['collectives']}")
            if device == "cuda" and r["triton_kernels"] == 0:
                problems.append(f"{v}: Inductor generated no Triton kernel")
    if problems:
        return _fail("; ".join(problems), **details)
    counts = ", ".join(f"{v} {r['collectives']}" for v, r in ran.items())
    skipped = [v for v in rows if v not in ran]
    note = f"; skipped {', '.join(skipped)} ({overlap_missing})" if skipped else ""
    kernels = sum(r["triton_kernels"] for r in ran.values())
    return _pass(f"collectives per step: {counts}; {kernels} Triton kernels{note}", **details)


# ----------------------------------------------------------------------------
# c. enabled() and backend() over a 1-rank NCCL group
# ----------------------------------------------------------------------------


def part_nccl(s: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    import redist_opt

    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from support import compile_models

    device = s["device"]
    backend_name = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        if not dist.is_nccl_available():
            return _skip("torch built without NCCL")
        torch.cuda.set_device(0)
    dist.init_process_group(backend_name, store=dist.HashStore(), rank=0, world_size=1)
    checks: dict = {}
    try:
        mesh = init_device_mesh(device, (1, 1), mesh_dim_names=("dp", "tp"))
        checks["group_backend"] = str(dist.get_backend(mesh.get_group("tp")))

        def dt(placements):
            local = torch.arange(24, dtype=torch.float32, device=device).reshape(6, 4)
            return DTensor.from_local(local, mesh, placements, run_check=False)

        src, dst = [Partial(), Partial()], [Replicate(), Shard(0)]
        with CommDebugMode() as c_torch:
            want = dt(src).redistribute(mesh, dst).to_local()
        with CommDebugMode() as c_ours:
            got = redist_opt.redistribute(dt(src), dst, groups="create").to_local()
        with CommDebugMode() as c_enabled, redist_opt.enabled(groups="create"):
            got_enabled = dt(src).redistribute(mesh, dst).to_local()
        checks["eager"] = {
            "redistribute_equal": bool(torch.equal(got, want)),
            "enabled_equal": bool(torch.equal(got_enabled, want)),
            "collectives": {
                "torch": c_torch.get_total_counts(),
                "redistribute": c_ours.get_total_counts(),
                "enabled": c_enabled.get_total_counts(),
            },
        }

        def inputs():
            g = torch.Generator().manual_seed(100)
            x = torch.randint(-2, 3, (4, compile_models.D_IN), generator=g).float().to(device)
            t = torch.randint(-2, 3, (4, compile_models.D_IN), generator=g).float().to(device)
            return x.requires_grad_(), t

        def step(model, x, t):
            return compile_models.dp_tp_loss(model, x, t, mesh)

        def run(model, fn):
            x, t = inputs()
            loss = fn(x, t)
            loss.backward()
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            return loss.detach(), x.grad, grads

        eager_model = compile_models.build_tp_mlp(mesh, seed=7)
        eager = run(eager_model, lambda x, t: step(eager_model, x, t))
        compiled_rows = {}
        for label, make in (
            ("backend()", lambda: redist_opt.backend()),
            (
                'backend("aot_eager", groups="create")',
                lambda: redist_opt.backend("aot_eager", groups="create"),
            ),
        ):
            torch._dynamo.reset()
            model = compile_models.build_tp_mlp(mesh, seed=7)
            fn = torch.compile(lambda x, t, model=model: step(model, x, t), backend=make(), fullgraph=True)
            try:
                got_c = run(model, fn)
                compiled_rows[label] = {
                    "loss_equal": bool(torch.equal(got_c[0], eager[0])),
                    "input_grad_equal": bool(torch.equal(got_c[1], eager[1])),
                    "param_grads_equal": all(torch.equal(got_c[2][n], eager[2][n]) for n in eager[2]),
                }
            except Exception as e:  # noqa: BLE001 - reported, the other compile still runs
                compiled_rows[label] = {"error": _error_text(e), "trace": traceback.format_exc()[-3000:]}

        # Hand-written all_reduces over each mesh dim's group: the graph pass raises the chain and
        # lowers it back with the groups' real names.
        def hand_written(x):
            y = funcol.all_reduce(x * 2, "sum", (mesh, 0))
            return funcol.all_reduce(y + 1, "sum", (mesh, 1))

        x = torch.arange(12, dtype=torch.float32, device=device).reshape(3, 4)
        with CommDebugMode() as c_eager:
            want_h = hand_written(x)
        torch._dynamo.reset()
        try:
            # (CommDebugMode is a dispatch mode, which torch.compile refuses: eager counts only)
            got_h = torch.compile(hand_written, backend=redist_opt.backend(), fullgraph=True)(x)
            compiled_rows["hand-written all_reduces, backend()"] = {
                "equal": bool(torch.equal(got_h, want_h)),
                "collectives": {"eager": c_eager.get_total_counts()},
            }
        except Exception as e:  # noqa: BLE001
            compiled_rows["hand-written all_reduces, backend()"] = {
                "error": _error_text(e),
                "trace": traceback.format_exc()[-3000:],
            }
        checks["compiled"] = compiled_rows
        checks["measuring"] = _measure_on_the_group(mesh, device, x, hand_written, eager_model, step, inputs)
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
    wrong = [k for k, v in checks["eager"].items() if v is False]
    wrong += [f"measuring: {k}" for k, v in checks["measuring"].items() if v is False]
    for label, row in checks["compiled"].items():
        if "error" in row:
            wrong.append(f"{label}: {row['error'][:300]}")
        wrong += [f"{label}: {k}" for k, v in row.items() if v is False]
    if wrong:
        return _fail(f"differs from torch on 1-rank {backend_name}: " + "; ".join(wrong), **checks)
    return _pass(
        f"redistribute, enabled() and {len(checks['compiled'])} compiled programs equal torch's eager "
        f"results on a 1-rank {backend_name} group",
        **checks,
    )


def _measure_on_the_group(mesh, device, x, hand_written, model, step, inputs) -> dict:
    """``profile_steps`` (on CUDA its device events) and ``tune`` (eager) on the group."""
    import tempfile

    import torch.distributed._functional_collectives as funcol

    import redist_opt

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        with redist_opt.profile_steps(os.path.join(tmp, "in_step.json")) as costs:
            for _ in range(3):
                funcol.wait_tensor(hand_written(x))
        times = [m["time"] for m in costs.measurements]
        out["profile_steps_keys"] = len(costs.measurements)
        out["profile_steps_times_finite"] = bool(times) and all(math.isfinite(t) and t >= 0 for t in times)
        out["profile_steps_clock"] = "device events" if device != "cpu" else "host"

        def make_step(backend):
            def one():
                loss = step(model, *inputs())
                loss.backward()

            return one

        result = redist_opt.tune(make_step, os.path.join(tmp, "tuned.json"), rounds=3, warmup=1)
        out["tune_steps"] = result.steps
        out["tune_wrote_profile"] = os.path.exists(os.path.join(tmp, "tuned.json"))
    return out


# ----------------------------------------------------------------------------
# d. The first step's compile time, torch against ours
# ----------------------------------------------------------------------------


def first_step_side(s: dict, side: str) -> dict:
    """One cold first step (this process, empty caches given by the parent) of one side."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from benchmarks import gpu_compile_check as G

    dist.init_process_group("fake", rank=0, world_size=G.WORLD)
    try:
        mesh = init_device_mesh(s["device"], (2, 2), mesh_dim_names=("dp", "tp"))
        t0 = time.perf_counter()
        row = G.run_variant(side, mesh, s["device"], s["dim"])
        row["variant_s"] = round(time.perf_counter() - t0, 2)
    finally:
        dist.destroy_process_group()
    row.pop("trace", None)
    return row


def part_first_step(s: dict, passthrough: list[str]) -> dict:
    runs: dict[str, list] = {"torch": [], "ours": []}
    errors = []
    for _ in range(s["repeats"]):
        for side in ("torch", "ours"):  # interleaved
            res = _run_child(
                ["--child", "first_step_side", "--side", side, *passthrough], s["part_timeout_s"] / 2
            )
            if res.get("ok"):
                runs[side].append(res["first_step_s"])
            else:
                errors.append(f"{side}: {res.get('error') or res.get('reason', '?')}"[:400])
    details = {"dim": s["dim"], "first_step_s": runs}
    if errors:
        return _fail("; ".join(errors), **details)
    med = {k: statistics.median(v) for k, v in runs.items()}
    caches = "caches shared with the other parts: a dry run" if s["dry_run"] else "cold caches"
    details["median_s"] = med
    details["ratio_ours_over_torch"] = round(med["ours"] / med["torch"], 3)
    return _pass(
        f"first step, compile included ({caches}, median of {s['repeats']}): torch {med['torch']:.2f} s, "
        f"ours {med['ours']:.2f} s ({details['ratio_ours_over_torch']}x)",
        **details,
    )


# ----------------------------------------------------------------------------
# The driver: one process per part
# ----------------------------------------------------------------------------


def _run_child(child_args: list[str], timeout_s: float) -> dict:
    """Run ``python -m benchmarks.gpu_check CHILD_ARGS`` and return the JSON it wrote (or a
    failure naming what happened). On the GPU each child starts with empty Inductor and Triton
    caches (part d's first steps are cold). A dry run's children share one cache directory
    (given by the driver in GPU_CHECK_SHARED_CACHE) and compile on one thread: on a 2-core CPU
    machine Inductor's one-time C++ setup and its compile workers would otherwise cost minutes
    in every child, and a dry run's times mean nothing."""
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ)
        caches = Path(env.get("GPU_CHECK_SHARED_CACHE") or tmp)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
        env["TRITON_CACHE_DIR"] = str(caches / "triton")
        if "GPU_CHECK_SHARED_CACHE" in env:
            env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "benchmarks.gpu_check", *child_args, "--out", str(out)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-1500:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            return _fail(f"timed out after {timeout_s:.0f} s", stderr_tail=tail)
        if out.exists():
            res = json.loads(out.read_text())
            if proc.returncode != 0 and res.get("status") == "pass":
                res = _fail(f"exit status {proc.returncode} after reporting a pass", **res)
            return res
        return _fail(
            f"the part's process exited with status {proc.returncode} and no result",
            stderr_tail=proc.stderr[-3000:],
        )


def _child(args) -> int:
    s = _settings(args)
    import warnings

    warnings.filterwarnings("ignore")
    try:
        if args.child == "differential":
            res = part_differential(s)
        elif args.child == "inductor":
            res = part_inductor(s)
        elif args.child == "nccl":
            res = part_nccl(s)
        elif args.child == "first_step":
            res = part_first_step(s, _passthrough(args))
        elif args.child == "first_step_side":
            res = first_step_side(s, args.side)
        else:
            raise SystemExit(f"unknown part {args.child}")
    except Exception as e:  # noqa: BLE001 - the part's failure is its result
        res = _fail(_error_text(e), trace=traceback.format_exc()[-4000:])
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


def _passthrough(args) -> list[str]:
    out = ["--dry-run"] if args.dry_run else []
    for flag in ("every", "budget_s", "dim", "repeats", "part_timeout_s", "total_s"):
        v = getattr(args, flag)
        if v is not None:
            out += [f"--{flag.replace('_', '-')}", str(v)]
    return out


def _info(s: dict) -> dict:
    import torch

    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dry_run": s["dry_run"],
        "device": s["device"],
        "cuda_available": torch.cuda.is_available(),
        "triton": _triton_available(),
        "settings": s,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="gpu_check.json", help="where to write the results")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--dry-run", action="store_true", help="CPU tensors, gloo for NCCL, tiny sizes")
    parser.add_argument("--every", type=int, help="part a: run one differential case in N (GPU 20, dry 400)")
    parser.add_argument(
        "--budget-s", type=float, help="part a: start no case after this many seconds (GPU 90)"
    )
    parser.add_argument("--dim", type=int, help="parts b and d: the MLP's width (GPU 512, dry 32)")
    parser.add_argument("--repeats", type=int, help="part d: cold first steps per side (GPU 2, dry 1)")
    parser.add_argument("--part-timeout-s", type=float, help="each part's time limit (GPU 300, dry 600)")
    parser.add_argument(
        "--total-s", type=float, help="parts that would start after this many seconds are skipped (GPU 540)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)

    s = _settings(args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; the parts are {', '.join(PARTS)}")
    info = _info(s)
    results: dict = {}
    t_all = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if s["dry_run"]:
            shared = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_check_cache."))
            os.environ["GPU_CHECK_SHARED_CACHE"] = shared
        for part in parts:
            t0 = time.perf_counter()
            left = s["total_s"] - (t0 - t_all)
            if not s["dry_run"] and not info["cuda_available"]:
                res = _skip("no CUDA device (--dry-run runs the same checks on CPU)")
            elif left < 30:
                res = _skip(f"the check's {s['total_s']:.0f} s (--total-s) were spent")
            else:
                print(f"gpu_check: {part} ...", flush=True)
                res = _run_child(["--child", part, *_passthrough(args)], min(s["part_timeout_s"], left))
            res["seconds"] = round(time.perf_counter() - t0, 1)
            results[part] = res
            print(
                f"gpu_check: {part}: {res['status']} ({res['seconds']} s) {res.get('reason', '')}", flush=True
            )
    ok = not any(r["status"] == "fail" for r in results.values())
    nothing_ran = all(r["status"] == "skipped" for r in results.values())
    report = {"info": info, "ok": ok, "seconds": round(time.perf_counter() - t_all, 1), "parts": results}
    Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print(
        f"\ngpu_check summary (torch {info['torch']}, {'dry run on CPU' if s['dry_run'] else s['device']}"
        f"{', ' + info['gpu'] if 'gpu' in info else ''}; {report['seconds']} s; {args.json}):"
    )
    for part, r in results.items():
        print(f"  {part:<13} {r['status']:<8} {r['seconds']:>7.1f} s  {r.get('reason', '')[:300]}")
    if nothing_ran:
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
