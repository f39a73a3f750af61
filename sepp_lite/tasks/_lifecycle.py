"""What runs around the workers of one registry (``Tasks.running``): the start-up hooks
and lifespans, entered by the first worker to start and closed by the last to stop,
once each, however the workers come and go."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Callable, Optional

__all__ = ["Lifecycle"]

Start = Callable[[contextlib.AsyncExitStack], Awaitable[None]]


class Lifecycle:
    """Reference-counted hooks. :meth:`held` enters them for the first user
    (``start(stack)``, which leaves on ``stack`` what closing must run); a user that
    comes while that start is under way waits for it and fails with its error, or, if it
    was cancelled, starts them itself; the last user to leave closes the stack, once,
    and a user that comes while it closes waits for that and then starts them again.

    The users must share one event loop while any is inside: what the hooks open
    (pools, clients) belongs to the loop that opened them. A user on another loop gets
    ``RuntimeError``; once the last has left, any loop may start them again.
    """

    def __init__(self, start: Start) -> None:
        self._start = start
        # Only the loop check and the count are read from other threads (to refuse them).
        self._guard = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._users = 0
        self._stack: Optional[contextlib.AsyncExitStack] = None  # open: started, not closing
        # A start or a close under way; a start's result is its failure (None if none).
        self._busy: Optional[asyncio.Future[Optional[BaseException]]] = None

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Inside the hooks: started on entry if nobody holds them, closed on exit if
        nobody else does. Raises what the start raised, or ``RuntimeError`` on a second
        event loop."""
        self._join()
        try:
            await self._started()
            yield
        finally:
            await self._leave()

    def _join(self) -> None:
        loop = asyncio.get_running_loop()
        with self._guard:
            if self._loop is not None and self._loop is not loop:
                raise RuntimeError(
                    "the hooks of this Tasks are running on another event loop (thread): "
                    "its workers must share one loop while any of them runs (what the "
                    "hooks open belongs to that loop); use a Tasks per loop"
                )
            self._loop = loop
            self._users += 1

    async def _started(self) -> None:
        while self._stack is None:
            busy = self._busy
            if busy is None:
                await self._enter()
                return
            # Shielded: a waiter that is cancelled must not cancel the start it waits for.
            failure = await asyncio.shield(busy)
            if failure is not None:
                raise failure

    async def _enter(self) -> None:
        busy = self._busy = asyncio.get_running_loop().create_future()
        stack = contextlib.AsyncExitStack()
        try:
            await self._start(stack)
        except BaseException as exc:
            # A cancelled start is this user's own affair: whoever waits starts anew.
            failure = None if isinstance(exc, asyncio.CancelledError) else exc
            try:
                await stack.aclose()  # what had started, and the shutdown hooks
            finally:
                self._busy = None
                busy.set_result(failure)
            raise
        self._stack, self._busy = stack, None
        busy.set_result(None)

    async def _leave(self) -> None:
        with self._guard:
            self._users -= 1
            last = self._users == 0
        stack = self._stack if last else None
        if stack is None:
            self._release_loop()
            return
        self._stack = None
        busy = self._busy = asyncio.get_running_loop().create_future()
        try:
            await stack.aclose()
        finally:
            self._busy = None
            busy.set_result(None)
            self._release_loop()

    def _release_loop(self) -> None:
        with self._guard:
            if self._users == 0 and self._busy is None and self._stack is None:
                self._loop = None
