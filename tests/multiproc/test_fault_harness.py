"""The fault harness's checks on hand-made traces (a mismatch must be detected and
named), and one real run: 8 gloo ranks, a program every rank runs alike."""

from __future__ import annotations

import fault_harness as fh
import fault_programs
import pytest
import torch
import torch.distributed as dist


def _ar(group, seq, size=(4, 6), op="gloo:all_reduce"):
    return fh.Collective(group, seq, op, (size,), (size,), ("Float", "Float"))


def _report(rank, collectives, groups, **kw):
    return fh.RankReport(rank, "ok", collectives=collectives, groups=groups, **kw)


PAIR = {"1": ((0, 1), "mesh_dim_0")}


def test_identical_sequences_pass():
    reps = {r: _report(r, [_ar("1", 1), _ar("1", 2, (2, 6))], PAIR) for r in (0, 1)}
    assert fh.sequence_mismatches(reps) == []


def test_a_missing_collective_is_named():
    reps = {0: _report(0, [_ar("1", 1), _ar("1", 2)], PAIR), 1: _report(1, [_ar("1", 1)], PAIR)}
    (problem,) = fh.sequence_mismatches(reps)
    assert "process group '1' (mesh_dim_0, ranks [0, 1])" in problem
    assert "collective #2 differs" in problem
    assert "rank 1 ran nothing (its sequence ends after 1)" in problem
    assert "rank 0 ran gloo:all_reduce" in problem


def test_a_different_op_or_size_is_named():
    reps = {0: _report(0, [_ar("1", 1)], PAIR), 1: _report(1, [_ar("1", 1, op="gloo:all_gather")], PAIR)}
    (problem,) = fh.sequence_mismatches(reps)
    assert "collective #1 differs" in problem and "gloo:all_gather" in problem
    reps[1] = _report(1, [_ar("1", 1, size=(2, 6))], PAIR)
    (problem,) = fh.sequence_mismatches(reps)
    assert "in=[[2, 6]]" in problem
    assert fh.sequence_mismatches(reps, compare_sizes=False) == []


def test_a_member_that_never_used_the_group_is_named():
    # the measured fault: rank 1 fell back to the unmerged plan while rank 0 ran the merged one
    merged = {"25": ((0, 1), "mesh_redist_opt_4_s2")}
    dim = {"1": ((0, 1), "mesh_dim_0")}
    reps = {0: _report(0, [_ar("25", 1)], merged), 1: _report(1, [_ar("1", 1)], dim)}
    problems = fh.sequence_mismatches(reps)
    assert len(problems) == 2
    assert any("process group '25'" in p and "rank 1 ran nothing" in p for p in problems)
    assert any("process group '1'" in p and "rank 0 ran nothing" in p for p in problems)


def test_disjoint_groups_are_compared_separately():
    g = {"1": ((0, 1), "a"), "2": ((2, 3), "a")}
    reps = {
        0: _report(0, [_ar("1", 1)], {"1": g["1"]}),
        1: _report(1, [_ar("1", 1)], {"1": g["1"]}),
        2: _report(2, [_ar("2", 1), _ar("2", 2)], {"2": g["2"]}),
        3: _report(3, [_ar("2", 1), _ar("2", 2)], {"2": g["2"]}),
    }
    assert fh.sequence_mismatches(reps) == []


def test_a_rank_without_a_report_is_not_compared():
    # a dead rank (no trace) is reported by its status, not as a mismatch
    reps = {0: _report(0, [_ar("1", 1)], PAIR)}
    assert fh.sequence_mismatches(reps) == []


def test_group_names_meaning_different_ranks_are_named():
    reps = {
        0: _report(0, [_ar("1", 1)], {"1": ((0, 1), "a")}),
        1: _report(1, [_ar("1", 1)], {"1": ((1, 2), "a")}),
    }
    problems = fh.sequence_mismatches(reps)
    assert any("has ranks [0, 1] on some ranks and [1, 2] on rank 1" in p for p in problems)


def test_collectives_from_a_flight_recorder_dump():
    entry = {
        "record_id": 0,
        "process_group": ("3", "mesh_b"),
        "collective_seq_id": 1,
        "is_p2p": False,
        "profiling_name": "gloo:all_gather",
        "input_sizes": [[3, 4]],
        "output_sizes": [[1, 3, 4]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
    }
    (c,), wrapped = fh.collectives_from_fr({"entries": [entry]})
    assert c == fh.Collective("3", 1, "gloo:all_gather", ((3, 4),), ((1, 3, 4),), ("Float", "Float"))
    assert not wrapped
    assert fh.collectives_from_fr({"entries": [dict(entry, record_id=7)]})[1]


def test_slow_sections_and_outputs():
    a = _report(
        0,
        [],
        {},
        sections={"agree": 0.5, "run": 9.0},
        reference={"y": torch.ones(2)},
        outputs={"y": torch.ones(2)},
    )
    b = _report(
        1, [], {}, sections={"agree": 6.0}, reference={"y": torch.ones(2)}, outputs={"y": torch.zeros(2)}
    )
    reps = {0: a, 1: b}
    assert fh.slow_sections(reps, 5.0) == [
        "rank 0: section 'run' took 9.00 s (bound 5 s)",
        "rank 1: section 'agree' took 6.00 s (bound 5 s)",
    ]
    assert fh.slow_sections(reps, 5.0, names={"agree"}) == ["rank 1: section 'agree' took 6.00 s (bound 5 s)"]
    assert fh.worst_wait(reps, names={"agree"}) == 6.0
    (problem,) = fh.output_mismatches(reps)
    assert problem.startswith("rank 1: output 'y' differs from the reference")
    with pytest.raises(AssertionError, match="rank 1: output 'y'"):
        fh.assert_consistent(reps)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_harness_on_8_gloo_ranks():
    reps = fh.run_program(
        fault_programs.reduce_on_2x2x2,
        8,
        options=dict(groups="create"),
        env={"REDIST_OPT_COST_PROFILE": "nccl"},
        bound_s=120,
    )
    fh.assert_consistent(reps, bound_s=60)
    # the merged all_reduce ran on a group redist_opt created, on every rank
    assert all(
        any(desc.startswith("mesh_redist_opt") for _, desc in rep.groups.values()) for rep in reps.values()
    )


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_watchdog_turns_a_hang_into_stacks_and_a_named_mismatch():
    reps = fh.run_program(fault_programs.one_rank_skips_a_collective, 4, bound_s=15)
    assert reps[1].status == "ok"
    hung = [r for r, rep in reps.items() if rep.status == "hung"]
    assert hung == [0, 2, 3], {r: (rep.status, rep.error) for r, rep in reps.items()}
    assert all("one_rank_skips_a_collective" in reps[r].stacks for r in hung)
    problems = fh.sequence_mismatches(reps)
    assert any("rank 1 ran nothing" in p for p in problems), problems
    with pytest.raises(AssertionError, match="rank 0 hung"):
        fh.assert_consistent(reps)
