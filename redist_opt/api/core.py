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

from redist_opt.runtime import torch_dtensor as tdt
from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import REDUCE_OPS, RedistributeError, normalize_placements, placement_str, placements_str

# Reduce ops the IR lowers; a Partial with any other op (torch's Partial accepts
# every c10d reduce op, "prod" included) is run by torch's redistribute.
LOWERED_REDUCE_OPS = REDUCE_OPS
from redist_opt.ir.plan import Plan, make_plan
from redist_opt.ir import cost
from redist_opt.ir import plan as plan_module
from redist_opt import pipeline
from redist_opt.debug import dump
from redist_opt import ir
from redist_opt.runtime.execute import GroupUnavailable, check_local_shape, execute

__all__ = ["plan", "optimize", "redistribute", "redistribute_local_tensor", "enabled", "clear_caches"]

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
    dump_dir=None,
) -> Plan:
    """Run the pass pipeline (``passes/``) over ``p``; returns a new plan.

    ``groups``: "existing" (only communicators that exist), "create", or a list of
    mesh-dim groups (``["dp+cp"]``) that may be created. ``cost``: a
    :class:`~redist_opt.ir.cost.CostModel` (default: NCCL-like). ``prefer``: "time",
    or "consistency" to merge every reduction a group allows (bitwise-equal
    replicas) whatever the cost. ``passes``: a list of pass classes to run
    instead of the default pipeline. ``dump_dir``: write the IR before the
    pipeline and after every pass that changed it into this directory (default:
    ``$REDIST_OPT_DUMP_DIR``, if set).
    """
    _check_groups(groups)
    if not isinstance(groups, str):
        for g in groups:  # names an existing mesh dim set, or raises naming the mesh
            p.mesh.dims_of(g)
    if prefer not in ("time", "consistency"):
        raise RedistributeError(f"prefer={prefer!r}: expected 'time' or 'consistency'")
    if p.fallback:
        return p
    on_change = dump.pass_dump_writer(dump_dir, p)
    return pipeline.run_pipeline(p, groups=groups, passes=passes, cost=cost, prefer=prefer, on_change=on_change)


# id(mesh) -> (weakref to the mesh, stamp, spec). Keyed by identity, not by
# DeviceMesh equality: two equal meshes can have different roots and so
# different flattened groups.
_spec_cache: dict[int, tuple] = {}


def _forget_spec(key: int, dead_ref) -> None:
    # Only if the entry is still the dead mesh's: its id may belong to a new mesh now.
    if _spec_cache.get(key, (None,))[0] is dead_ref:
        del _spec_cache[key]


# Open recorders of the meshes planned on (redist_opt.backend: the meshes of one trace).
_mesh_recorders: list[dict] = []


@contextlib.contextmanager
def recording_meshes():
    """Yields a dict (id -> DeviceMesh) of the meshes planned on inside the block."""
    used: dict = {}
    _mesh_recorders.append(used)
    try:
        yield used
    finally:
        _mesh_recorders.remove(used)


def spec_of(device_mesh) -> MeshSpec:
    """``MeshSpec.from_device_mesh``, cached per mesh until its root gains a flattened mesh."""
    for used in _mesh_recorders:
        used[id(device_mesh)] = device_mesh
    root = device_mesh._get_root_mesh()
    stamp = (id(root), len(root._flatten_mapping), dist.is_initialized())
    hit = _spec_cache.get(id(device_mesh))
    if hit is None or hit[0]() is not device_mesh or hit[1] != stamp:
        key = id(device_mesh)
        ref = weakref.ref(device_mesh, lambda r, key=key: _forget_spec(key, r))
        hit = (ref, stamp, MeshSpec.from_device_mesh(device_mesh))
        _spec_cache[key] = hit
    return hit[2]


def meshes_seen() -> list:
    """The live DeviceMeshes redist_opt has planned on (graph dumps name their groups)."""
    return [m for m in (entry[0]() for entry in list(_spec_cache.values())) if m is not None]


