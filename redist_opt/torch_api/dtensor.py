"""The one module that touches DTensor's private planner and spec classes.

``DTensorSpec``, ``TensorMeta``, ``redistribute_local_tensor``,
``_gen_transform_infos_non_cached`` and ``disable_redistribute_transform_optimization``
are private to ``torch.distributed.tensor``, and so are a DTensor's ``_spec`` and
``_local_tensor`` and LocalTensorMode's per-rank values
(``torch.distributed._local_tensor``); a torch upgrade that changes them should
only need this file updated (mesh-layout internals: ``redist_opt.ir.layout``).

Patch points. torch 2.13 looks ``redistribute_local_tensor`` up by name, at call
time, in these module namespaces (each imported it with ``from ... import``):

- ``torch.distributed.tensor._redistribute``: ``Redistribute.forward`` (explicit
  ``DTensor.redistribute`` and ``full_tensor``) and ``_redistribute_backward``
  (``NestedRedistribute``: the backward of every redistribution, and its
  double backward);
- ``torch.distributed.tensor._dispatch``: implicit reshards of op inputs
  (``OpDispatcher.redistribute_local_args``), forward and backward ops alike;
- ``torch.distributed.tensor._api``: ``_FromTorchTensor.backward`` (the gradient
  of ``from_local`` and the ``grad_placements`` given to ``to_local`` /
  ``full_tensor`` arrive here as a reshard of the incoming gradient);
- ``torch.distributed.tensor.experimental._tp_transform``: the TP export transform.

Replacing the name in each namespace routes every one of those callers, eager
and while AOTAutograd traces a compiled program, without touching
``DTensor.redistribute`` itself (Dynamo keeps seeing torch's own method).

Bindings imported by name outside torch are found by identity: the rule is in
:mod:`redist_opt.runtime.bindings`.
"""

from __future__ import annotations

import contextlib
import importlib

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
from torch.distributed._functional_collectives import _are_we_tracing as _funcol_are_we_tracing
from torch.distributed._functional_collectives import _resolve_group_name as _funcol_resolve_group_name
from torch.distributed._local_tensor import LocalTensor, enabled_local_tensor_mode, tensor_map
from torch.distributed.distributed_c10d import _resolve_process_group, get_process_group_ranks
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import _collective_utils as _torch_collective_utils
from torch.distributed.tensor import _redistribute as _torch_redistribute
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.distributed.tensor.placement_types import _MaskPartial
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode
from torch.utils._debug_mode import get_active_debug_mode

__all__ = [
    "needs_torch_planner",
    "torch_redistribute_local",
    "torch_plan_steps",
    "make_spec",
    "respec",
    "spec_with_dtype",
    "tensor_meta",
    "reference_semantics",
    "TORCH_REDISTRIBUTE_LOCAL",
    "REDISTRIBUTE_LOCAL_PATCH_POINTS",
    "TORCH_REDISTRIBUTE_COST",
    "TORCH_COST_UNITS_PER_SECOND",
    "REDISTRIBUTE_COST_PATCH_POINTS",
    "importable",
    "install_redistribute_cost",
    "restore_redistribute_cost",
    "clear_sharding_strategy_caches",
    "shape_is_symbolic",
    "record_redistribute",
    "dispatched_op",
    "traced_without_graph",
    "running_autograd_node",
    "outside_tracing",
    "local_tensor_of",
    "spec_of_dtensor",
    "make_dtensor",
    "local_tensor_mode",
    "is_per_rank",
    "map_per_rank",
    "per_rank_tensors",
    "int_on_rank",
    "ints_on_every_rank",
    "is_mask_partial",
    "mask_partition",
    "apply_and_release_mask",
    "torch_redistribute_handback",
    "hits_uneven_all_gather_merge",
    "group_name",
    "are_we_tracing",
    "debug_mode_active",
]

# torch's own function, captured before anyone patches it: our fallback and oracle.
TORCH_REDISTRIBUTE_LOCAL = _torch_redistribute.redistribute_local_tensor

REDISTRIBUTE_LOCAL_PATCH_POINTS = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
    "torch.distributed.tensor.experimental._tp_transform",
)


# -- the cost DTensor's sharding propagation chooses op strategies by ------------------

# torch's ``redistribute_cost(current_spec, target_spec)``: modelled time of torch's
# own plan, in microseconds (its alpha-beta helpers return ``latency_us + bw_s * 1e6``).
TORCH_REDISTRIBUTE_COST = _torch_collective_utils.redistribute_cost
TORCH_COST_UNITS_PER_SECOND = 1e6

