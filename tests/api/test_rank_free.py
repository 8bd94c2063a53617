"""Rank-free planning: redist_opt.plan on a MeshSpec needs no process group,
and predicts what torch issues.

* In a fresh interpreter that never initialises torch.distributed, planning on a
  131072-rank MeshSpec(sizes=(8, 16, 32, 32)) works for even and uneven shapes
  and leaves ``torch.distributed.is_initialized()`` False.
* Its ``num_collectives`` equals the number of collectives torch (merge pass
  disabled) issues for the same placements on a 2x2x2x2 fake mesh (every mesh
  dim has size > 1 in both, so torch skips no step in either); the same pairs are
  also checked differentially on the 2x2x2x2 mesh.

The quick tier runs a fixed sample of about one pair and shape in ``SAMPLE_EVERY``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
from support.harness import Case, check_case, oracle_only
from support.paths import ROOT
from support.sampling import sampled

import redist_opt

BIG = dict(sizes=(8, 16, 32, 32), names=("a", "b", "c", "d"))
MAIN_SRC, MAIN_DST = ["P", "P", "S(0)", "R"], ["R", "S(0)", "R", "R"]
BIG_SHAPES = [(4096, 1024), (4097, 1023), (5, 3), (0, 7), (131073, 3)]

# placement pairs cross-checked against torch on 2x2x2x2
_rng = random.Random(4)
_lists = [tuple(x) for x in itertools.product(["R", "S(0)", "S(1)", "P"], repeat=4)]
PAIRS = (
    [(tuple(MAIN_SRC), tuple(MAIN_DST))]
    + [
        (s, d)
        for s, d in ((_rng.choice(_lists), _rng.choice(_lists)) for _ in range(40))
        if not any(b == "P" and a != "P" for a, b in zip(s, d))  # torch rejects X -> P
    ][:24]
    + [
        (("P(avg)", "P(avg)", "S(0)", "R"), ("S(1)", "P(avg)", "R", "R")),
        (("P(max)", "R", "P(max)", "S(1)"), ("S(1)", "R", "R", "S(0)")),
    ]
)


def _run_isolated(code: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plan_without_process_group():
    code = textwrap.dedent(
        f"""
        import json, time
        import torch
        import torch.distributed as dist
        import redist_opt
        assert not dist.is_initialized()
        spec = redist_opt.MeshSpec(sizes={BIG["sizes"]!r}, names={BIG["names"]!r})
        out = {{}}
        for shape in {BIG_SHAPES!r}:
            t = time.perf_counter()
            p = redist_opt.plan(spec, {MAIN_SRC!r}, {MAIN_DST!r}, shape=shape)
            out[str(shape)] = dict(n=p.num_collectives, fallback=p.fallback,
                                   seconds=time.perf_counter() - t)
        pairs = {[list(map(list, pr)) for pr in PAIRS]!r}
        out["pairs"] = [redist_opt.plan(spec, s, d, shape=(4096, 1024)).num_collectives
                        for s, d in pairs]
        out["from_names_spec_bf16"] = redist_opt.plan(
            spec, ",".join({MAIN_SRC!r}), ",".join({MAIN_DST!r}), shape=(4096, 1024),
            dtype=torch.bfloat16).num_collectives
        out["initialized"] = dist.is_initialized()
        print(json.dumps(out))
        """
    )
    out = _run_isolated(code)
    assert out["initialized"] is False, "planning initialised torch.distributed"
    expected = _torch_count(MAIN_SRC, MAIN_DST, (16, 8))
    for shape in BIG_SHAPES:
        r = out[str(shape)]
        assert r["fallback"] is False, f"{shape}: plan is a fallback"
        assert r["n"] == expected, (
            f"shape {shape}: rank-free plan has {r['n']} collectives, torch issues {expected} on 2x2x2x2"
        )
        assert r["seconds"] < 30, f"shape {shape}: planning took {r['seconds']:.1f}s"
    assert out["from_names_spec_bf16"] == expected
    for (s, d), n in zip(PAIRS, out["pairs"]):
        t = _torch_count(list(s), list(d), (16, 8))
        assert n == t, f"{s}->{d}: rank-free plan {n} collectives, torch on 2x2x2x2 {t}"


_COUNT_CACHE: dict = {}


def _torch_count(src, dst, shape) -> int:
    """Collectives torch (merge disabled) issues on the 2x2x2x2 fake mesh."""
    key = (tuple(src), tuple(dst), tuple(shape))
    if key not in _COUNT_CACHE:
        ref = oracle_only(Case("2x2x2x2", tuple(src), tuple(dst), tuple(shape)))
        assert ref.error is None, f"torch rejects {src}->{dst}: {ref.describe_error()}"
        _COUNT_CACHE[key] = ref.total
    return _COUNT_CACHE[key]


SAMPLE_EVERY = 4


def _pair_shape_params(shapes):
    return [
        sampled(
            (list(s), list(d), shape),
            f"{'x'.join(map(str, shape))}-{','.join(s)}_to_{','.join(d)}",
            SAMPLE_EVERY,
        )
        for shape in shapes
        for s, d in PAIRS
    ]


@pytest.mark.parametrize("src,dst,shape", _pair_shape_params([(16, 8), (5, 3), (0, 4)]))
def test_rank_free_count_matches_torch_2x2x2x2(src, dst, shape):
    n_torch = _torch_count(src, dst, shape)
    big = redist_opt.plan(redist_opt.MeshSpec(**BIG), src, dst, shape=(4096, 1024))
    small = redist_opt.plan(
        redist_opt.MeshSpec(sizes=(2, 2, 2, 2), names=("a", "b", "c", "d")), src, dst, shape=shape
    )
    assert small.num_collectives == n_torch, (
        f"plan on MeshSpec 2x2x2x2 {shape}: {small.num_collectives} collectives, torch {n_torch}"
    )
    assert big.num_collectives == n_torch, (
        f"plan on MeshSpec 8x16x32x32: {big.num_collectives} collectives, torch on 2x2x2x2 {n_torch}"
    )


@pytest.mark.parametrize("src,dst,shape", _pair_shape_params([(16, 8), (5, 3)]))
def test_differential_2x2x2x2(src, dst, shape):
    """The same pairs, fully checked (values, placements, counts) on 2x2x2x2."""
    check_case("2x2x2x2", src, dst, shape)
