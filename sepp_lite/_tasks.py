"""TaskSet: the small owner for child tasks that Python 3.9 lacks (no TaskGroup).
Whoever creates a TaskSet awaits or cancels everything spawned in it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Callable

from sepp_lite import _otel

logger = _otel.logger()


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

    async def cancel(self, grace: float | None = None) -> bool:
        """Cancel every task and wait until all have finished, or at most ``grace``
        seconds (a task that swallows its cancellation cannot be stopped: it is left
        running and reported). True when none is left."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            # asyncio.wait leaves the children alone when the caller itself is cancelled,
            # so the caller's own cancellation still propagates out of this await.
            await asyncio.wait(tasks, timeout=grace)
        left = [task for task in tasks if not task.done()]
        if left:
            logger.error(
                "%d %s task(s) ignored cancellation; leaving them behind", len(left), self._name
            )
        return not left
