"""Inductor's FX graph cache and AOTAutograd's cache never serve a graph compiled by
torch for ``redist_opt.backend()`` or the other way round: in one process in
either order, and through the disk cache in a fresh process; and ours are served
to ours, from the FX graph cache (AOTAutograd's is off for ours: docs/inductor.md).
4 real gloo ranks, caches on; each compiled step's collectives are counted as they
run (torch's TP block issues 7 per step, ours 4), so a swapped artifact shows in the
count.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support import inductor_cache_programs as P

from redist_opt.tools.spawn import run_ranks
from redist_opt.torch_api.version import at_least

gloo = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

TIMEOUT_S = 900
TORCH_STEP, OURS_STEP = 7, 4
# Whether torch's own compile of a DTensor program can use AOTAutograd's cache. torch
# 2.11's Dynamo puts DTensor's ``redistribute`` / ``to_local`` into the graph as closures
# (``TensorVariable.method_redistribute``'s ``prim_redistribute``, ``method_to_local``'s
# ``prim_to_local``), which that cache refuses ("Unsupported call_function target":
# ``autograd_cache_bypass``), so there torch's compiles of the block use the FX graph
# cache only; 2.12 on trace them as methods it accepts.
AOT_CACHES_DTENSOR_PROGRAMS = at_least(2, 12)


def _check(result: dict) -> None:
    """Every compile issues its own backend's count and the eager loss; ours uses the
    FX graph cache only (a lookup per graph, forward and backward)."""
    assert result["eager"] == TORCH_STEP
    for who, count, loss, cache in result["runs"]:
        assert count == (TORCH_STEP if who == "torch" else OURS_STEP), (who, result["runs"])
        assert loss == pytest.approx(result["eager_loss"], rel=1e-5), (who, loss, result["eager_loss"])
        if who == "ours":
            assert set(cache) <= {"inductor.fxgraph_cache_miss", "inductor.fxgraph_cache_hit"}, cache
            assert sum(cache.values()) == 2, cache


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
        cache = result["runs"][2][3]
        if AOT_CACHES_DTENSOR_PROGRAMS:
            assert cache.get("aot_autograd.autograd_cache_hit", 0) > 0, result["runs"]
        else:  # 2.11: from the FX graph cache (AOTAutograd's bypassed, see above)
            assert cache.get("aot_autograd.autograd_cache_bypass", 0) > 0, result["runs"]
            assert cache.get("inductor.fxgraph_cache_hit", 0) > 0, result["runs"]
    for result in ours_first:
        # ours' second compile loads both graphs its first compiled
        assert result["runs"][2][3] == {"inductor.fxgraph_cache_hit": 2}, result["runs"]


@pytest.mark.slow
@gloo
def test_disk_cache_serves_ours_to_ours_only_in_a_fresh_process(tmp_path):
    # First job: ours, then torch, into an empty cache dir; torch's entry is saved.
    first = run_ranks(
        P.compile_in_order, P.WORLD, (str(tmp_path), 8, 16, ("ours", "torch")), timeout=TIMEOUT_S
    )
    # Fresh processes, same cache dir, the other order. (torch 2.13 keys a DTensor program's
    # compiles on its DeviceMesh inputs pickled with their Python hash, which differs
    # between processes, so torch misses its own AOTAutograd entry here; ours keys the
    # mesh by what it is and loads its FX entries.)
    second = run_ranks(
        P.compile_in_order, P.WORLD, (str(tmp_path), 8, 16, ("torch", "ours")), timeout=TIMEOUT_S
    )
    for result in first + second:
        _check(result)
    for result in first:
        cache = result["runs"][1][3]
        if AOT_CACHES_DTENSOR_PROGRAMS:
            assert cache.get("aot_autograd.autograd_cache_saved", 0) > 0, result["runs"]
        else:  # 2.11: torch's entries are its FX graph cache entries (stored on a miss)
            assert cache.get("aot_autograd.autograd_cache_bypass", 0) > 0, result["runs"]
            assert cache.get("inductor.fxgraph_cache_miss", 0) > 0, result["runs"]
    for result in second:  # the block has a mesh input: both graphs are loaded, not compiled
        assert result["runs"][1][3] == {"inductor.fxgraph_cache_hit": 2}, result["runs"]


@pytest.mark.slow
@gloo
def test_a_restarted_job_loads_the_backends_graphs_from_the_disk_cache(tmp_path):
    first = run_ranks(P.compile_reduce_then_slice, P.WORLD, (str(tmp_path),), timeout=TIMEOUT_S)
    second = run_ranks(P.compile_reduce_then_slice, P.WORLD, (str(tmp_path),), timeout=TIMEOUT_S)
    for rank, (cold, warm) in enumerate(zip(first, second)):
        assert cold["kinds"] == ["reduce_scatter_tensor"], cold  # the graph pass ran
        assert warm["cache"] == {"inductor.fxgraph_cache_hit": 1}, warm  # loaded, not compiled
        assert warm["kinds"] == cold["kinds"] and warm["out"] == cold["out"]
        # this rank's block of the sum over ranks of 2 * (x + rank), plus 1
        x = torch.arange(P.WORLD * 6.0).reshape(P.WORLD * 2, 3)
        expected = (2 * (P.WORLD * x + sum(range(P.WORLD)))).chunk(P.WORLD)[rank] + 1
        assert warm["out"] == expected.tolist()


@pytest.mark.slow  # Inductor compiles: tens of seconds on a loaded CPU
def test_backend_uses_the_fx_graph_cache_under_its_own_key_and_keeps_the_users_pass(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters
    from torch._inductor.custom_graph_pass import CustomGraphPass

    import redist_opt

    class UsersPass(CustomGraphPass):
        calls = 0

        def __call__(self, graph):
            UsersPass.calls += 1

        def uuid(self):
            return "users-pass"

    def compile_and_run(backend) -> dict:
        torch._dynamo.reset()
        counters.clear()
        x = torch.randn(3, requires_grad=True)
        torch.compile(lambda t: (t * 2).sin(), backend=backend)(x).sum().backward()
        return {
            f"{g}.{k}": v
            for g in ("aot_autograd", "inductor")
            for k, v in counters[g].items()
            if "cache" in k
        }

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with (
        torch._inductor.config.patch(fx_graph_cache=True, post_grad_custom_post_pass=UsersPass()),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        # AOTAutograd's cache is never asked; the FX graph cache stores the forward and
        # backward, then serves them to a second compile of ours.
        assert compile_and_run(redist_opt.backend()) == {"inductor.fxgraph_cache_miss": 2}
        assert UsersPass.calls == 2
        assert compile_and_run(redist_opt.backend()) == {"inductor.fxgraph_cache_hit": 2}
        # torch's compile of the same graphs (nothing here to rewrite) has keys of its own
        plain = compile_and_run("inductor")
        assert plain["inductor.fxgraph_cache_miss"] == 2 and "inductor.fxgraph_cache_hit" not in plain, plain
        # and so does ours with other options
        assert compile_and_run(redist_opt.backend(prefer="consistency")) == {"inductor.fxgraph_cache_miss": 2}
