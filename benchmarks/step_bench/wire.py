"""Counting collectives on the wire, and which DTensor transitions issued them.

FSDP2 calls c10d directly (``dist.all_gather_into_tensor``), DTensor and compiled
graphs call functional collectives; both reach the dispatcher as ``c10d::*`` or
``_c10d_functional::*`` ops, so one dispatch mode sees every one of them. A
functional collective runs its c10d op inside the mode's own call, where the mode
is off: nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from redist_opt.api import errors, routing
from redist_opt.ir.placements import placements_str
from redist_opt.runtime import bindings
from redist_opt.torch_api import dtensor as tdt

# op name (namespace-free) -> the kind reported
KINDS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
}
SHORT = {
    "all_reduce": "AR",
    "all_gather": "AG",
    "reduce_scatter": "RS",
    "all_to_all": "A2A",
    "broadcast": "BC",
}
_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


@dataclass
class Collective:
    kind: str
    group_size: int
    nbytes: int  # this rank's input payload


def _group_size(args, kwargs) -> int:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.ScriptObject):  # how c10d ops carry their ProcessGroup
            try:
                a = dist.ProcessGroup.unbox(a)
            except Exception:  # noqa: BLE001 - another script object
                continue
        if isinstance(a, dist.ProcessGroup):
            return a.size()
        if isinstance(a, str):
            try:
                return len(tdt.process_group_ranks(a))
            except Exception:  # noqa: BLE001 - a string that names no group
                continue
    return -1


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


class WireCounter(TorchDispatchMode):
    """Every collective issued while active, in order."""

    def __init__(self):
        super().__init__()
        self.calls: list[Collective] = []

    @classmethod
    def is_infra_mode(cls) -> bool:
        # Dynamo skips every frame while a user dispatch mode is active; an infra
        # mode it leaves alone, so compiled modes really compile under the counter.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor dispatches to local ops, which we see
        if func.namespace in _NAMESPACES:
            kind = KINDS.get(func._schema.name.split("::")[-1])
            if kind is not None:
                self.calls.append(
                    Collective(kind, _group_size(args, kwargs), _nbytes(args[0] if args else None))
                )
        return func(*args, **kwargs)


def summarize(calls: list[Collective]) -> dict:
    """{"by_kind": {"AR@4": n, ...}, "count": n, "bytes": b}."""
    by = Counter(f"{SHORT.get(c.kind, c.kind)}@{c.group_size}" for c in calls)
    return {"by_kind": dict(sorted(by.items())), "count": len(calls), "bytes": sum(c.nbytes for c in calls)}


class Window:
    """The collectives and transitions issued while the window is entered (once)."""

    def __init__(self, counter: WireCounter, log: TransitionLog):
        self.counter, self.log = counter, log
        self.calls: list[Collective] = []
        self.transitions: list[Transition] = []

    def __enter__(self):
        self._start = (len(self.counter.calls), len(self.log.calls))
        return self

    def __exit__(self, *exc):
        self.calls = self.counter.calls[self._start[0] :]
        self.transitions = self.log.calls[self._start[1] :]

    def summary(self) -> dict:
        return {"wire": summarize(self.calls), "transitions": [t.__dict__ for t in self.transitions]}


# -- DTensor transitions -----------------------------------------------------------------


@dataclass
class Transition:
    key: str  # "S(0),S(1) -> R,R on (dp_shard, tp) (2048, 128)"
    route: str  # "torch", "routed", or "handed back"
    reason: str = ""
    collectives: list[str] = field(default_factory=list)


def _pl(placements) -> str:
    try:
        text = placements_str(placements)
    except Exception:  # noqa: BLE001 - a placement redist_opt cannot print
        return ",".join(str(p) for p in placements)
    if any(type(p).__name__ == "_MaskPartial" for p in placements):
        text += " (_MaskPartial)"  # the IR prints it as a plain P (a sum, once masked)
    return text


def transition_key(current_spec, target_spec) -> str:
    mesh = current_spec.mesh
    names = ",".join(mesh.mesh_dim_names or ()) or "x".join(map(str, mesh.shape))
    return (
        f"{_pl(current_spec.placements)} -> {_pl(target_spec.placements)} "
        f"on ({names}) {tuple(current_spec.shape)}"
    )


class TransitionLog:
    """Wraps the function DTensor calls for every redistribution, recording each call."""

    def __init__(self, counter: WireCounter):
        self.counter = counter
        self.calls: list[Transition] = []

    def wrap(self, fn, routed: bool):
        """``fn`` (torch's or redist_opt's routed function), recording what each call did."""

        def recorded(local_tensor, current_spec, target_spec, *args, **kwargs):
            start = len(self.counter.calls)
            errors._warned.clear()  # a hand-back warns once per reason: make every call say why
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = fn(local_tensor, current_spec, target_spec, *args, **kwargs)
            reasons = [str(w.message) for w in caught if "using torch's redistribute" in str(w.message)]
            route = "torch" if not routed else ("handed back" if reasons else "routed")
            reason = reasons[0].split("using torch's redistribute: ", 1)[-1] if reasons else ""
            issued = [f"{SHORT.get(c.kind, c.kind)}@{c.group_size}" for c in self.counter.calls[start:]]
            self.calls.append(Transition(transition_key(current_spec, target_spec), route, reason, issued))
            return out

        return recorded


@contextlib.contextmanager
def record_torch_transitions(log: TransitionLog):
    """Record torch's own redistributions (the plain modes)."""
    wrapper = log.wrap(tdt.TORCH_REDISTRIBUTE_LOCAL, routed=False)
    previous = bindings.install_redistribute_local(wrapper)
    try:
        yield
    finally:
        bindings.restore_redistribute_local(previous, wrapper)


@contextlib.contextmanager
def record_routed_transitions(log: TransitionLog):
    """Record redist_opt's routed calls; enter before ``redist_opt.enabled()``, which installs
    whatever ``routing.routed_redistribute_local_tensor`` is at its entry."""
    original = routing.routed_redistribute_local_tensor
    routing.routed_redistribute_local_tensor = log.wrap(original, routed=True)
    try:
        yield
    finally:
        routing.routed_redistribute_local_tensor = original
