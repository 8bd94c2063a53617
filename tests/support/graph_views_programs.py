"""Compiled programs on meshes built the way torchtitan builds them, for the graph-pass tests.

torchtitan 0.3.0's ``ParallelDims.build_mesh`` makes one 1-D world mesh and
``_unflatten``s it into every mesh it uses (degree-1 dims on the fake backend),
flattens groups of those views, and keeps dense and expert (sparse) meshes as
sibling views of the same world root. :func:`build_meshes` does exactly that
with the installed torch's ``DeviceMesh._unflatten``, for pp=1, dp_replicate=1,
dp_shard=2, cp=2, tp=2, ep=2 on 8 ranks (``full_dtensor`` layout), plus the
flattened ``dp_shard_cp`` group SimpleFSDP reduces gradients over.

Usage as a script (prints JSON): ``python graph_views_programs.py fake RANK`` (one
fake rank), ``... torchtitan RANK`` (the same with torchtitan's own ``ParallelDims``,
when installed) or ``... gloo RANK 8 PORT`` (8 gloo ranks, outputs checked).
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

# Run as a script, this file's folder is on sys.path; the tests folder (for
# ``support``) must be too.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from support.graph_pass_programs import Recorder, compile_program, local_input  # noqa: E402
from support.program_report import emit  # noqa: E402

DEGREES = {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2}


def build_meshes(world_size: int = 8, degrees=DEGREES) -> dict:
    """torchtitan's ``ParallelDims.build_mesh`` (spmd_backend="full_dtensor")."""
    d = degrees
    batch, fsdp = d["dp_replicate"] * d["dp_shard"], d["dp_shard"] * d["cp"]
    efsdp = fsdp * d["tp"] // d["ep"]
    world = init_device_mesh("cpu", (world_size,), mesh_dim_names=("world",))

    def unflatten(names, degs):
        # torchtitan's _mesh_exist: dp_shard is kept under full_dtensor, efsdp when ep > 1
        keep = {"dp_shard": True, "efsdp": d["ep"] > 1}
        override = {n: "fake" for n, g in zip(names, degs) if not keep.get(n, g > 1)}
        return world._unflatten(0, degs, names, backend_override=override)

    dataloading = unflatten(("pp", "batch", "cp", "tp"), (d["pp"], batch, d["cp"], d["tp"]))
    loss = dataloading["batch", "cp"]._flatten("loss_mesh")
    dense = unflatten(
        ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
        (d["pp"], d["dp_replicate"], d["dp_shard"], d["cp"], d["tp"]),
    )
    sparse = unflatten(("pp", "dp_replicate", "efsdp", "ep"), (d["pp"], d["dp_replicate"], efsdp, d["ep"]))
    dense["dp_shard", "cp"]._flatten("dp_shard_cp")
    return {
        "world": world,
        "dataloading": dataloading,
        "loss": loss,
        "dense": dense,
        "sparse": sparse,
        "spmd": dense["dp_shard", "cp", "tp"],
        "expert": sparse["efsdp", "ep"],
    }


def build_meshes_torchtitan(world_size: int = 8, degrees=DEGREES) -> dict:
    """The same meshes from torchtitan's own ``ParallelDims`` (when installed)."""
    from torchtitan.distributed import parallel_dims
    from torchtitan.distributed.parallel_dims import ParallelDims

    # torchtitan picks "cuda" when no accelerator is found; these meshes live on the CPU.
    parallel_dims.device_type = "cpu"
    d = degrees
    dims = ParallelDims(
        dp_replicate=d["dp_replicate"],
        dp_shard=d["dp_shard"],
        cp=d["cp"],
        tp=d["tp"],
        pp=d["pp"],
        ep=d["ep"],
        world_size=world_size,
        spmd_backend="full_dtensor",
    )
    world = dims.build_mesh()
    meshes = dims._global_meshes
    dense, sparse = meshes["dense"], meshes["sparse"]
    dense["dp_shard", "cp"]._flatten("dp_shard_cp")
    return {
        "world": world,
        "dataloading": meshes["dataloading"],
        "loss": meshes["loss"],
        "dense": dense,
        "sparse": sparse,
        "spmd": dense["dp_shard", "cp", "tp"],
        "expert": sparse["efsdp", "ep"],
    }


