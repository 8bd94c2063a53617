"""The collective IR: a ``torch.fx.Graph`` whose nodes are collectives over
``MeshGroup``s and the local ops that reproduce DTensor's padding semantics.

Op set (every op takes the local tensor first)::

    all_reduce(x, group, op)                      P -> R on the group
    reduce_scatter(x, group, op, dim)             input dim divisible by group size
    all_gather(x, group, dim)                     equal-size inputs
    all_to_all(x, group, split_dim, cat_dim)      equal chunks along split_dim
    pad_to(x, dim, size)                          zero-pad the end of dim up to size
    pad_nested(x, dim, counts)                    split dim into nested torch.chunk pieces (counts[0]
                                                  outermost), pad every piece to the largest, concat
    unpad_nested(x, dim, length, counts)          inverse of pad_nested for a dim of `length`
    narrow(x, dim, start, length)                 keep [start, start+length) of dim
    select_chunk(x, dim, n, index)                chunk `index` of torch.chunk(x, n, dim), cloned
    divide(x, divisor)                            x / divisor (R -> P(sum), P(avg) scaling; a float
                                                  n ** (1/p) for R -> P(norm p), as torch)
    power(x, p)                                   x ** p: the pre-step of a partial p-norm reduction
                                                  (torch's _NormPartial._pre_reduce_transform)
    root(x, p)                                    x ** (1.0 / p): its post-step (_post_reduce_transform)
    unpack_blocks(x, dim, counts, blocks, *lengths)
                                                  reassemble an all_gather of padded blocks along dim:
                                                  slot k (row-major over counts) holds the block at
                                                  the nested chunk index, per tensor dim t of
                                                  blocks = ((t, positions), ...), given by the slot
                                                  coordinates at positions; t gets lengths[i]

Sizes, starts and indices are sympy expressions in the mesh coordinates
(``redist_opt.ir.symbolic``): one graph serves every rank. Each node carries
``node.meta``:

* ``shape``: the local shape after the node, a tuple of size expressions;
* ``step``: the :class:`StepInfo` of the planner step the node implements
  (mesh dims, src/dst placement, logical shape); a step DTensor's planner does
  not make (a pass's merge of steps it cannot express) names its variant in the
  step table :data:`STEP_VARIANTS`;
* ``from_node``: names of the nodes a pass rewrote into this one (provenance).

The graph is held by a ``torch.fx.GraphModule`` so ``torch.fx.passes.infra``
passes apply; it runs as a rank program (``redist_opt.runtime.specialize``), never by fx codegen.
The ops here carry only their shape functions; what each local op does to a tensor
is defined once in :mod:`redist_opt.ir.local_ops`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch.distributed.tensor.placement_types import Placement

from redist_opt.ir import symbolic as sym
from redist_opt.ir.mesh import MeshGroup
from redist_opt.ir.placements import reduce_op_of, shard_order
from redist_opt.torch_api.tracing import LazyGraphModule

__all__ = [
    "OPS",
    "COLLECTIVES",
    "StepInfo",
    "StepVariant",
    "STEP_VARIANTS",
    "GraphBuilder",
    "collective_nodes",
    "verify",
    "IRVerificationError",
]


def _ir_op(name: str, *, collective: bool):
    def deco(shape_fn: Callable) -> Callable:
        def op(*args, **kwargs):  # pragma: no cover - markers are read, not called
            raise RuntimeError(
                f"redist_opt IR op {name} runs in a rank program (redist_opt.runtime.specialize)"
            )

        op.__name__ = op.__qualname__ = name
        op.__module__ = __name__
        op.ir_name = name
        op.is_collective = collective
        op.shape_fn = shape_fn
        return op

    return deco


def _set(shape, dim, value):
    out = list(shape)
    out[dim] = sym.as_expr(value)
    return tuple(out)


@_ir_op("all_reduce", collective=True)
def all_reduce(shape, group: MeshGroup, op: str):
    return shape


@_ir_op("reduce_scatter", collective=True)
def reduce_scatter(shape, group: MeshGroup, op: str, dim: int):
    return _set(shape, dim, sym.CeilDiv(shape[dim], group.size))


@_ir_op("all_gather", collective=True)
def all_gather(shape, group: MeshGroup, dim: int):
    return _set(shape, dim, shape[dim] * group.size)


@_ir_op("all_to_all", collective=True)
def all_to_all(shape, group: MeshGroup, split_dim, cat_dim: int):
    # split_dim: one tensor dim cut into group.size pieces, or ((dim, pieces), ...):
    # several dims cut (product of pieces = group size), member k gets block k row-major.
    for d, n in split_dims(split_dim, group.size):
        shape = _set(shape, d, sym.CeilDiv(shape[d], n))
    return _set(shape, cat_dim, shape[cat_dim] * group.size)


def split_dims(split_dim, group_size: int) -> tuple:
    """An all_to_all's split as ((tensor dim, pieces), ...)."""
    return tuple(split_dim) if isinstance(split_dim, tuple) else ((split_dim, group_size),)


