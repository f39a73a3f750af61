"""The connection's timers, one typed handle each."""

from __future__ import annotations

import asyncio
import heapq
from typing import Any, Callable, Optional


class Timer:
    """A callback the loop runs once, ``delay`` seconds after ``start`` (or at loop
    time ``when``, after ``start_at``). Starting a running timer moves it; ``cancel``
    is safe at any time. ``running`` is true from a start until the callback runs or
    the timer is cancelled."""

    __slots__ = ("_callback", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: Optional[asyncio.TimerHandle] = None

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self, delay: float) -> None:
        self.start_at(self._loop.time() + delay)

    def start_at(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_at(when, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None  # before the callback, which may start the timer again
        self._callback()


_NOT_ARMED = float("inf")


class Deadlines:
    """The deadlines of a connection's calls: one loop timer for all of them, at the
    earliest, instead of one per call.

    A timer per call cost each call a ``TimerHandle``, its push onto the loop's heap
    (compared by a Python ``__lt__``) and its cancel; a call that ends leaves nothing
    to undo here. Entries are ``(deadline, key, item)``; ``key`` is unique and orders
    entries with equal deadlines, so items are never compared. An entry whose item is
    no longer ``live`` is dropped when it reaches the front, or when such entries
    outnumber the live ones (so a long call at the front, a long poll, holds no
    growing backlog). ``expire(item)`` runs for each live item whose deadline came."""

    __slots__ = ("_armed_at", "_entries", "_expire", "_live", "_loop", "_timer")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        live: Callable[[Any], bool],
        expire: Callable[[Any], None],
    ) -> None:
        self._loop = loop
        self._live = live
        self._expire = expire
        self._entries: list[tuple[float, int, Any]] = []
        self._timer = Timer(loop, self._fire)
        self._armed_at = _NOT_ARMED  # the timer's time while it runs

    def add(self, deadline: float, key: int, item: Any, live_count: int) -> None:
        """Watch ``item`` (``live_count``: how many items are live now, this one too)."""
        entries = self._entries
        if len(entries) > 2 * live_count + 64:
            self._prune()
        heapq.heappush(entries, (deadline, key, item))
        if deadline < self._armed_at:
            self._arm(deadline)

    def cancel(self) -> None:
        """Forget every deadline (the connection is closed)."""
        self._timer.cancel()
        self._armed_at = _NOT_ARMED
        self._entries.clear()

    def _prune(self) -> None:
        live = self._live
        self._entries[:] = [entry for entry in self._entries if live(entry[2])]
        heapq.heapify(self._entries)

    def _arm(self, deadline: float) -> None:
        self._armed_at = deadline
        self._timer.start_at(deadline)

    def _fire(self) -> None:
        self._armed_at = _NOT_ARMED
        entries, live = self._entries, self._live
        now = self._loop.time()
        while entries:
            deadline, _, item = entries[0]
            if not live(item):
                heapq.heappop(entries)
            elif deadline <= now:
                heapq.heappop(entries)
                self._expire(item)  # may add entries; the loop sees them
            else:
                break
        if entries and entries[0][0] < self._armed_at:
            self._arm(entries[0][0])
