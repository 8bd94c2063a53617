"""Programs for the memory tests: 4 gloo ranks (``redist_opt.tools.spawn.run_ranks``) run a
small tensor-parallel training step as torch's and as ours, eager and compiled, and measure
each variant's peak bytes in interleaved memory rounds (``redist_opt.measure``). Kept free
of pytest imports.

The step: a column-parallel then a row-parallel Linear (``parallelize_module``, a 1-D mesh
of every rank), the sum of the replicated output as the loss, backward and an SGD step. Its
redistributions are the row-parallel output's Partial -> Replicate and, in backward, the
column-parallel input gradient's Partial -> Replicate: one all_reduce each, which torch
and ours issue alike (the test checks the collectives the profiler saw)."""

from __future__ import annotations

import collections
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.profiler import ProfilerActivity, profile

import redist_opt
from redist_opt.measure import interleaved_memory_rounds
from redist_opt.torch_api import inductor

DIM, HIDDEN, BATCH = 64, 256, 32
ROUNDS = 4
# what the profiler names a gloo collective's work, on the thread that runs it
_COLLECTIVE_EVENT = "gloo:"


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _collectives(step) -> dict[str, int]:
    """The gloo collectives one step ran, by kind."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return dict(collections.Counter(e.name for e in prof.events() if e.name.startswith(_COLLECTIVE_EVENT)))


def tp_step_peaks(rank: int, world: int) -> dict:
    """This rank's peak bytes per memory round and the collectives of one step, per variant
    (eager/torch, eager/ours, aot_eager/torch, aot_eager/ours)."""
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    model = parallelize_module(_MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # the same on every rank (seeded): a replicated input, whose gradient (the column-parallel
    # input gradient, Partial) is summed in backward as a block's input gradient would be
    x = torch.randn(BATCH, DIM, requires_grad=True)
    with inductor.separate_compiles():
        forwards = {
            "eager": model,
            "aot_eager/torch": torch.compile(model, backend="aot_eager"),
            "aot_eager/ours": torch.compile(model, backend=redist_opt.backend("aot_eager")),
        }

        def make_step(name: str):
            forward = forwards["eager" if name.startswith("eager") else name]
            routed = name == "eager/ours"

            def step():
                opt.zero_grad()
                x.grad = None
                with redist_opt.enabled() if routed else contextlib.nullcontext():
                    loss = forward(x).sum()
                    loss.backward()
                opt.step()

            return step

        names = ("eager/torch", "eager/ours", "aot_eager/torch", "aot_eager/ours")
        steps = {name: make_step(name) for name in names}
        for step in steps.values():  # warm-up: the compiles happen here
            step()
            step()
        collectives = {name: _collectives(step) for name, step in steps.items()}
        peaks = interleaved_memory_rounds(steps, ROUNDS)
    dist.barrier()
    return {"rank": rank, "peaks": peaks, "collectives": collectives}