# -- programs: (make(meshes) -> fn, local input shape, mesh given to the pass) -------------------


def simplefsdp_grad(meshes):
    """SimpleFSDP's gradient on dp_shard x cp: funcol all_reduce over tp (a rowwise
    projection's partial), then DTensor ``P,P -> R,S(0)`` over (dp_shard, cp)."""
    m2 = meshes["dense"]["dp_shard", "cp"]
    tp = meshes["dense"]["tp"].get_group()

    def f(x):
        y = funcol.all_reduce(x, "sum", tp)
        d = DTensor.from_local(y, m2, [Partial(), Partial()], run_check=False)
        return d.redistribute(m2, [Replicate(), Shard(0)]).to_local()

    return f


def ppp_grad(meshes):
    """``P,P,P -> R,S(0),R`` on the spmd mesh (dp_shard, cp, tp), a slice of a view."""
    m3 = meshes["spmd"]

    def f(x):
        d = DTensor.from_local(x * 2, m3, [Partial(), Partial(), Partial()], run_check=False)
        return d.redistribute(m3, [Replicate(), Shard(0), Replicate()]).to_local() + 1

    return f


def expert_grad(meshes):
    """The expert mesh (efsdp, ep), a sibling view: ``P,P -> S(0),R``."""
    m2 = meshes["expert"]

    def f(x):
        d = DTensor.from_local(x, m2, [Partial(), Partial()], run_check=False)
        return d.redistribute(m2, [Shard(0), Replicate()]).to_local()

    return f


PROGRAMS = {
    "simplefsdp_grad": (simplefsdp_grad, (8, 4), "spmd"),
    "ppp_grad": (ppp_grad, (8, 4), "spmd"),
    "expert_grad": (expert_grad, (8, 4), "expert"),
}


def run_programs(rank: int, check=None, build=build_meshes) -> dict:
    """Each program compiled with the pass (meshes given as the backend would, and
    found among the live meshes); with ``check(name, fn, x, got)`` each is also run eagerly."""
    meshes = build()
    report = {}
    for name, (make, shape, m) in PROGRAMS.items():
        for given in ("given", "live"):
            rec = Recorder(meshes=meshes[m] if given == "given" else None)
            x = local_input(name, shape, rank)
            fn = make(meshes)
            got, _ = compile_program(fn, x, rec)
            if check is not None:
                check(name, fn, x, got)
            report[f"{given}/{name}"] = [
                {k: g[k] for k in ("before", "after", "explain", "modified")} for g in rec.graphs
            ]
    return report


def fake_main(rank: int, torchtitan: bool = False) -> dict:
    dist.init_process_group("fake", rank=rank, world_size=8)
    return run_programs(rank, build=build_meshes_torchtitan if torchtitan else build_meshes)


def gloo_main(rank: int, world: int, port: int) -> dict:
    """Every program eagerly and compiled with the pass on gloo ranks: outputs equal
    (inputs are integer-valued, so regrouped sums are exact)."""
    import torch

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)

    def check(name, fn, x, got):
        assert torch.equal(got, fn(x)), f"rank {rank} {name}: outputs differ"

    report = run_programs(rank, check)
    dist.destroy_process_group()
    return report


if __name__ == "__main__" and sys.argv[1] in ("fake", "torchtitan"):
    emit(fake_main(int(sys.argv[2]), torchtitan=sys.argv[1] == "torchtitan"))
elif __name__ == "__main__" and sys.argv[1] == "gloo":
    emit(gloo_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
