"""Rank bodies of test_inductor_cache.py: a tensor-parallel block compiled with
Inductor by torch (``torch.compile(m)``) and by ``redist_opt.backend()`` in one
process, with Inductor's FX graph cache and AOTAutograd's cache on, and the
collectives each compiled step issues, counted as they run.

The block is classic (Megatron) TP on a 1-D mesh of 4 ranks: q, k, v, w1, w3
column-wise, o and w2 row-wise, activations local. torch all_reduces the input
grad of every column-wise projection in the backward (5) and each row-wise
output in the forward (2); redist_opt's graph pass all_reduces each sum of input
grads once (2 + 2). So the count of a step says whose graph ran.
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

WORLD = 4
_COLLECTIVES = (
    "all_reduce",
    "all_reduce_",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "all_to_all_single",
)


class CollectiveCounter(TorchDispatchMode):
    """Counts functional collectives issued while active (compiled graphs included)."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.kinds: list[str] = []

    @classmethod
    def is_infra_mode(cls) -> bool:
        # Dynamo skips frames under a user dispatch mode; an infra mode it leaves alone,
        # so the compiled code runs (and is counted) under this one.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = func._schema.name.split("::")[-1]
        if func.namespace == "_c10d_functional" and kind in _COLLECTIVES:
            self.count += 1
            self.kinds.append(kind)
        return func(*args, **(kwargs or {}))


class Block(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        x = x + self.o(self.q(x) * self.k(x) + self.v(x))  # elementwise stand-in for attention
        return x + self.w2(F.silu(self.w1(x)) * self.w3(x))


def build_block(mesh, d: int, hidden: int) -> nn.Module:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    block = Block(d, hidden)
    col, row = ColwiseParallel(), RowwiseParallel()
    plan = {"q": col, "k": col, "v": col, "w1": col, "w3": col, "o": row, "w2": row}
    return parallelize_module(block, mesh, plan)


def step_collectives(step, x) -> tuple[int, float]:
    """(collectives issued, loss) of one forward + backward of ``step``."""
    counter = CollectiveCounter()
    with counter:
        loss = step(x).sum()
        loss.backward()
    return counter.count, loss.item()


def _setup(cache_dir: str):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import warnings

    warnings.filterwarnings("ignore")
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))


def compile_in_order(
    rank: int,
    world: int,
    cache_dir: str,
    d: int,
    hidden: int,
    order: tuple,
    inductor_config: dict | None = None,
) -> dict:
    """Compile (after ``torch._dynamo.reset()``) and run one step of the same block by each
    backend of ``order`` ("torch": ``torch.compile(m)``; "ours": ``redist_opt.backend()``),
    in that order, in this process, with ``inductor_config`` patched into Inductor's config.
    Returns the eager step's count and, per compile, (backend, collectives of the step,
    loss, the cache counters it moved: {"aot_autograd.autograd_cache_hit": n, ...})."""
    from torch._dynamo.utils import counters

    import redist_opt

    mesh = _setup(cache_dir)
    # The input needs its grad, as a block's does inside a model: then the input grads of
    # q, k and v are reduced too.
    x = torch.randn(2, d, generator=torch.Generator().manual_seed(1)).requires_grad_()
    eager, eager_loss = step_collectives(build_block(mesh, d, hidden), x)
    # One untimed trace first, by torch's aot_eager (no Inductor, no cache read or
    # written): torch 2.11 and 2.12 name a process's first AOTAutograd trace of the block
    # differently from later ones (the same graphs, other node suffixes: permute_8 /
    # permute_7), and the FX graph cache keys on that code, so without it a compile
    # traced first could never be served to a later one in the same process.
    torch._dynamo.reset()
    step_collectives(torch.compile(build_block(mesh, d, hidden), backend="aot_eager"), x)
    runs = []
    for who in order:
        torch._dynamo.reset()
        backend = redist_opt.backend() if who == "ours" else "inductor"
        before = _cache_counts(counters)
        compiled = torch.compile(build_block(mesh, d, hidden), backend=backend)
        with torch._inductor.config.patch(inductor_config or {}):
            count, loss = step_collectives(compiled, x)
        hits = {k: v - before.get(k, 0) for k, v in _cache_counts(counters).items()}
        runs.append((who, count, loss, {k: v for k, v in hits.items() if v}))
    return {"eager": eager, "eager_loss": eager_loss, "runs": runs}


