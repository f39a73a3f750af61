"""TaskSet: the small owner for child tasks that Python 3.9 lacks (no TaskGroup).
Whoever creates a TaskSet awaits or cancels everything spawned in it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Callable

logger = logging.getLogger("sepp_lite")


class TaskSet:
    """Tasks owned by one coroutine. A task that fails with an unexpected exception is
    logged (the owner never awaits a result from them)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        coro: Coroutine[Any, Any, None],
        on_done: Callable[[asyncio.Task[None]], None] | None = None,
    ) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if on_done is not None:
                on_done(finished)
            if not finished.cancelled() and finished.exception() is not None:
                logger.error("%s task crashed", self._name, exc_info=finished.exception())

        task.add_done_callback(done)
        return task

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait for every task (``timeout`` seconds at most); True when none is left.
        Cancelling the caller does not cancel the tasks: see :meth:`cancel`."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return not self._tasks

    async def cancel(self) -> None:
        """Cancel every task and wait until all have finished."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        # gather(return_exceptions=True) absorbs the children's CancelledError only; a
        # cancellation of the caller itself still propagates out of this await.
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
