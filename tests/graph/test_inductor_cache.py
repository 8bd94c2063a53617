"""Inductor's FX graph cache and AOTAutograd's cache never serve a graph compiled by
torch for ``redist_opt.backend()`` or the other way round: in one process in
either order, and through the disk cache in a fresh process. 4 real gloo ranks,
caches on; each compiled step's collectives are counted as they run (torch's TP
block issues 7 per step, ours 4), so a swapped artifact shows in the count.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support import inductor_cache_programs as P

from redist_opt.tools.spawn import run_ranks

gloo = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

TIMEOUT_S = 900
TORCH_STEP, OURS_STEP = 7, 4


def _check(result: dict) -> None:
    """Every compile issues its own backend's count and the eager loss; ours never
    touches the caches (bypassed: no lookup, no store)."""
    assert result["eager"] == TORCH_STEP
    for who, count, loss, cache in result["runs"]:
        assert count == (TORCH_STEP if who == "torch" else OURS_STEP), (who, result["runs"])
        assert loss == pytest.approx(result["eager_loss"], rel=1e-5), (who, loss, result["eager_loss"])
        if who == "ours":
            assert set(cache) == {"aot_autograd.autograd_cache_bypass", "inductor.fxgraph_cache_bypass"}, (
                cache
            )


@pytest.mark.slow
@gloo
def test_either_compile_order_in_one_process_gets_its_own_graphs(tmp_path):
    # Two block sizes: each order starts from keys the cache has never seen.
    torch_first = run_ranks(
        P.compile_in_order, P.WORLD, (str(tmp_path), 8, 16, ("torch", "ours", "torch")), timeout=TIMEOUT_S
    )
    ours_first = run_ranks(
        P.compile_in_order, P.WORLD, (str(tmp_path), 8, 24, ("ours", "torch", "ours")), timeout=TIMEOUT_S
    )
    for result in torch_first + ours_first:
        _check(result)
    for result in torch_first:
        # The caches are really on: torch's second compile of the block loads its first.
        assert result["runs"][2][3].get("aot_autograd.autograd_cache_hit", 0) > 0, result["runs"]


@pytest.mark.slow
@gloo
def test_disk_cache_does_not_cross_serve_in_a_fresh_process(tmp_path):
    # First job: ours, then torch, into an empty cache dir; torch's entry is saved.
    first = run_ranks(
        P.compile_in_order, P.WORLD, (str(tmp_path), 8, 16, ("ours", "torch")), timeout=TIMEOUT_S
    )
    # Fresh processes, same cache dir, the other order. (torch 2.13 keys a DTensor program's
    # AOTAutograd entry on its DTensor inputs' metadata, which differs between processes:
    # torch misses its own entry here; ours must not even look.)
    second = run_ranks(
        P.compile_in_order, P.WORLD, (str(tmp_path), 8, 16, ("torch", "ours")), timeout=TIMEOUT_S
    )
    for result in first + second:
        _check(result)
    for result in first:
        assert result["runs"][1][3].get("aot_autograd.autograd_cache_saved", 0) > 0, result["runs"]


@pytest.mark.slow  # an Inductor compile: tens of seconds on a loaded CPU
def test_backend_bypasses_both_caches_and_keeps_the_users_post_grad_pass(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters
    from torch._inductor.custom_graph_pass import CustomGraphPass

    import redist_opt

    class UsersPass(CustomGraphPass):
        calls = 0

        def __call__(self, graph):
            UsersPass.calls += 1

        def uuid(self):
            return "users-pass"

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    counters.clear()
    with (
        torch._inductor.config.patch(fx_graph_cache=True, post_grad_custom_post_pass=UsersPass()),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        x = torch.randn(3, requires_grad=True)
        torch.compile(lambda t: (t * 2).sin(), backend=redist_opt.backend())(x).sum().backward()
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 1
    assert counters["inductor"]["fxgraph_cache_bypass"] == 2  # forward and backward
    assert (
        not counters["aot_autograd"]["autograd_cache_saved"]
        and not counters["inductor"]["fxgraph_cache_miss"]
    )
    assert UsersPass.calls == 2
