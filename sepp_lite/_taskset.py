"""TaskSet: the small owner for child tasks that Python 3.9 lacks (no TaskGroup).
Whoever creates a TaskSet awaits or cancels everything spawned in it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Callable, Optional

from sepp_lite import _log

logger = _log.logger()

OnDone = Optional[Callable[["asyncio.Task[None]"], None]]


class TaskSet:
    """Tasks owned by one coroutine. A task that fails with an unexpected exception is
    logged (the owner never awaits a result from them).

    A task leaves the set, and its ``on_done`` runs, at the end of its own last step,
    not in a done-callback: a callback would cost the event loop one more iteration
    (one more ``epoll_wait``) per task, which the Worker pays for every job. The one
    case a task cannot clean up after itself is a cancellation that lands before its
    first step (its coroutine never starts), so :meth:`stop` adds a done-callback to
    every task it cancels; whichever of the two runs first does the cleanup."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: dict[asyncio.Task[None], tuple[Coroutine[Any, Any, None], OnDone]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, None], on_done: OnDone = None) -> asyncio.Task[None]:
        """Run ``coro`` in a task of this set; ``on_done(task)`` runs once it has ended."""
        task = asyncio.ensure_future(self._run(coro))
        self._tasks[task] = (coro, on_done)
        return task

    async def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            logger.error("%s task crashed", self._name, exc_info=exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise  # asyncio passes these on to whoever runs the loop
        finally:
            task = asyncio.current_task()
            assert task is not None
            self._finish(task)

    def _finish(self, task: asyncio.Task[None]) -> None:
        entry = self._tasks.pop(task, None)
        if entry is None:
            return  # cleaned up already
        coro, on_done = entry
        # Only a task cancelled before its first step gets here with ``coro`` unstarted:
        # close it so that Python does not warn that it was never awaited.
        coro.close()
        if on_done is not None:
            on_done(task)

    def stop(self, task: asyncio.Task[None]) -> None:
        """Cancel one task of this set (see the class docstring)."""
        if task.cancel():
            task.add_done_callback(self._finish)

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
            self.stop(task)
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
