"""A model of torch 2.13's redistribute *with* its merge pass, on our step lists.

``torch_model(plan, flattened)`` answers: given the same flattened meshes, which
collectives does ``DTensor.redistribute`` (torch 2.13, merge pass ON) issue for
the redistribution of ``plan``, and how many bytes does each rank feed them?
It replays ``torch.distributed.tensor._redistribute._optimize_transform_infos``
on ``plan.steps`` (which replay torch's greedy planner, one step per mesh dim,
size-1 mesh dims included, as torch's transform infos) and lowers the result
with ``redist_opt.ir.lower.lower_steps``, so its ``Plan`` (``plan.replace(graph=...)``)
reports collectives and bytes exactly as our optimized plans do.

torch's rules, as read in torch/distributed/tensor/_redistribute.py (2.13.0):

1. only *consecutive* transforms merge; a run is the maximal sequence of
   transforms with a mergeable comm type (all_reduce, reduce_scatter,
   all_gather; never all_to_all, never local ops) whose ``src_dst_placements``
   are mergeable with the run's *first* one (equal, or sum/avg partials with the
   same destination);
2. all-or-nothing: the whole run becomes one collective or none of it does;
3. a flattened mesh whose layout equals the collapsed layout of the run's mesh
   dims *sorted ascending* must exist in the root's ``_flatten_mapping`` (never
   the world group, never created; the mesh needs dim names);
4. reduce_scatter runs must be in ascending mesh-dim order, all_gather runs in
   descending order ("non_ascending_mesh_dims" otherwise);
5. reduce_scatter: the outermost transform's logical size of the scattered dim
   must be divisible by the product of the run's mesh-dim sizes. That logical
   size is computed with the *calling rank's* coordinate, so the decision can
   differ between ranks (it is uniform within each flattened group): the model
   then returns one variant per class of ranks;
6. all_gather: no evenness check (hence the wrong result of pytorch PR 194457
   for uneven nested shards; the bytes torch moves equal the correct lowering's,
   ceil(ceil(L/a)/b) == ceil(L/(a*b)), so lowering the merged step with our
   ``lower_step`` counts them exactly).

The model is validated against torch's real ``CommDebugMode`` counts in
``test_public_cases.py::test_torch_merge_model_matches_torch``. The execution
helpers that run torch and redist_opt side by side are in ``exact_runs``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from torch.distributed.tensor.placement_types import Partial

from redist_opt import ir
from redist_opt.ir import layout
from redist_opt.ir import symbolic as sym
from redist_opt.ir.lower import lower_steps
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.plan import Plan
from redist_opt.torch_api import mesh as tm

__all__ = [
    "TorchModel",
    "signature",
    "torch_flattened_layouts",
    "torch_merged_steps",
    "torch_model",
]

_MERGEABLE = ("all_gather", "all_reduce", "reduce_scatter")


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------


def torch_flattened_layouts(device_mesh) -> frozenset:
    """Collapsed layouts of the flattened meshes torch's merge pass can find
    (``root._flatten_mapping``): not the world group, not the root's own dims, as the
    IR's layouts (read through redist_opt's mesh boundary, on every torch of the range)."""
    return layout.flatten_mapping_layouts(tm.internals(device_mesh))


def _layouts_of(mesh: MeshSpec, flattened) -> frozenset:
    if flattened is None:
        return frozenset(mesh.flattened_layouts)
    out = set()
    for g in flattened:
        if hasattr(g, "check_orthogonal"):  # already a layout
            out.add(g)
        else:
            out.add(mesh.group(tuple(sorted(mesh.dims_of(g)))).layout)
    return frozenset(out)


def _comm_type(step: ir.StepInfo) -> str | None:
    kind = step.kind
    return kind if kind in _MERGEABLE else None


def _placements_mergeable(a: ir.StepInfo, b: ir.StepInfo) -> bool:
    """torch's ``are_placements_mergeable(p1, p2)``."""
    if (a.src, a.dst) == (b.src, b.dst):
        return True
    if a.dst != b.dst or not (a.src.is_partial() and b.src.is_partial()):
        return False
    return a.src.reduce_op in ("sum", "avg") and b.src.reduce_op in ("sum", "avg")


