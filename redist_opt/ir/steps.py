"""Step-level view of the IR, shared by every pass.

The IR is a chain of *regions*: the ops one planner step lowered to (a
collective plus the pad/narrow ops around it), tagged by ``node.meta["step"]``.
Passes decide at the level of steps (may these two commute? may these merge?)
and rewrite the IR by re-lowering the changed step list through
``redist_opt.ir.lower.lower_step``, so the padding rules for uneven shards live in
one place. Regions whose step a pass did not touch are re-lowered from the same
``StepInfo`` and so produce the same ops.

The one compatibility question every merge pass asks is :func:`merge_key`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch.fx as fx
from torch.distributed.tensor.placement_types import Partial, Shard

from redist_opt import ir
from redist_opt.ir import symbolic as sym
from redist_opt.ir.lower import lower_step
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import partial_of, shard_order

__all__ = [
    "Region",
    "regions",
    "commute",
    "merge_key",
    "ShardState",
    "relower",
    "step_label",
]


@dataclasses.dataclass
class Region:
    step: ir.StepInfo
    nodes: list[fx.Node]

    @property
    def collective(self) -> fx.Node | None:
        return next((n for n in self.nodes if ir.is_collective(n)), None)

    @property
    def inherited(self) -> tuple[str, ...]:
        """Provenance a previous pass recorded on this region's nodes (may be empty)."""
        names: list[str] = []
        for n in self.nodes:
            names.extend(n.meta.get("from_node", ()))
        return tuple(dict.fromkeys(names))

    @property
    def origin(self) -> tuple[str, ...]:
        """Names of the collectives this region came from (its provenance)."""
        names: list[str] = []
        for n in self.nodes:
            names.extend(n.meta.get("from_node", ()) or ((n.name,) if ir.is_collective(n) else ()))
        return tuple(dict.fromkeys(names))


def regions(gm: fx.GraphModule) -> list[Region]:
    out: list[Region] = []
    for node in gm.graph.nodes:
        if ir.ir_name(node) is None:
            continue
        step = node.meta.get("step")
        if out and out[-1].step is step:
            out[-1].nodes.append(node)
        else:
            out.append(Region(step, [node]))
    return out


def step_label(step: ir.StepInfo, mesh: MeshSpec) -> str:
    """``all_reduce(a+c)`` style label used in notes and logs."""
    dims = "+".join(mesh.dim_name(d) for d in step.mesh_dims)
    return f"{step.kind}({dims})"


# -- the compatibility key ------------------------------------------------------------


def merge_key(step: ir.StepInfo, dtype=None) -> tuple | None:
    """Steps with equal keys over disjoint mesh dims may become one collective.

    Same collective kind, same reduce op, same tensor dims (for nested shards).
    Partial p-norms ("norm(p)") merge only with the same p, never with sum: the
    merged step is one ``power``, one sum over the product group, one ``root``.
    sum and avg share a key (both linear: ``AR_avg(G1) . AR_sum(G2) =
    AR_sum(G1 x G2) / |G1|``, see :func:`merged_step`), except on integer
    ``dtype``s, where every avg reduction truncates and merges with nothing.
    Local steps (chunk, partition) never merge: they cost nothing.
    """
    if step.kind in ("chunk", "partition"):
        return None
    op = step.reduce_op
    if op in _LINEAR:
        op = "sum|avg" if avg_is_linear(dtype) else op
        if op == "avg":  # unique: no other step has these mesh dims
            op = ("avg", "truncating", step.mesh_dims)
    return (step.kind, op, tuple(sorted(step.tensor_dims)), _dst_dim(step))


def avg_is_linear(dtype) -> bool:
    """avg is sum / n exactly up to rounding on floating dtypes (None: assume so).

    On integer dtypes each avg reduction truncates its quotient (as torch's does),
    so avg neither merges nor commutes with another reduction there.
    """
    return dtype is None or dtype.is_floating_point or dtype.is_complex


def _dst_dim(step: ir.StepInfo):
    return step.dst.dim if isinstance(step.dst, Shard) else None


# -- commutation -----------------------------------------------------------------------

_LINEAR = {"sum", "avg"}


def commute(a: ir.StepInfo, b: ir.StepInfo, dtype=None) -> str | None:
    """None if ``a; b`` equals ``b; a`` on every rank, else the reason it does not.

    Legal when (1) the steps span disjoint mesh dims, (2) they change the layout
    of disjoint tensor dims (so neither's sizes depend on the other's chunking,
    and shard order is kept), and (3) reductions in both use the same op, or both
    linear ones: a sum over one group commutes with a sum over another, and with
    any pure data movement (gathers, scatters, chunking) on other dims.
    Replicate -> Partial steps are never moved. On integer ``dtype``s an avg
    reduction truncates, so it commutes with no other reduction.
    """
    if set(a.mesh_dims) & set(b.mesh_dims):
        return "they share a mesh dim"
    if a.tensor_dims & b.tensor_dims:
        return f"both change the layout of tensor dim {sorted(a.tensor_dims & b.tensor_dims)[0]}"
    if "partition" in (a.kind, b.kind):
        return "Replicate -> Partial steps stay in place"
    ra, rb = a.reduce_op, b.reduce_op
    if ra and rb and ra != rb and not (ra in _LINEAR and rb in _LINEAR):
        return f"reduce ops {ra} and {rb} do not commute"
    if ra and rb and "avg" in (ra, rb) and not avg_is_linear(dtype):
        return f"avg on {dtype} truncates each reduction: it commutes with no other reduction"
    return None


