"""Run-time faults on 8 gloo ranks (2x2x2 meshes), each checked with the fault
harness: what every rank sent (flight recorder), how long it waited, and what it
computed against torch's redistribute (merge pass off). See docs/faults.md.

The agreement bound is the default group's timeout: ``PG_TIMEOUT_S`` here.
Without the fixes (merged-group creation and the cost profile agreed in
``redist_opt.runtime.consensus``; groups created by their members only), (c),
(e) and (f) hang with mismatched collective sequences; (d) then has no
agreement point, and the other ranks sit in a collective until gloo's timeout.
"""

from __future__ import annotations

import json

import fault_harness as fh
import fault_programs
import pytest
import torch.distributed as dist

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo"),
]

WORLD = 8
PG_TIMEOUT_S = 10.0  # the default group's timeout: the agreement bound
BUDGET_S = 90.0  # each rank's wall time (watchdog)
# Polling and a loaded machine: how far past the bound a round may end.
SLACK_S = 2.0
NCCL = {"REDIST_OPT_COST_PROFILE": "nccl"}


def _run(program, **kw):
    kw.setdefault("options", dict(groups="create"))
    kw.setdefault("env", NCCL)
    reps = fh.run_program(program, WORLD, bound_s=BUDGET_S, pg_timeout_s=PG_TIMEOUT_S, **kw)
    # the numbers docs/faults.md reports (`-s` shows them)
    print(
        f"\n{program.__name__} {kw.get('args', '')}: worst agreement round "
        f"{fh.worst_agreement_wait(reps):.2f} s, worst section {fh.worst_wait(reps):.2f} s "
        f"(T = {PG_TIMEOUT_S:g} s)"
    )
    return reps


def _assert_every_rank_raised(reps, *needles):
    for rank, rep in sorted(reps.items()):
        assert rep.status == "error", f"rank {rank} {rep.status}: {rep.error or rep.stacks}"
        last = rep.error.strip().splitlines()[-1]
        assert "AgreementError" in last, last
        for needle in needles:
            assert needle in last, (needle, last)


def test_pipeline_stages_create_different_groups_in_eager():
    # (c, eager) stage 0 creates a merged group, stage 1 none; a group spanning both
    # stages is created afterwards and must carry one name on all its members.
    reps = _run(fault_programs.stages_run_different_programs)
    fh.assert_consistent(reps, bound_s=PG_TIMEOUT_S + SLACK_S)
    merged = {rep.groups[g][1] for rep in reps.values() for g in rep.groups}
    assert "mesh_redist_opt_4_s1" in merged  # stage 0 did use its merged group


@pytest.mark.parametrize("late", ["13", "exit", "kill"])
def test_a_rank_that_does_not_reach_agreement(late):
    # (d) rank 3 reaches its first planning 3 s after the bound, or never (it exits,
    # or its process is killed): every other rank raises within the bound, naming
    # rank 3; a late rank 3 raises when it arrives. Nobody issues a collective.
    reps = _run(fault_programs.rank_3_fails_to_arrive, args=(late,))
    survivors = {r: rep for r, rep in reps.items() if r != 3}
    _assert_every_rank_raised(survivors, "rank(s) [3] did not join it")
    if late == "13":
        _assert_every_rank_raised({3: reps[3]}, "this rank (3) joined after the others had given up")
    else:
        assert reps[3].status == "died"
    assert fh.worst_agreement_wait(reps) <= PG_TIMEOUT_S + SLACK_S
    assert fh.sequence_mismatches(survivors) == []
    # the optimized run issued no collective: every rank's trace is the reference run's
    counts = {r: len(rep.collectives) for r, rep in survivors.items()}
    assert len(set(counts.values())) == 1, counts


def test_merged_group_creation_fails_on_one_rank():
    # (e) the measured fault: creation refused on rank 1 only. Every rank falls back
    # to the unmerged plan, with the same collectives, and computes torch's values.
    reps = _run(fault_programs.group_creation_fails_on_rank_1)
    # each of the two transitions waits at most half the bound for rank 1's peers to
    # give up connecting, then one round
    fh.assert_consistent(reps, bound_s=2 * PG_TIMEOUT_S + SLACK_S)
    assert fh.worst_agreement_wait(reps) <= PG_TIMEOUT_S + SLACK_S
    for rep in reps.values():
        assert not any(desc.startswith("mesh_redist_opt") for _, desc in rep.groups.values())


@pytest.mark.parametrize("rank_1_profile", ["gloo", "/nonexistent/profile.json"])
def test_ranks_with_different_cost_profiles(rank_1_profile):
    # (f) rank 1 plans with the gloo profile (which keeps two all_reduces where nccl's
    # merges them), or names a calibrated file it does not have: every rank raises,
    # naming the setting and the ranks, before any collective of the optimized run.
    reps = _run(fault_programs.profile_differs, rank_env={1: {"REDIST_OPT_COST_PROFILE": rank_1_profile}})
    if rank_1_profile == "gloo":
        _assert_every_rank_raised(
            reps,
            "ranks [0, 2, 3, 4, 5, 6, 7] plan with REDIST_OPT_COST_PROFILE=nccl",
            "ranks [1] plan with REDIST_OPT_COST_PROFILE=gloo",
        )
    else:
        _assert_every_rank_raised(reps, "rank(s) [1] cannot resolve the cost profile", rank_1_profile)
    assert fh.sequence_mismatches(reps) == []
    assert fh.worst_agreement_wait(reps) <= PG_TIMEOUT_S + SLACK_S


def test_a_rank_that_measures_differently_plans_like_the_others(tmp_path):
    # (g) rank 3 is late at every profiled step, so its in-step times differ from its
    # peers': the ranks agree on one profile (the slowest rank's medians) and then issue
    # the same collectives with it, computing torch's values.
    reps = _run(fault_programs.in_step_profile_with_a_late_rank, args=(str(tmp_path), 0.2))
    fh.assert_consistent(reps, bound_s=PG_TIMEOUT_S + SLACK_S)
    files = {p.read_bytes() for p in tmp_path.glob("in_step_rank*.json")}
    assert len(files) == 1, "every rank wrote the same profile"


def test_a_rank_that_is_late_at_every_tuned_step_decides_like_the_others(tmp_path):
    # (h) rank 3 is late at every step redist_opt.tune times, so its own clock says
    # something else than its peers': every rank decides from the gathered times (the
    # slowest rank per step), writes the same profile and issues the same collectives.
    reps = _run(fault_programs.tuned_with_a_late_rank, args=(str(tmp_path), 0.05))
    fh.assert_consistent(reps, bound_s=PG_TIMEOUT_S + SLACK_S)
    files = {p.read_bytes() for p in tmp_path.glob("tuned_rank*.json")}
    assert len(files) == 1, "every rank wrote the same profile"
    record = json.loads(files.pop())["calibration"]["tune"]
    assert record["world_size"] == WORLD and record["decisions"], record
    assert min(min(ts) for ts in record["times"].values()) >= 0.05  # every step waited for rank 3
