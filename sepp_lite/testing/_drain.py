"""``run_until_drained``: run a worker until its queues on the in-process server hold
nothing ready, in flight or scheduled, moving a manual clock over the waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Callable, Optional, Union

from sepp_lite._clock import Clock, TimerHandle
from sepp_lite.testing._clock import ManualClock
from sepp_lite.testing._server import SeppTestServer
from sepp_lite.testing._state import Backlog
from sepp_lite.testing._thread import SeppServerThread
from sepp_lite.worker import Worker, keep_leases_by

__all__ = ["run_until_drained"]

# How often the server's backlog is looked at while the worker runs. There is no event
# for "nothing left anywhere": the worker, the server and the jobs' timers all take part.
_POLL_S = 0.005

Step = Callable[[bool], Awaitable[Optional[Backlog]]]


async def run_until_drained(
    worker: Worker,
    server: Union[SeppTestServer, SeppServerThread],
    *,
    timeout: float = 30.0,
) -> None:
    """Run ``worker`` until nothing is ready, in flight or scheduled on its queues on
    the in-process ``server``, then shut it down and return once its ``run()`` has.

    With a :class:`ManualClock`, whenever the worker is idle and only scheduled jobs
    are left (a ``HandlerError.retry_after``, a queue's retry policy, a delayed
    enqueue), the clock jumps to the next due time, so the retry runs at once; with
    the wall clock it waits for it. Jobs in flight that the worker does not hold (a
    test reserved them) are waited for until they are settled or their leases expire.
    Unlike ``run(until_idle=True)``, it sees scheduled jobs, and it works with a
    manual clock (whose long polls end only when the clock moves); the worker's lease
    keeper then keeps time by that clock too, as the server expires the leases.

    Returns early when ``run()`` returns on its own (a handler shut the worker
    down); raises what ``run()`` raises, and ``asyncio.TimeoutError`` naming what is
    left after ``timeout`` seconds (the worker is then cancelled).
    """
    queues = worker.queues
    step = _stepper(server, queues)
    loop = asyncio.get_running_loop()
    clock = _lease_clock(server, loop)
    if clock is not None:
        keep_leases_by(worker, clock)  # the server expires its leases by that clock
    deadline = loop.time() + timeout
    run = asyncio.ensure_future(worker.run())
    shutdown = worker.shutdown_handle()
    try:
        while not run.done():
            # A worker that is shutting down is not idle: moving the clock now could
            # hand a due job to a poll still in flight, which the shutdown then leaves.
            backlog = await step(worker.in_flight == 0 and not shutdown.is_shutdown)
            if backlog is None:
                shutdown.shutdown()
                break
            if loop.time() > deadline:
                raise asyncio.TimeoutError(_not_drained(queues, backlog, worker, timeout))
            await asyncio.wait({run}, timeout=_POLL_S)
        await run
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


def _lease_clock(
    server: Union[SeppTestServer, SeppServerThread], loop: asyncio.AbstractEventLoop
) -> Optional[Clock]:
    """The server's clock for the worker's lease keeper when it is manual (the wall
    clock is the worker's own already); for a server on its own thread, that clock as
    seen from the worker's loop."""
    if isinstance(server, SeppServerThread):
        return _ClockAcross(server, loop) if server.clock.manual else None
    return server.clock if isinstance(server.clock, ManualClock) else None


class _ClockAcross:
    """The manual clock of a :class:`SeppServerThread`, for a worker on another loop:
    read and armed on the server's thread (where ``advance`` runs its timers), each
    timer's callback run back on the worker's loop."""

    def __init__(self, server: SeppServerThread, loop: asyncio.AbstractEventLoop) -> None:
        self._server = server
        self._loop = loop

    def now_ms(self) -> int:
        return self._server.clock.now_ms()

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> TimerHandle:
        loop = self._loop

        def on_the_worker_loop() -> None:
            with contextlib.suppress(RuntimeError):  # the worker's loop has closed
                loop.call_soon_threadsafe(callback)

        clock = self._server.server.clock
        timer: TimerHandle = self._server.call(clock.call_at, deadline_ms, on_the_worker_loop)
        return _TimerAcross(self._server, timer)


class _TimerAcross:
    """A timer of :class:`_ClockAcross`, cancelled on the server's thread."""

    def __init__(self, server: SeppServerThread, timer: TimerHandle) -> None:
        self._server = server
        self._timer = timer

    def cancel(self) -> None:
        with contextlib.suppress(RuntimeError):  # the server has stopped: nothing runs
            self._server.call(self._timer.cancel)


def _stepper(server: Union[SeppTestServer, SeppServerThread], queues: list[str]) -> Step:
    """One look at the backlog, run where the server's state lives. The worker's
    loop does not move meanwhile (the same loop, or blocked on the server's thread),
    so the worker's idleness and the backlog are one consistent picture."""
    if isinstance(server, SeppServerThread):
        threaded = server

        async def across_threads(worker_idle: bool) -> Optional[Backlog]:
            result: Optional[Backlog] = threaded.call(_step, threaded.server, queues, worker_idle)
            return result

        return across_threads

    async def same_loop(worker_idle: bool) -> Optional[Backlog]:
        return await _step(server, queues, worker_idle)

    return same_loop


async def _step(server: SeppTestServer, queues: list[str], worker_idle: bool) -> Optional[Backlog]:
    """``None`` when drained; otherwise the backlog, after moving a manual clock to
    the next due time when only scheduled jobs are left and nothing else can move."""
    backlog = server.backlog(queues)
    if not worker_idle or backlog.ready or backlog.in_flight:
        return backlog
    if not backlog.scheduled:
        return None
    clock = server.clock
    if isinstance(clock, ManualClock) and backlog.next_due_ms is not None:
        await server.advance(max(0, backlog.next_due_ms - clock.now_ms()) / 1000)
    return backlog


def _not_drained(queues: list[str], backlog: Backlog, worker: Worker, timeout: float) -> str:
    held = worker.in_flight
    text = (
        f"queues {queues} not drained within {timeout:g} s: {backlog.ready} ready, "
        f"{backlog.scheduled} scheduled, {backlog.in_flight} in flight "
        f"({held} of them held by the worker)"
    )
    if backlog.in_flight > held:
        text += "; jobs leased elsewhere wait for an ack, a nack or their lease to expire"
    return text