def _as_spec(mesh) -> MeshSpec:
    if isinstance(mesh, MeshSpec):
        return mesh
    if hasattr(mesh, "_layout") and hasattr(mesh, "mesh_dim_names"):
        return spec_of(mesh)
    raise RedistributeError(f"expected a DeviceMesh or MeshSpec, got {type(mesh).__name__}")


def clear_caches() -> None:
    """Forget every cached result: lowered plans, pipeline results, hot plans,
    MeshSpecs of DeviceMeshes and cost profiles read from files."""
    plan_module.clear_cache()
    pipeline.clear_cache()
    cost.clear_cache()
    _spec_cache.clear()
    _hot_plans.clear()


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
        raise _torch_typed(RuntimeError, "placements is needed for redistribute!")
    if device_mesh != dtensor.device_mesh:
        raise _torch_typed(NotImplementedError, 
            f"redistributing to another mesh ({device_mesh}) is not supported (DTensor's is "
            f"{dtensor.device_mesh})"
        )
    target = normalize_placements(
        placements, mesh_shape=tuple(device_mesh.shape), tensor_ndim=dtensor.ndim, role="target"
    )
    _check_spec_matches(dtensor)
    for i, p in enumerate(target):
        if isinstance(p, Partial) and dtensor.placements[i] != p:
            raise _torch_typed(
                RuntimeError,
                f"Can not redistribute from {placement_str(dtensor.placements[i])} to "
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


# -- routing every redistribution ---------------------------------------------------
#
# enabled() replaces torch's ``redistribute_local_tensor`` in the namespaces that
# call it (listed in torch_dtensor.REDISTRIBUTE_LOCAL_PATCH_POINTS) with
# ``_routed_redistribute_local_tensor``. The patch is process-wide (the name is a
# module global) and installed once, reference-counted; which options apply is
# per thread: the calling thread's innermost enabled() block, or, for a thread
# that entered none (autograd's device threads run backward on GPUs), the most
# recently entered block of any thread. Outside every block the patched name
# calls torch's function unchanged.

_route_lock = threading.Lock()
_route_entries: list = []  # [(token, thread id, options)] in entry order
_route_previous: dict | None = None  # what install_redistribute_local replaced
_route_local = threading.local()


def _active_route_options():
    stack = getattr(_route_local, "stack", None)
    if stack:
        return stack[-1][1]
    entries = _route_entries
    return entries[-1][2] if entries else None


def _routed_redistribute_local_tensor(
    local_tensor,
    current_spec,
    target_spec,
    *,
    async_op: bool = False,
    use_graph_based_transform=None,
    is_explicit: bool = False,
    **torch_only,
):
    """Stands in for torch's ``redistribute_local_tensor`` inside ``enabled()``."""
    torch_fn = tdt.TORCH_REDISTRIBUTE_LOCAL
    if torch.compiler.is_dynamo_compiling():
        # Dynamo traces torch's own code; AOTAutograd, which runs after it, comes
        # back here with Dynamo off and traces our plan into the graph.
        return torch_fn(local_tensor, current_spec, target_spec, async_op=async_op,
                        use_graph_based_transform=use_graph_based_transform,
                        is_explicit=is_explicit, **torch_only)
    options = _active_route_options()
    reason = None
    if options is None:
        pass
    elif torch_only:
        reason = f"torch passed arguments redist_opt does not model: {sorted(torch_only)}"
    elif use_graph_based_transform:
        reason = "torch's graph-based planner was requested (use_graph_based_transform=True)"
    elif current_spec.mesh != target_spec.mesh:
        reason = "the source and target meshes differ"  # torch raises its own error for this
    elif tdt.shape_is_symbolic(current_spec):
        reason = (
            f"the global shape {tuple(current_spec.shape)} is symbolic (dynamic shapes); "
            "redist_opt plans concrete shapes only"
        )
    else:
        reason = tdt.needs_torch_planner(current_spec, target_spec) or _unlowered_reduce_op(
            current_spec, target_spec
        )
    if options is None or reason is not None:
        if reason is not None and options is not None:
            _warn_once(("route", reason), f"redist_opt: using torch's redistribute: {reason}")
        return torch_fn(local_tensor, current_spec, target_spec, async_op=async_op,
                        use_graph_based_transform=use_graph_based_transform,
                        is_explicit=is_explicit, **torch_only)
    summary = f"redist_opt {placements_str(current_spec.placements)} -> {placements_str(target_spec.placements)}"
    with tdt.record_redistribute(local_tensor, current_spec, target_spec, summary, is_explicit):
        try:
            return redistribute_local_tensor(local_tensor, current_spec, target_spec, async_op=async_op, **options)
        except RedistributeError as ours:
            raise _as_torch_error(ours, local_tensor, current_spec, target_spec) from None


def _unlowered_reduce_op(current_spec, target_spec) -> str | None:
    for spec in (current_spec, target_spec):
        for p in spec.placements:
            if isinstance(p, Partial) and p.reduce_op not in LOWERED_REDUCE_OPS:
                return f"Partial({p.reduce_op!r}) is not lowered by redist_opt"
    return None


_torch_typed_errors: dict = {}


def _torch_typed(kind: type, message: str) -> RedistributeError:
    """A RedistributeError that is also an instance of ``kind``, torch's type for this input."""
    cls = _torch_typed_errors.get(kind)
    if cls is None:
        cls = _torch_typed_errors[kind] = type(
            "RedistributeError", (RedistributeError, kind), {"__module__": __name__}
        )
    return cls(message)


def _as_torch_error(ours: RedistributeError, local_tensor, current_spec, target_spec) -> Exception:
    """``ours`` as an instance of what torch raises for the same input.

    Asks torch's own function: if it raises too, the error returned is both a
    RedistributeError and an instance of torch's exception type, with our message
    (which names the placement, mesh dim and mesh) followed by torch's. If torch accepts the input,
    ours stands: redist_opt refuses what it can prove wrong rather than return it.
    """
    try:
        tdt.TORCH_REDISTRIBUTE_LOCAL(local_tensor, current_spec, target_spec)
    except Exception as theirs:  # noqa: BLE001 - any type torch raises is the one to match
        kind = type(theirs)
        if isinstance(ours, kind):
            return ours
        try:
            # torch's message too: code matching torch's wording keeps working
            err = _torch_typed(kind, f"{ours} (torch: {theirs})")
        except TypeError:  # an exception type that cannot be combined (layout conflict)
            return ours
        err.__cause__ = theirs
        return err
    return ours


@contextlib.contextmanager
def enabled(groups: str | Sequence = "existing", **options):
    """Route every DTensor redistribution through redist_opt inside the block.

    Covers explicit ``DTensor.redistribute`` and ``full_tensor``, implicit reshards
    of op inputs, the backward of all of those, gradients arriving through
    ``from_local`` / ``to_local(grad_placements=...)``, and ``torch.compile``
    called inside the block (AOTAutograd traces our plans into the forward and
    backward graphs). ``options`` (passes, cost, prefer) go to :func:`optimize`.
    Nests; the innermost block of the calling thread decides the options.
    """
    global _route_previous
    _check_groups(groups)
    unknown = set(options) - {"passes", "cost", "prefer"}
    if unknown:
        raise RedistributeError(f"enabled(): unknown options {sorted(unknown)} (expected passes, cost, prefer)")
    if options.get("passes") is not None:
        options["passes"] = tuple(options["passes"])
    entry_options = dict(groups=groups if isinstance(groups, str) else tuple(groups), **options)
    token = object()
    stack = getattr(_route_local, "stack", None)
    if stack is None:
        stack = _route_local.stack = []
    with _route_lock:
        if not _route_entries:
            _route_previous = tdt.install_redistribute_local(_routed_redistribute_local_tensor)
        _route_entries.append((token, threading.get_ident(), entry_options))
    stack.append((token, entry_options))
    try:
        yield
    finally:
        stack[:] = [e for e in stack if e[0] is not token]
        with _route_lock:
            _route_entries[:] = [e for e in _route_entries if e[0] is not token]
            if not _route_entries:
                tdt.restore_redistribute_local(_route_previous, _routed_redistribute_local_tensor)
                _route_previous = None
