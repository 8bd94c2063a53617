"""Per-rank body of test_gloo.py::test_gloo_compiled_tp_mlp_matches_eager: 4 real
gloo processes, a 2x2 (dp, tp) mesh. Each rank runs the tensor-parallel MLP of
compile_models eagerly with torch's DTensor, then compiled with
redist_opt.backend("aot_eager", groups="create"), and compares the loss and every
gradient exactly (integer-valued weights and inputs: sums are exact in any order).
The compiled loss reduction [P, P] -> [R, R] needs a dp+tp group that does not
exist (the mesh lists ranks column-major, so it is not the world group): it is
created while tracing, in the same order on every rank.
"""

from __future__ import annotations

import datetime
import os
import sys

# The tests folder (for ``support``); redist_opt itself is installed.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORLD = 4
COLLECTIVE_TIMEOUT_S = 120


def worker(rank: int, port: int) -> None:
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    import redist_opt
    from redist_opt.graph.backend import collectives
    from redist_opt.ir.cost import CostModel
    from support import compile_models

    warnings.filterwarnings("ignore")
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    try:
        # Ranks in column-major order: dp+tp is then not the world group's order,
        # so the merged all_reduce needs a new group (with init_device_mesh's
        # row-major mesh it would run on the world group).
        mesh = DeviceMesh("cpu", torch.tensor([[0, 2], [1, 3]]), mesh_dim_names=("dp", "tp"))
        dp = mesh.get_coordinate()[0]

        def inputs():
            g = torch.Generator().manual_seed(100 + dp)  # each dp rank its own batch shard
            x = torch.randint(-2, 3, (4, compile_models.D_IN), generator=g).float().requires_grad_()
            t = torch.randint(-2, 3, (4, compile_models.D_IN), generator=g).float()
            return x, t

        def run(model, fn):
            x, t = inputs()
            loss = fn(x, t)
            loss.backward()
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            return loss.detach(), x.grad, grads

        eager_model = compile_models.build_tp_mlp(mesh, seed=7)
        eager = run(eager_model, lambda x, t: compile_models.dp_tp_loss(eager_model, x, t, mesh))

        graphs = []
        from torch._dynamo.backends.debugging import boxed_nop

        def recording_aot_eager(gm, example_inputs):
            graphs.append(gm)
            return boxed_nop(gm, example_inputs)

        for inner in ("aot_eager", recording_aot_eager):
            torch._dynamo.reset()
            model = compile_models.build_tp_mlp(mesh, seed=7)
            compiled = torch.compile(
                lambda x, t, model=model: compile_models.dp_tp_loss(model, x, t, mesh),
                # The default (NCCL) model, under which merging the loss's dp and tp
                # all_reduces pays; gloo's profile (picked from this mesh's backend)
                # keeps them apart, and this test is about creating the group.
                backend=redist_opt.backend(inner, groups="create", cost=CostModel.default()),
                fullgraph=True,
            )
            got = run(model, compiled)
            who = f"rank {rank} ({inner if isinstance(inner, str) else 'recording aot_eager'})"
            assert torch.equal(got[0], eager[0]), f"{who}: loss {got[0]} != eager {eager[0]}"
            assert torch.equal(got[1], eager[1]), f"{who}: input gradient differs"
            for n in eager[2]:
                assert torch.equal(got[2][n], eager[2][n]), f"{who}: gradient of {n} differs"
        # the loss's [P, P] -> [R, R] became one all_reduce over a group created while tracing
        assert len(mesh._flatten_mapping) == 1, f"rank {rank}: flattened groups {list(mesh._flatten_mapping)}"
        flat = next(iter(mesh._flatten_mapping.values()))
        forward = collectives(graphs[0])
        assert ("all_reduce", flat.get_group(0).group_name) in forward, f"rank {rank}: forward {forward}"
        dist.barrier()
    finally:
        dist.destroy_process_group()