@_ir_op("pad_to", collective=False)
def pad_to(shape, dim: int, size):
    return _set(shape, dim, size)


@_ir_op("pad_nested", collective=False)
def pad_nested(shape, dim: int, counts: tuple):
    return _set(shape, dim, sym.nested_max_chunk(shape[dim], counts) * math.prod(counts))


@_ir_op("unpad_nested", collective=False)
def unpad_nested(shape, dim: int, length, counts: tuple):
    return _set(shape, dim, length)


@_ir_op("narrow", collective=False)
def narrow(shape, dim: int, start, length):
    return _set(shape, dim, length)


@_ir_op("select_chunk", collective=False)
def select_chunk(shape, dim: int, n: int, index):
    return _set(shape, dim, sym.ChunkSize(shape[dim], n, index))


@_ir_op("divide", collective=False)
def divide(shape, divisor: int):
    return shape


@_ir_op("power", collective=False)
def power(shape, p):
    return shape


@_ir_op("root", collective=False)
def root(shape, p):
    return shape


@_ir_op("unpack_blocks", collective=False)
def unpack_blocks(shape, dim: int, counts: tuple, blocks: tuple, *lengths):
    out = shape
    for (t, _positions), length in zip(blocks, lengths):
        out = _set(out, t, length)
    return out


OPS = {
    op.ir_name: op
    for op in (
        all_reduce,
        reduce_scatter,
        all_gather,
        all_to_all,
        pad_to,
        pad_nested,
        unpad_nested,
        narrow,
        select_chunk,
        divide,
        power,
        root,
        unpack_blocks,
    )
}
COLLECTIVES = frozenset(name for name, op in OPS.items() if op.is_collective)


@dataclasses.dataclass(frozen=True)
class StepVariant:
    """A step that is not one of DTensor's per-mesh-dim steps: a pass made it, and
    ``redist_opt.ir.lower`` lowers it by its ``name``. ``parts`` of such a step are
    ``((tensor dim, mesh dims outermost first), ...)``."""

    name: str
    kind: str  # the StepInfo.kind it refines
    doc: str