def _runs(steps: Sequence[ir.StepInfo]) -> list[tuple[int, int]]:
    """(start, end) of every run torch's loop forms (single steps included)."""
    out, i = [], 0
    while i < len(steps):
        if _comm_type(steps[i]) is None:
            out.append((i, i + 1))
            i += 1
            continue
        j = i + 1
        while (
            j < len(steps) and _comm_type(steps[j]) is not None and _placements_mergeable(steps[j], steps[i])
        ):
            j += 1
        out.append((i, j))
        i = j
    return out


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """A run's fate: merged (True/False) or, for reduce_scatter evenness, an
    expression whose divisibility by ``n`` decides it per rank."""

    merged: bool | None
    why: str
    expr: object = None
    n: int = 1


def _verdict(mesh: MeshSpec, run: Sequence[ir.StepInfo], layouts: frozenset) -> _Verdict:
    if len(run) < 2:
        return _Verdict(False, "too_few_transforms")
    kind = run[0].kind
    dims = tuple(s.mesh_dims[0] for s in run)
    sorted_dims = tuple(sorted(dims))
    if kind == "reduce_scatter" and dims != sorted_dims:
        return _Verdict(False, "non_ascending_mesh_dims")
    if kind == "all_gather" and dims != sorted_dims[::-1]:
        return _Verdict(False, "non_ascending_mesh_dims")
    if mesh.names is None:
        return _Verdict(False, "no_flattened_mesh (mesh has no dim names)")
    if mesh.group(sorted_dims).layout not in layouts:
        return _Verdict(False, "no_flattened_mesh")
    if kind == "reduce_scatter":
        outer = min(run, key=lambda s: s.mesh_dims[0])
        expr = outer.logical_shape[outer.dst.dim]
        n = math.prod(mesh.sizes[d] for d in dims)
        values = sym.possible_values(expr, mesh.sizes)
        even = {v % n == 0 for v in values}
        if even == {True}:
            return _Verdict(True, "merged")
        if even == {False}:
            return _Verdict(False, "uneven_tensor_shape")
        return _Verdict(None, "rank-dependent evenness", expr, n)
    return _Verdict(True, "merged")


def _merged_step(mesh: MeshSpec, run: Sequence[ir.StepInfo]) -> ir.StepInfo:
    dims = tuple(sorted(s.mesh_dims[0] for s in run))
    # torch keeps the outermost transform's logical shape (the largest on the
    # affected dim: logical shapes shrink monotonically along the mesh dims).
    outer = min(run, key=lambda s: s.mesh_dims[0])
    src = run[0].src
    scale = 1
    if src.is_partial():
        src = Partial(src.reduce_op)
        if len({s.src.reduce_op for s in run}) > 1:
            # torch runs a sum+avg mix as a sum, then divides by avg_scale (the
            # sizes of the avg dims); the count and bytes do not depend on it.
            src = Partial("sum")
            scale = math.prod(mesh.sizes[s.mesh_dims[0]] for s in run if s.src.reduce_op == "avg")
    return ir.StepInfo(run[0].index, dims, src, run[0].dst, outer.logical_shape, scale)


