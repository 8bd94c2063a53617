"""Public API: ``plan``, ``optimize``, ``redistribute`` and ``enabled``.

``redistribute`` is a drop-in for ``DTensor.redistribute`` (same arguments, same
result, differentiable twice like it); ``enabled()`` routes existing
``DTensor.redistribute`` calls through it without edits.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import warnings
import weakref
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from . import torch_dtensor as tdt
from .mesh import MeshSpec
from .placements import RedistributeError, normalize_placements, placement_str, placements_str
from .plan import Plan, make_plan
from . import ir
from .runtime import GroupUnavailable, check_local_shape, execute

__all__ = ["plan", "optimize", "redistribute", "redistribute_local_tensor", "enabled"]

logger = logging.getLogger("redist_opt")

GROUP_POLICIES = ("existing", "create")


def plan(
    mesh,
    src: Sequence[Placement | str] | str,
    dst: Sequence[Placement | str] | str,
    *,
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
) -> Plan:
    """The naive plan DTensor would run for ``src -> dst`` (its merge pass disabled).

    ``mesh`` is a DeviceMesh or a rank-free :class:`MeshSpec`; placements are torch
    ``Placement`` objects or strings (``"R"``, ``"S(0)"``, ``"P(avg)"``; or one
    comma-separated string).
    """
    return make_plan(_as_spec(mesh), src, dst, shape, dtype)


def optimize(
    p: Plan,
    *,
    groups: str | Sequence = "existing",
    passes=None,
    cost=None,
    prefer: str = "time",
) -> Plan:
    """Run the pass pipeline (``passes/``) over ``p``; returns a new plan.

    ``groups``: "existing" (only communicators that exist), "create", or a list of
    mesh-dim groups (``["dp+cp"]``) that may be created. ``cost``: a
    :class:`~redist_opt.cost.CostModel` (default: NCCL-like). ``prefer``: "time",
    or "consistency" to merge every reduction a group allows (bitwise-equal
    replicas) whatever the cost. ``passes``: a list of pass classes to run
    instead of the default pipeline.
    """
    _check_groups(groups)
    if not isinstance(groups, str):
        for g in groups:  # names an existing mesh dim set, or raises naming the mesh
            p.mesh.dims_of(g)
    if prefer not in ("time", "consistency"):
        raise RedistributeError(f"prefer={prefer!r}: expected 'time' or 'consistency'")
    if p.fallback:
        return p
    from .pipeline import run_pipeline

    return run_pipeline(p, groups=groups, passes=passes, cost=cost, prefer=prefer)


# id(mesh) -> (weakref to the mesh, stamp, spec). Keyed by identity, not by
# DeviceMesh equality: two equal meshes can have different roots and so
# different flattened groups.
_spec_cache: dict[int, tuple] = {}


def _forget_spec(key: int, dead_ref) -> None:
    # Only if the entry is still the dead mesh's: its id may belong to a new mesh now.
    if _spec_cache.get(key, (None,))[0] is dead_ref:
        del _spec_cache[key]


def spec_of(device_mesh) -> MeshSpec:
    """``MeshSpec.from_device_mesh``, cached per mesh until its root gains a flattened mesh."""
    root = device_mesh._get_root_mesh()
    stamp = (id(root), len(root._flatten_mapping), dist.is_initialized())
    hit = _spec_cache.get(id(device_mesh))
    if hit is None or hit[0]() is not device_mesh or hit[1] != stamp:
        key = id(device_mesh)
        ref = weakref.ref(device_mesh, lambda r, key=key: _forget_spec(key, r))
        hit = (ref, stamp, MeshSpec.from_device_mesh(device_mesh))
        _spec_cache[key] = hit
    return hit[2]


def _as_spec(mesh) -> MeshSpec:
    if isinstance(mesh, MeshSpec):
        return mesh
    if hasattr(mesh, "_layout") and hasattr(mesh, "mesh_dim_names"):
        return spec_of(mesh)
    raise RedistributeError(f"expected a DeviceMesh or MeshSpec, got {type(mesh).__name__}")


def _check_groups(groups) -> None:
    if isinstance(groups, str) and groups not in GROUP_POLICIES:
        raise RedistributeError(
            f"groups={groups!r}: expected 'existing', 'create' or a list of allowed groups"
        )


# -- eager execution ----------------------------------------------------------

_warned: set = set()


def _warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)
        logger.warning(message)


def redistribute_local_tensor(
    local_tensor: torch.Tensor,
    current_spec,
    target_spec,
    *,
    async_op: bool = False,
    groups: str | Sequence = "existing",
    passes=None,
    cost=None,
    prefer: str = "time",
) -> torch.Tensor:
    """redist_opt's version of torch's ``redistribute_local_tensor`` (same contract)."""
    device_mesh = current_spec.mesh
    if target_spec.mesh != device_mesh:
        raise RedistributeError(
            f"cannot redistribute between different meshes ({device_mesh} -> {target_spec.mesh})"
        )
    if not device_mesh._is_current_rank_part_of_mesh():
        return local_tensor
    reason = tdt.needs_torch_planner(current_spec, target_spec)
    if reason is None:
        p, opt = _plans_for(
            spec_of(device_mesh),
            current_spec.placements,
            target_spec.placements,
            tuple(current_spec.shape),
            local_tensor.dtype,
            (groups if isinstance(groups, str) else tuple(groups), passes, cost, prefer),
        )
        reason = p.fallback_reason
    if reason is not None:
        _warn_once(("fallback", reason), f"redist_opt: using torch's redistribute: {reason}")
        return tdt.torch_redistribute_local(local_tensor, current_spec, target_spec, async_op=async_op)
    try:
        return execute(opt.graph, local_tensor, device_mesh, groups=groups, async_op=async_op)
    except GroupUnavailable as e:
        if opt is p:
            raise
        _warn_once(
            ("group", str(e)),
            f"redist_opt: {e}; running the unmerged plan for {placements_str(p.src)} -> "
            f"{placements_str(p.dst)}",
        )
        return execute(p.graph, local_tensor, device_mesh, async_op=async_op)


_hot_plans: dict = {}


def _plans_for(spec, src, dst, shape, dtype, options) -> tuple[Plan, Plan]:
    """(naive, optimized) plan; after the first call one dict lookup (the eager hot path)."""
    key = (spec, src, dst, shape, dtype, options)
    hit = _hot_plans.get(key)
    if hit is None:
        groups, passes, cost, prefer = options
        naive = make_plan(spec, src, dst, shape, dtype)
        opt = naive if naive.fallback else optimize(naive, groups=groups, passes=passes, cost=cost, prefer=prefer)
        if len(_hot_plans) > 65536:  # a job with ever-new shapes: bound the memory
            _hot_plans.clear()
        hit = _hot_plans[key] = (naive, opt)
    return hit


def _at_dtype(dtensor: DTensor, dtype: torch.dtype):
    """(local tensor, spec) of ``dtensor`` cast to ``dtype`` for the collectives."""
    local = dtensor._local_tensor
    if local.dtype == dtype:
        return local, dtensor._spec
    return local.to(dtype=dtype), tdt.spec_with_dtype(dtensor._spec, dtensor, dtype)


class _Redistribute(torch.autograd.Function):
    """Mirror of torch's ``Redistribute`` with our local redistribution."""

    @staticmethod
    def forward(ctx, input, device_mesh, placements, async_op, dtype_config, options):  # type: ignore[override]
        ctx.async_op = async_op
        ctx.options = options
        ctx.bwd_op_dtype, ctx.bwd_out_dtype = dtype_config["backward"]
        op_dtype, out_dtype = dtype_config["forward"]
        local, current_spec = _at_dtype(input, op_dtype)
        ctx.current_spec = current_spec
        if current_spec.placements != placements:
            target_spec = tdt.make_spec(device_mesh, placements, current_spec.tensor_meta)
            output = redistribute_local_tensor(
                local, current_spec, target_spec, async_op=async_op, **options
            )
        else:
            output, target_spec = local, current_spec
        if output.dtype != out_dtype:
            output = output.to(out_dtype)
            target_spec = tdt.spec_with_dtype(target_spec, input, out_dtype)
        return DTensor(output, target_spec, requires_grad=input.requires_grad)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        out = _NestedRedistribute.apply(
            grad_output, ctx.current_spec, ctx.async_op, ctx.bwd_op_dtype, ctx.bwd_out_dtype, ctx.options
        )
        return out, None, None, None, None, None


