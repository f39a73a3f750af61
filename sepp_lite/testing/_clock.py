"""Clocks for the in-process server.

The state machine reads the time and schedules its timers only through a clock
(``sepp_lite._clock.Clock``, the shape the periodic scheduler takes too), so a test can
swap the wall clock for a :class:`ManualClock` and move time by hand: leases,
schedules, dedup windows, long-poll deadlines and retention then need no real waiting.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Optional

from sepp_lite._clock import Clock, TimerHandle, WallClock

__all__ = ["Clock", "ManualClock", "RealClock", "TimerHandle"]


class _NoTimer:
    """A handle for a timer that could not be armed (no running event loop)."""

    def cancel(self) -> None:
        pass


class RealClock(WallClock):
    """Wall-clock milliseconds, clamped so that time never goes backwards (as the
    server's stamp clamp does); timers run on the running asyncio loop."""

    def __init__(self) -> None:
        self._last = 0

    def now_ms(self) -> int:
        """The wall clock in ms, or the last answer if the wall clock stepped back."""
        now = super().now_ms()
        if now < self._last:
            return self._last
        self._last = now
        return now

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """A ``loop.call_later`` timer. Outside a running loop nothing is armed (the
        state machine then catches up on due work at its next operation)."""
        try:
            return super().call_at(deadline_ms, callback)
        except RuntimeError:  # no running loop
            return _NoTimer()


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Optional[Callable[[], None]] = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = None


class ManualClock:
    """A clock that moves only when told to.

    ``advance()`` runs every timer that falls due on the way, in deadline order, with
    the clock set to each timer's own deadline while it runs: a lease that expires at
    T is expired "at" T, exactly as a prompt sweep of the real server would do it.
    """

    def __init__(self, start_ms: Optional[int] = None) -> None:
        self._now = time.time_ns() // 1_000_000 if start_ms is None else int(start_ms)
        self._timers: list[tuple[int, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        """The clock's current time in ms."""
        return self._now

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Register ``callback`` to run when :meth:`advance` reaches ``deadline_ms``.
        A deadline already reached runs at the next ``advance`` (even ``advance(0)``)."""
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (int(deadline_ms), next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (rounded to whole ms) and run every
        timer due on the way. Raises ``ValueError`` for a negative amount."""
        self.advance_ms(round(seconds * 1000))

    def advance_ms(self, ms: int) -> None:
        """Move the clock forward by ``ms`` milliseconds; see :meth:`advance`."""
        if ms < 0:
            raise ValueError(f"a ManualClock cannot go backwards (asked for {ms} ms)")
        target = self._now + ms
        timers = self._timers
        while timers and timers[0][0] <= target:
            deadline, _, timer = heapq.heappop(timers)
            callback = timer.callback
            if callback is None:
                continue
            timer.callback = None
            self._now = max(self._now, deadline)
            callback()
        self._now = target

    def pending_timers(self) -> int:
        """How many timers are armed and not cancelled (for leak checks in tests)."""
        return sum(1 for _, _, timer in self._timers if timer.callback is not None)
