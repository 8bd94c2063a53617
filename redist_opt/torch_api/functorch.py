"""AOTAutograd and Dynamo's backend helpers: what ``redist_opt.backend`` builds on.

``torch._dynamo.backends.common.aot_autograd`` (a backend from forward / backward
graph compilers), ``torch._dynamo.backends.debugging.boxed_nop`` (torch's
"aot_eager" per-graph compiler), ``torch._functorch.partitioners.
min_cut_rematerialization_partition`` and ``torch._functorch.config``
(``enable_autograd_cache``, ``enable_remote_autograd_cache``) are private.

Read in the sources of torch 2.11 to 2.15: every name here is in all of them.
The compiler modules load lazily (``import redist_opt`` does not import them).
"""

from __future__ import annotations

from redist_opt.torch_api.version import PrivateName, resolve_declared

__all__ = [
    "PRIVATE_NAMES",
    "aot_autograd",
    "boxed_nop",
    "min_cut_partitioner",
    "autograd_cache_off",
]

_AOT_AUTOGRAD = PrivateName("torch._dynamo.backends.common", "aot_autograd", lazy=True)
_BOXED_NOP = PrivateName("torch._dynamo.backends.debugging", "boxed_nop", lazy=True)
_MIN_CUT = PrivateName("torch._functorch.partitioners", "min_cut_rematerialization_partition", lazy=True)
_CONFIG = PrivateName("torch._functorch.config")

PRIVATE_NAMES = (
    _AOT_AUTOGRAD,
    _BOXED_NOP,
    _MIN_CUT,
    _CONFIG,
    PrivateName("torch._functorch.config", "enable_autograd_cache"),
    PrivateName("torch._functorch.config", "enable_remote_autograd_cache"),
)
resolve_declared(PRIVATE_NAMES)


def aot_autograd(**kwargs):
    """A Dynamo backend that traces with AOTAutograd and compiles each graph with the
    given ``fw_compiler`` / ``bw_compiler`` (``torch._dynamo.backends.common.aot_autograd``)."""
    return _AOT_AUTOGRAD.get()(**kwargs)


def boxed_nop():
    """torch's "aot_eager" per-graph compiler (the graph run as is), itself."""
    return _BOXED_NOP.get()


def min_cut_partitioner():
    """AOTAutograd's min-cut rematerializing forward / backward partitioner, itself
    (torch's own backends pass this very function)."""
    return _MIN_CUT.get()


def autograd_cache_off():
    """A context with AOTAutograd's local and remote caches off."""
    return _CONFIG.get().patch(enable_autograd_cache=False, enable_remote_autograd_cache=False)
