"""Where a block of work is timed, and the clock of a training step.

A collective returns to the host before an accelerator finishes it, so a time read on
the host measures launches, not work: on an accelerator a block is timed by events on
the current stream, waited for before they are read; on the CPU (gloo waits for every
call) by the host's ``perf_counter``.
"""

from __future__ import annotations

import time

import torch

__all__ = ["Clock", "step_clock", "step_device"]


class Clock:
    """Where a block of work is timed: ``start()`` -> token, ``stop(token)`` -> seconds.
    On CPU the host's ``perf_counter`` (every timed call waits for its result: gloo);
    on an accelerator, events on the current stream (``torch.Event``), since the host
    returns from a collective before the device finishes it. ``device`` is where the
    timed tensors (and the agreement all_reduce) live."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def start(self):
        if self.device.type == "cpu":
            return time.perf_counter()
        begin = torch.Event(self.device, enable_timing=True)
        begin.record()
        return begin

    def stop(self, token) -> float:
        if self.device.type == "cpu":
            return time.perf_counter() - token
        end = torch.Event(self.device, enable_timing=True)
        end.record()
        end.synchronize()
        return token.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def step_device() -> torch.device:
    """Where the steps this process has run live: the current CUDA device once a step has
    used CUDA, else the CPU (a CPU step on a machine that has a GPU ran on the host). What a
    step is timed on (:func:`step_clock`) and whose allocator its peak memory is read from
    (:mod:`redist_opt.measure.memory`)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def step_clock() -> Clock:
    """The clock of the steps this process has run (:func:`step_device`): events on the
    current CUDA stream once a step has used CUDA (NCCL's kernels run after the host
    returns), else the host clock."""
    return Clock(step_device())