# Where torch 2.13's sharding propagation looks ``redistribute_cost`` up by name:
# ``_ops.utils.generate_redistribute_costs``, which fills every OpSpec's
# ``redistribute_cost`` matrix (strategy functions and the single-dim strategy
# expansion alike); ``ShardingPropagator`` then picks the strategy of least total.
# (``_utils.ExplicitRedistributionContext`` only asks whether a cost is <= 0, and
# the unused Dijkstra expansion prices steps itself: neither is patched.)
REDISTRIBUTE_COST_PATCH_POINTS = ("torch.distributed.tensor._ops.utils",)


def importable(names) -> list:
    """The modules of ``names`` this torch has (patch points move between versions)."""
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError:  # another torch version
            continue
    return found


def install_redistribute_cost(replacement) -> dict:
    """Point each cost patch point's ``redistribute_cost`` at ``replacement``;
    returns {module: previous value} for :func:`restore_redistribute_cost`."""
    previous = {}
    for module in importable(REDISTRIBUTE_COST_PATCH_POINTS):
        if hasattr(module, "redistribute_cost"):
            previous[module] = module.redistribute_cost
            module.redistribute_cost = replacement
    return previous


def restore_redistribute_cost(previous: dict, replacement) -> None:
    """Undo :func:`install_redistribute_cost` where the name still holds ``replacement``."""
    for module, value in previous.items():
        if module.redistribute_cost is replacement:
            module.redistribute_cost = value


def clear_sharding_strategy_caches() -> None:
    """Forget the strategies DTensor's sharding propagation cached per op schema (its
    Python cache and the C++ dispatch fast path's): they were chosen by the cost
    function in place when they were computed."""
    _clear_sharding_prop_cache()


def shape_is_symbolic(spec: DTensorSpec) -> bool:
    """True when the global shape holds SymInts without a constant value (dynamic shapes)."""
    meta = spec.tensor_meta
    if meta is None:
        return False
    for s in meta.shape:
        if isinstance(s, torch.SymInt) and s.node.maybe_as_int() is None:
            return True
    return False


def record_redistribute(
    local_tensor, current: DTensorSpec, target: DTensorSpec, summary: str, is_explicit: bool
):
    """The context torch opens so an active ``DebugMode`` logs a redistribution (or a no-op)."""
    debug_mode = get_active_debug_mode()
    if debug_mode is None:
        return contextlib.nullcontext()
    return debug_mode.record_redistribute_calls(
        local_tensor, current.placements, target.placements, summary, is_explicit=is_explicit
    )


def debug_mode_active() -> bool:
    """Whether a ``DebugMode`` is recording (torch asks the same on every call)."""
    return get_active_debug_mode() is not None


def dispatched_op(frame) -> str | None:
    """The aten op DTensor's dispatcher is resharding inputs for, found on the Python
    stack from ``frame`` outwards (``redist_opt.record`` names call sites by it), or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(_DISPATCH_FILE):
            op_info = frame.f_locals.get("op_info")
            op = getattr(getattr(op_info, "schema", None), "op", None) or frame.f_locals.get("op_call")
            if op is not None:
                return str(op)
        frame = frame.f_back
    return None


_DISPATCH_FILE = "/".join(("distributed", "tensor", "_dispatch.py"))


def running_autograd_node() -> str | None:
    """The name of the autograd node whose backward is running (``MmBackward0``), or None."""
    node = torch._C._current_autograd_node()
    return None if node is None else node.name()


def traced_without_graph(local_tensor) -> bool:
    """Whether ``local_tensor`` is a fake tensor seen outside graph tracing: Dynamo
    computing example values, or AOTAutograd collecting metadata (runs that build no
    graph and are repeated); the graph's own trace runs under a proxy mode."""
    return is_fake(local_tensor) and get_proxy_mode() is None


def tensor_meta(shape, stride, dtype) -> TensorMeta:
    return TensorMeta(shape=torch.Size(shape), stride=tuple(stride), dtype=dtype)


def make_spec(mesh, placements, meta: TensorMeta | None) -> DTensorSpec:
    return DTensorSpec(mesh, tuple(placements), tensor_meta=meta)


def respec(spec: DTensorSpec, *, placements=None, tensor_meta=None) -> DTensorSpec:
    return DTensorSpec(
        spec.device_mesh,
        placements=tuple(placements) if placements is not None else spec.placements,
        tensor_meta=tensor_meta if tensor_meta is not None else spec.tensor_meta,
        use_strided_shard_as_shard_order=spec.use_strided_shard_as_shard_order,
    )


def spec_with_dtype(spec: DTensorSpec, dtensor, dtype: torch.dtype) -> DTensorSpec:
    return respec(spec, tensor_meta=tensor_meta(dtensor.shape, dtensor.stride(), dtype))


