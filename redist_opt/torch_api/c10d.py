"""Functional collectives and c10d's group registry.

``torch.ops._c10d_functional`` (the traceable collectives a compiled graph holds,
each completed by ``wait_tensor``) and ``torch.distributed._functional_collectives``
(their Python API, ``AsyncCollectiveTensor``, and the group-name resolution every
call does) are private, and so are c10d's ``_resolve_process_group`` (group name
-> ProcessGroup) and ``_get_default_store``.

Read in the sources of torch 2.11 to 2.15 (``_functional_collectives.py``,
``distributed_c10d.py``): every name here is in all of them, except funcol's
``all_gather_single`` / ``reduce_scatter_single``, new in 2.13; 2.11 and 2.12's
``all_gather_tensor`` / ``reduce_scatter_tensor`` take the same arguments and issue
the same ops (2.13 keeps them, deprecated).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import get_process_group_ranks

from redist_opt.torch_api.version import PrivateName, private, resolve_declared

__all__ = [
    "PRIVATE_NAMES",
    "C10D",
    "ALL_REDUCE",
    "ALL_REDUCE_INPLACE",
    "REDUCE_SCATTER",
    "ALL_GATHER",
    "ALL_TO_ALL",
    "WAIT",
    "FUNCTIONAL_NAMESPACES",
    "AsyncCollectiveTensor",
    "all_reduce",
    "all_gather_single",
    "reduce_scatter_single",
    "all_to_all_single",
    "are_we_tracing",
    "group_name",
    "process_group_ranks",
    "default_store",
    "process_rank",
]

_FUNCOL = "torch.distributed._functional_collectives"
_C10D = "torch.distributed.distributed_c10d"
_OPS = "torch.ops"

# funcol's 2.13 names for the single-tensor gather and reduce_scatter.
_ALL_GATHER_SINGLE = PrivateName(_FUNCOL, "all_gather_single", since=(2, 13))
_REDUCE_SCATTER_SINGLE = PrivateName(_FUNCOL, "reduce_scatter_single", since=(2, 13))

PRIVATE_NAMES = (
    PrivateName(_OPS, "_c10d_functional.all_reduce.default"),
    PrivateName(_OPS, "_c10d_functional.all_reduce_.default"),
    PrivateName(_OPS, "_c10d_functional.reduce_scatter_tensor.default"),
    PrivateName(_OPS, "_c10d_functional.all_gather_into_tensor.default"),
    PrivateName(_OPS, "_c10d_functional.all_to_all_single.default"),
    PrivateName(_OPS, "_c10d_functional.wait_tensor.default"),
    PrivateName(_FUNCOL),
    PrivateName(_FUNCOL, "AsyncCollectiveTensor"),
    PrivateName(_FUNCOL, "all_reduce"),
    PrivateName(_FUNCOL, "all_to_all_single"),
    _ALL_GATHER_SINGLE,
    _REDUCE_SCATTER_SINGLE,
    PrivateName(_FUNCOL, "all_gather_tensor"),
    PrivateName(_FUNCOL, "reduce_scatter_tensor"),
    PrivateName(_FUNCOL, "_resolve_group_name"),
    PrivateName(_FUNCOL, "_are_we_tracing"),
    PrivateName(_C10D, "_resolve_process_group"),
    PrivateName(_C10D, "_get_default_store"),
)
resolve_declared(PRIVATE_NAMES)

# The op namespace: ``C10D.all_reduce.default`` and the like (each op used is declared above).
C10D = private(_OPS, "_c10d_functional")
ALL_REDUCE = private(_OPS, "_c10d_functional.all_reduce.default")
ALL_REDUCE_INPLACE = private(_OPS, "_c10d_functional.all_reduce_.default")
REDUCE_SCATTER = private(_OPS, "_c10d_functional.reduce_scatter_tensor.default")
ALL_GATHER = private(_OPS, "_c10d_functional.all_gather_into_tensor.default")
ALL_TO_ALL = private(_OPS, "_c10d_functional.all_to_all_single.default")
WAIT = private(_OPS, "_c10d_functional.wait_tensor.default")
# The namespaces a traced graph's functional collectives come from (the legacy
# ``c10d_functional`` one is what Inductor's own bucketing waits with).
FUNCTIONAL_NAMESPACES = ("_c10d_functional", "c10d_functional")

AsyncCollectiveTensor = private(_FUNCOL, "AsyncCollectiveTensor")
all_reduce = private(_FUNCOL, "all_reduce")
all_to_all_single = private(_FUNCOL, "all_to_all_single")
if _ALL_GATHER_SINGLE.expected:
    all_gather_single = _ALL_GATHER_SINGLE.get()
    reduce_scatter_single = _REDUCE_SCATTER_SINGLE.get()
else:  # 2.11, 2.12: the same (x, gather_dim, group) / (x, op, scatter_dim, group), older names
    all_gather_single = private(_FUNCOL, "all_gather_tensor")
    reduce_scatter_single = private(_FUNCOL, "reduce_scatter_tensor")
_resolve_group_name = private(_FUNCOL, "_resolve_group_name")
_are_we_tracing = private(_FUNCOL, "_are_we_tracing")
_resolve_process_group = private(_C10D, "_resolve_process_group")
_get_default_store = private(_C10D, "_get_default_store")


def are_we_tracing() -> bool:
    """torch's own test (funcol's ``_are_we_tracing``): Dynamo, fake or proxy tracing."""
    return _are_we_tracing()


def group_name(group) -> str:
    """The name of the process group a funcol ``group`` argument ((mesh, dim), a
    process group, a name) stands for: what funcol resolves it to on every call."""
    return _resolve_group_name(group)


def process_group(name: str):
    """The process group named ``name`` (what funcol resolves a name to). Raises when no
    such group exists in this process."""
    return _resolve_process_group(name)


def process_group_ranks(name: str) -> list[int]:
    """Global ranks, in group order, of the process group named ``name`` (the string
    functional collectives carry). Raises when no such group exists."""
    return list(get_process_group_ranks(process_group(name)))


def default_store():
    """The key-value store of the default process group (the one it rendezvoused on)."""
    return _get_default_store()


def process_rank() -> int:
    """This process's rank in the default process group, as a plain int (0 before
    torch.distributed is initialized): what names a record, a dump file or a per-rank
    file. Under LocalTensorMode torch 2.15 patches ``dist.get_rank()`` to return a SymInt
    holding every simulated rank's value (no JSON, no file name can hold it); the default
    group's own ``rank()``, unpatched, is what ``dist.get_rank()`` returns outside the mode,
    and what torch 2.13 returns inside it."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    rank = dist.get_rank()
    if isinstance(rank, torch.SymInt):
        rank = dist.group.WORLD.rank()
    return int(rank)
