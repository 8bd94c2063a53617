"""The compiled-graph pass on real gloo processes (``aot_eager`` + the pass).

* The acceptance programs on 8 ranks (a 2x2x2 and a 2x4 mesh): outputs and
  gradients equal the uncompiled program's under torch's own redistribute with its
  merge pass off, bitwise (integer-valued inputs);
  on the 2x2x2 mesh the rank slices' mesh dims are agreed across ranks at
  compile time, so the slice rewrites happen there too.
* Randomized chains of DTensor redistributions, hand-written funcol
  all_reduces and pointwise ops on 4 ranks (2x2 mesh): equal outputs, never
  more collectives than the graph torch traced. ``REDIST_OPT_RANDOM_PROGRAMS``
  sets how many (default 12; seeds are fixed).
"""

from __future__ import annotations

import os

import pytest
from support import graph_pass_programs as P

from redist_opt.tools.spawn import run_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("graph_pass_gloo"),
    pytest.mark.differential,  # .ci/run runs it on every torch: compiled against uncompiled on gloo ranks
]  # compiles programs on 8 and on 4 gloo ranks


@pytest.fixture(scope="module")
def programs():
    return run_ranks(P.gloo_programs, 8, (), timeout=1800)


def test_outputs_and_gradients_equal_uncompiled(programs):
    # every rank asserted equality itself; all ranks made the same decisions
    first = programs[0]
    for r in programs[1:]:
        assert {k: v["after"] for k, v in r.items()} == {k: v["after"] for k, v in first.items()}


def test_programs_get_cheaper_on_gloo(programs):
    r = programs[0]
    assert r["flat/simplefsdp"] == {"before": 3, "after": 2, "modified": True}
    assert r["noflat/simplefsdp"]["modified"] and r["noflat/simplefsdp"]["after"] == 3
    assert r["noflat/gather_then_own_block"]["after"] == 0
    assert r["noflat/gathered_params"] == {"before": 2, "after": 1, "modified": True}
    # uneven: rank 0 has no pad before its gathers, rank 1 has; both leave them apart
    assert r["noflat/gathered_params_uneven"] == {"before": 2, "after": 2, "modified": False}
    assert r["noflat/scattered_grads"] == {"before": 2, "after": 1, "modified": True}
    # slices on the all-size-2 mesh: resolved by agreement across ranks
    assert r["noflat/gather_then_own_block@m3"]["after"] == 0
    assert r["noflat/replicate_then_shard@m3"]["modified"]
    for name in ("user_chunk", "uneven", "two_users"):
        assert not r[f"noflat/{name}"]["modified"]


def test_random_programs():
    n = int(os.environ.get("REDIST_OPT_RANDOM_PROGRAMS", "12"))
    seeds = list(range(n))
    results = run_ranks(P.gloo_random, 4, (seeds,), timeout=1800)
    by_rank = [[(x["before"], x["after"]) for x in r] for r in results]
    assert all(b == by_rank[0] for b in by_rank)  # same decisions on every rank
    rows = results[0]
    assert all(x["after"] <= x["before"] for x in rows)
    # the generator makes chains the pass can shorten: some must be rewritten
    assert any(x["modified"] for x in rows), rows
