"""Running one side of a differential case under ``CommDebugMode``: torch's
``DTensor.redistribute`` with its merge pass disabled (``run_oracle``), or
redist_opt (``run_candidate``), each as an ``Outcome`` (result or error, and
the collectives issued, by kind: see ``collective_kind``).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

from torch.distributed.tensor import DTensor, Placement
from torch.distributed.tensor._redistribute import (
    disable_redistribute_transform_optimization,
)
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from support.inputs import Input, local_tensors


@dataclasses.dataclass
class Outcome:
    out: DTensor | None = None
    error: BaseException | None = None
    tb: str = ""
    counts: Counter = dataclasses.field(default_factory=Counter)
    total: int = 0
    optimized: Outcome | None = None  # check_case: the optimized run's outcome

    def describe_error(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


def collective_kind(op: Any) -> str:
    """Collective class of a CommDebugMode key: torch issues an all-to-all as
    ``_dtensor.shard_dim_alltoall``, a reimplementation may use
    ``all_to_all_single``; both are one all_to_all."""
    name = str(op).split(".")[-1].lower()
    for kind, keys in [
        ("all_to_all", ("alltoall", "all_to_all")),
        ("all_gather", ("all_gather", "allgather")),
        ("reduce_scatter", ("reduce_scatter",)),
        ("all_reduce", ("all_reduce", "allreduce")),
        ("broadcast", ("broadcast",)),
        ("scatter", ("scatter",)),
        ("gather", ("gather",)),
    ]:
        if any(k in name for k in keys):
            return kind
    return name


def count_collectives(cdm: CommDebugMode) -> tuple[Counter, int]:
    c: Counter = Counter()
    for k, v in cdm.get_comm_counts().items():
        if v:
            c[collective_kind(k)] += v
    return c, cdm.get_total_counts()


def run_oracle(inp: Input, dst: Sequence[Placement], **kwargs) -> Outcome:
    o = Outcome()
    try:
        with CommDebugMode() as cdm, disable_redistribute_transform_optimization():
            o.out = inp.dt.redistribute(inp.mesh, list(dst), **kwargs)
            local_tensors(o.out)  # waits (async_op=True) inside the mode
    except Exception as e:  # noqa: BLE001 - any error from torch is acceptable
        o.error, o.tb = e, traceback.format_exc()
    o.counts, o.total = count_collectives(cdm)
    return o


def run_candidate(
    inp: Input,
    dst: Sequence[Placement | str],
    *,
    via: str = "function",
    pass_mesh: bool = False,
    passes=None,
    groups: str = "existing",
    **kwargs,
) -> Outcome:
    """redist_opt on the input; ``passes=()`` runs DTensor's own plan (no optimization)."""
    o = Outcome()
    try:
        with CommDebugMode() as cdm:
            if via == "function":
                if pass_mesh:
                    kwargs["device_mesh"] = inp.mesh
                o.out = redist_opt.redistribute(inp.dt, list(dst), groups=groups, passes=passes, **kwargs)
            elif via == "enabled":
                extra = {"cost": kwargs.pop("cost")} if "cost" in kwargs else {}
                with redist_opt.enabled(groups=groups, passes=passes, **extra):
                    o.out = inp.dt.redistribute(inp.mesh, list(dst), **kwargs)
            else:
                raise AssertionError(via)
            if isinstance(o.out, DTensor):
                local_tensors(o.out)  # waits (async_op=True) inside the mode
    except Exception as e:  # noqa: BLE001
        o.error, o.tb = e, traceback.format_exc()
    o.counts, o.total = count_collectives(cdm)
    return o
