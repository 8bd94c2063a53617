"""The one module that touches DTensor's private planner and spec classes.

``DTensorSpec``, ``TensorMeta``, ``redistribute_local_tensor``,
``_gen_transform_infos_non_cached`` and ``disable_redistribute_transform_optimization``
are private to ``torch.distributed.tensor``; a torch upgrade that changes them
should only need this file updated.
"""

from __future__ import annotations

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
]


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
        return _torch_redistribute.redistribute_local_tensor(
            local_tensor, current, target, async_op=async_op
        )


def torch_plan_steps(mesh, src, dst, shape, dtype=torch.float32):
    """(mesh_dim, src, dst) of every step torch's planner emits, for cross-checking ours."""
    meta = tensor_meta(shape, _contiguous_stride(shape), dtype)
    infos = _torch_redistribute._gen_transform_infos_non_cached(
        make_spec(mesh, src, meta), make_spec(mesh, dst, meta)
    )
    return [(i.mesh_dim, *i.src_dst_placements) for i in infos]


def _contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(tuple(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))
