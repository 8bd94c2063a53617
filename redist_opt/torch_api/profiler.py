"""The CPU allocator's allocation records, read from ``torch.profiler``: what
:mod:`redist_opt.measure.memory` measures a step's peak with.

``torch.profiler.profile(activities=[CPU], profile_memory=True)`` records each
allocation and free of the CPU allocator (on every thread that runs under the
profiler: the caller's and gloo's work threads) as a ``[memory]`` event
(``torch.autograd.profiler_util.MEMORY_EVENT_NAME``) with its size (negative for a
free) and start time. torch's own ``FunctionEvent`` list attributes these records to
the ops that made them and sums them per op, which loses their order; the raw events
keep it: ``profile.profiler.kineto_results.events()``, each with ``name()``,
``nbytes()``, ``device_type()``, ``start_ns()`` and ``end_ns()``. None of these is an
underscore name, but the raw event type (``torch._C._autograd._KinetoEvent``) is
undocumented (its ``nbytes`` is not even in torch's stubs): read in the sources of
torch 2.11, 2.13 and 2.15, which all have it, and exercised on each by
``tests/measure/test_memory.py``. The method is declared (``PRIVATE_NAMES``) and
bound at import, so a torch without it fails loudly, naming it.
"""

from __future__ import annotations

import contextlib

from torch.autograd.profiler_util import MEMORY_EVENT_NAME
from torch.profiler import ProfilerActivity, profile, record_function

from redist_opt.torch_api.version import PrivateName, resolve_declared

__all__ = ["PRIVATE_NAMES", "memory_profile", "marked", "allocations_in", "CPU_ALLOCATOR_DEVICES"]

_NBYTES = PrivateName("torch._C._autograd", "_KinetoEvent.nbytes")
PRIVATE_NAMES = (_NBYTES,)
resolve_declared(PRIVATE_NAMES)  # loud at import: the size of a record is read through this method

# The device types whose records torch counts as CPU memory (``autograd.profiler``'s
# ``_cpu_memory_usage``): the CPU allocator, and oneDNN's tensors allocated through it.
CPU_ALLOCATOR_DEVICES = ("CPU", "MKLDNN", "IDEEP")


def memory_profile():
    """A profiler that records the CPU allocator's allocations and frees, and nothing of
    the device (its allocator is read by ``torch.cuda``'s counters)."""
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


@contextlib.contextmanager
def marked(name: str):
    """A range named ``name`` in the profile (``record_function``), which
    :func:`allocations_in` finds again on the profile's own clock."""
    with record_function(name):
        yield


def allocations_in(prof, mark: str) -> list[int]:
    """The sizes of the CPU allocator's records (allocations > 0, frees < 0) inside the
    range :func:`marked` ``mark`` (the first one), in the order they happened, on every
    thread of the profile. Raises ``ValueError`` when the profile has no such range."""
    events = prof.profiler.kineto_results.events()
    ranges = [(e.start_ns(), e.end_ns()) for e in events if e.name() == mark]
    if not ranges:
        raise ValueError(f"the profile has no range named {mark!r}")
    lo, hi = min(ranges)
    records = [
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(events)
        if e.name() == MEMORY_EVENT_NAME
        and lo <= e.start_ns() <= hi
        and e.device_type().name in CPU_ALLOCATOR_DEVICES
    ]
    return [nbytes for _, _, nbytes in sorted(records)]
