"""``redistribute``: the drop-in for ``DTensor.redistribute`` (same arguments, same
result, differentiable twice like it) that plans and optimizes the collectives.

The rest of the public API lives beside it: ``plan``, ``optimize`` and
``clear_caches`` in :mod:`redist_opt.api.planning`, ``redistribute_local_tensor``
in :mod:`redist_opt.api.eager`, ``enabled`` in :mod:`redist_opt.api.routing`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from redist_opt.api.autograd import apply_redistribute
from redist_opt.api.errors import torch_typed
from redist_opt.ir.ops import local_shape
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import RedistributeError, normalize_placements, placements_str
from redist_opt.runtime.execute import check_local_shape
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api import mesh as tm

__all__ = ["redistribute"]


def redistribute(
    dtensor: DTensor,
    placements: Sequence[Placement | str] | str | None = None,
    *,
    device_mesh=None,
    async_op: bool = False,
    forward_dtype: torch.dtype | None = None,
    backward_dtype: torch.dtype | None = None,
    options: PlanOptions | None = None,
    **fields,
) -> DTensor:
    """Drop-in for ``DTensor.redistribute`` that plans and optimizes the collectives.

    The plan options are ``options=PlanOptions(...)`` or its fields as keywords
    (those of :func:`optimize`): ``groups="existing"`` uses only process groups that
    already exist; ``groups="create"`` lets merged collectives create flattened
    groups on first use; ``passes=[]`` runs DTensor's own plan.
    """
    options = PlanOptions.of(options, **fields)
    if not isinstance(dtensor, DTensor):
        raise RedistributeError(f"expected a DTensor, got {type(dtensor).__name__}")
    device_mesh = device_mesh or dtensor.device_mesh
    if placements is None:
        raise torch_typed(RuntimeError, "placements is needed for redistribute!")
    if device_mesh != dtensor.device_mesh:
        raise torch_typed(
            NotImplementedError,
            f"redistributing to another mesh ({device_mesh}) is not supported (DTensor's is "
            f"{dtensor.device_mesh})",
        )
    target = normalize_placements(
        placements, mesh_shape=tuple(device_mesh.shape), tensor_ndim=dtensor.ndim, role="target"
    )
    _check_spec_matches(dtensor)
    for i, p in enumerate(target):
        # What the installed torch's DTensor.redistribute refuses, it refuses here with the
        # same message: torch 2.13 every new Partial, torch 2.15 all but Shard -> Partial("sum")
        # (its zero-fill, which the eager path hands to torch).
        refusal = tdt.partial_target_refusal(dtensor.placements[i], p)
        if refusal is not None:
            raise torch_typed(RuntimeError, f"{refusal} (mesh dim {i})")
    input_dtype = tdt.local_tensor_of(dtensor).dtype
    forward_dtype = forward_dtype or input_dtype
    dtype_config = {
        "forward": (forward_dtype, forward_dtype),
        "backward": (backward_dtype or input_dtype, input_dtype),
    }
    return apply_redistribute(dtensor, device_mesh, target, async_op, dtype_config, options)


_local_shape = functools.lru_cache(maxsize=4096)(local_shape)


def _check_spec_matches(dtensor: DTensor) -> None:
    spec = tdt.spec_of_dtensor(dtensor)
    # The DTensor's own placements get the same checks as requested ones.
    normalize_placements(
        spec.placements, mesh_shape=tuple(spec.mesh.shape), tensor_ndim=dtensor.ndim, role="DTensor spec"
    )
    if spec.tensor_meta is not None and tuple(spec.tensor_meta.shape) != tuple(dtensor.shape):
        raise RedistributeError(
            f"DTensor spec shape {tuple(spec.tensor_meta.shape)} does not match its shape "
            f"{tuple(dtensor.shape)}"
        )
    if tm.rank_in_mesh(spec.mesh) and all(type(p) in (Shard, Replicate, Partial) for p in spec.placements):
        expected = _local_shape(tuple(dtensor.shape), tuple(spec.placements), tuple(spec.mesh.shape))
        check_local_shape(expected, tdt.local_tensor_of(dtensor), spec.mesh, placements_str(spec.placements))
