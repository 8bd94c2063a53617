"""A tiny 2-layer tensor-parallel decoder compiled with the graph pass, for the
reassociation tests: one fake rank (inspection) or gloo ranks (values).

Each layer has attention-like q, k, v projections and an MLP with gate and up
(colwise), o and down (rowwise), plan as in torch's TP tutorial. In the backward
the input grad of every colwise projection is all_reduced over tp and the grads
are summed: reassociation folds each summed group into one all_reduce.

Usage as a script: ``python graph_reassociate_programs.py fake RANK`` or
``python graph_reassociate_programs.py gloo RANK WORLD PORT`` (prints JSON).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# Run as a script, this file's folder is on sys.path; the tests folder (for
# ``support``) must be too.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from redist_opt.graph_pass import GraphRewrites  # noqa: E402
from support.graph_pass_programs import Recorder, compile_program  # noqa: E402
from support.program_report import emit  # noqa: E402

DIM = 8


class Layer(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        h = x + self.o(self.q(x) * self.k(x) + self.v(x))
        return h + self.down(F.silu(self.gate(h)) * self.up(h))


PLAN = {
    **{n: ColwiseParallel() for n in ("q", "k", "v", "gate", "up")},
    **{n: RowwiseParallel() for n in ("o", "down")},
}


def build(tp_mesh, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(Layer(), Layer())
    for layer in model:
        parallelize_module(layer, tp_mesh, PLAN)
    return model


def run(rank: int, world: int, reassociate: bool, check: bool) -> dict:
    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    out = {}
    for mode in (["eager"] if check else []) + ["compiled"]:
        model = build(tp)
        x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
        if mode == "eager":
            rec, y = None, model(x)
            y.sum().backward()
            x_grad = x.grad.clone()
        else:
            rec = Recorder(meshes=tp, rewrites=GraphRewrites(reassociate=reassociate))
            y, x_grad = compile_program(model, x, rec)
        grads = [p.grad.to_local().clone() for p in model.parameters()]
        out[mode] = {"y": y.detach(), "x_grad": x_grad, "grads": grads, "rec": rec}
    rec = out["compiled"]["rec"]
    report = {"graphs": [{k: g[k] for k in ("before", "after", "explain")} for g in rec.graphs]}
    if check:
        e, c = out["eager"], out["compiled"]
        report["max_diff"] = max(
            float((a - b).abs().max())
            for a, b in zip([e["y"], e["x_grad"], *e["grads"]], [c["y"], c["x_grad"], *c["grads"]])
        )
    return report


if __name__ == "__main__":
    mode, rank = sys.argv[1], int(sys.argv[2])
    if mode == "fake":
        dist.init_process_group("fake", rank=rank, world_size=2)
        report = {k: run(rank, 2, k == "on", check=False) for k in ("off", "on")}
    else:
        world, port = int(sys.argv[3]), sys.argv[4]
        store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        report = {k: run(rank, world, k == "on", check=True) for k in ("off", "on")}
        dist.destroy_process_group()
    emit(report)