class _NestedRedistribute(torch.autograd.Function):
    """The backward of a redistribution is itself a planned redistribution."""

    @staticmethod
    def forward(ctx, grad_output, previous_spec, async_op, op_dtype, out_dtype, options):  # type: ignore[override]
        ctx.async_op, ctx.op_dtype, ctx.options = async_op, op_dtype, options
        ctx.original_dtype = grad_output._local_tensor.dtype
        local, current_spec = _at_dtype(grad_output, op_dtype)
        if current_spec is not grad_output._spec:
            previous_spec = tdt.respec(previous_spec, tensor_meta=current_spec.tensor_meta)
        # As torch: gradients of Shard/Replicate -> Partial stay Replicate (reducing
        # them back to Partial would only cost a reduction later).
        normalized = tuple(
            Replicate() if (cur.is_shard() or cur.is_replicate()) and tgt.is_partial() else tgt
            for cur, tgt in zip(current_spec.placements, previous_spec.placements)
        )
        previous_spec = tdt.respec(previous_spec, placements=normalized)
        output = redistribute_local_tensor(
            local, current_spec, previous_spec, async_op=async_op, **options
        )
        if output.dtype != out_dtype:
            output = output.to(out_dtype)
        spec = tdt.make_spec(
            previous_spec.device_mesh,
            normalized,
            tdt.tensor_meta(grad_output.shape, grad_output.stride(), output.dtype),
        )
        ctx.current_spec = spec
        return DTensor(output, spec, requires_grad=grad_output.requires_grad)

    @staticmethod
    def backward(ctx, grad2_output):  # type: ignore[override]
        out = _NestedRedistribute.apply(
            grad2_output, ctx.current_spec, ctx.async_op, ctx.op_dtype, ctx.original_dtype, ctx.options
        )
        return out, None, None, None, None, None


