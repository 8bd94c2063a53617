"""Compile-only checks of ``redist_opt.backend()`` on one accelerator.

``python -m benchmarks.gpu_compile_check [--device cuda] [--json out.json]``

One process plays rank 0 of a 4-rank job on torch's ``fake`` process group (collectives are
issued, counted and return without communicating), so one GPU is enough to check what a
multi-GPU job's compile does: Inductor generates Triton code for the forward and backward,
redist_opt's graph pass rewrites the collectives, and Inductor's own distributed passes
(``aten_distributed_optimizations``: overlap scheduling and collective bucketing) run after it.

For each variant (torch's Inductor, ``redist_opt.backend()``, each with and without torch's
overlap scheduling) it reports whether the compile succeeded, the first-step time (compile
included) and the collectives per step counted with ``CommDebugMode``. Times here are
compile times, not step times: the fake group moves no data.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import redist_opt

WORLD = 4
VARIANTS = ("torch", "ours", "torch+overlap", "ours+overlap")


class Block(nn.Module):
    """An MLP block, tensor-parallel over "tp" (column- then row-wise, Partial output)."""

    def __init__(self, dim: int):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _overlap(on: bool):
    """Inductor's overlap scheduling and collective bucketing, which run after our pass."""
    if not on:
        return contextlib.nullcontext()
    return torch._inductor.config.patch(
        {
            "aten_distributed_optimizations.enable_overlap_scheduling": True,
            "aten_distributed_optimizations.collective_bucketing": True,
        }
    )


def run_variant(name: str, mesh, device: str, dim: int) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(dim) for _ in range(2)).to(device)
    for b in blocks:
        parallelize_module(
            b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel(output_layouts=Partial())}
        )

    def step(x):
        for b in blocks:
            x = b(x)
        loss = DTensor.from_local((x * x).sum(), mesh, [Partial(), Partial()], run_check=False)
        return loss.full_tensor()

    backend = redist_opt.backend() if name.startswith("ours") else "inductor"
    compiled = torch.compile(step, backend=backend)
    x = torch.randn(8, dim, device=device)
    row: dict = {"variant": name}
    try:
        with _overlap(name.endswith("+overlap")):
            t0 = time.perf_counter()
            compiled(x).backward()
            if device != "cpu":
                torch.accelerator.synchronize()
            row["first_step_s"] = round(time.perf_counter() - t0, 2)
            comm = CommDebugMode()
            with comm:
                compiled(x).backward()
            row["collectives"] = comm.get_total_counts()
            row["ok"] = True
    except Exception as e:  # a variant that fails is the result, not the end of the check
        row |= {
            "ok": False,
            "error": f"{type(e).__name__}: {e}"[:2000],
            "trace": traceback.format_exc()[-4000:],
        }
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    dist.init_process_group("fake", rank=0, world_size=WORLD)
    mesh = init_device_mesh(args.device, (2, 2), mesh_dim_names=("dp", "tp"))
    info = {"device": args.device, "torch": torch.__version__, "world": WORLD, "dim": args.dim}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    rows = [run_variant(v, mesh, args.device, args.dim) for v in VARIANTS]
    for r in rows:
        status = f"{r['first_step_s']} s, {r['collectives']} collectives" if r["ok"] else r["error"][:300]
        print(f"{r['variant']:>14}: {'ok' if r['ok'] else 'FAILED'} {status}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
