"""Programs the compile tests trace: shared by test_compile.py (fake backend) and
gloo_compile_worker.py (real gloo ranks). Kept free of pytest imports."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Partial
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

D_IN, D_HIDDEN = 8, 16


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D_IN, D_HIDDEN, bias=False)
        self.down = nn.Linear(D_HIDDEN, D_IN, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def integer_valued_(module: nn.Module, seed: int) -> nn.Module:
    """Small integer weights: sums of products stay exact in float32 whatever the
    reduction order, so compiled and eager results can be compared bit for bit."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, generator=g).to(p.dtype))
    return module


def build_tp_mlp(mesh2d, seed: int = 0) -> nn.Module:
    """The MLP tensor-parallel over mesh dim "tp" (column- then row-wise); the
    row-wise output stays Partial over tp so the loss reduces it with dp."""
    model = integer_valued_(MLP(), seed)
    return parallelize_module(
        model,
        mesh2d["tp"],
        {"up": ColwiseParallel(), "down": RowwiseParallel(output_layouts=Partial())},
    )


def dp_tp_loss(model: nn.Module, x_local: torch.Tensor, target_local: torch.Tensor, mesh2d) -> torch.Tensor:
    """Each dp rank runs its batch shard; the loss (linear in the output, so partial
    sums may be reduced after it) is a sum over the batch (dp) and over the tp
    partial sums: one DTensor Partial on both mesh dims, made Replicate."""
    out_local = model(x_local)  # this rank's tp partial sum of its dp batch shard
    part = (out_local * target_local).sum()
    loss = DTensor.from_local(part, mesh2d, [Partial(), Partial()], run_check=False)
    return loss.full_tensor()