def torch_merged_steps(
    mesh: MeshSpec,
    steps: Sequence[ir.StepInfo],
    flattened=None,
    coords: Sequence[int] | None = None,
) -> list[ir.StepInfo]:
    """torch's ``_optimize_transform_infos`` on ``steps`` for the rank at ``coords``
    (only needed when a reduce_scatter's evenness depends on the rank)."""
    layouts = _layouts_of(mesh, flattened)
    out: list[ir.StepInfo] = []
    for start, end in _runs(steps):
        run = list(steps[start:end])
        v = _verdict(mesh, run, layouts)
        merged = v.merged
        if merged is None:
            if coords is None:
                raise ValueError("reduce_scatter evenness depends on the rank: pass coords")
            merged = sym.evaluate(v.expr, tuple(coords)) % v.n == 0
        if merged:
            out.append(_merged_step(mesh, run))
        else:
            out.extend(run)
    return out


@dataclasses.dataclass(frozen=True)
class TorchModel:
    """What torch 2.13 (merge ON) runs: one Plan per class of ranks (usually one)."""

    variants: tuple[Plan, ...]
    why: tuple[str, ...]  # per run: merged / reason it was not

    @property
    def uniform(self) -> bool:
        return len(self.variants) == 1

    @property
    def plan(self) -> Plan:
        assert self.uniform, "torch's plan depends on the rank here; use .variants"
        return self.variants[0]

    @property
    def min_collectives(self) -> int:
        return min(v.num_collectives for v in self.variants)

    @property
    def min_bytes_per_rank(self) -> int:
        return min(v.bytes_per_rank for v in self.variants)

    def describe(self) -> str:
        return " | ".join(" ".join(signature(v)) or "(none)" for v in self.variants)


def _lower(plan: Plan, steps: Sequence[ir.StepInfo]) -> Plan:
    mesh = plan.mesh
    gm = lower_steps(mesh, steps, ir.local_shape(plan.shape, plan.src, mesh.sizes))
    # the model's own sanity: the lowering ends in the destination's local shape
    ir.verify(gm, mesh.sizes, ir.local_shape(plan.shape, plan.dst, mesh.sizes))
    return plan.replace(graph=gm, steps=tuple(steps), applied_passes=("torch-2.13-merge",), notes=())


def torch_model(plan: Plan, flattened=None) -> TorchModel:
    """The torch 2.13 plan for ``plan``'s redistribution given ``flattened``
    (dim groups like ``("a", "c")``, or layouts; default: ``plan.mesh``'s own
    flattened groups, which for a rank-free ``MeshSpec`` are exactly the ones
    it was given; a MeshSpec read off a DeviceMesh also lists the world group
    and the root's dims, which torch's merge pass does not use: pass
    ``torch_flattened_layouts(device_mesh)`` for those)."""
    assert not plan.fallback, "fallback plans are not modelled"
    mesh = plan.mesh
    layouts = _layouts_of(mesh, flattened)
    steps = list(plan.steps)
    verdicts = [(start, end, _verdict(mesh, steps[start:end], layouts)) for start, end in _runs(steps)]
    why = tuple(v.why for s, e, v in verdicts if e - s > 1)
    open_ = [v for _, _, v in verdicts if v.merged is None]
    if not open_:
        return TorchModel((_lower(plan, torch_merged_steps(mesh, steps, layouts)),), why)
    # rank-dependent: enumerate the coordinates the open decisions depend on
    free = sorted({int(s.name[1:]) for v in open_ for s in v.expr.free_symbols})
    variants: dict[tuple, Plan] = {}
    for values in itertools.product(*(range(mesh.sizes[d]) for d in free)):
        coords = [0] * mesh.ndim
        for d, c in zip(free, values):
            coords[d] = c
        merged = torch_merged_steps(mesh, steps, layouts, coords)
        key = tuple((s.mesh_dims, s.kind) for s in merged)
        if key not in variants:
            variants[key] = _lower(plan, merged)
    return TorchModel(tuple(variants.values()), why)


def signature(plan: Plan) -> list[str]:
    """``kind[op](a+c)`` per collective, in order."""
    out = []
    for c in plan.collectives():
        op = f"[{c.reduce_op}]" if c.reduce_op else ""
        out.append(f"{c.kind}{op}({c.group.name(plan.mesh)})")
    return out