# -- shard state -----------------------------------------------------------------------


@dataclasses.dataclass
class ShardState:
    """Which mesh dims shard each tensor dim, in shard order (outermost first)."""

    order: dict[int, list[int]]

    # Size-1 mesh dims are left out: chunking by 1 changes nothing, and DTensor
    # emits no op (so no region) for them.

    @classmethod
    def of(cls, placements, mesh: MeshSpec) -> ShardState:
        decoded = shard_order(placements, mesh.sizes)  # _StridedShard encodes its order
        if decoded is None:
            raise ValueError(f"placements {placements} encode no shard order")
        order = {t: [d for d in ds if mesh.sizes[d] > 1] for t, ds in decoded.items()}
        return cls({t: ds for t, ds in order.items() if ds})

    def copy(self) -> ShardState:
        return ShardState({t: list(ds) for t, ds in self.order.items()})

    def apply(self, step: ir.StepInfo, mesh: MeshSpec) -> None:
        if step.variant == "gather_blocks":  # unshards each part's tensor dim
            for tdim, dims in step.parts:
                self._unshard(tdim, tuple(d for d in dims if mesh.sizes[d] > 1), step)
            return
        real = tuple(d for d in step.mesh_dims if mesh.sizes[d] > 1)
        if step.src.is_shard():
            self._unshard(step.src.dim, real, step)
        if step.variant == "split_all_to_all":  # each part's mesh dims shard its tensor dim
            for tdim, dims in step.parts:
                self.order.setdefault(tdim, []).extend(d for d in dims if mesh.sizes[d] > 1)
        elif step.dst.is_shard():
            self.order.setdefault(step.dst.dim, []).extend(real)

    def _unshard(self, tdim: int, real: tuple[int, ...], step: ir.StepInfo) -> None:
        dims = self.order.get(tdim, [])
        k = len(real)
        if k and tuple(dims[-k:]) != real:
            raise AssertionError(
                f"step {step} unshards mesh dims {real} but tensor dim "
                f"{tdim} is sharded by {dims} (innermost last)"
            )
        if k:
            del dims[-k:]

    def logical_shape(self, global_shape, mesh: MeshSpec, exclude: Sequence[int]) -> tuple:
        """Sizes of every tensor dim chunked by its sharding dims other than ``exclude``."""
        out = []
        for t, size in enumerate(global_shape):
            e = sym.as_expr(size)
            for d in self.order.get(t, []):
                if d not in exclude:
                    e = sym.ChunkSize(e, mesh.sizes[d], sym.coord(d))
            out.append(e)
        return tuple(out)


def states_before(regs: Sequence[Region], src, mesh: MeshSpec) -> list[ShardState]:
    """The shard state before each region, replaying the steps from ``src``."""
    state = ShardState.of(src, mesh)
    out = []
    for r in regs:
        out.append(state.copy())
        state.apply(r.step, mesh)
    return out


def with_state_logical_shape(
    step: ir.StepInfo, state: ShardState, global_shape, mesh: MeshSpec
) -> ir.StepInfo:
    """The step with its logical shape recomputed from the actual state before it."""
    return dataclasses.replace(step, logical_shape=state.logical_shape(global_shape, mesh, step.mesh_dims))


def merged_step(
    steps: Sequence[ir.StepInfo], mesh_dims: Sequence[int], index: int, mesh_sizes: Sequence[int] = ()
) -> ir.StepInfo:
    """One step over ``mesh_dims`` doing what ``steps`` did (equal merge keys).

    Mixed sum/avg reductions become one sum followed by one division by the
    sizes of the avg steps' mesh dims (``avg_scale``): avg over G1 then sum over
    G2 is sum over G1 x G2 divided by |G1|. All-avg stays avg (over the product).
    """
    first = steps[0]
    src = first.src
    scale = 1
    if isinstance(src, Partial):
        src = partial_of(first.reduce_op)
        ops = {s.reduce_op for s in steps}
        if ops <= _LINEAR and (len(ops) > 1 or any(s.avg_scale > 1 for s in steps)):
            src = Partial("sum")
            for s in steps:
                scale *= s.avg_scale
                if s.reduce_op == "avg":
                    for d in s.mesh_dims:
                        scale *= mesh_sizes[d]
    return ir.StepInfo(index, tuple(mesh_dims), src, first.dst, first.logical_shape, scale)


# -- rewriting -------------------------------------------------------------------------


def relower(
    gm: fx.GraphModule,
    mesh: MeshSpec,
    new_steps: Sequence[ir.StepInfo],
    provenance: Sequence[tuple[str, ...]],
) -> fx.GraphModule:
    """Rebuild the IR from a step list; ``provenance[i]`` names step i's source collectives."""
    placeholder = next(iter(gm.graph.nodes))
    b = ir.GraphBuilder(placeholder.meta["shape"])
    for step, origin in zip(new_steps, provenance):
        start = len(b.graph.nodes)
        lower_step(b, mesh, step)
        for node in list(b.graph.nodes)[start:]:
            if origin:
                node.meta["from_node"] = tuple(origin)
    return b.finish()
