"""The connection's timers, one typed handle each."""

from __future__ import annotations

import asyncio
from typing import Callable, Optional


class Timer:
    """A callback the loop runs once, ``delay`` seconds after ``start``. Starting a
    running timer moves it; ``cancel`` is safe at any time. ``running`` is true from
    ``start`` until the callback runs or the timer is cancelled."""

    __slots__ = ("_callback", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: Optional[asyncio.TimerHandle] = None

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self, delay: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_later(delay, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None  # before the callback, which may start the timer again
        self._callback()
