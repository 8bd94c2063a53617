"""FX, fake tensors, proxy tracing and dispatch modes.

The graph builders and the compiled-graph pass read what torch's tracing keeps
private: ``torch.fx._lazy_graph_module._LazyGraphModule`` (a GraphModule whose code
is generated on first call), ``torch._subclasses.fake_tensor`` (``is_fake``,
``unset_fake_temporarily``), ``torch._guards.detect_fake_mode``,
``torch.utils._pytree``, the proxy modes of ``make_fx``, ``torch.utils._debug_mode``
(DebugMode's record of redistributions), ``torch._C._current_autograd_node`` and an
OpOverload's ``_opname``.

Dispatch modes: a ``TorchDispatchMode`` that answers ``is_infra_mode() -> True`` is
one Dynamo does not skip frames for (``torch.utils._python_dispatch.
any_torch_dispatch_mode_on_stack``, asked by ``torch._dynamo.convert_frame``).
:class:`InfraDispatchMode` is that contract, checked at import: if torch stops
asking, this module raises instead of letting a timer make every compiled frame
fall back to eager.

Read in the sources of torch 2.11 to 2.15: every name here is in all of them.
"""

from __future__ import annotations

import contextlib

import torch
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode

from redist_opt.torch_api.version import PrivateName, TorchAPIError, private, resolve_declared

__all__ = [
    "PRIVATE_NAMES",
    "LazyGraphModule",
    "is_fake",
    "unset_fake_temporarily",
    "detect_fake_mode",
    "tree_leaves",
    "get_proxy_mode",
    "disable_proxy_modes_tracing",
    "outside_tracing",
    "traced_without_graph",
    "get_active_debug_mode",
    "running_autograd_node",
    "op_name",
    "is_redistribute_source",
    "InfraDispatchMode",
]

_DISPATCH = "torch.utils._python_dispatch"

PRIVATE_NAMES = (
    PrivateName("torch.fx._lazy_graph_module", "_LazyGraphModule"),
    PrivateName("torch._subclasses.fake_tensor", "is_fake"),
    PrivateName("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
    PrivateName("torch._guards", "detect_fake_mode"),
    PrivateName("torch.utils._pytree", "tree_leaves"),
    PrivateName("torch.utils._debug_mode", "get_active_debug_mode"),
    PrivateName("torch._C", "_current_autograd_node"),
    PrivateName("torch._ops", "OpOverload._opname", instance=True),
    PrivateName(_DISPATCH, "TorchDispatchMode"),
    PrivateName(_DISPATCH, "TorchDispatchMode.is_infra_mode"),
    PrivateName(_DISPATCH, "any_torch_dispatch_mode_on_stack"),
)
resolve_declared(PRIVATE_NAMES)

LazyGraphModule = private("torch.fx._lazy_graph_module", "_LazyGraphModule")
is_fake = private("torch._subclasses.fake_tensor", "is_fake")
unset_fake_temporarily = private("torch._subclasses.fake_tensor", "unset_fake_temporarily")
detect_fake_mode = private("torch._guards", "detect_fake_mode")
tree_leaves = private("torch.utils._pytree", "tree_leaves")
get_active_debug_mode = private("torch.utils._debug_mode", "get_active_debug_mode")
_current_autograd_node = private("torch._C", "_current_autograd_node")
_OpOverload = private("torch._ops", "OpOverload")
_TorchDispatchMode = private(_DISPATCH, "TorchDispatchMode")
_modes_on_stack = private(_DISPATCH, "any_torch_dispatch_mode_on_stack")
if "is_infra_mode" not in _modes_on_stack.__code__.co_names:
    raise TorchAPIError(
        f"redist_opt's timing mode relies on {_DISPATCH}.any_torch_dispatch_mode_on_stack "
        f"leaving out modes whose is_infra_mode() is True; torch {torch.__version__} does not ask it"
    )


class InfraDispatchMode(_TorchDispatchMode):
    """A ``TorchDispatchMode`` Dynamo does not skip compiled frames for (an infra mode):
    compiled code runs under it, and its ``__torch_dispatch__`` sees the ops it calls."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True


def running_autograd_node() -> str | None:
    """The name of the autograd node whose backward is running (``MmBackward0``), or None."""
    node = _current_autograd_node()
    return None if node is None else node.name()


def op_name(target) -> str | None:
    """The op name of an OpOverload (``all_reduce`` of ``_c10d_functional.all_reduce.default``),
    None for any other call target (a Python function, an OpOverloadPacket)."""
    return target._opname if isinstance(target, _OpOverload) else None


# The name Dynamo records in ``source_fn_stack`` for ``DTensor.redistribute``: 2.12 on
# trace the method itself (the string "redistribute"); 2.11's
# ``TensorVariable.method_redistribute`` puts a closure named "prim_redistribute" in
# the graph instead (``torch/_dynamo/variables/tensor.py``).
_REDISTRIBUTE_SOURCES = ("redistribute", "prim_redistribute")


def is_redistribute_source(target) -> bool:
    """Whether ``target`` (the second item of a ``source_fn_stack`` entry: a function or
    a method name) is Dynamo's record of a ``DTensor.redistribute`` call."""
    return getattr(target, "__name__", target) in _REDISTRIBUTE_SOURCES


def traced_without_graph(local_tensor) -> bool:
    """Whether ``local_tensor`` is a fake tensor seen outside graph tracing: Dynamo
    computing example values, or AOTAutograd collecting metadata (runs that build no
    graph and are repeated); the graph's own trace runs under a proxy mode."""
    return is_fake(local_tensor) and get_proxy_mode() is None


def outside_tracing():
    """A context that steps out of AOTAutograd's fake-tensor and proxy tracing modes.

    Creating a process group (a flattened DeviceMesh) while a compiled program is
    traced must build real rank tensors and real communicators, not traced ones.
    """
    stack = contextlib.ExitStack()
    stack.enter_context(unset_fake_temporarily())
    stack.enter_context(disable_proxy_modes_tracing())
    return stack
