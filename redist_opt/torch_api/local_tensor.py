"""LocalTensorMode: every simulated rank's values in one process.

``torch.distributed._local_tensor`` is private. Under ``LocalTensorMode`` a
tensor is a ``LocalTensor`` holding one tensor per simulated rank
(``_local_tensors``: {rank: tensor}), and a rank-dependent int (a mesh
coordinate, a per-rank size) is a SymInt whose node is a ``LocalIntNode``
holding ``_local_ints`` ({rank: int}); a value equal on every rank is a
``ConstantIntNode``.

Read in the sources of torch 2.11 to 2.15 (``_local_tensor/__init__.py``):
``LocalTensor``, ``LocalTensorMode`` (with its ``tensor_map`` method),
``enabled_local_tensor_mode`` and ``LocalIntNode._local_ints`` are in all of them.
The module-level ``tensor_map(tensor, cb)`` is new in 2.12; 2.11 gets the same
function here, written as 2.12 to 2.15 write it (the active mode's ``tensor_map``
under LocalTensorMode, else ``cb(dist.get_rank(), tensor)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from redist_opt.torch_api.version import PrivateName, private, resolve_declared

__all__ = [
    "PRIVATE_NAMES",
    "LocalTensor",
    "local_tensor_mode",
    "is_per_rank",
    "map_per_rank",
    "per_rank_tensors",
    "int_on_rank",
    "ints_on_every_rank",
]

_LT = "torch.distributed._local_tensor"

# The module-level tensor_map (2.12 on; 2.11 gets :func:`_tensor_map_2_11`).
_TENSOR_MAP = PrivateName(_LT, "tensor_map", since=(2, 12))

PRIVATE_NAMES = (
    PrivateName(_LT),
    PrivateName(_LT, "LocalTensor"),
    PrivateName(_LT, "LocalTensor._local_tensors", instance=True),
    PrivateName(_LT, "LocalTensorMode.tensor_map"),
    PrivateName(_LT, "LocalIntNode._local_ints", instance=True),
    PrivateName(_LT, "enabled_local_tensor_mode"),
    _TENSOR_MAP,
)
resolve_declared(PRIVATE_NAMES)

LocalTensor = private(_LT, "LocalTensor")
LocalIntNode = private(_LT, "LocalIntNode")
_enabled_local_tensor_mode = private(_LT, "enabled_local_tensor_mode")
_mode_tensor_map = private(_LT, "LocalTensorMode.tensor_map")


def _tensor_map_2_11(tensor: torch.Tensor, cb) -> torch.Tensor:
    """torch 2.12's ``_local_tensor.tensor_map``, for 2.11 (which has only the mode's method)."""
    mode = _enabled_local_tensor_mode()
    if mode is not None:
        if not isinstance(tensor, LocalTensor):
            raise TypeError(f"map_per_rank under LocalTensorMode: expected a LocalTensor, got {type(tensor)}")
        return _mode_tensor_map(mode, tensor, cb)
    out = cb(dist.get_rank(), tensor)
    if out is None:
        raise ValueError("map_per_rank: the callback returned None")
    return out


_tensor_map = _TENSOR_MAP.get() if _TENSOR_MAP.expected else _tensor_map_2_11


def local_tensor_mode():
    """The active LocalTensorMode, or None (real process groups)."""
    return _enabled_local_tensor_mode()


def is_per_rank(x: torch.Tensor) -> bool:
    """Whether ``x`` holds one tensor per simulated rank (a LocalTensor)."""
    return isinstance(x, LocalTensor)


def map_per_rank(x: torch.Tensor, fn) -> torch.Tensor:
    """``fn(rank, tensor)`` on each simulated rank's tensor, as one LocalTensor (outside
    LocalTensorMode: ``fn(this rank, x)``)."""
    return _tensor_map(x, fn)


def per_rank_tensors(x: torch.Tensor) -> dict | None:
    """{rank: tensor} of a LocalTensor, None for a plain tensor."""
    if not isinstance(x, LocalTensor):
        return None
    return x._local_tensors


def _local_ints(c) -> dict | None:
    """{rank: int} of LocalTensorMode's per-rank SymInt, None for any other SymInt."""
    node = c.node
    return node._local_ints if isinstance(node, LocalIntNode) else None


def int_on_rank(c, rank: int) -> int:
    """A coordinate LocalTensorMode gives as a per-rank SymInt (or a constant), on ``rank``."""
    if isinstance(c, torch.SymInt):
        values = _local_ints(c)
        if values is not None:
            return int(values[rank])
        value = c.node.maybe_as_int()
        if value is None:
            raise ValueError(f"int_on_rank: {c} is symbolic (dynamic shapes): no rank has a value")
        return int(value)
    return int(c)


def ints_on_every_rank(c) -> tuple[int, ...] | None:
    """The values of a size on every rank: one for an int or a constant SymInt, one per
    simulated rank for LocalTensorMode's per-rank SymInt; None when it is symbolic
    (dynamic shapes), where no rank has a value yet."""
    if isinstance(c, torch.SymInt):
        values = _local_ints(c)
        if values is not None:
            return tuple(int(v) for v in values.values())
        value = c.node.maybe_as_int()
        return None if value is None else (int(value),)
    return (int(c),)
