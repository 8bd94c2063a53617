"""A plain-torch tensor-parallel step, tuned with ``redist-opt tune`` (no harness of ours).

The model is a user's: a pre-norm MLP block in sequence parallel over ``tp`` and data
parallel over ``dp``, its parameters 2-D DTensors (``distribute_module``): the norm's
weight and bias replicated on both dims, the up projection column-parallel
(``Replicate, Shard(0)``), the down projection row-parallel (``Replicate, Shard(1)``). The
activations are sharded by batch over ``dp`` and by sequence over ``tp``, so the norm's
gradients arrive as ``Partial`` on both dims: torch reduces them over dp and tp one after
the other, redist_opt (``groups="create"``) in one all_reduce over both. Whether that pays
inside this step on these ranks is what tuning measures.

Tune (every rank), then restart with the profile::

    torchrun --nproc_per_node=4 -m redist_opt tune examples/tune_tp.py:make_step \\
        --out tuned.json --compiler inductor --groups create
    torchrun --nproc_per_node=4 examples/tune_tp.py --profile tuned.json --compiler inductor

The second command times torch's compiled step, ``redist_opt.backend()`` untuned and
``redist_opt.backend(cost="tuned.json")`` in interleaved rounds (``--rounds``) and prints
each one's ratio to torch with its 95% interval, then measures each one's peak bytes per step
in ``--memory-rounds`` interleaved memory rounds (docs/memory.md) and prints them. Sizes:
``TUNE_TP_DIM`` (default 256), ``TUNE_TP_SEQ`` (default 64) and ``TUNE_TP_BATCH`` (default 4)
in the environment.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile

if __name__ == "__main__":
    # One Inductor cache directory per rank, set before torch reads it: torch 2.13's AOTAutograd
    # cache served rank 0 the graph of torch's own compile that rank 2 had saved on an earlier
    # run on this machine, with rank 2's tensor-parallel group name baked in ("Could not resolve
    # the process group registered under the name 4" on ranks 0 and 1). redist_opt.backend()
    # keeps its graphs out of that cache; torch's side needs this.
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR",
        os.path.join(tempfile.gettempdir(), f"torchinductor_tune_tp_rank{os.environ.get('RANK', '0')}"),
    )

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor

import redist_opt
from redist_opt.graph.backend import INNER_COMPILERS
from redist_opt.measure import interleaved_step_peaks, interleaved_step_times, memory, wall_stats

GROUPS = "create"


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: DTensor) -> DTensor:  # x: [batch, seq, dim], (Shard(0), Shard(1))
        h = self.norm(x).redistribute(placements=[Shard(0), Replicate()])  # gather the sequence
        h = self.down(torch.relu(self.up(h)))  # (Shard(0), Partial) after the row-parallel matmul
        return x + h.redistribute(placements=[Shard(0), Shard(1)])  # reduce-scatter the sequence


_PLACEMENTS = {"up.weight": [Replicate(), Shard(0)], "down.weight": [Replicate(), Shard(1)]}


class _Job:
    """The model, optimizer and batch, built once per process (on first use)."""

    def __init__(self) -> None:
        size = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
        dim, seq, batch = size("TUNE_TP_DIM", 256), size("TUNE_TP_SEQ", 64), size("TUNE_TP_BATCH", 4)
        tp = 2
        self.mesh = init_device_mesh("cpu", (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        model = Block(dim)

        def place(name, module, mesh):
            for pname, param in list(module.named_parameters(recurse=False)):
                full = f"{name}.{pname}" if name else pname
                placements = _PLACEMENTS.get(full, [Replicate(), Replicate()])
                module.register_parameter(pname, nn.Parameter(distribute_tensor(param, mesh, placements)))

        self.model = distribute_module(model, self.mesh, place)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        x = torch.randn(batch * self.mesh.size(0), seq, dim, generator=torch.Generator().manual_seed(1))
        self.x = distribute_tensor(x, self.mesh, [Shard(0), Shard(1)])


_job: _Job | None = None


def job() -> _Job:
    global _job
    if _job is None:
        _job = _Job()
    return _job


def make_step(backend):
    """One training step, the model compiled with ``backend`` (None: eager)."""
    j = job()
    model = j.model if backend is None else torch.compile(j.model, backend=backend)

    def step():
        loss = model(j.x).sum().full_tensor()
        loss.backward()
        j.optimizer.step()
        j.optimizer.zero_grad()
        return loss

    return step


def _inside_enabled(step, cost: dict):
    with redist_opt.enabled(GROUPS, **cost):
        return step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="the profile redist-opt tune wrote")
    parser.add_argument("--compiler", choices=("eager", *INNER_COMPILERS), default="inductor")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--memory-rounds", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    compiler = None if args.compiler == "eager" else args.compiler
    # torch's step; ours untuned and tuned, as tune measured them: the model compiled with
    # redist_opt.backend(...) and the whole step inside redist_opt.enabled(...)
    steps = {"torch": make_step(compiler)}
    for name, cost in (("untuned", {}), ("tuned", {"cost": args.profile})):
        inner = make_step(None if compiler is None else redist_opt.backend(compiler, groups=GROUPS, **cost))
        steps[name] = functools.partial(_inside_enabled, inner, cost)
    for name in steps:  # warm-up: the compiles
        for _ in range(2):
            steps[name]()
    slowest = interleaved_step_times(steps, args.rounds)
    peaks = interleaved_step_peaks(steps, args.memory_rounds) if args.memory_rounds > 0 else {}
    if dist.get_rank() == 0:
        print(f"{args.rounds} interleaved rounds, {dist.get_world_size()} ranks, {args.compiler}")
        for name in ("untuned", "tuned"):
            c = wall_stats.compare(slowest["torch"], slowest[name])
            lo, hi = c["interval"]
            print(f"  torch/{name:<8} {c['ratio']:.3f}x [{lo:.3f}, {hi:.3f}]  {c['verdict']}")
        c = wall_stats.compare(slowest["untuned"], slowest["tuned"])
        lo, hi = c["interval"]
        print(f"  untuned/tuned  {c['ratio']:.3f}x [{lo:.3f}, {hi:.3f}]  {c['verdict']}")
        if peaks:
            print(f"peak bytes per step, {args.memory_rounds} memory rounds ({memory.RULE}):")
        for name, per_rank in peaks.items():
            summary = memory.peak_summary(per_rank)
            print(f"  {name:<8} {summary['bytes']:>12,} B  (spread {summary['spread']:.0%})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
