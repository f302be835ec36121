"""The one wall-clock timer of the package: median milliseconds of a call.

Used for batch-1 latency in report.json (pipeline), parity.json (export) and
bin/benchmark, so every figure is measured the same way: untimed warm-up
calls first (tracing, allocation), then the median of the timed calls.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np


def median_ms(fn: Callable[[], Any], runs: int = 30, warmup: int = 3,
              budget_s: Optional[float] = None) -> float:
    """Median wall time of `fn()` in milliseconds over up to `runs` calls after
    `warmup` untimed ones. With `budget_s`, stops early once that many seconds
    are spent (after at least 3 timed calls, or 1 when one call takes half the
    budget). `fn` should block until its result is ready (e.g. call .numpy())."""
    for _ in range(max(0, warmup)):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max(1, runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        if budget_s is not None and time.perf_counter() - start > budget_s and (
                len(times) >= 3 or times[0] / 1e3 > budget_s / 2):
            break
    return float(np.median(times))


def interleaved_median_ms(fns: dict[str, Callable[[], Any]], runs: int = 100,
                          warmup: int = 3) -> dict[str, float]:
    """Median wall time in ms of each of several calls, timed in rounds: every round
    calls each function once in turn, so a load that comes and goes on the machine
    slows all of them alike and their ratio stays meaningful. Each `fn` should block
    until its result is ready."""
    for fn in fns.values():
        for _ in range(max(0, warmup)):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(1, runs)):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return {name: float(np.median(values)) for name, values in times.items()}
