"""DTensor's private placements: the ones real jobs hand us.

- ``_NormPartial(p)`` (``torch.distributed.tensor._ops._math_ops``): grad-norm
  clipping's partial p-norm (``norm_type``).
- ``_MaskPartial`` (``placement_types``): the vocab-parallel embedding's partial, a
  sum with a row mask kept in its ``mask_buffer``; ``_partition_value`` makes it
  from a replicated tensor.
- ``_StridedShard(dim, split_factor=)`` (``placement_types``): FSDP2 + TP state
  dicts. In 2.15 it derives from a C++ ``StridedShard``; the Python name,
  constructor and ``split_factor`` are the same as in 2.11 and 2.13.

Read in the sources of torch 2.11 to 2.15: every name here is in all of them.
"""

from __future__ import annotations

from redist_opt.torch_api.version import PrivateName, private, resolve_declared

__all__ = [
    "PRIVATE_NAMES",
    "NormPartial",
    "MaskPartial",
    "StridedShard",
    "is_mask_partial",
    "mask_partition",
    "apply_and_release_mask",
]

_TYPES = "torch.distributed.tensor.placement_types"
_MATH = "torch.distributed.tensor._ops._math_ops"

PRIVATE_NAMES = (
    PrivateName(_MATH, "_NormPartial"),
    PrivateName(_TYPES, "_StridedShard"),
    PrivateName(_TYPES, "_MaskPartial"),
    PrivateName(_TYPES, "_MaskPartial._partition_value"),
)
resolve_declared(PRIVATE_NAMES)

NormPartial = private(_MATH, "_NormPartial")
StridedShard = private(_TYPES, "_StridedShard")
MaskPartial = private(_TYPES, "_MaskPartial")


def is_mask_partial(p) -> bool:
    """``_MaskPartial``: the vocab-parallel embedding's partial (a sum with a row mask)."""
    return isinstance(p, MaskPartial)


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
