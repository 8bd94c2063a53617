"""The ``redist-opt`` command: ``demo``, ``explain``, ``calibrate`` and ``bench``.

Errors are one line naming the offending argument, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

__all__ = ["main"]


class CliError(Exception):
    pass


def _parse_mesh(text: str):
    sizes, names = [], []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        if "=" in part:
            name, size = part.split("=", 1)
        else:
            name, size = f"d{i}", part
        try:
            sizes.append(int(size))
        except ValueError:
            raise CliError(f"--mesh: size {size!r} of dim {name!r} is not an integer") from None
        names.append(name.strip())
    if not sizes:
        raise CliError("--mesh: give dims as name=size,... (e.g. dp=2,cp=2,tp=2)")
    return tuple(sizes), tuple(names)


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise CliError(f"--shape: {text!r} is not a comma-separated list of integers") from None


def _parse_dtype(text: str):
    import torch

    dt = getattr(torch, text, None)
    if not isinstance(dt, torch.dtype):
        raise CliError(f"--dtype: unknown dtype {text!r} (e.g. float32, bfloat16)")
    return dt


def cmd_explain(args) -> int:
    """``redist-opt explain``: the naive and optimized plans, their cost, and why.

    Every bad argument becomes a :class:`CliError` naming it (one line, exit 2).
    """
    import contextlib
    import dataclasses
    import json

    import redist_opt
    from redist_opt import dump, visualize
    from redist_opt.placements import RedistributeError, normalize_placements

    spec = _explain_mesh(args.mesh, args.flatten or [])
    if args.backend:
        spec = dataclasses.replace(spec, backend=args.backend)
    shape = _parse_shape(args.shape)
    if any(s < 0 for s in shape):
        raise CliError(f"--shape: {args.shape!r} has a negative size")
    dtype = _parse_dtype(args.dtype)
    for flag, text, role in (("--src", args.src, "source"), ("--dst", args.dst, "target")):
        try:
            normalize_placements(text, mesh_shape=spec.sizes, tensor_ndim=len(shape), role=role)
        except RedistributeError as e:
            raise CliError(f"{flag}: {e}") from None
    try:
        naive = redist_opt.plan(spec, args.src, args.dst, shape=shape, dtype=dtype)
    except RedistributeError as e:
        raise CliError(f"--src/--dst: {e}") from None
    model, source = _explain_cost_model(args.cost_model, args.devices_per_host, spec)
    if args.rank_lists < 0:
        raise CliError(f"--rank-lists: {args.rank_lists} must be >= 0")

    dump_ctx = contextlib.nullcontext()
    if args.dump_dir is not None:
        try:
            os.makedirs(args.dump_dir, exist_ok=True)
        except OSError as e:
            raise CliError(f"--dump-dir: cannot create {args.dump_dir!r}: {e.strerror or e}") from None
        dump_ctx = _explain_env(dump.DUMP_DIR_ENV, args.dump_dir)
    with dump_ctx:
        try:
            dump.dump_pass_filter_from_env()
            # Without --cost-model / --devices-per-host the pipeline resolves the same
            # model itself, and records where it came from in the plan (and the dumps).
            given = None if args.cost_model is None and args.devices_per_host is None else model
            optimized = redist_opt.optimize(naive, groups=args.groups, cost=given, prefer=args.prefer)
        except ValueError as e:
            if isinstance(e, RedistributeError) or dump.DUMP_PASSES_ENV in str(e):
                raise CliError(str(e)) from None
            raise

    # Files first: an error there must not leave half the output on stdout.
    plans = [("naive", naive), ("optimized", optimized)]
    if args.svg:
        _explain_write("--svg", args.svg, lambda: visualize.plan_graph_svg(plans))
    if args.mesh_svg:
        _explain_write("--mesh-svg", args.mesh_svg, lambda: visualize.mesh_svg(spec, plans))

    kwargs = dict(cost_model=model, groups=args.groups, rank_limit=args.rank_lists, cost_source=source)
    if args.format == "json":
        print(json.dumps(dump.explain_data(naive, optimized, **kwargs), indent=2))
    elif args.format == "dot":
        print(visualize.plans_to_dot(plans, name="explain"), end="")
    else:
        print(dump.format_explain(naive, optimized, show_ir=not args.no_ir, **kwargs))
    if args.dump_dir is not None:
        n = len([f for f in os.listdir(args.dump_dir) if f.endswith(".txt")])
        print(f"redist-opt explain: {n} pass dump(s) (.txt + .dot) in {args.dump_dir}", file=sys.stderr)
    return 0


def _explain_mesh(text: str, flatten: list[str]):
    """``--mesh`` and ``--flatten`` -> MeshSpec; errors name the flag."""
    import redist_opt
    from redist_opt.placements import RedistributeError

    sizes, names = _parse_mesh(text)
    for name, size in zip(names, sizes):
        if not name:
            raise CliError(f"--mesh: {text!r} has a dim without a name (give name=size)")
        if not name.isidentifier():
            raise CliError(f"--mesh: dim name {name!r} must be an identifier such as dp or tp")
        if size < 1:
            raise CliError(f"--mesh: dim {name!r} has size {size}; sizes must be >= 1")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CliError(f"--mesh: dim name {dup[0]!r} is given twice")
    try:
        spec = redist_opt.MeshSpec(sizes=sizes, names=names)
    except RedistributeError as e:
        raise CliError(f"--mesh: {e}") from None
    groups = []
    for g in flatten:
        try:
            dims = spec.dims_of(g)
        except RedistributeError as e:
            raise CliError(f"--flatten {g}: {e}") from None
        if not dims:
            raise CliError(f"--flatten {g!r}: give mesh dims joined by '+', e.g. dp+cp")
        groups.append(g)
    return spec.with_flattened(groups) if groups else spec


def _explain_cost_model(profile: str | None, devices_per_host: int | None, spec=None):
    """(model, where it came from): --cost-model, else $REDIST_OPT_COST_PROFILE or --backend."""
    import dataclasses

    from redist_opt.cost import PROFILE_ENV, CostModel, resolve

    source = f"--cost-model {profile}"
    try:
        if profile is None:
            try:
                model, source = resolve(spec)
            except ValueError as e:
                raise CliError(str(e)) from None
        elif profile in ("nccl", "gloo"):
            model = CostModel.profile(profile)
        else:
            model = CostModel.load(profile)
    except OSError as e:
        raise CliError(f"--cost-model: cannot read {profile!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise CliError(f"--cost-model: {e}") from None
    if devices_per_host is not None:
        if devices_per_host < 1:
            raise CliError(f"--devices-per-host: {devices_per_host} must be >= 1")
        model = dataclasses.replace(model, devices_per_host=devices_per_host)
        source += f", --devices-per-host {devices_per_host}"
    return model, source


def _explain_env(name: str, value: str):
    import contextlib

    @contextlib.contextmanager
    def ctx():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

    return ctx()


def _explain_write(flag: str, path: str, render) -> None:
    from redist_opt.visualize import write_text

    try:
        text = render()
    except ValueError as e:
        raise CliError(f"{flag}: {e}") from None
    try:
        write_text(path, text)
    except OSError as e:
        raise CliError(f"{flag}: cannot write {path!r}: {e.strerror or e}") from None
    print(f"redist-opt explain: wrote {path}", file=sys.stderr)


def _explain_error(message: str):
    """argparse errors of ``explain``: one line naming the argument, exit 2 (no usage dump)."""
    print(f"redist-opt explain: error: {message}", file=sys.stderr)
    sys.exit(2)


# -- demo: a 3-D redistribution over 8 real gloo processes -------------------------

DEMO_MESH = ((2, 2, 2), ("dp", "cp", "tp"))
# Flattened meshes the demo job creates (as a training job would for its loss
# reductions); the whole mesh is also the world group, which exists anyway.
DEMO_FLATTEN = (("dp", "cp"), ("dp", "tp"))
DEMO_CASES = [
    # (src, dst, global shape)
    ("P,P,P", "R,S(0),R", (8, 6)),  # reduce_scatter first, then one all_reduce over dp+tp
    ("P,P,P", "R,R,R", (4, 4)),  # one all_reduce over the world group
    ("S(0),S(0),S(1)", "R,R,R", (5, 3)),  # uneven: one exact all_gather over dp+cp
    ("S(0),S(0),R", "S(1),S(1),R", (6, 8)),  # one all_to_all over dp+cp
]


def _demo_spec():
    import redist_opt

    sizes, names = DEMO_MESH
    return redist_opt.MeshSpec(
        sizes=sizes, names=names, flattened=["+".join(f) for f in DEMO_FLATTEN] + ["+".join(names)]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _demo_input(mesh, src_p, shape, rank):
    import torch
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    # Small integers: every summation order gives the same bits, so results can
    # be compared exactly with torch's, however the optimizer regrouped the sums.
    full = (torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) * 7) % 11
    base = [Replicate() if p.is_partial() else p for p in src_p]
    dt = distribute_tensor(full, mesh, base, src_data_rank=None)
    if any(p.is_partial() for p in src_p):
        local = dt.to_local() + rank % 3  # every rank holds a different partial value
        dt = DTensor.from_local(local, mesh, src_p, run_check=False, shape=full.shape, stride=full.stride())
    return dt


def _demo_worker(rank: int, world: int, port: int, queue) -> None:
    import logging

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    import redist_opt
    from redist_opt.torch_dtensor import reference_semantics

    # torch warns on every rank that gloo's alltoall falls back to all_gather + chunk.
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sizes, names = DEMO_MESH
        mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
        for dims in DEMO_FLATTEN:
            mesh[dims]._flatten()
        results = []
        for src, dst, shape in DEMO_CASES:
            src_p = redist_opt.parse_placements(src)
            dst_p = redist_opt.parse_placements(dst)
            dt = _demo_input(mesh, src_p, shape, rank)
            with reference_semantics(), CommDebugMode() as ref_mode:
                ref = dt.redistribute(mesh, dst_p).to_local()
            with CommDebugMode() as torch_mode:
                merged = dt.redistribute(mesh, dst_p).to_local()
            with CommDebugMode() as our_mode:
                out = redist_opt.redistribute(dt, dst_p).to_local()
            results.append(
                dict(
                    equal=bool(torch.equal(ref, out)),
                    torch_merge_equal=bool(torch.equal(ref, merged)),
                    ref_colls=ref_mode.get_total_counts(),
                    torch_colls=torch_mode.get_total_counts(),
                    our_colls=our_mode.get_total_counts(),
                    t_ref=_median_time(lambda: dt.redistribute(mesh, dst_p), reference_semantics),
                    t_torch=_median_time(lambda: dt.redistribute(mesh, dst_p)),
                    t_our=_median_time(lambda: redist_opt.redistribute(dt, dst_p)),
                )
            )
        queue.put((rank, results, None))
    except Exception:  # report to the parent instead of hanging the others
        import traceback

        queue.put((rank, None, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def _median_time(fn, context=None, repeat: int = 7) -> float:
    """Median wall time of ``fn`` after the first (planning) call, in seconds."""
    import contextlib

    import torch.distributed as dist

    times = []
    with context() if context else contextlib.nullcontext():
        fn()
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def cmd_demo(args) -> int:
    import torch.multiprocessing as mp

    import redist_opt
    from redist_opt.cost import CostModel
    from redist_opt.dump import format_explain

    sizes, names = DEMO_MESH
    world = 1
    for s in sizes:
        world *= s
    spec = _demo_spec()
    flats = ", ".join("+".join(f) for f in DEMO_FLATTEN)
    print(f"redist-opt demo: {world} gloo processes on this CPU, mesh {spec.shape_str}, flattened: {flats}\n")
    for src, dst, shape in DEMO_CASES:
        naive = redist_opt.plan(spec, src, dst, shape=shape)
        print(format_explain(naive, redist_opt.optimize(naive), cost_model=CostModel.default(), show_ir=False))
        print()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    print(f"executing on {world} ranks (gloo, 127.0.0.1:{port}) ...", flush=True)
    pc = mp.start_processes(
        _demo_worker, args=(world, port, queue), nprocs=world, join=False, start_method="spawn"
    )
    reports = {}
    deadline = time.time() + args.timeout
    while len(reports) < world and time.time() < deadline:
        try:
            rank, results, err = queue.get(timeout=1.0)
        except Exception:
            if not all(p.is_alive() for p in pc.processes) and queue.empty():
                break
            continue
        if err:
            print(f"rank {rank} failed:\n{err}", file=sys.stderr)
            pc.join()
            return 1
        reports[rank] = results
    pc.join(timeout=30)
    if len(reports) < world:
        print(f"demo: only {len(reports)}/{world} ranks reported before the timeout", file=sys.stderr)
        return 1
    ok = True
    print()
    print("collectives and wall time per redistribution (median of 7 runs, slowest rank):")
    header = f"{'case':<38} {'equal':>6} {'torch no-merge':>15} {'torch merge':>12} {'redist_opt':>11}"
    print(header)
    for i, (src, dst, shape) in enumerate(DEMO_CASES):
        rows = [reports[r][i] for r in range(world)]
        equal = all(r["equal"] for r in rows)
        ok &= equal
        t = {k: max(r[k] for r in rows) * 1e3 for k in ("t_ref", "t_torch", "t_our")}
        torch_ok = "" if all(r["torch_merge_equal"] for r in rows) else " WRONG"
        case = f"{src} -> {dst} {shape}"
        print(
            f"{case:<38} {str(equal):>6} {rows[0]['ref_colls']:>3} {t['t_ref']:>7.2f} ms "
            f"{rows[0]['torch_colls']:>2} {t['t_torch']:>5.2f} ms{torch_ok} "
            f"{rows[0]['our_colls']:>2} {t['t_our']:>5.2f} ms"
        )
    print()
    if ok:
        print(f"every rank's result equals torch's redistribute (merge pass disabled), bit for bit, on {world} ranks")
    else:
        print("MISMATCH against torch's redistribute")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="redist-opt", description=__doc__.splitlines()[0])
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
    )
    ex.error = _explain_error
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
    ex.add_argument("--format", default="text", choices=["text", "json", "dot"],
                    help="text (default), json (schema redist_opt.explain/1) or dot (plan graph)")
    ex.add_argument("--rank-lists", type=int, default=2, metavar="K",
                    help="rank lists shown per collective (first K groups; default 2)")
    ex.add_argument("--no-ir", action="store_true", help="text format: leave out the IR listings")
    ex.add_argument("--dump-dir", metavar="DIR",
                    help="write the IR before the pipeline and after each pass that changed it")
    ex.add_argument("--svg", metavar="FILE", help="write the plan graph (naive | optimized) as SVG")
    ex.add_argument("--mesh-svg", metavar="FILE", help="write the mesh diagram (ranks per collective) as SVG")
    ex.set_defaults(func=cmd_explain)

    from . import bench

    cal = sub.add_parser("calibrate", help="measure gloo collectives and fit a cost profile (JSON)")
    bench.add_calibrate_arguments(cal)
    cal.set_defaults(func=bench.cmd_calibrate)

    be = sub.add_parser("bench", help="planning speed, and wall clock vs torch over 4 gloo processes")
    bench.add_bench_arguments(be)
    be.set_defaults(func=bench.cmd_bench)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from redist_opt.placements import RedistributeError

    try:
        return args.func(args)
    except (CliError, RedistributeError) as e:
        print(f"redist-opt {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
