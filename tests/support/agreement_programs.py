"""Per-rank bodies of test_graph_pass_agreement.py: compile-time agreement on slice dims
when ranks do not compile the same graphs. Kept free of pytest so spawned children
import it cheaply.

Both run on 4 gloo ranks and a 2x2 mesh: both dims have size 2, so every rank slice
DTensor puts in a graph needs agreement across ranks on the mesh dim it selects
over. Every compiled output is compared with the uncompiled program's (integer-valued
inputs), and each run of the pass is timed (``pass_seconds``).
"""

from __future__ import annotations

import torch
import torch._dynamo
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from support import graph_pass_programs as P

# Read by with_extra(): changed on one rank only, it makes Dynamo recompile there only.
EXTRA = 0


def with_extra(fn):
    """``fn(x) + EXTRA``: a graph that Dynamo guards on ``EXTRA``, whose chain does not
    depend on it (the add comes after the chain's last slice)."""

    def f(x):
        return fn(x) + EXTRA

    return f


def _compile(fn, x, recorder):
    """Compile and run ``fn`` (the pass's graphs recorded); the output."""
    out, _ = P.compile_program(fn, x, recorder)
    return out


def _compile_only(fn, x, recorder) -> dict:
    """Compile ``fn`` through the pass without running it (this rank alone compiles it)."""
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=recorder.backend(), fullgraph=True)(x)
    except Exception as e:  # the backend's PassDone, wrapped by Dynamo
        if "PassDone" not in repr(e) and not isinstance(e.__cause__, P.PassDone):
            raise
    return recorder.graphs[-1]


def _row(graph: dict) -> dict:
    return {
        "modified": graph.get("modified"),
        "before": P.total([graph["before"]]),
        "after": P.total([graph["after"]]),
        "seconds": graph.get("pass_seconds"),
        "explain": graph.get("explain"),
    }


def recompile_on_one_rank(rank: int, world: int) -> dict:
    """(a) Rank 0 compiles more graphs than the others.

    1. every rank: replicate -> shard (an all_reduce then this rank's block) agreed on 4 ranks;
    2. rank 0 only recompiles it (``EXTRA`` changed): the same chain, answered at once
       from the store, rewritten the same way, so the collectives still pair up when
       every rank runs it again;
    3. rank 0 only compiles a graph nobody else compiles: gives up after the timeout,
       the chain left as it was;
    4. every rank: a new program, agreed at once (the extra graphs shifted nothing);
    5. every rank: rank 0's lone program of step 3: the give-up holds for everyone, at once.
    """
    global EXTRA
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out: dict = {}
    fn = with_extra(P.replicate_then_shard(mesh))
    x = P.local_input("recompile", (8, 4), rank)
    ref = fn(x)
    rec = P.Recorder(meshes=mesh)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=rec.backend(), fullgraph=True)
    assert torch.equal(compiled(x), ref), f"rank {rank}: step 1 output differs"
    out["first"] = _row(rec.graphs[-1])
    if rank == 0:
        EXTRA = 1
    got = compiled(x)  # rank 0 recompiles here; every rank runs its graph
    assert torch.equal(got, ref + EXTRA), f"rank {rank}: step 2 output differs"
    out["graphs_compiled"] = len(rec.graphs)
    out["recompiled"] = _row(rec.graphs[-1])
    EXTRA = 0
    lone = P.replicate_then_shard(mesh)
    y = P.local_input("lone", (16, 4), rank)
    if rank == 0:
        out["lone"] = _row(_compile_only(lone, y, P.Recorder(meshes=mesh, stop_after_pass=True)))
    dist.barrier()
    gather = P.gather_then_own_block(mesh)
    z = P.local_input("gather", (4, 4), rank)
    rec = P.Recorder(meshes=mesh)
    assert torch.equal(_compile(gather, z, rec), gather(z)), f"rank {rank}: step 4 output differs"
    out["after"] = _row(rec.graphs[-1])
    rec = P.Recorder(meshes=mesh)
    assert torch.equal(_compile(lone, y, rec), lone(y)), f"rank {rank}: step 5 output differs"
    out["lone_everywhere"] = _row(rec.graphs[-1])
    return out


def pipeline_stages(rank: int, world: int) -> dict:
    """(b) Two rank sets compile different programs, like pipeline stages on a (pp, tp) mesh.

    1. each stage its own program, the stage's submesh given: agreed within the stage;
    2. both stages the same program: agreed within each stage, separately;
    3. the programs of 1 with the root mesh given (every rank of it asked): every
       agreement gives up after the timeout, the chains left as they were.
    """
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    stage_mesh = mesh["tp"]
    stage = mesh.get_coordinate()[0]
    programs = [(P.gather_then_own_block, (4, 4)), (P.replicate_then_shard, (8, 4))]
    out: dict = {"stage": stage}
    for step, meshes, which in (("own", stage_mesh, stage), ("same", stage_mesh, 0), ("root", mesh, stage)):
        make, shape = programs[which]
        fn = make(mesh)
        x = P.local_input(f"{step}{stage}", shape, rank)
        ref = fn(x)
        rec = P.Recorder(meshes=meshes)
        assert torch.equal(_compile(fn, x, rec), ref), f"rank {rank}: {step} output differs"
        out[step] = _row(rec.graphs[-1])
    return out
