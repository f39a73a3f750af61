"""Small timing helpers shared by the benchmarks: warm up, then time rounds and report
the median, so one noisy round on a shared 2-core machine does not decide a figure."""

from __future__ import annotations

import platform
import statistics
import sys
import time
from typing import Callable


def per_op_us(
    fn: Callable[[], object],
    ops_per_call: int,
    *,
    rounds: int = 7,
    min_round_s: float = 0.2,
    warmup_s: float = 0.5,
) -> float:
    """Median microseconds per operation of ``fn`` (which performs ``ops_per_call``)."""
    if platform.python_implementation() == "PyPy":
        warmup_s *= 6  # let the JIT settle
    deadline = time.perf_counter() + warmup_s
    calls = 0
    while time.perf_counter() < deadline or calls < 3:
        fn()
        calls += 1
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    repeat = max(1, int(min_round_s / once))
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        samples.append((time.perf_counter() - t0) / (repeat * ops_per_call) * 1e6)
    return statistics.median(samples)


def interpreter() -> str:
    impl = platform.python_implementation()
    return f"{impl} {platform.python_version()} ({sys.platform}, {platform.machine()})"
