"""Running a function on N real gloo processes on 127.0.0.1 and collecting their results.

Used by ``redist-opt demo``, ``calibrate`` and ``bench``: every rank runs
``target(rank, world, *args)`` after ``init_process_group("gloo")``; a rank that
raises (or hangs) stops the others and its traceback is raised in the parent as
:class:`SpawnError`, instead of every rank hanging in its next collective.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["SpawnError", "run_ranks", "free_port", "quiet_torch_logs"]


class SpawnError(RuntimeError):
    """A rank failed (its traceback is in the message) or the ranks timed out."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# torch warns on every rank that gloo's alltoall falls back to all_gather + chunk,
# and on each unmerged run ("N sequential all_reduce ... flatten mesh dims");
# neither is news in a benchmark.
_NOISY_TORCH_LOGGERS = ("torch.distributed.tensor._collective_utils", "torch.distributed.tensor._redistribute")


@contextlib.contextmanager
def quiet_torch_logs():
    """Within the block, torch's DTensor redistribution loggers report errors only;
    their previous levels come back afterwards."""
    loggers = [logging.getLogger(name) for name in _NOISY_TORCH_LOGGERS]
    previous = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, previous):
            lg.setLevel(level)


def _rank_entry(rank: int, target: Callable, world: int, port: int, queue, timeout: float, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
        )
        with quiet_torch_logs():
            result = target(rank, world, *args)
        queue.put((rank, result, None))
    except BaseException:
        queue.put((rank, None, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_ranks(target: Callable, nprocs: int, args: tuple = (), *, timeout: float = 120.0) -> list:
    """Run ``target(rank, world, *args)`` on ``nprocs`` spawned gloo ranks; their results by rank.

    ``target`` must be a module-level function. A rank that raises makes this raise
    :class:`SpawnError` with that rank's traceback; ranks that do not report within
    ``timeout`` seconds are terminated and reported.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    # Collectives time out a little before we give up on the ranks, so a hang
    # surfaces as a child traceback rather than a kill.
    pg_timeout = max(10.0, timeout - 5.0)
    pc = mp.start_processes(
        _rank_entry,
        args=(target, nprocs, port, queue, pg_timeout, args),
        nprocs=nprocs,
        join=False,
        start_method="spawn",
    )
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < nprocs:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, result, err = queue.get(timeout=min(1.0, remaining))
            except queue_mod.Empty:
                exited = [
                    i for i, p in enumerate(pc.processes)
                    if p.exitcode is not None and i not in results and i not in errors
                ]  # fmt: skip
                if exited:
                    # Give an exiting rank's report a moment to arrive through the pipe.
                    try:
                        rank, result, err = queue.get(timeout=2.0)
                    except queue_mod.Empty:
                        for i in exited:
                            errors[i] = (
                                f"rank {i} exited with code {pc.processes[i].exitcode} without a "
                                "report (killed, or its result could not be pickled)"
                            )
                        break
                else:
                    continue
            if err is not None:
                errors[rank] = err
                # One failure makes the others hang in their next collective: stop now.
                break
            results[rank] = result
    finally:
        _stop(pc, graceful=not errors and len(results) == nprocs)
    if errors:
        first = next(iter(errors))  # the first report is the cause; later ones are fallout
        raise SpawnError(f"rank {first} of {nprocs} failed:\n{errors[first].rstrip()}")
    if len(results) < nprocs:
        missing = sorted(set(range(nprocs)) - set(results))
        raise SpawnError(f"ranks {missing} of {nprocs} did not report within {timeout:.0f}s")
    return [results[r] for r in range(nprocs)]


def _stop(pc, *, graceful: bool) -> None:
    """Join our processes; terminate (then kill) any that are still running."""
    deadline = time.monotonic() + (30.0 if graceful else 2.0)
    for p in pc.processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in pc.processes:
        if p.is_alive():
            p.terminate()
    for p in pc.processes:
        p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)
