"""Periodic tasks: ``@tasks.periodic(cron=..., tz=...)`` or ``every=...`` registers a task
that takes no input, and each worker of the registry keeps its next slots enqueued
(:mod:`sepp_lite._scheduler` has the design: one job per slot through the server's
deduplication, no leader)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from datetime import tzinfo
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from sepp_lite import _log
from sepp_lite._scheduler import PeriodicJob, PeriodicScheduler
from sepp_lite._time import Duration
from sepp_lite.tasks._signature import is_async, name_of, shape_of
from sepp_lite.types import JobCtx

if TYPE_CHECKING:
    from sepp_lite.tasks._task import Task

__all__ = ["schedule_of", "scheduler_beside", "task_function"]

logger = _log.logger()

Fn = Callable[..., Any]


def task_function(fn: Fn) -> Callable[[bytes, JobCtx], Awaitable[Any]]:
    """``fn`` (``fn(ctx)`` or ``fn()``, an ``async def`` or a plain ``def``, which then
    runs in a worker thread) as a task's function: its input is the empty payload of a
    periodic job. ``TypeError`` for another shape."""
    takes_ctx = shape_of(fn, periodic=True).takes_ctx
    run: Callable[[bytes, JobCtx], Any]
    if is_async(fn):

        async def run(_: bytes, ctx: JobCtx) -> Any:
            return await (fn(ctx) if takes_ctx else fn())

    else:

        def run(_: bytes, ctx: JobCtx) -> Any:
            return fn(ctx) if takes_ctx else fn()

    run.__qualname__ = name_of(fn)
    return run


def schedule_of(
    task: Task[bytes],
    *,
    every: Optional[Duration],
    cron: Optional[str],
    tz: Union[str, tzinfo, None],
    lookahead: Duration,
    misfire_grace: Optional[Duration],
) -> PeriodicJob:
    """The :class:`PeriodicJob` that enqueues ``task``'s slots, with its priority and
    attempts; ``ValueError`` for a bad schedule."""
    return PeriodicJob(
        task.job_type,
        task.queue,
        every=every,
        cron=cron,
        tz=tz,
        lookahead=lookahead,
        misfire_grace=misfire_grace,
        priority=None if task.priority is None else task.priority.value,
        max_attempts=task.max_attempts,
    )


@contextlib.asynccontextmanager
async def scheduler_beside(scheduler: Optional[PeriodicScheduler]) -> AsyncIterator[None]:
    """Check ``scheduler``'s schedules against the server (``ValueError`` for one it
    cannot keep), then run it while the body runs; nothing without one."""
    if scheduler is None or not scheduler.jobs:
        yield
        return
    await scheduler.check()
    running = asyncio.ensure_future(scheduler.run())
    running.add_done_callback(_report)
    try:
        yield
    finally:
        running.remove_done_callback(_report)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("periodic scheduling stopped", exc_info=task.exception())
