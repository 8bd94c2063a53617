"""The one module that touches DTensor's private planner and spec classes.

``DTensorSpec``, ``TensorMeta``, ``redistribute_local_tensor``,
``_gen_transform_infos_non_cached`` and ``disable_redistribute_transform_optimization``
are private to ``torch.distributed.tensor``; a torch upgrade that changes them
should only need this file updated.

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
"""

from __future__ import annotations

import importlib

import torch
from torch.distributed.tensor import _redistribute as _torch_redistribute
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

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
    "install_redistribute_local",
    "restore_redistribute_local",
    "shape_is_symbolic",
    "record_redistribute",
]

# torch's own function, captured before anyone patches it: our fallback and oracle.
TORCH_REDISTRIBUTE_LOCAL = _torch_redistribute.redistribute_local_tensor

REDISTRIBUTE_LOCAL_PATCH_POINTS = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
    "torch.distributed.tensor.experimental._tp_transform",
)


def install_redistribute_local(replacement) -> dict:
    """Point every patch point's ``redistribute_local_tensor`` at ``replacement``.

    Returns {module: previous value} for :func:`restore_redistribute_local`.
    A module that does not import the name (another torch version) is skipped.
    """
    previous = {}
    for name in REDISTRIBUTE_LOCAL_PATCH_POINTS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "redistribute_local_tensor"):
            previous[module] = module.redistribute_local_tensor
            module.redistribute_local_tensor = replacement
    return previous


def restore_redistribute_local(previous: dict, replacement) -> None:
    """Undo :func:`install_redistribute_local` where the name still holds ``replacement``
    (a later patch by someone else is left in place)."""
    for module, value in previous.items():
        if module.redistribute_local_tensor is replacement:
            module.redistribute_local_tensor = value


def shape_is_symbolic(spec: DTensorSpec) -> bool:
    """True when the global shape holds SymInts without a constant value (dynamic shapes)."""
    meta = spec.tensor_meta
    if meta is None:
        return False
    for s in meta.shape:
        if isinstance(s, torch.SymInt) and s.node.maybe_as_int() is None:
            return True
    return False


def record_redistribute(local_tensor, current: DTensorSpec, target: DTensorSpec, summary: str, is_explicit: bool):
    """The context torch opens so an active ``DebugMode`` logs a redistribution (or a no-op)."""
    import contextlib

    from torch.utils._debug_mode import get_active_debug_mode

    debug_mode = get_active_debug_mode()
    if debug_mode is None:
        return contextlib.nullcontext()
    return debug_mode.record_redistribute_calls(
        local_tensor, current.placements, target.placements, summary, is_explicit=is_explicit
    )


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
    """Why torch would plan this with its graph-based planner (which we do not lower)."""
    for spec, role in ((current, "source"), (target, "target")):
        if spec.shard_order is None:
            return f"{role} placements {spec.placements} use _StridedShard"
        if not DTensorSpec.is_default_device_order(spec.shard_order):
            return f"{role} has a non-default shard order {spec.shard_order}"
    if _torch_redistribute._FORCE_MIN_COST_REDISTRIBUTION_PLAN:
        return "torch's min-cost planner is forced (use_min_cost_redistribution_plan)"
    return None


def reference_semantics():
    """Context manager: torch's redistribute with its merge pass disabled (our oracle)."""
    return _torch_redistribute.disable_redistribute_transform_optimization()


def torch_redistribute_local(local_tensor, current: DTensorSpec, target: DTensorSpec, *, async_op=False):
    """torch's own local redistribution, merge pass disabled: the reference semantics."""
    with reference_semantics():
        return TORCH_REDISTRIBUTE_LOCAL(local_tensor, current, target, async_op=async_op)


def torch_plan_steps(mesh, src, dst, shape, dtype=torch.float32):
    """(mesh_dim, src, dst, logical_shape) of every step torch's planner emits, for
    cross-checking ours (tests/test_lower.py). The logical shape is the calling
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


def outside_tracing():
    """A context that steps out of AOTAutograd's fake-tensor and proxy tracing modes.

    Creating a process group (a flattened DeviceMesh) while a compiled program is
    traced must build real rank tensors and real communicators, not traced ones.
    """
    import contextlib

    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    stack = contextlib.ExitStack()
    stack.enter_context(unset_fake_temporarily())
    stack.enter_context(disable_proxy_modes_tracing())
    return stack
