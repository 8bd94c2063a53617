"""``Plan``: one redistribution, planned once, valid on every rank.

A plan holds the rank-free mesh, the source and destination placements, the
global shape and dtype, the planner steps and the IR graph. It never holds a
process group: ``redist_opt.execute`` binds it to a DeviceMesh (as a rank program).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx
from torch.distributed.tensor.placement_types import Placement

from redist_opt import ir
from redist_opt.ir.lower import check_transition, dtype_reason, greedy_steps, lower_steps, unsupported_reason
from redist_opt.ir.mesh import MeshGroup, MeshSpec
from redist_opt.ir.placements import RedistributeError, normalize_placements
from redist_opt.ir.strided import has_strided, strided_reason, strided_steps
from redist_opt.ir.text import format_plan

__all__ = ["Plan", "make_plan", "Collective", "Note"]


@dataclasses.dataclass(frozen=True)
class Note:
    """A decision a pass made or declined, for ``explain`` ("say why not").

    ``made`` is True for a rewrite that was applied; ``reason`` says why it was
    legal and chosen, or why it was not made (no group with that layout, ranks
    overlap, reduce op mismatch, cost, ...).
    """

    pass_name: str  # kebab-case pass name, e.g. "merge-reductions"
    made: bool
    what: str  # e.g. "all_reduce(a) + all_reduce(c) -> all_reduce(a+c)"
    reason: str

    def __str__(self) -> str:
        verdict = "merged" if self.made else "not merged"
        return f"[{self.pass_name}] {self.what}: {verdict}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Collective:
    """A collective of a plan, as dumps and the cost model see it."""

    kind: str
    group: MeshGroup
    reduce_op: str | None
    bytes_in: int  # largest input any rank sends into it
    node: str


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    mesh: MeshSpec
    src: tuple[Placement, ...]
    dst: tuple[Placement, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    steps: tuple[ir.StepInfo, ...]
    graph: fx.GraphModule | None
    # Why this plan runs through torch's own path instead of our IR (None: it does not).
    fallback_reason: str | None = None
    # Passes that ran and changed the IR, in order, and merges that were not made.
    applied_passes: tuple[str, ...] = ()
    notes: tuple[Note, ...] = ()
    # The cost model the passes used and where it came from ("gloo (mesh backend gloo)").
    cost_profile: str | None = None

    @property
    def fallback(self) -> bool:
        return self.fallback_reason is not None

    @property
    def key(self) -> tuple:
        return (self.mesh, self.src, self.dst, self.shape, self.dtype)

    def collectives(self) -> list[Collective]:
        if self.graph is None:
            return []
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        out = []
        for node in ir.collective_nodes(self.graph):
            params = node.args[1:]
            op = params[1] if ir.ir_name(node) in ("all_reduce", "reduce_scatter") else None
            in_shape = node.args[0].meta["shape"]
            out.append(
                Collective(
                    kind=ir.ir_name(node),
                    group=params[0],
                    reduce_op=op,
                    bytes_in=ir.max_numel(in_shape, self.mesh.sizes) * itemsize,
                    node=node.name,
                )
            )
        return out

    @property
    def num_collectives(self) -> int:
        return len(self.collectives())

    @property
    def bytes_per_rank(self) -> int:
        """Bytes each rank feeds into collectives (upper bound over ranks)."""
        return sum(c.bytes_in for c in self.collectives())

    def groups_needed(self) -> frozenset[MeshGroup]:
        return frozenset(c.group for c in self.collectives())

    def replace(self, **changes) -> Plan:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return format_plan(self)


def make_plan(
    mesh: MeshSpec,
    src: Sequence[Placement | str] | str,
    dst: Sequence[Placement | str] | str,
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
) -> Plan:
    """Validate the request and lower it (cached: the eager path calls this per redistribute)."""
    shape = _check_shape(shape)
    src_p = normalize_placements(src, mesh_shape=mesh.sizes, tensor_ndim=len(shape), role="source")
    dst_p = normalize_placements(dst, mesh_shape=mesh.sizes, tensor_ndim=len(shape), role="target")
    return _make_plan_cached(mesh, src_p, dst_p, shape, dtype)


@functools.lru_cache(maxsize=4096)
def _make_plan_cached(mesh: MeshSpec, src, dst, shape, dtype) -> Plan:
    reason = unsupported_reason(src, dst) or dtype_reason(src, dtype) or strided_reason(mesh, src, dst, shape)
    if reason is not None:
        return Plan(mesh, src, dst, shape, dtype, (), None, fallback_reason=reason)
    check_transition(src, dst, mesh)
    planner = strided_steps if has_strided(src) else greedy_steps
    steps = tuple(planner(mesh, src, dst, shape))
    gm = lower_steps(mesh, steps, ir.local_shape(shape, src, mesh.sizes))
    ir.verify(gm, mesh.sizes, ir.local_shape(shape, dst, mesh.sizes))
    return Plan(mesh, src, dst, shape, dtype, steps, gm)


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise RedistributeError(f"tensor shape {shape!r} must be a sequence of integers") from None
    if any(s < 0 for s in out):
        raise RedistributeError(f"tensor shape {out} has a negative size")
    return out


def clear_cache() -> None:
    """Forget every lowered plan (``redist_opt.clear_caches``)."""
    _make_plan_cached.cache_clear()
