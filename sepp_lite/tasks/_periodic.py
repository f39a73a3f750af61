"""Periodic tasks: ``@tasks.periodic(cron=..., tz=...)`` or ``every=...`` registers a task
that takes no input, and each worker of the registry keeps its next slots enqueued
(:mod:`sepp_lite._periodic` has the design: one job per slot through the server's
deduplication, no leader)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable
from datetime import tzinfo
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from sepp_lite import _otel
from sepp_lite._periodic import DEFAULT_LOOKAHEAD, PeriodicJob, PeriodicScheduler
from sepp_lite._time import Duration
from sepp_lite.tasks._codecs import BytesCodec
from sepp_lite.types import JobCtx

if TYPE_CHECKING:
    from sepp_lite.tasks._task import Task

__all__ = ["periodic_task", "scheduler_beside"]

logger = _otel.logger()

Fn = Callable[..., Awaitable[Any]]


def periodic_task(
    tasks: Any,  # the Tasks registering it (its module imports this one)
    fn: Fn,
    *,
    every: Optional[Duration] = None,
    cron: Optional[str] = None,
    tz: Union[str, tzinfo, None] = None,
    lookahead: Duration = DEFAULT_LOOKAHEAD,
    misfire_grace: Optional[Duration] = None,
    job_type: Optional[str] = None,
    **options: Any,
) -> Task[bytes]:
    """Register ``fn`` (``async def fn(ctx)`` or ``async def fn()``) as a task of
    ``tasks`` and its schedule; see :meth:`Tasks.periodic`."""
    takes_ctx = _takes_ctx(fn)
    name = fn.__name__ if job_type is None else job_type

    async def run(_: bytes, ctx: JobCtx) -> Any:
        return await (fn(ctx) if takes_ctx else fn())

    run.__qualname__ = getattr(fn, "__qualname__", name)
    task: Task[bytes] = tasks._register(
        run, job_type=name, input_type=bytes, codec=BytesCodec(), **options
    )
    try:
        job = PeriodicJob(
            name,
            task.queue,
            every=every,
            cron=cron,
            tz=tz,
            lookahead=lookahead,
            misfire_grace=misfire_grace,
            priority=None if task.priority is None else task.priority.value,
            max_attempts=task.max_attempts,
        )
    except BaseException:
        del tasks._tasks[name]  # a schedule that cannot be is no task either
        raise
    tasks._periodic[name] = job
    return task


def _takes_ctx(fn: Fn) -> bool:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r}: a task must be an async def")
    positional = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) > 1:
        raise TypeError(
            f"{fn.__qualname__}: a periodic task takes the JobCtx or nothing, "
            f"got {len(positional)} positional parameters"
        )
    return len(positional) == 1


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
