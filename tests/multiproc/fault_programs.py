"""Programs the fault tests run on gloo ranks through fault_harness.run_program.

Each is ``program(ctx) -> {name: tensor}``; ``ctx.reference`` says whether this is
torch's run (merge pass off) or redist_opt's, and faults are injected in the
latter only. Inputs are integer-valued, so sums are exact in any order. Kept free
of pytest imports (spawned children import this module).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard


def _partial_input(mesh, placements, shape=(4, 6)):
    rank = dist.get_rank()
    local = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) + rank
    return DTensor.from_local(local, mesh, placements, run_check=False)


def reduce_on_2x2x2(ctx):
    """``P,P,R -> R,R,R`` on a 2x2x2 mesh (a merged all_reduce over dims 0 and 1 needs
    a new group under groups="create"), then ``P,R,P -> R,S(0),R``."""
    mesh = init_device_mesh("cpu", (2, 2, 2))
    with ctx.redistribution():
        return _ppr_and_prp(ctx, mesh, {})


def one_rank_skips_a_collective(ctx):
    """Every rank but 1 runs an all_reduce (optimized run only): the hang the watchdog must catch."""
    t = torch.ones(2)
    if not ctx.reference and ctx.rank != 1:
        dist.all_reduce(t)
    return {"t": t}


def _ppr_and_prp(ctx, mesh, out, shape=(4, 6)):
    with ctx.section("redistribute"):
        x = _partial_input(mesh, [Partial(), Partial(), Replicate()], shape)
        out["ppr"] = x.redistribute(mesh, [Replicate(), Replicate(), Replicate()]).to_local()
        y = _partial_input(mesh, [Partial(), Replicate(), Partial()])
        out["prp"] = y.redistribute(mesh, [Replicate(), Shard(0), Replicate()]).to_local()
    return out


def group_creation_fails_on_rank_1(ctx):
    """(e) ``P,P,R -> R,R,R`` and ``P,R,P -> R,S(0),R`` on 2x2x2 under groups="create":
    creating a merged group raises on rank 1 only (optimized run)."""
    from redist_opt.runtime import flattened_meshes

    mesh = init_device_mesh("cpu", (2, 2, 2))
    if not ctx.reference and ctx.rank == 1:

        def refuse(*args, **kwargs):
            raise RuntimeError("injected: this rank cannot create a communicator")

        flattened_meshes.create_flattened_mesh = refuse
    with ctx.redistribution():
        return _ppr_and_prp(ctx, mesh, {})


def stages_run_different_programs(ctx):
    """(c, eager) pipeline stages on a (pp=2, dp=2, tp=2) mesh: stage 0 reduces
    ``P,P -> R,R`` over (dp, tp) (a merged group created on first use), stage 1
    gathers ``S(0),R -> R,R`` (no new group); then every rank flattens
    (pp, dp) and all-reduces over it, a group whose members span both stages."""
    import torch.distributed._functional_collectives as funcol

    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    stage = mesh["dp", "tp"]
    out = {}
    with ctx.redistribution():
        with ctx.section("redistribute"):
            if mesh.get_coordinate()[0] == 0:
                x = _partial_input(stage, [Partial(), Partial()])
                out["stage"] = x.redistribute(stage, [Replicate(), Replicate()]).to_local()
            else:
                x = DTensor.from_local(
                    torch.arange(6.0).reshape(2, 3) + dist.get_rank(),
                    stage,
                    [Shard(0), Replicate()],
                    run_check=False,
                )
                out["stage"] = x.redistribute(stage, [Replicate(), Replicate()]).to_local()
    if not ctx.reference:  # the reference run's flatten is cached: the optimized run's is new
        with ctx.section("world"):
            pp_dp = mesh["pp", "dp"]._flatten("pp_dp")
            out["pp_dp"] = funcol.all_reduce(torch.ones(3) * dist.get_rank(), "sum", (pp_dp, 0)).wait()
    else:
        out["pp_dp"] = _pp_dp_reference(mesh)
    return out


def _pp_dp_reference(mesh):
    coord = mesh.get_coordinate()
    tp = coord[2]
    members = [r for r in range(8) if r % 2 == tp]  # (pp, dp) varies, tp fixed: row-major rank = 4pp+2dp+tp
    return torch.ones(3) * sum(members)


def profile_differs(ctx):
    """(f) ``P,P,R -> R,R,R`` on 2x2x2 under groups="create" with each rank's own
    ``REDIST_OPT_COST_PROFILE`` (set per rank by the test). At (64, 64) the nccl
    profile merges the two all_reduces into one over a new group and the gloo
    profile keeps two."""
    mesh = init_device_mesh("cpu", (2, 2, 2))
    with ctx.redistribution():
        return _ppr_and_prp(ctx, mesh, {}, shape=(64, 64))


def rank_3_fails_to_arrive(ctx):
    """(d) rank 3 reaches redist_opt's first planning late (``ctx.args[0]`` seconds
    late), or never: it exits (``"exit"``) or its process is killed (``"kill"``)."""
    import signal
    import time

    mesh = init_device_mesh("cpu", (2, 2, 2))
    how = ctx.args[0]
    if not ctx.reference and ctx.rank == 3:
        if how == "exit":
            os._exit(0)
        elif how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            time.sleep(float(how))
    with ctx.redistribution():
        return _ppr_and_prp(ctx, mesh, {})


def in_step_profile_with_a_late_rank(ctx):
    """(g) the ranks measure two steps with ``redist_opt.profile_steps`` while rank 3
    arrives ``ctx.args[1]`` seconds late at each (so its own measurements differ from its
    peers'), each into its own file in the folder ``ctx.args[0]`` (as on separate hosts);
    then ``P,P,R -> R,R,R`` and ``P,R,P -> R,S(0),R`` planned with that profile (optimized
    run): every rank must issue the same collectives."""
    import time

    import redist_opt

    mesh = init_device_mesh("cpu", (2, 2, 2))
    folder, late_s = ctx.args
    path = os.path.join(folder, f"in_step_rank{ctx.rank}.json")
    if not ctx.reference:
        with redist_opt.profile_steps(path):
            for _ in range(2):
                if ctx.rank == 3:
                    time.sleep(late_s)
                with ctx.redistribution():
                    _ppr_and_prp(ctx, mesh, {})
    with ctx.redistribution(cost=path):
        return _ppr_and_prp(ctx, mesh, {})


def tuned_with_a_late_rank(ctx):
    """(h) the ranks tune the step ``P,P,R -> R,R,R`` and ``P,R,P -> R,S(0),R`` with
    ``redist_opt.tune`` (eager, ``groups="create"``) while rank 3 arrives ``ctx.args[1]``
    seconds late at every step, so its own step times differ from its peers'; each rank
    writes its profile into its own file in the folder ``ctx.args[0]`` (as on separate
    hosts); then that step planned with the profile (optimized run): every rank must write
    the same decisions (the same bytes) and issue the same collectives."""
    import time

    import redist_opt

    mesh = init_device_mesh("cpu", (2, 2, 2))
    folder, late_s = ctx.args
    path = os.path.join(folder, f"tuned_rank{ctx.rank}.json")
    out = {}
    if not ctx.reference:

        def make_step(backend):
            def step():
                if ctx.rank == 3:
                    time.sleep(late_s)
                _ppr_and_prp(ctx, mesh, {})

            return step

        redist_opt.tune(make_step, path, rounds=4, warmup=1, groups=ctx.options["groups"])
    with ctx.redistribution(cost=path):
        return _ppr_and_prp(ctx, mesh, out)