def needs_torch_planner(current: DTensorSpec, target: DTensorSpec) -> str | None:
    """Why torch plans this in a way we do not lower. (A ``_StridedShard`` read as a
    shard order, the default, is lowered: ``redist_opt.ir.strided``.) Calls under
    ``use_min_cost_redistribution_plan()`` are ours: the flag only picks between torch's
    greedy and graph-based planners, which agree for default shard orders."""
    for spec, role in ((current, "source"), (target, "target")):
        if spec.shard_order is None:  # _StridedShard encodes the order (use_strided_shard_as_shard_order)
            continue
        if any(type(p).__name__ == "_StridedShard" for p in spec.placements):
            return f"{role} treats _StridedShard as a plain shard (use_strided_shard_as_shard_order=False)"
        if not DTensorSpec.is_default_device_order(spec.shard_order):
            return f"{role} has a non-default shard order (planned by torch's graph-based planner)"
    return None


def is_mask_partial(p) -> bool:
    """``_MaskPartial``: the vocab-parallel embedding's partial (a sum with a row mask)."""
    return isinstance(p, _MaskPartial)


def mask_partition(placement, local_tensor, mesh, mesh_dim: int):
    """Replicate -> ``_MaskPartial`` on ``mesh_dim``: torch's own ``_partition_value``
    (shifts the indices into the local shard, zeroes the others, and materialises
    the mask in the placement's mask buffer for the later reduction)."""
    return placement._partition_value(local_tensor, mesh, mesh_dim)


def apply_and_release_mask(placement, local_tensor) -> None:
    """What ``_MaskPartial._reduce_value`` / ``_reduce_shard_value`` do before their
    sum: zero the masked rows of ``local_tensor`` in place, release the buffer."""
    placement.mask_buffer.apply_mask(local_tensor)
    placement.mask_buffer.release_mask()


def hits_uneven_all_gather_merge(
    current: DTensorSpec, target: DTensorSpec, use_graph_based_transform: bool | None = None
) -> bool:
    """Whether torch 2.13's merge pass (``_optimize_transform_infos``) would merge
    all_gathers of an unevenly sharded tensor dim into one flattened all_gather,
    which it does wrongly (it checks evenness for reduce_scatter only; fixed upstream
    in pytorch PR 194457): consecutive ``Shard(d) -> Replicate`` steps in descending
    mesh dim order, a flattened mesh over their dims, and the logical size of ``d``
    at the outermost of them (the size torch pads the merged gather by) not
    divisible by the product of their sizes.

    The steps are torch's own for this call (``use_graph_based_transform`` as the
    caller passed it), read from torch's plan cache as its redistribute does, so the
    call that follows finds them planned. Under LocalTensorMode the logical size is
    one value per simulated rank: uneven on any rank is a hit (the merge pass is then
    off for every rank, which is correct for all). A symbolic size (dynamic shapes)
    cannot be checked: a hit, so torch's unmerged plan runs, right for every size."""
    try:
        if _funcol_are_we_tracing():  # torch plans uncached while tracing: so do we
            infos = _torch_redistribute._gen_transform_infos_non_cached(
                current, target, use_graph_based_transform
            )
        else:  # positional, as torch's redistribute calls it: one cache entry for both
            infos = _torch_redistribute._gen_transform_infos(current, target, use_graph_based_transform)
    except Exception:  # noqa: BLE001 - torch will raise its own error when it runs
        return False
    mesh = current.mesh
    i = 0
    while i < len(infos):
        j = i + 1
        if infos[i]._comm_type_key() == "all_gather":
            while j < len(infos) and infos[j].src_dst_placements == infos[i].src_dst_placements:
                j += 1
        run = infos[i:j]
        i = j
        dims = tuple(r.mesh_dim for r in run)
        if len(run) < 2 or dims != tuple(sorted(dims, reverse=True)):
            continue
        if _torch_redistribute._get_flattened_mesh_by_layout(mesh, tuple(sorted(dims))) is None:
            continue
        n = 1
        for d in dims:
            n *= mesh.size(d)
        outermost = run[-1]  # the smallest mesh dim: its logical shape is the merged gather's
        sizes = ints_on_every_rank(outermost.logical_shape[outermost.src_dst_placements[0].dim])
        if sizes is None or any(size % n for size in sizes):
            return True
    return False


def torch_redistribute_handback(local_tensor, current: DTensorSpec, target: DTensorSpec, *, async_op=False):
    """torch's own redistribution for a call redist_opt hands back: torch's merge pass
    as torch has it (so a hand-back is never worse than torch), except where that
    exact input hits the uneven all_gather merge bug (then merge pass off)."""
    if hits_uneven_all_gather_merge(current, target):
        return torch_redistribute_local(local_tensor, current, target, async_op=async_op)
    return TORCH_REDISTRIBUTE_LOCAL(local_tensor, current, target, async_op=async_op)


def reference_semantics():
    """Context manager: torch's redistribute with its merge pass disabled (our oracle)."""
    return _torch_redistribute.disable_redistribute_transform_optimization()


