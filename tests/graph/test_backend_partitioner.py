"""``redist_opt.backend("aot_eager")`` partitions forward and backward as torch's own
``aot_eager`` backend does (min-cut rematerialization), so the two differ only by the
graph pass: the default partitioner keeps different values for the backward."""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.backends.debugging import aot_eager

import redist_opt
from redist_opt.graph import backend as backend_module


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)) * torch.sigmoid(self.up(x)))


def _ops(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _graphs_of_torchs_aot_eager(model, x) -> list[list[str]]:
    graphs = []

    def record(gm, inputs):
        graphs.append(_ops(gm))
        return gm

    from functorch.compile import make_boxed_compiler

    boxed = make_boxed_compiler(record)
    torch.compile(
        model, backend=lambda gm, inputs: aot_eager(gm, inputs, fw_compiler=boxed, bw_compiler=boxed)
    )(x).sum().backward()
    return graphs


def _graphs_of_ours(model, x, monkeypatch) -> list[list[str]]:
    graphs = []
    real = backend_module.graph_compiler

    def recording(inner):
        compile_one = real(inner)

        def run(gm, inputs):
            graphs.append(_ops(gm))
            return compile_one(gm, inputs)

        return run

    monkeypatch.setattr(backend_module, "graph_compiler", recording)
    torch.compile(model, backend=redist_opt.backend("aot_eager"))(x).sum().backward()
    return graphs


def test_aot_eager_inner_partitions_as_torchs_aot_eager(monkeypatch):
    torch.manual_seed(0)
    model, x = _Mlp(), torch.randn(4, 8, requires_grad=True)
    torch._dynamo.reset()
    theirs = _graphs_of_torchs_aot_eager(model, x)
    torch._dynamo.reset()
    ours = _graphs_of_ours(model, x, monkeypatch)
    torch._dynamo.reset()
    assert len(theirs) == len(ours) == 2  # forward, backward
    assert ours == theirs
