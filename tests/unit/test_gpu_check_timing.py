"""scripts/gpu_check/gpu_check_timing.py: the one way the GPU check times a step; on the CPU the host clock over N
calls after an untimed warm-up (on a GPU the same calls between two CUDA events)."""

from __future__ import annotations

import time

from scripts.gpu_check import gpu_check_timing as timing


def test_rounds_of_n_calls_after_an_untimed_warm_up():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.002)

    rounds = timing.time_calls(step, 5, device="cpu", warmup=3, rounds=2)
    assert len(calls) == 3 + 2 * 5 and len(rounds) == 2
    assert all(0.002 <= s < 0.5 for s in rounds)  # seconds per call, not per round
    assert timing.median_ms([0.001, 0.003, 0.002]) == 2.0


def test_the_three_parts_time_their_steps_with_it():
    """speed (and capture, through its compare), perf and steps call the one timer, and no step loop of theirs reads
    the host clock itself."""
    from scripts.gpu_check import gpu_check_perf, gpu_check_speed, gpu_check_steps

    assert gpu_check_speed.seconds_per_call is timing.seconds_per_call
    assert gpu_check_perf.time_calls is timing.time_calls
    assert gpu_check_steps.seconds_per_call is timing.seconds_per_call
