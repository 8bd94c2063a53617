"""A rank-free model of torch 2.13's merge pass: how many collectives the shipped
``DTensor.redistribute`` issues for a plan's redistribution, and that plan itself.

The collective cap (the default of :class:`redist_opt.ir.options.PlanOptions`)
needs torch's count without running torch and
without a rank: :func:`torch_merged_plan` replays
``torch.distributed.tensor._redistribute._optimize_transform_infos`` on a naive
plan's steps (which are torch's greedy transform infos, one per mesh dim, size-1
dims included) and lowers the result with :func:`~redist_opt.ir.lower.lower_steps`,
so its collectives and bytes are counted exactly as our optimized plans' are.

torch's rules (torch/distributed/tensor/_redistribute.py, 2.13.0):

1. only consecutive transforms merge; a run is the maximal sequence of
   all_reduce / reduce_scatter / all_gather transforms whose (src, dst) are
   mergeable with the run's first (equal, or sum/avg partials with one dst);
2. the whole run becomes one collective or none of it does;
3. a flattened mesh with the layout of the run's mesh dims sorted ascending must
   exist (the mesh needs dim names);
4. reduce_scatter runs in ascending, all_gather runs in descending mesh-dim order;
5. reduce_scatter: the outermost transform's logical size of the scattered dim is
   divisible by the product of the run's mesh-dim sizes. torch evaluates it with
   the calling rank's coordinate, so it may merge on some ranks only; the model
   merges such a run (our lowering pads uneven nested pieces), so its count is
   the fewest any rank issues;
6. all_gather: no evenness check.

The model counts the groups torch's merge pass finds, ``MeshSpec.torch_flattened_layouts``:
a MeshSpec read off a live DeviceMesh lists its root's ``_flatten`` meshes there, not
the world group nor an ``_unflatten`` view's root dims, which redist_opt's own plans
may use but torch's merge pass does not consult. The tests check the model against
torch's own counts (``tests/runtime/test_collective_cap.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.distributed.tensor.placement_types import Partial

from redist_opt.ir import symbolic as sym
from redist_opt.ir.lower import lower_steps
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.ops import StepInfo, local_shape
from redist_opt.ir.steps import avg_is_linear

__all__ = ["merge_runs", "torch_merged_steps", "torch_merged_plan", "torch_collective_count"]

_MERGEABLE = ("all_gather", "all_reduce", "reduce_scatter")


def _mergeable(a: StepInfo, b: StepInfo) -> bool:
    """torch's ``are_placements_mergeable``."""
    if (a.src, a.dst) == (b.src, b.dst):
        return True
    if a.dst != b.dst or not (a.src.is_partial() and b.src.is_partial()):
        return False
    return a.src.reduce_op in ("sum", "avg") and b.src.reduce_op in ("sum", "avg")


def merge_runs(steps: Sequence[StepInfo]) -> list[tuple[int, int]]:
    """(start, end) of every run torch's loop forms, single steps included."""
    out, i = [], 0
    while i < len(steps):
        j = i + 1
        if steps[i].kind in _MERGEABLE and not steps[i].variant:
            while (
                j < len(steps)
                and steps[j].kind in _MERGEABLE
                and not steps[j].variant
                and _mergeable(steps[j], steps[i])
            ):
                j += 1
        out.append((i, j))
        i = j
    return out


def _merges(mesh: MeshSpec, run: Sequence[StepInfo], dtype=None) -> bool:
    """Whether torch merges ``run`` on at least one rank, and our lowering of the
    merged step is that of torch (its group ranks members in mesh-dim order)."""
    if len(run) < 2 or mesh.names is None:
        return False
    if not avg_is_linear(dtype) and any(s.src.is_partial() and s.src.reduce_op == "avg" for s in run):
        # torch merges a sum/avg run into one sum and one division, which on integers
        # truncates once instead of once per mesh dim: not DTensor's result (its merge
        # pass off), so no plan of ours makes that merge and the cap does not count it.
        return False
    kind = run[0].kind
    dims = tuple(s.mesh_dims[0] for s in run)
    ascending = tuple(sorted(dims))
    if kind == "reduce_scatter" and dims != ascending:
        return False
    if kind == "all_gather" and dims != ascending[::-1]:
        return False
    if mesh.group(ascending).layout not in mesh.torch_flattened_layouts:
        return False
    real = tuple(d for d in ascending if mesh.sizes[d] > 1)  # rank_order drops size-1 dims
    if kind != "all_reduce" and mesh.rank_order(ascending) != real:
        return False  # torch's merged collective would not be DTensor's layout: we keep it split
    if kind == "reduce_scatter":
        outer = min(run, key=lambda s: s.mesh_dims[0])
        n = math.prod(mesh.sizes[d] for d in dims)
        return any(v % n == 0 for v in sym.possible_values(outer.logical_shape[outer.dst.dim], mesh.sizes))
    return True


def _merged_step(mesh: MeshSpec, run: Sequence[StepInfo]) -> StepInfo:
    dims = tuple(sorted(s.mesh_dims[0] for s in run))
    outer = min(run, key=lambda s: s.mesh_dims[0])  # the largest logical shape
    src, scale = run[0].src, 1
    if src.is_partial() and len({s.src.reduce_op for s in run}) > 1:
        # torch runs a sum+avg mix as a sum, then divides by the avg dims' sizes
        src = Partial("sum")
        scale = math.prod(mesh.sizes[s.mesh_dims[0]] for s in run if s.src.reduce_op == "avg")
    return StepInfo(run[0].index, dims, src, run[0].dst, outer.logical_shape, scale)


def torch_merged_steps(mesh: MeshSpec, steps: Sequence[StepInfo], dtype=None) -> list[StepInfo]:
    """``steps`` (torch's transform infos) after torch's merge pass, as the model runs it."""
    out: list[StepInfo] = []
    for start, end in merge_runs(steps):
        run = list(steps[start:end])
        if _merges(mesh, run, dtype):
            out.append(_merged_step(mesh, run))
        else:
            out.extend(run)
    return out


def torch_merged_plan(naive):
    """The plan torch 2.13 (merge pass on) runs for ``naive``'s redistribution
    (a ``Plan`` fresh from ``redist_opt.plan``: its steps are torch's)."""
    mesh = naive.mesh
    steps = torch_merged_steps(mesh, naive.steps, naive.dtype)
    if list(steps) == list(naive.steps):
        return naive
    graph = lower_steps(mesh, steps, local_shape(naive.shape, naive.src, mesh.sizes))
    return naive.replace(graph=graph, steps=tuple(steps))


def torch_collective_count(naive) -> int:
    """How many collectives torch 2.13's shipped redistribute issues for ``naive``'s
    redistribution (the fewest any rank issues), given ``naive.mesh``'s groups."""
    return torch_merged_plan(naive).num_collectives
