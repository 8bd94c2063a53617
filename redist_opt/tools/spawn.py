"""Running a function on N real gloo processes on 127.0.0.1 and collecting their results.

Used by ``redist-opt demo``, ``calibrate`` and ``bench``: every rank runs
``target(rank, world, *args)`` after ``init_process_group("gloo")`` and saves its
result to a file the parent reads. Failure handling is torch's own
(``torch.multiprocessing``'s ``ProcessContext.join``): a rank that raises stops the
others, and its traceback is raised in the parent as :class:`SpawnError` instead of
every rank hanging in its next collective.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.utils.distributed import get_free_port as free_port

from redist_opt.torch_api.dtensor import REDISTRIBUTE_LOGGERS

__all__ = ["SpawnError", "run_ranks", "free_port", "on_a_free_port", "quiet_torch_logs"]


T = TypeVar("T")


class SpawnError(RuntimeError):
    """A rank failed (its traceback is in the message) or the ranks timed out."""


# torch warns on every rank that gloo's alltoall falls back to all_gather + chunk,
# and on each unmerged run ("N sequential all_reduce ... flatten mesh dims");
# neither is news in a benchmark.
_NOISY_TORCH_LOGGERS = REDISTRIBUTE_LOGGERS


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


def _result_path(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"rank{rank}.pt")


def _rank_entry(
    rank: int, target: Callable, world: int, port: int, out_dir: str, timeout: float, args
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
    with quiet_torch_logs():
        result = target(rank, world, *args)
    torch.save(result, _result_path(out_dir, rank))
    # Only on success: a failing rank exits at once, so torch writes its traceback
    # before its peers' collectives break (see _first_failure). Rank 0 serves the
    # store: no rank leaves before every rank is done with it.
    dist.barrier()
    dist.destroy_process_group()
    # The result is saved: skip the interpreter's teardown, where threads torch started
    # (Inductor's compile workers) can abort the process ("terminate called without an
    # active exception") after the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _first_failure(error_files, nprocs: int, error) -> str:
    """The earliest rank traceback written: the first failure is the cause; the ranks whose
    next collective broke because of it fail a moment later (fallout)."""
    written = [(os.stat(f).st_mtime_ns, rank, f) for rank, f in enumerate(error_files) if os.path.exists(f)]
    if not written:
        return (
            f"rank {error.error_index} of {nprocs} failed: {error} (killed, or its result could not be saved)"
        )
    _, rank, path = min(written)
    with open(path, "rb") as f:
        return f"rank {rank} of {nprocs} failed:\n{pickle.load(f).rstrip()}"


# How many ports a spawn tries before a taken port is reported as the failure.
PORT_TRIES = 3


def on_a_free_port(spawn: Callable[[int], T]) -> T:
    """``spawn(port)`` on a free port, and again on another when rank 0's store could
    not listen on it (EADDRINUSE): torch's free port is bound, then closed, so another
    process can take it before the store binds it. ``spawn`` raises the ranks' failure
    (``SpawnError`` or torch's ``ProcessRaisedException``, with the rank's traceback)."""
    for _ in range(PORT_TRIES - 1):
        try:
            return spawn(free_port())
        except (SpawnError, mp.ProcessRaisedException) as e:
            if "EADDRINUSE" not in str(e):
                raise
    return spawn(free_port())


def run_ranks(target: Callable, nprocs: int, args: tuple = (), *, timeout: float = 120.0) -> list:
    """Run ``target(rank, world, *args)`` on ``nprocs`` spawned gloo ranks; their results by rank.

    ``target`` must be a module-level function. A rank that raises makes this raise
    :class:`SpawnError` with that rank's traceback; ranks that do not report within
    ``timeout`` seconds are terminated and reported.
    """
    return on_a_free_port(lambda port: _run_ranks_on(port, target, nprocs, args, timeout))


def _run_ranks_on(port: int, target: Callable, nprocs: int, args: tuple, timeout: float) -> list:
    # Collectives time out a little before we give up on the ranks, so a hang
    # surfaces as a child traceback rather than a kill.
    pg_timeout = max(10.0, timeout - 5.0)
    with tempfile.TemporaryDirectory(prefix="redist_opt_ranks_") as out_dir:
        pc = mp.start_processes(
            _rank_entry,
            args=(target, nprocs, port, out_dir, pg_timeout, args),
            nprocs=nprocs,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not pc.join(timeout=min(1.0, max(0.0, deadline - time.monotonic())), grace_period=2.0):
                if time.monotonic() >= deadline:
                    break
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            raise SpawnError(_first_failure(pc.error_files, nprocs, e)) from None
        finally:
            for p in pc.processes:  # the ones still running at the deadline
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5.0)
        missing = [r for r in range(nprocs) if not os.path.exists(_result_path(out_dir, r))]
        if missing:
            raise SpawnError(f"ranks {missing} of {nprocs} did not report within {timeout:.0f}s")
        return [torch.load(_result_path(out_dir, r), weights_only=False) for r in range(nprocs)]
