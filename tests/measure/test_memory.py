"""A step's peak bytes (redist_opt/measure/memory.py) on known CPU steps, one process, and
the statistic that compares steps by them."""

from __future__ import annotations

import pytest
import torch

from redist_opt.measure import memory

# Allocations of these sizes (bytes): float32 elements * 4.
A, B, C = 4_000, 8_000, 2_000


def _known_step(kept: list):
    """Holds A, then A + B (its peak), frees A, allocates C, frees B and C, keeps one tensor
    of A bytes: peak A + B above the start."""

    def step():
        a = torch.empty(A // 4)
        b = torch.empty(B // 4)
        del a
        c = torch.empty(C // 4)
        del b, c
        kept[:] = [torch.empty(A // 4)]

    return step


def test_the_peak_is_the_highest_running_total_above_the_start():
    assert memory.peak_above_start([A, B, -A, C, -B, -C]) == A + B
    assert memory.peak_above_start([-A, B]) == B - A  # the step first freed what it found
    assert memory.peak_above_start([-A, -B]) == 0  # never above its start
    assert memory.peak_above_start([]) == 0


def test_a_known_cpu_step_is_measured_to_the_byte():
    kept: list = []
    step = _known_step(kept)
    before = []
    assert memory.step_peak(step, "cpu", before=lambda: before.append(1)) == A + B
    assert before == [1]  # just before the measured step, once


def test_what_the_step_frees_of_the_step_before_it_is_counted():
    # the next step frees the last one's kept tensor first (as zero_grad frees the last
    # step's gradients): the lead-in step inside the window makes that free known, so the
    # measured peak is B + C (held at once) - A (freed first), not B + C
    state = {"kept": torch.empty(A // 4)}

    def step():
        state["kept"] = None
        b = torch.empty(B // 4)
        c = torch.empty(C // 4)
        del b, c
        state["kept"] = torch.empty(A // 4)

    assert memory.step_peak(step, "cpu") == B + C - A


def test_a_thread_the_profiler_does_not_follow_is_missed():
    # the profiler records on threads that carry its thread-local state (the caller's, and
    # gloo's work threads, which c10d starts with it; docs/memory.md);
    # a plain Python thread the step starts is not one of them (docs/memory.md)
    import threading

    def step():
        out = []
        worker = threading.Thread(target=lambda: out.append(torch.empty(B // 4)))
        worker.start()
        worker.join()
        a = torch.empty(A // 4)
        del a
        out.clear()

    assert memory.step_peak(step, "cpu") == A


def test_a_device_without_a_counter_is_refused():
    with pytest.raises(ValueError, match="no allocator counter for device meta"):
        memory.step_peak(lambda: None, "meta")


def test_the_statistic_is_the_least_per_rank_then_the_most_over_ranks():
    per_rank = [[110, 100, 120], [90, 95, 130]]
    assert memory.peak_statistic(per_rank) == 100
    summary = memory.peak_summary(per_rank)
    assert summary["bytes"] == 100 and summary["per_rank"] == per_rank
    assert summary["spread"] == pytest.approx(40 / 90)  # rank 1: (130 - 90) / 90
    assert memory.peak_summary([[0, 0]])["spread"] == 0.0


def test_memory_rounds_measure_every_step_per_round_in_the_interleaved_order():
    # under the test session's default group (the fake backend: its barrier returns at once)
    from redist_opt.measure import interleaved_memory_rounds

    ran: list = []

    def step(name: str, nbytes: int):
        def run():
            ran.append(name)
            held = torch.empty(nbytes // 4)
            del held

        return run

    peaks = interleaved_memory_rounds({"a": step("a", A), "b": step("b", B)}, 2)
    assert peaks == {"a": [A, A], "b": [B, B]}
    assert ran == ["a", "a", "b", "b", "b", "b", "a", "a"]  # a lead-in and the measured step each