def _cache_counts(counters) -> dict:
    return {
        f"{group}.{k}": v
        for group in ("aot_autograd", "inductor")
        for k, v in counters[group].items()
        if "cache" in k
    }


def compile_reduce_then_slice(rank: int, world: int, cache_dir: str) -> dict:
    """Compile with ``redist_opt.backend()`` a function that all_reduces over the mesh's
    group and keeps this rank's block (the graph pass makes it one reduce_scatter,
    after a slice-agreement round with the other ranks) and run it: the collectives
    it issued, its output and the FX graph cache's counters. Its graph's inputs are
    tensors only (a DTensor program's graphs also take its DeviceMesh: see
    docs/inductor.md on why those miss in a fresh process)."""
    import torch.distributed._functional_collectives as funcol
    from torch._dynamo.utils import counters

    import redist_opt

    mesh = _setup(cache_dir)
    group = mesh.get_group()

    def f(x):
        return funcol.all_reduce(x * 2, "sum", group).chunk(world)[rank] + 1

    x = torch.arange(world * 6.0).reshape(world * 2, 3) + rank
    torch._dynamo.reset()
    counters.clear()
    counter = CollectiveCounter()
    with counter:
        out = torch.compile(f, backend=redist_opt.backend())(x)
    return {
        "kinds": counter.kinds,
        "out": out.tolist(),
        "cache": {k: v for k, v in _cache_counts(counters).items() if v},
    }


# Where one compile of the block by ``redist_opt.backend()`` spends its time, by the
# cumulative time cProfile gives each of these functions on one rank (they nest: the
# graph pass holds the agreement rounds, combining, ...; the backend's call holds the
# trace and the pass; Inductor's per-graph compile is apart for a lazily compiled backward).
PROFILED = {
    "first step (compile + run)": ("inductor_cache_programs.py", "step_collectives"),
    "backend call: AOT trace, graph pass, Inductor": ("graph/backend.py", "__call__"),
    "routed redistributions while tracing (all)": ("api/routing.py", "routed_redistribute_local_tensor"),
    "  planning them": ("api/planning.py", "plans_for"),
    "graph pass (all)": ("graph/backend.py", "run_graph_pass"),
    "  agreement: slice round": ("graph/agreement.py", "agree"),
    "  agreement: cost-profile check": ("graph/agreement.py", "check_profile"),
    "  finding chains": ("graph/raise_chains.py", "find_chains"),
    "  re-planning + lowering chains": ("graph/chain_decision.py", "decide_chain"),
    "  reassociation": ("graph/reassociate.py", "reassociate_all_reduces"),
    "  combining": ("graph/combine.py", "combine_collectives"),
    "cache key (backend uuid)": ("graph/cache_key.py", "rewritten_graph_key"),
    "Inductor per-graph compile": ("_inductor/compile_fx.py", "compile_fx_inner"),
}


def profile_compile(rank: int, world: int, cache_dir: str, d: int, hidden: int, inner: str) -> dict | None:
    """cProfile one compile + step of the block by ``redist_opt.backend(inner)``; on rank
    0, the cumulative seconds of each :data:`PROFILED` function."""
    import cProfile
    import pstats

    import redist_opt

    mesh = _setup(cache_dir)
    x = torch.randn(2, d, generator=torch.Generator().manual_seed(1)).requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(build_block(mesh, d, hidden), backend=redist_opt.backend(inner))
    profile = cProfile.Profile()
    profile.runcall(step_collectives, compiled, x)
    if rank != 0:
        return None
    stats = pstats.Stats(profile).stats
    out = {}
    for label, (path, name) in PROFILED.items():
        out[label] = max(
            (v[3] for (file, _, func), v in stats.items() if func == name and file.endswith(path)),
            default=0.0,
        )
    return out


if __name__ == "__main__":
    # python tests/support/inductor_cache_programs.py [inductor|aot_eager]: 4 gloo ranks,
    # an empty cache directory, the block at d=8, hidden=16; rank 0's profile.
    import sys
    import tempfile

    from redist_opt.tools.spawn import run_ranks

    with tempfile.TemporaryDirectory() as cache:
        inner = sys.argv[1] if len(sys.argv) > 1 else "inductor"
        (report, *_) = run_ranks(profile_compile, WORLD, (cache, 8, 16, inner), timeout=900)
    total = report["first step (compile + run)"]
    for label, seconds in report.items():
        print(f"{label:50s} {seconds:8.3f} s  {100 * seconds / total:5.1f}%")
