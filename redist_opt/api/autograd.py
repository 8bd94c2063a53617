"""The autograd Functions behind ``redist_opt.redistribute``: mirrors of torch's
``Redistribute`` and ``NestedRedistribute`` that run our local redistribution.

Both call ``eager.redistribute_local_tensor`` through its module, so a test can
replace that one name to see every call.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate

from redist_opt.api import eager
from redist_opt.ir.options import PlanOptions
from redist_opt.torch_api import dtensor as tdt

__all__ = ["apply_redistribute"]


def _at_dtype(dtensor: DTensor, dtype: torch.dtype):
    """(local tensor, spec) of ``dtensor`` cast to ``dtype`` for the collectives."""
    local = tdt.local_tensor_of(dtensor)
    spec = tdt.spec_of_dtensor(dtensor)
    if local.dtype == dtype:
        return local, spec
    return local.to(dtype=dtype), tdt.spec_with_dtype(spec, dtensor, dtype)


def apply_redistribute(
    dtensor: DTensor, device_mesh, placements, async_op: bool, dtype_config: dict, options: PlanOptions
) -> DTensor:
    """``dtensor`` redistributed to ``placements``, differentiable (twice, like torch's).

    ``dtype_config``: {"forward": (op dtype, out dtype), "backward": (op dtype, out
    dtype)}; ``options``: the :class:`~redist_opt.PlanOptions` to plan with.
    """
    return _Redistribute.apply(dtensor, device_mesh, placements, async_op, dtype_config, options)


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
            output = eager.redistribute_local_tensor(
                local, current_spec, target_spec, async_op=async_op, options=options
            )
        else:
            output, target_spec = local, current_spec
        # As the installed torch: 2.13 casts the output to the forward dtype, 2.11 / 2.12 keep
        # the dtype the local redistribution returned (a LocalTensorMode reduce_scatter "avg"
        # of integers returns float32: tdt.REDISTRIBUTE_CASTS_OUTPUT), with target_spec as is.
        if output.dtype != out_dtype and tdt.REDISTRIBUTE_CASTS_OUTPUT:
            output = output.to(out_dtype)
            target_spec = tdt.spec_with_dtype(target_spec, input, out_dtype)
        return tdt.make_dtensor(output, target_spec, requires_grad=input.requires_grad)

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
        ctx.original_dtype = tdt.local_tensor_of(grad_output).dtype
        local, current_spec = _at_dtype(grad_output, op_dtype)
        if current_spec is not tdt.spec_of_dtensor(grad_output):
            previous_spec = tdt.respec(previous_spec, tensor_meta=current_spec.tensor_meta)
        # As torch: gradients of Shard/Replicate -> Partial stay Replicate (reducing
        # them back to Partial would only cost a reduction later).
        normalized = tuple(
            Replicate() if (cur.is_shard() or cur.is_replicate()) and tgt.is_partial() else tgt
            for cur, tgt in zip(current_spec.placements, previous_spec.placements)
        )
        previous_spec = tdt.respec(previous_spec, placements=normalized)
        output = eager.redistribute_local_tensor(
            local, current_spec, previous_spec, async_op=async_op, options=options
        )
        if output.dtype != out_dtype:
            output = output.to(out_dtype)
        spec = tdt.make_spec(
            previous_spec.device_mesh,
            normalized,
            tdt.tensor_meta(grad_output.shape, grad_output.stride(), output.dtype),
        )
        ctx.current_spec = spec
        return tdt.make_dtensor(output, spec, requires_grad=grad_output.requires_grad)

    @staticmethod
    def backward(ctx, grad2_output):  # type: ignore[override]
        out = _NestedRedistribute.apply(
            grad2_output, ctx.current_spec, ctx.async_op, ctx.op_dtype, ctx.original_dtype, ctx.options
        )
        return out, None, None, None, None, None