def torch_redistribute_local(local_tensor, current: DTensorSpec, target: DTensorSpec, *, async_op=False):
    """torch's own local redistribution, merge pass disabled: the reference semantics."""
    with reference_semantics():
        return TORCH_REDISTRIBUTE_LOCAL(local_tensor, current, target, async_op=async_op)


def torch_plan_steps(mesh, src, dst, shape, dtype=torch.float32):
    """(mesh_dim, src, dst, logical_shape) of every step torch's planner emits, for
    cross-checking ours (tests/ir/test_lower.py). The logical shape is the calling
    rank's (under LocalTensorMode: SymInts holding every simulated rank's value)."""
    meta = tensor_meta(shape, _contiguous_stride(shape), dtype)
    infos = _torch_redistribute._gen_transform_infos_non_cached(
        make_spec(mesh, src, meta), make_spec(mesh, dst, meta)
    )
    return [(i.mesh_dim, *i.src_dst_placements, tuple(i.logical_shape)) for i in infos]


def _contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(tuple(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


def are_we_tracing() -> bool:
    """torch's own test (funcol's ``_are_we_tracing``): Dynamo, fake or proxy tracing."""
    return _funcol_are_we_tracing()


def group_name(group) -> str:
    """The name of the process group a funcol ``group`` argument ((mesh, dim), a
    process group, a name) stands for: what funcol resolves it to on every call."""
    return _funcol_resolve_group_name(group)


def outside_tracing():
    """A context that steps out of AOTAutograd's fake-tensor and proxy tracing modes.

    Creating a process group (a flattened DeviceMesh) while a compiled program is
    traced must build real rank tensors and real communicators, not traced ones.
    """
    stack = contextlib.ExitStack()
    stack.enter_context(unset_fake_temporarily())
    stack.enter_context(disable_proxy_modes_tracing())
    return stack


# -- c10d facts the compiled-graph pass reads (redist_opt.graph) ------------------------


def process_group_ranks(group_name: str) -> list[int]:
    """Global ranks, in group order, of the process group named ``group_name`` (the
    string functional collectives carry). Raises when no such group exists."""
    return list(get_process_group_ranks(_resolve_process_group(group_name)))


def default_store():
    """The key-value store of the default process group (the one it rendezvoused on)."""
    return dist.distributed_c10d._get_default_store()


# -- a DTensor's parts -------------------------------------------------------------


def local_tensor_of(dtensor: DTensor) -> torch.Tensor:
    """The DTensor's local tensor itself (not ``to_local()``'s autograd view)."""
    return dtensor._local_tensor


def spec_of_dtensor(dtensor: DTensor) -> DTensorSpec:
    return dtensor._spec


def make_dtensor(local_tensor: torch.Tensor, spec: DTensorSpec, *, requires_grad: bool) -> DTensor:
    """A DTensor of ``local_tensor`` with ``spec``, as torch's own Redistribute builds it."""
    return DTensor(local_tensor, spec, requires_grad=requires_grad)


# -- LocalTensorMode: simulated ranks in one process ----------------------------------


def local_tensor_mode():
    """The active LocalTensorMode, or None (real process groups)."""
    return enabled_local_tensor_mode()


def is_per_rank(x: torch.Tensor) -> bool:
    """Whether ``x`` holds one tensor per simulated rank (a LocalTensor)."""
    return isinstance(x, LocalTensor)


def map_per_rank(x: torch.Tensor, fn) -> torch.Tensor:
    """``fn(rank, tensor)`` on each simulated rank's tensor, as one LocalTensor."""
    return tensor_map(x, fn)


def per_rank_tensors(x: torch.Tensor) -> dict | None:
    """{rank: tensor} of a LocalTensor, None for a plain tensor."""
    return getattr(x, "_local_tensors", None)


def int_on_rank(c, rank: int) -> int:
    """A coordinate LocalTensorMode gives as a per-rank SymInt (or a constant), on ``rank``."""
    if isinstance(c, torch.SymInt):
        node = c.node
        values = getattr(node, "_local_ints", None)
        if values is not None:
            return int(values[rank])
        return int(node.maybe_as_int() if hasattr(node, "maybe_as_int") else node.int_())
    return int(c)


def ints_on_every_rank(c) -> tuple[int, ...] | None:
    """The values of a size on every rank: one for an int or a constant SymInt, one per
    simulated rank for LocalTensorMode's per-rank SymInt; None when it is symbolic
    (dynamic shapes), where no rank has a value yet."""
    if isinstance(c, torch.SymInt):
        node = c.node
        values = getattr(node, "_local_ints", None)
        if values is not None:
            return tuple(int(v) for v in values.values())
        value = node.maybe_as_int() if hasattr(node, "maybe_as_int") else None
        return None if value is None else (int(value),)
    return (int(c),)