# Step variants (``StepInfo.variant``): the op table of steps, as ``OPS`` is of ops.
STEP_VARIANTS = {
    v.name: v
    for v in (
        StepVariant(
            "split_all_to_all",
            "all_to_all",
            "one all_to_all that cats src.dim and splits several tensor dims: parts, in "
            "mesh_dims order, say which mesh dims split which tensor dim (dst is the first "
            "part's); member k of the group gets block k, row-major over the parts",
        ),
        StepVariant(
            "gather_blocks",
            "all_gather",
            "one all_gather that unshards several tensor dims: parts, by tensor dim, say "
            "over which mesh dims each is gathered; mesh_dims is the group's dim order; "
            "the blocks are reassembled locally (unpack_blocks)",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One redistribution step as DTensor's planner emits it (after our lowering)."""

    index: int
    # Mesh dims the step spans, in shard order (outermost first). One dim for
    # DTensor's own steps; several once a pass merged steps.
    mesh_dims: tuple[int, ...]
    src: Placement
    dst: Placement
    # Sizes, per tensor dim, before the step's mesh dims shard it (expressions).
    logical_shape: tuple
    # Merged sum/avg partials: the reduction is a sum, divided afterwards by this
    # (the product of the sizes of the avg mesh dims). 1: no scaling.
    avg_scale: int = 1
    # A name in STEP_VARIANTS ("" for a plain step) and its ((tensor dim, mesh dims), ...).
    variant: str = ""
    parts: tuple = ()

    def __post_init__(self) -> None:
        if self.variant and STEP_VARIANTS[self.variant].kind != self.kind:
            raise ValueError(
                f"step variant {self.variant} is a {STEP_VARIANTS[self.variant].kind}, not {self.kind}"
            )

    # Derived facts are cached: every pass asks them many times per plan.
    @functools.cached_property
    def kind(self) -> str:
        """all_reduce | reduce_scatter | all_gather | all_to_all | chunk | partition."""
        s, d = self.src, self.dst
        if s.is_partial():
            return "all_reduce" if d.is_replicate() else "reduce_scatter"
        if s.is_shard():
            return "all_gather" if d.is_replicate() else "all_to_all"
        return "chunk" if d.is_shard() else "partition"

    @functools.cached_property
    def tensor_dims(self) -> frozenset[int]:
        """Tensor dims whose layout the step changes (reductions change none)."""
        dims = {t for t, _ in self.parts}
        for p in (self.src, self.dst):
            if p.is_shard():
                dims.add(p.dim)
        return frozenset(dims)

    @functools.cached_property
    def reduce_op(self) -> str | None:
        """ "sum", "avg", "max", "min", "product", or "norm(p)" for a partial p-norm."""
        for p in (self.src, self.dst):
            if p.is_partial():
                return reduce_op_of(p)
        return None


class GraphBuilder:
    """Appends IR ops to a fresh graph, propagating shapes symbolically."""

    def __init__(self, input_shape: Sequence) -> None:
        self.graph = fx.Graph()
        self.value = self.graph.placeholder("x")
        self.value.meta["shape"] = tuple(sym.as_expr(s) for s in input_shape)
        self.step: StepInfo | None = None

    @property
    def shape(self) -> tuple:
        return self.value.meta["shape"]

    def emit(self, name: str, *args) -> fx.Node:
        op = OPS[name]
        node = self.graph.call_function(op, (self.value, *args))
        node.meta["shape"] = tuple(sym.as_expr(s) for s in op.shape_fn(self.shape, *args))
        node.meta["step"] = self.step
        self.value = node
        return node

    def finish(self) -> fx.GraphModule:
        self.graph.output(self.value)
        # A lazy GraphModule skips Python code generation: our graphs are read into rank
        # programs (redist_opt.runtime.specialize), and codegen after every pass dominated planning time.
        return LazyGraphModule(torch.nn.Module(), self.graph)


def ir_name(node: fx.Node) -> str | None:
    return getattr(node.target, "ir_name", None) if node.op == "call_function" else None


def is_collective(node: fx.Node) -> bool:
    return ir_name(node) in COLLECTIVES


def collective_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if is_collective(n)]


class IRVerificationError(AssertionError):
    """The IR broke an invariant: a pass or the lowering has a bug."""


def verify(gm: fx.GraphModule, mesh_sizes: Sequence[int], expected_output_shape=None) -> None:
    """Check the invariants every pass must keep.

    1. One placeholder, one output, a single chain of known IR ops.
    2. Every group names existing mesh dims, no dim twice, and its layout has
       no rank twice (orthogonal).
    3. Recorded shapes equal the shapes the op semantics derive; collectives that
       need equal chunks get a dim provably divisible by the group size.
    4. The output shape equals ``expected_output_shape`` (the local shape the
       destination placements define), checked on corner coordinates.
    """
    nodes = list(gm.graph.nodes)
    if not nodes or nodes[0].op != "placeholder" or nodes[-1].op != "output":
        raise IRVerificationError("IR must start with one placeholder and end with output")
    prev = nodes[0]
    for node in nodes[1:-1]:
        name = ir_name(node)
        if name is None:
            raise IRVerificationError(f"{node.format_node()}: not a redist_opt IR op")
        if node.args[0] is not prev:
            raise IRVerificationError(f"{node.name}: IR must be a chain; input is {node.args[0]}")
        params = node.args[1:]
        if name in COLLECTIVES:
            group = params[0]
            if not isinstance(group, MeshGroup):
                raise IRVerificationError(f"{node.name}: group {group!r} is not a MeshGroup")
            if len(set(group.dims)) != len(group.dims) or any(
                not 0 <= d < len(mesh_sizes) for d in group.dims
            ):
                raise IRVerificationError(f"{node.name}: bad mesh dims {group.dims}")
            if not group.layout.check_orthogonal():
                raise IRVerificationError(f"{node.name}: group layout overlaps itself")
            split_dim = {"reduce_scatter": 3, "all_to_all": 2}.get(name)
            if split_dim is not None:
                splits = split_dims(node.args[split_dim], group.size)
                if math.prod(n for _, n in splits) != group.size:
                    raise IRVerificationError(f"{node.name}: split {splits} does not cover the group")
                for d, n in splits:
                    size = prev.meta["shape"][d]
                    if not sym.is_divisible(size, n, mesh_sizes):
                        raise IRVerificationError(
                            f"{node.name}: dim size {size} not divisible by {n} (group size {group.size})"
                        )
        derived = tuple(sym.as_expr(s) for s in OPS[name].shape_fn(prev.meta["shape"], *params))
        if derived != node.meta.get("shape"):
            raise IRVerificationError(
                f"{node.name}: recorded shape {node.meta.get('shape')} != derived {derived}"
            )
        prev = node
    if nodes[-1].args[0] is not prev:
        raise IRVerificationError("output must return the last op")
    if expected_output_shape is not None:
        got = prev.meta["shape"]
        if tuple(got) == tuple(sym.as_expr(e) for e in expected_output_shape):
            return
        for coords in corner_coords(mesh_sizes):
            a = [sym.evaluate(e, coords) for e in got]
            b = [sym.evaluate(e, coords) for e in expected_output_shape]
            if a != b:
                raise IRVerificationError(
                    f"output shape {a} != expected local shape {b} at coordinates {coords}"
                )


def corner_coords(mesh_sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """A small rank-free sample: all-zero, all-last, and each dim at each end."""
    nd = len(mesh_sizes)
    out = {tuple(0 for _ in range(nd)), tuple(s - 1 for s in mesh_sizes)}
    for d in range(nd):
        for v in {0, 1, mesh_sizes[d] - 1, mesh_sizes[d] // 2}:
            if 0 <= v < mesh_sizes[d]:
                out.add(tuple(v if i == d else mesh_sizes[i] - 1 for i in range(nd)))
                out.add(tuple(v if i == d else 0 for i in range(nd)))
    return sorted(out)


def local_shape(global_shape: Sequence[int], placements: Sequence[Placement], mesh_sizes) -> tuple:
    """The local shape of ``placements``: nested chunks in shard order (the default
    order, or the one ``_StridedShard`` split factors encode: ``placements.shard_order``)."""
    shape = [sym.as_expr(s) for s in global_shape]
    order = shard_order(placements, mesh_sizes)
    if order is None:
        raise ValueError(f"placements {placements} encode no shard order")
    for t, dims in order.items():
        for d in dims:
            shape[t] = sym.ChunkSize(shape[t], mesh_sizes[d], sym.coord(d))
    return tuple(shape)


def max_numel(shape: Sequence, mesh_sizes: Sequence[int]) -> int:
    """The largest local element count any rank holds for ``shape``."""
    total = 1
    for s in shape:
        total *= max(sym.possible_values(s, mesh_sizes))
    return total


def from_nodes(node) -> tuple[str, ...]:
    """Names of the nodes ``node`` was rewritten from (``node.meta["from_node"]``)."""
    src = node.meta.get("from_node") if hasattr(node, "meta") else None
    if not src:
        return ()
    if isinstance(src, (str, bytes)) or not isinstance(src, (list, tuple, set, frozenset)):
        src = [src]
    out = []
    for s in src:
        name = getattr(s, "name", s)
        out.append(str(name))
    return tuple(out)
