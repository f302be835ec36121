"""The package's wall-clock timers: what they call and in which order (no timings)."""
from __future__ import annotations

from tinybert_tf.timing import interleaved_median_ms, median_ms


def test_interleaved_timing_calls_each_function_once_per_round_in_turn():
    calls: list[str] = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("teacher", "student")}
    out = interleaved_median_ms(fns, runs=4, warmup=2)
    assert set(out) == {"teacher", "student"}
    assert all(v >= 0 for v in out.values())
    # Warm-up calls first (each function's own), then the timed rounds alternate.
    assert calls[:4] == ["teacher", "teacher", "student", "student"]
    assert calls[4:] == ["teacher", "student"] * 4


def test_median_ms_times_the_requested_number_of_calls_after_the_warm_up():
    calls: list[int] = []
    median_ms(lambda: calls.append(1), runs=5, warmup=2)
    assert len(calls) == 7
