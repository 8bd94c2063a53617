"""Where ours runs the same collectives as torch, it holds no more than torch at the step's
peak, eager and compiled (issue 42, item 4): a tensor-parallel step on 4 gloo ranks, each
variant's peak bytes from interleaved memory rounds (programs:
``tests/support/memory_programs.py``; the method and the statistic: docs/memory.md)."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from support import memory_programs

from redist_opt.measure import memory
from redist_opt.tools.spawn import run_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo"),
]


def test_ours_holds_no_more_than_torch_at_the_peak_of_a_tp_step_eager_and_compiled():
    ranks = run_ranks(memory_programs.tp_step_peaks, 4, (), timeout=600)
    # the up projection's output alone (this rank's column shard of it) is live at the peak
    least = memory_programs.BATCH * memory_programs.HIDDEN // 4 * 4
    for compiler in ("eager", "aot_eager"):
        theirs, ours = f"{compiler}/torch", f"{compiler}/ours"
        for r in ranks:
            # the same collectives: the output's and the input gradient's all_reduce
            assert r["collectives"][ours] == r["collectives"][theirs] == {"gloo:all_reduce": 2}, r["rank"]
            assert len(r["peaks"][ours]) == len(r["peaks"][theirs]) == memory_programs.ROUNDS
            # on every rank, by the statistic's per-rank part (the least over the rounds)
            assert least <= min(r["peaks"][ours]) <= min(r["peaks"][theirs]), (
                compiler,
                r["rank"],
                r["peaks"],
            )
        per_rank = {side: [r["peaks"][side] for r in ranks] for side in (theirs, ours)}
        assert memory.peak_statistic(per_rank[ours]) <= memory.peak_statistic(per_rank[theirs])
