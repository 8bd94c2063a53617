"""Real multi-process run: 4 processes, gloo backend over loopback, a 2x2 mesh
from init_device_mesh. Every rank compares redist_opt.redistribute against
torch's DTensor.redistribute (merge pass disabled) on the cases listed in
gloo_worker.CASES. A failure in any child fails this test with the child's
traceback; a hang fails it after TIMEOUT_S instead of blocking the run.
"""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from support import gloo_worker

from redist_opt.tools.spawn import on_a_free_port

# 4 gloo ranks against torch; .ci/run runs it on every torch of the range
pytestmark = pytest.mark.differential

TIMEOUT_S = 300


def spawn_and_join(worker, nprocs: int, timeout_s: float = TIMEOUT_S) -> None:
    """Run ``worker(rank, port)`` on ``nprocs`` spawned processes; fail on any child's
    exception (with its traceback) or when they do not finish in time. A port taken
    before rank 0's store bound it is retried on another."""
    on_a_free_port(lambda port: _spawn_on(port, worker, nprocs, timeout_s))


def _spawn_on(port: int, worker, nprocs: int, timeout_s: float) -> None:
    ctx = mp.start_processes(
        worker,
        args=(port,),
        nprocs=nprocs,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        # join() re-raises a child's exception (ProcessRaisedException carries
        # the child's traceback) and terminates the other children.
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                alive = [i for i, p in enumerate(ctx.processes) if p.is_alive()]
                pytest.fail(f"gloo run did not finish within {timeout_s}s (ranks still running: {alive})")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(5)
            if p.is_alive():
                p.kill()


@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_gloo_2x2_matches_torch():
    spawn_and_join(gloo_worker.worker, gloo_worker.WORLD)


@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
@pytest.mark.slow  # about 110 s: torch.compile on 4 gloo ranks
def test_gloo_compiled_tp_mlp_matches_eager():
    from support import gloo_compile_worker

    spawn_and_join(gloo_compile_worker.worker, gloo_compile_worker.WORLD, timeout_s=900)