def redistribute(
    dtensor: DTensor,
    placements: Sequence[Placement | str] | str | None = None,
    *,
    device_mesh=None,
    async_op: bool = False,
    forward_dtype: torch.dtype | None = None,
    backward_dtype: torch.dtype | None = None,
    groups: str | Sequence = "existing",
    passes=None,
    cost=None,
    prefer: str = "time",
) -> DTensor:
    """Drop-in for ``DTensor.redistribute`` that plans and optimizes the collectives.

    ``groups="existing"`` uses only process groups that already exist;
    ``groups="create"`` lets merged collectives create flattened groups on first use.
    ``passes``, ``cost`` and ``prefer`` are passed to :func:`optimize`
    (``passes=[]`` runs DTensor's own plan through redist_opt's runtime).
    """
    _check_groups(groups)
    if not isinstance(dtensor, DTensor):
        raise RedistributeError(f"expected a DTensor, got {type(dtensor).__name__}")
    device_mesh = device_mesh or dtensor.device_mesh
    if placements is None:
        raise RedistributeError("placements is needed for redistribute!")
    if device_mesh != dtensor.device_mesh:
        raise RedistributeError(
            f"redistributing to another mesh ({device_mesh}) is not supported (DTensor's is "
            f"{dtensor.device_mesh})"
        )
    target = normalize_placements(
        placements, mesh_shape=tuple(device_mesh.shape), tensor_ndim=dtensor.ndim, role="target"
    )
    _check_spec_matches(dtensor)
    for i, p in enumerate(target):
        if isinstance(p, Partial) and dtensor.placements[i] != p:
            raise RedistributeError(
                f"cannot redistribute from {placement_str(dtensor.placements[i])} to "
                f"{placement_str(p)} on mesh dim {i}: redistributing to Partial is for "
                "internal use only (use redist_opt.plan for such plans)"
            )
    input_dtype = dtensor._local_tensor.dtype
    forward_dtype = forward_dtype or input_dtype
    dtype_config = {
        "forward": (forward_dtype, forward_dtype),
        "backward": (backward_dtype or input_dtype, input_dtype),
    }
    options = dict(groups=groups, passes=None if passes is None else tuple(passes), cost=cost, prefer=prefer)
    return _Redistribute.apply(dtensor, device_mesh, target, async_op, dtype_config, options)


_local_shape = functools.lru_cache(maxsize=4096)(ir.local_shape)


def _check_spec_matches(dtensor: DTensor) -> None:
    spec = dtensor._spec
    # The DTensor's own placements get the same checks as requested ones.
    normalize_placements(
        spec.placements, mesh_shape=tuple(spec.mesh.shape), tensor_ndim=dtensor.ndim, role="DTensor spec"
    )
    if spec.tensor_meta is not None and tuple(spec.tensor_meta.shape) != tuple(dtensor.shape):
        raise RedistributeError(
            f"DTensor spec shape {tuple(spec.tensor_meta.shape)} does not match its shape "
            f"{tuple(dtensor.shape)}"
        )
    if spec.mesh._is_current_rank_part_of_mesh() and all(type(p) in (Shard, Replicate, Partial) for p in spec.placements):
        expected = _local_shape(tuple(dtensor.shape), tuple(spec.placements), tuple(spec.mesh.shape))
        check_local_shape(expected, dtensor._local_tensor, spec.mesh, placements_str(spec.placements))


# -- routing DTensor.redistribute ---------------------------------------------------

_route_lock = threading.Lock()
_route_stack: list = []


@contextlib.contextmanager
def enabled(groups: str | Sequence = "existing", **options):
    """Route ``DTensor.redistribute`` through redist_opt inside the block.

    ``options`` (passes, cost, prefer) go to :func:`optimize`. Patches the method
    process-wide (DTensor has no per-thread hook); nests.
    """
    _check_groups(groups)

    def routed(self, device_mesh=None, placements=None, *, async_op=False, forward_dtype=None, backward_dtype=None):
        return redistribute(
            self,
            placements,
            device_mesh=device_mesh,
            async_op=async_op,
            forward_dtype=forward_dtype,
            backward_dtype=backward_dtype,
            groups=groups,
            **options,
        )

    with _route_lock:
        _route_stack.append(DTensor.redistribute)
        DTensor.redistribute = routed
    try:
        yield
    finally:
        with _route_lock:
            DTensor.redistribute = _route_stack.pop()
