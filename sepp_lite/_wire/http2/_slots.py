"""Stream slots: calls waiting for the peer's MAX_CONCURRENT_STREAMS to let them in.

A server that allows N streams at once refuses the N+1th with RST_STREAM
(REFUSED_STREAM), or counts it against us; so a call over the limit waits here, on
the client, first come first served, and takes the slot of the first stream to end.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable

# Builds the exception a waiter fails with (the connection decides what it is).
Failure = Callable[[], BaseException]


class StreamSlots:
    """The waiters for a free stream, in arrival order.

    Why ``reserved``: waking a waiter only schedules it; until it runs and opens its
    stream, the slot it was given is not in the connection's count of streams, and a
    call arriving meanwhile would take it. ``reserved`` counts such promised slots,
    so the connection sees them as taken."""

    __slots__ = ("_loop", "reserved", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.reserved = 0  # slots promised to woken waiters that have not run yet

    async def wait(self, deadline_at: float, expired: Failure) -> None:
        """Wait for ``wake`` to give us a slot, which is ours when this returns.
        At ``deadline_at`` fail with ``expired()``; on any exception the slot, if one
        was given, is handed back (the caller then wakes the next waiter)."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        self.waiters.append(waiter)
        timer = self._loop.call_at(deadline_at, _expire, waiter, expired)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.reserved -= 1  # woken, then cancelled before taking the slot
            elif waiter in self.waiters:
                self.waiters.remove(waiter)
            raise
        finally:
            timer.cancel()
        self.reserved -= 1

    def wake(self, room: int) -> None:
        """Give slots to waiters while fewer than ``room`` are promised (``room``: the
        peer's limit less the streams open now)."""
        waiters = self.waiters
        while waiters and self.reserved < room:
            waiter = waiters.popleft()
            if not waiter.done():
                self.reserved += 1
                waiter.set_result(None)

    def fail_all(self, failure: Failure) -> None:
        """No slot will come (the connection drains or closed): each waiter fails with
        its own ``failure()``."""
        waiters, self.waiters = self.waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(failure())


def _expire(waiter: asyncio.Future[None], expired: Failure) -> None:
    if not waiter.done():
        waiter.set_exception(expired())
