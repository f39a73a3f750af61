"""Clocks: the one shape of a clock in sepp_lite, and the wall clock.

Whatever keeps time by a clock takes a :class:`Clock`, epoch milliseconds and a timer
at an instant, so that a test can hand it a clock that moves only when told
(``sepp_lite.testing.ManualClock``): the periodic scheduler keeps its slots by one,
the in-process server its leases, schedules and deadlines, the Worker's lease keeper
its extensions.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

__all__ = ["Clock", "TimerHandle", "WallClock"]


class TimerHandle(Protocol):
    """What :meth:`Clock.call_at` returns: something that can be cancelled."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Milliseconds since the Unix epoch, and timers at such instants."""

    def now_ms(self) -> int:
        """The current time in integer milliseconds (the in-process server's clocks
        never answer less than before)."""
        ...

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` once the clock reaches ``deadline_ms``; return a handle whose
        ``cancel()`` stops it."""
        ...


class WallClock:
    """The wall clock as it is (a step back shows: the periodic scheduler reads the
    server's clock again when its own went back); timers run on the running asyncio
    loop."""

    def now_ms(self) -> int:
        """``time.time_ns()`` in whole milliseconds."""
        return time.time_ns() // 1_000_000

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """A ``loop.call_later`` timer on the running loop (``RuntimeError`` without
        one)."""
        # An instant passed already runs at the loop's next turn, as a delay of 0 would.
        delay = (deadline_ms - self.now_ms()) / 1000
        return asyncio.get_running_loop().call_later(delay, callback)
