"""Worker over real sockets against the in-process server: outcomes, concurrency, the
lease keeper, shutdown (plain and bounded), cancellation, unknown job types, server
limits, run-until-idle, restarts, and the signal helper."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Optional

import pytest
from grpclib.const import Status

import sepp_lite as sepp
from sepp_lite import worker as worker_module
from sepp_lite.testing import Limits, ManualClock, SeppTestServer
from tests.client_helpers import (
    ScriptedServer,
    connected,
    on_clock,
    once_reconnected,
    status_errors,
    unique_queue,
    until,
    worker_running,
)

pytestmark = pytest.mark.timeout(60)


async def enqueue(
    client: sepp.SeppClient, queue: str, job_type: str, n: int = 1, **kw: object
) -> list[str]:
    acks = await client.enqueue_batch(
        [sepp.EnqueueRequest(queue, job_type, **kw) for _ in range(n)]
    )  # type: ignore[arg-type]
    ids = []
    for ack in acks:
        assert isinstance(ack, sepp.EnqueueAck), ack
        ids.append(ack.job_id)
    return ids


async def run_for(worker: sepp.Worker, predicate: object, timeout: float = 10.0) -> None:
    """Run the worker until ``predicate()`` holds, then shut it down and drain."""
    async with worker_running(worker, 10) as task:
        async with _deadline(timeout):
            while not predicate():  # type: ignore[operator]
                await asyncio.sleep(0.01)
                if task.done():
                    task.result()
                    raise AssertionError("worker stopped early")


class _deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def __aenter__(self) -> None:
        self.task = asyncio.current_task()
        self.handle = asyncio.get_running_loop().call_later(self.seconds, self._fire)
        self.fired = False

    def _fire(self) -> None:
        self.fired = True
        assert self.task is not None
        self.task.cancel()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.handle.cancel()
        if self.fired and exc_type is asyncio.CancelledError:
            raise AssertionError(f"condition not reached within {self.seconds} s")


# -- construction and registration -------------------------------------------------


async def test_options_are_validated(client: sepp.SeppClient) -> None:
    with pytest.raises(ValueError, match="wait_timeout"):
        sepp.Worker(client, ["q"], 10, wait_timeout=0)
    with pytest.raises(ValueError, match="lease_duration"):
        sepp.Worker(client, ["q"], 0)
    with pytest.raises(ValueError, match="max_jobs"):
        sepp.Worker(client, ["q"], 10, max_jobs=0)
    with pytest.raises(ValueError, match="worker_id"):
        sepp.Worker(client, ["q"], 10, worker_id="")
    with pytest.raises(ValueError, match="at least one queue"):
        sepp.Worker(client, [], 10)
    worker = sepp.Worker(client, ["q"], timedelta(seconds=10), max_in_flight=0)
    assert worker._max_in_flight == 1
    host_part = worker.worker_id.rsplit("-", 2)
    assert host_part[1] == str(os.getpid()) and len(host_part[2]) == 8


async def test_registration(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(client, ["q"], 10)

    async def first(payload: object, ctx: object) -> None: ...

    async def second(payload: object, ctx: object) -> None: ...

    assert worker.handle("a", first) is worker
    with pytest.raises(sepp.DuplicateHandlerError, match="'a'"):
        worker.handle("a", second)
    with pytest.raises(sepp.DuplicateHandlerError):
        worker.handler("a")(second)
    worker.replace_handler("a", second)
    assert worker._handlers["a"].fn is second
    worker.remove_handler("a").remove_handler("missing")
    assert "a" not in worker._handlers
    assert worker.catch_all(first) is first
    assert worker._catch_all is not None and worker._catch_all.fn is first


# -- outcomes ----------------------------------------------------------------------


async def test_return_acks_and_handlers_see_the_job(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    [job_id] = await enqueue(
        client, queue, "greet", payload=sepp.Payload(b"hi", "text/plain"), custom={"n": 1}
    )
    seen: list[tuple[object, sepp.JobCtx]] = []
    worker = sepp.Worker(client, [queue], 10)

    @worker.handler("greet")
    async def greet(payload: sepp.Payload | None, ctx: sepp.JobCtx) -> None:
        seen.append((payload, ctx))

    await run_for(worker, lambda: server.counts(queue) == (0, 0, 0, 0) and seen)
    [(payload, ctx)] = seen
    assert payload == sepp.Payload(b"hi", "text/plain")
    assert (ctx.id, ctx.job_type, ctx.attempt, ctx.custom) == (job_id, "greet", 1, {"n": 1})
    assert ctx.lease is not None and ctx.lease.worker_id == worker.worker_id


async def test_handler_errors_nack_as_asked(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "retry", max_attempts=5)
    await enqueue(client, queue, "permanent")
    attempts: list[int] = []
    worker = sepp.Worker(client, [queue], 10)

    @worker.handler("retry")
    async def retry(payload: object, ctx: sepp.JobCtx) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise sepp.HandlerError.retry("not yet")

    @worker.handler("permanent")
    async def permanent(payload: object, ctx: sepp.JobCtx) -> None:
        raise sepp.HandlerError.permanent("broken input")

    await run_for(worker, lambda: server.counts(queue) == (0, 0, 0, 1) and attempts[-1:] == [3])
    assert attempts == [1, 2, 3]
    [record] = await client.drain_dead_letters(queue, 10)
    assert record.job_type == "permanent"
    assert record.cause is sepp.DeadLetterCause.REJECTED
    assert record.last_reason == "broken input"


async def test_retry_after_delays_the_redelivery(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "later", max_attempts=3)
    times: list[float] = []
    worker = sepp.Worker(client, [queue], 10)

    @worker.handler("later")
    async def later(payload: object, ctx: sepp.JobCtx) -> None:
        times.append(asyncio.get_running_loop().time())
        if ctx.attempt == 1:
            raise sepp.HandlerError.retry_after("wait", 0.6)

    await run_for(worker, lambda: len(times) == 2 and server.counts(queue).in_flight == 0)
    assert times[1] - times[0] >= 0.55


async def test_other_exceptions_nack_and_the_last_attempt_is_logged_with_traceback(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "boom", max_attempts=2)
    await enqueue(client, queue, "fine")
    done: list[str] = []
    worker = sepp.Worker(client, [queue], 10)

    @worker.handler("boom")
    async def boom(payload: object, ctx: sepp.JobCtx) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    @worker.handler("fine")
    async def fine(payload: object, ctx: sepp.JobCtx) -> None:
        done.append(ctx.id)

    with caplog.at_level(logging.WARNING, "sepp_lite"):
        await run_for(worker, lambda: server.counts(queue) == (0, 0, 0, 1) and done)
    [record] = await client.drain_dead_letters(queue, 10)
    assert record.cause is sepp.DeadLetterCause.ATTEMPTS_EXHAUSTED
    assert record.last_reason == "handler raised RuntimeError: boom 2"
    logged = [r for r in caplog.records if "handler raised RuntimeError" in r.getMessage()]
    # The retry: one WARNING, no traceback; the last attempt: one ERROR with it.
    assert [(r.levelname, bool(r.exc_info)) for r in logged] == [
        ("WARNING", False),
        ("ERROR", True),
    ]
    retry = logged[0].getMessage()
    assert retry.endswith(
        "(type 'boom', attempt 1/2): handler raised RuntimeError: boom 1; "
        "next attempt after the queue's retry delay"
    )
    assert "dead-lettered" in logged[1].getMessage()


class Fatal(BaseException):
    """A BaseException that is neither cancellation nor KeyboardInterrupt."""


async def test_base_exceptions_are_not_swallowed(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "fatal")
    worker = sepp.Worker(client, [queue], 10)
    raised = asyncio.Event()

    @worker.handler("fatal")
    async def fatal(payload: object, ctx: object) -> None:
        raised.set()
        raise Fatal

    def crashed() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "job task crashed"]

    with caplog.at_level(logging.ERROR, "sepp_lite"):
        async with worker_running(worker, 5):
            await asyncio.wait_for(raised.wait(), 5)
            # The job's task has ended: whatever it would have sent is sent.
            await until(crashed, 5)
    # Not turned into a nack: the job stays leased (until its lease lapses) and the
    # exception ends the job's task, which is reported.
    assert server.counts(queue) == (0, 0, 1, 0)
    [report] = crashed()
    assert isinstance(report.exc_info[1], Fatal)  # type: ignore[index]


# -- unknown job types -------------------------------------------------------------


class Unhandled(sepp.WorkerObserver):
    """Counts ``job_unhandled`` by job type."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def job_unhandled(self, ctx: sepp.JobCtx) -> None:
        self.seen[ctx.job_type] = self.seen.get(ctx.job_type, 0) + 1


def unhandled_lines(caplog: pytest.LogCaptureFixture, job_type: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and f"no handler for job type {job_type!r}" in r.getMessage()
    ]


async def test_unknown_job_types_wait_minutes_and_are_reported_once(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    nobody = await enqueue(client, queue, "nobody", n=3)
    await enqueue(client, queue, "stranger", n=2)
    worker = sepp.Worker(client, [queue], 10, max_jobs=5)
    worker.handle("known", lambda payload, ctx: None).handle("other", lambda payload, ctx: None)
    counted = Unhandled()
    worker.add_observer(counted)
    assert worker.unknown_type_delay == 300
    with caplog.at_level(logging.INFO, "sepp_lite"):
        await run_for(worker, lambda: server.counts(queue).scheduled == 5)
    assert server.counts(queue) == (0, 5, 0, 0)
    # Each waits 5 minutes (by the server's clock) for a worker with its handler.
    for job_id in nobody:
        view = server.state.job(job_id)
        assert view is not None and view.attempt == 2 and view.due_ms is not None
        assert 299_000 <= view.due_ms - server.clock.now_ms() <= 300_000
    # One ERROR line per type (within the minute), with the queue and the known types.
    [line] = unhandled_lines(caplog, "nobody")
    assert f"on queue {queue!r} (this worker handles: known, other)" in line
    assert "(attempt 1/3) goes back to wait 300 s before attempt 2" in line
    assert len(unhandled_lines(caplog, "stranger")) == 1
    assert counted.seen == {"nobody": 3, "stranger": 2}
    # The start line lists the types it has.
    assert any("job types=known,other" in r.getMessage() for r in caplog.records)


@pytest.fixture
async def clocked() -> AsyncIterator[SeppTestServer]:
    async with SeppTestServer(clock=ManualClock(), dead_letter_retention_ms=3_600_000) as srv:
        yield srv


async def test_an_unknown_type_outlives_15_minutes_of_workers_without_its_handler(
    clocked: SeppTestServer,
) -> None:
    server = clocked
    queue = unique_queue()
    async with connected(server.addr) as client:
        [job_id] = await enqueue(client, queue, "report")
        lacking = sepp.Worker(client, [queue], 30)
        lacking.handle("other", lambda payload, ctx: None)

        def waiting(attempt: int) -> bool:
            view = server.state.job(job_id)
            return view is not None and view.state == "scheduled" and view.attempt == attempt

        async with worker_running(lacking, 5):
            await until(lambda: waiting(2))  # its first attempt: 5 minutes
            await server.advance(299.999)
            assert waiting(2)
            await server.advance(0.001)
            await until(lambda: waiting(3))  # its second: 10 minutes
            await server.advance(599.999)
            assert waiting(3)
        # 15 minutes on, a worker that has the handler runs it, on its last attempt.
        ran: list[int] = []
        knowing = sepp.Worker(client, [queue], 30)

        @knowing.handler("report")
        async def report(payload: object, ctx: sepp.JobCtx) -> None:
            ran.append(ctx.attempt)

        async with worker_running(knowing, 5):
            await server.advance(0.001)
            await until(lambda: server.state.job(job_id) is None)
    assert ran == [3]
    assert server.state.dead_letters(queue) == []


async def test_unknown_type_delay_grows_to_the_server_horizon_and_repeats_its_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A line a minute per type (here a fifth of a second), counting the jobs between.
    monkeypatch.setattr(worker_module, "_UNKNOWN_REPORT_S", 0.2)
    queue = unique_queue()
    async with SeppTestServer(clock=ManualClock(), max_schedule_horizon_ms=25_000) as server:
        async with connected(server.addr) as client:
            ids = await enqueue(client, queue, "late", n=3, max_attempts=5)
            with pytest.raises(ValueError, match="unknown_type_delay"):
                sepp.Worker(client, [queue], 10, unknown_type_delay=-1)
            worker = sepp.Worker(client, [queue], 10, unknown_type_delay=timedelta(seconds=10))

            def due_in() -> list[Optional[int]]:
                views = [server.state.job(job_id) for job_id in ids]
                now = server.clock.now_ms()
                return [v.due_ms - now if v and v.due_ms else None for v in views]

            with caplog.at_level(logging.INFO, "sepp_lite"):
                async with worker_running(worker, 5):
                    await until(lambda: due_in() == [10_000] * 3)
                    await asyncio.sleep(0.25)  # the line's minute passes
                    await server.advance(10)
                    await until(lambda: due_in() == [20_000] * 3)  # doubled
                    lines = unhandled_lines(caplog, "late")
                    await server.advance(20)
                    await until(lambda: due_in() == [25_000] * 3)  # the server's horizon
    assert len(lines) == 2, lines
    assert lines[0].endswith("(attempt 1/5) goes back to wait 10 s before attempt 2")
    assert lines[1].endswith(
        "(attempt 2/5) goes back to wait 20 s before attempt 3; 2 more of its jobs since "
        "the last such line"
    )


async def test_catch_all_takes_unknown_types(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "mystery")
    seen: list[str] = []
    worker = sepp.Worker(client, [queue], 10)

    @worker.catch_all
    async def anything(payload: object, ctx: sepp.JobCtx) -> None:
        seen.append(ctx.job_type)

    await run_for(worker, lambda: seen and server.counts(queue) == (0, 0, 0, 0))
    assert seen == ["mystery"]


# -- concurrency -------------------------------------------------------------------


async def test_never_more_than_max_in_flight(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "work", n=12)
    running = peak = 0
    leased_peak = 0
    done = 0
    worker = sepp.Worker(client, [queue], 10, max_in_flight=3, max_jobs=10)

    @worker.handler("work")
    async def work(payload: object, ctx: object) -> None:
        nonlocal running, peak, done, leased_peak
        running += 1
        peak = max(peak, running)
        leased_peak = max(leased_peak, server.counts(queue).in_flight)
        await asyncio.sleep(0.05)
        running -= 1
        done += 1

    await run_for(worker, lambda: done == 12)
    assert peak == 3
    # Reserve asks only for free capacity, so the server never leased more than 3.
    assert leased_peak <= 3


# -- leases ------------------------------------------------------------------------
# On the in-process server's ManualClock, which the Worker's lease keeper runs by too
# (``on_clock``): the server expires leases, and the keeper extends them, only as the
# test moves the clock.


class LeaseExtensions(sepp.WorkerObserver):
    """The outcomes of a worker's lease extensions, in order."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def lease_extended(self, ctx: sepp.JobCtx, outcome: str) -> None:
        self.outcomes.append(outcome)


async def test_auto_extend_keeps_a_slow_handler_alive(clocked: SeppTestServer) -> None:
    """Two leases' worth of the clock pass while the handler works: a third of the way
    to each expiry the keeper extends it (once each step), and the job is delivered
    once."""
    server, queue = clocked, unique_queue()
    runs: list[int] = []
    done = asyncio.Event()
    async with connected(server.addr) as client:
        await enqueue(client, queue, "slow")
        worker = sepp.Worker(client, [queue], 30, auto_extend=True)
        on_clock(worker, server.clock)
        extensions = LeaseExtensions()
        worker.add_observer(extensions)

        @worker.handler("slow")
        async def slow(payload: object, ctx: sepp.JobCtx) -> None:
            runs.append(ctx.attempt)
            await done.wait()

        async with worker_running(worker, 5):
            await until(lambda: runs)
            for step in range(1, 7):  # 60 s
                await server.advance(10)
                await until(lambda n=step: len(extensions.outcomes) == n)
            assert server.counts(queue).in_flight == 1
            done.set()
            await until(lambda: server.counts(queue) == (0, 0, 0, 0))
    assert runs == [1]  # never redelivered while it ran
    assert extensions.outcomes == ["extended"] * 6


async def test_without_auto_extend_the_lease_lapses(clocked: SeppTestServer) -> None:
    server, queue = clocked, unique_queue()
    attempts: list[int] = []
    first_may_end = asyncio.Event()
    async with connected(server.addr) as client:
        await enqueue(client, queue, "slow")
        worker = sepp.Worker(client, [queue], 30, max_in_flight=2)

        @worker.handler("slow")
        async def slow(payload: object, ctx: sepp.JobCtx) -> None:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                await first_may_end.wait()

        async with worker_running(worker, 5):
            await until(lambda: attempts == [1])
            await server.advance(29.999)
            assert server.counts(queue).in_flight == 1
            await server.advance(0.001)
            await until(lambda: attempts == [1, 2] and server.counts(queue).in_flight == 0)
            # The second delivery was acked; the first delivery's late ack fails (logged).
            first_may_end.set()
    assert server.counts(queue) == (0, 0, 0, 0)


async def test_lost_lease_cancels_the_handler_and_settles_nothing(
    clocked: SeppTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    server, queue = clocked, unique_queue()
    started = asyncio.Event()
    cancelled: list[str] = []
    async with connected(server.addr) as client:
        await enqueue(client, queue, "slow")
        # Extends every 40 s, but the lease is 30 s: it lapses, a thief reserves the job,
        # and the keeper's first extend finds an attempt mismatch.
        worker = sepp.Worker(client, [queue], 30, auto_extend_interval=40, max_in_flight=1)
        on_clock(worker, server.clock)

        @worker.handler("slow")
        async def slow(payload: object, ctx: sepp.JobCtx) -> None:
            started.set()
            try:
                await asyncio.Event().wait()  # until cancelled
            except asyncio.CancelledError:
                cancelled.append(ctx.id)
                raise

        caplog.set_level(logging.INFO, "sepp_lite")
        async with worker_running(worker, 5):
            await asyncio.wait_for(started.wait(), 5)
            await server.advance(30)
            [stolen] = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=1))
            assert stolen.ctx.attempt == 2
            assert not cancelled  # the keeper has not looked yet
            await server.advance(10)
            await until(lambda: cancelled)
            # Still in flight under the thief's attempt 2: the cancelled handler acked nothing.
            assert server.counts(queue) == (0, 0, 1, 0)
            await client.ack(stolen.ctx)
    # Logged once, by the lease keeper that found it lost.
    about = [r for r in caplog.records if stolen.ctx.id in r.getMessage()]
    assert [(r.levelname, r.getMessage().split(" (")[0]) for r in about] == [
        ("ERROR", f"job {stolen.ctx.id}: lease lost")
    ]


# -- shutdown ----------------------------------------------------------------------


async def test_shutdown_waits_for_slow_handlers(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "slow", n=2)
    finished = 0
    worker = sepp.Worker(client, [queue], 10, max_in_flight=2)

    @worker.handler("slow")
    async def slow(payload: object, ctx: object) -> None:
        nonlocal finished
        await asyncio.sleep(0.5)
        finished += 1

    async with worker_running(worker, 5) as task:
        # The worker's own count: the server counts a job in flight as soon as it leases
        # it, before its answer reaches the worker (a shutdown then cancels that reserve).
        await until(lambda: worker.in_flight == 2)
        worker.shutdown_handle().shutdown()
        assert worker.shutdown_handle().is_shutdown
        await asyncio.wait_for(task, 5)
    assert finished == 2 and server.counts(queue) == (0, 0, 0, 0)


async def test_bounded_shutdown_cancels_and_hands_the_jobs_back(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "slow", n=2)
    await enqueue(client, queue, "quick")
    cancelled = 0
    worker = sepp.Worker(client, [queue], 60, max_in_flight=3, shutdown_timeout=0.3)

    @worker.handler("slow")
    async def slow(payload: object, ctx: object) -> None:
        nonlocal cancelled
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled += 1
            raise

    @worker.handler("quick")
    async def quick(payload: object, ctx: object) -> None:
        await asyncio.sleep(0.1)

    loop = asyncio.get_running_loop()
    async with worker_running(worker, 5) as task:
        await until(lambda: worker.in_flight == 3)
        begun = loop.time()
        worker.shutdown_handle().shutdown()
        await asyncio.wait_for(task, 5)
    assert 0.25 <= loop.time() - begun < 2.0
    assert cancelled == 2
    # The quick job was acked; the slow ones are ready again at once, long before their
    # leases (a minute) would have lapsed.
    assert server.counts(queue) == (2, 0, 0, 0)
    assert server.state.totals()["lease_expired"] == 0
    jobs = await client.reserve(sepp.ReserveOptions([queue], 5, wait_timeout=1, max_jobs=2))
    assert jobs is not None and sorted(j.ctx.attempt for j in jobs) == [2, 2]


async def test_cancelling_run_leaves_no_task_behind(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "slow", n=2)
    started = asyncio.Event()
    worker = sepp.Worker(client, [queue], 10, max_in_flight=2, auto_extend=True)

    @worker.handler("slow")
    async def slow(payload: object, ctx: object) -> None:
        started.set()
        await asyncio.sleep(30)

    before = asyncio.all_tasks()
    task = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    leftovers = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert {t for t in leftovers if not t.done()} == set()


async def test_jobs_reserved_as_shutdown_comes_are_run_or_handed_back(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    seen: list[str] = []
    worker = sepp.Worker(client, [queue], 10, wait_timeout=5)
    handle = worker.shutdown_handle()

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        seen.append(ctx.id)

    async with worker_running(worker, 5) as task:
        await asyncio.sleep(0.2)  # the long poll is outstanding
        [job_id] = await enqueue(client, queue, "t")
        handle.shutdown()  # same loop step as the reserve's answer, or just after it
        await asyncio.wait_for(task, 5)
    view = server.state.job(job_id)
    if view is None:  # its handler ran before shutdown came
        assert seen == [job_id] and server.counts(queue) == (0, 0, 0, 0)
    else:  # never leased (attempt 1), or leased and handed back unrun (attempt 2)
        assert seen == [] and view.state == "ready"


# -- run until idle, server limits, reserve errors ---------------------------------


async def test_run_until_idle_returns_when_the_queues_are_empty(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "t", n=20)
    done = 0
    worker = sepp.Worker(client, [queue], 10, max_in_flight=8)

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        nonlocal done
        await asyncio.sleep(0.01)
        done += 1

    await asyncio.wait_for(worker.run(until_idle=True), 10)
    assert done == 20 and server.counts(queue) == (0, 0, 0, 0)


async def test_worker_clamps_to_the_server_limits(caplog: pytest.LogCaptureFixture) -> None:
    limits = Limits(max_lease_duration_ms=2_000, max_reserve_batch=4, max_wait_timeout_ms=1_000)
    async with (
        SeppTestServer(limits=limits) as server,
        await sepp.SeppClient.connect(server.addr) as client,
    ):
        queue = unique_queue()
        await enqueue(client, queue, "t")
        worker = sepp.Worker(client, [queue], 60, max_jobs=100, wait_timeout=30)
        seen: list[sepp.JobCtx] = []

        @worker.handler("t")
        async def handler(payload: object, ctx: sepp.JobCtx) -> None:
            seen.append(ctx)

        with caplog.at_level(logging.INFO, "sepp_lite"):
            await asyncio.wait_for(worker.run(until_idle=True), 10)
        assert worker._opts.max_jobs == 4
        assert worker._opts.lease_duration == timedelta(seconds=2)
        assert worker._opts.wait_timeout == timedelta(seconds=1)
        [clamped] = [r for r in caplog.records if "clamped to the server's limits" in r.msg]
        assert clamped.levelname == "WARNING"
        assert "lease 60 s -> 2 s" in clamped.getMessage()
        assert "wait 30 s -> 1 s" in clamped.getMessage()
        [ctx] = seen
        lease = (ctx.lease_expires_at - ctx.enqueued_at).total_seconds()
        assert lease <= 2.5


async def test_reserve_errors_back_off_and_never_stop_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every reserve fails with a status that may heal (test_worker_fail_fast.py has the
    # ones that cannot).
    transient = [Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.INTERNAL] * 100
    async with (
        ScriptedServer() as server,
        await sepp.SeppClient.connect(server.addr) as client,
    ):
        server.script("Reserve", *status_errors(transient))
        worker = sepp.Worker(client, ["q"], 10, reserve_error_backoff=0.05)
        with caplog.at_level(logging.WARNING, "sepp_lite"):
            async with worker_running(worker, 5) as task:
                await asyncio.sleep(0.5)
                assert not task.done()
        failures = [r for r in caplog.records if r.getMessage().startswith("reserve failed")]
        assert 3 <= len(failures) <= 12


async def test_worker_survives_a_server_restart() -> None:
    first = SeppTestServer()
    await first.start()
    port = first.port
    client = await sepp.SeppClient.connect(first.addr)
    queue = unique_queue()
    handled: list[str] = []
    worker = sepp.Worker(client, [queue], 10, wait_timeout=1, reserve_error_backoff=0.1)

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        handled.append(ctx.id)

    second: SeppTestServer | None = None
    try:
        async with worker_running(worker, 5) as task:
            await enqueue(client, queue, "t")
            await until(lambda: len(handled) == 1)
            await first.stop()
            await asyncio.sleep(0.4)  # the worker's reserves fail meanwhile
            assert not task.done()
            second = SeppTestServer(port=port)
            await second.start()
            # The client reconnects once its backoff (about 1 s after a failed connect,
            # growing) has passed; the worker's reserves fail at once meanwhile.
            await once_reconnected(lambda: enqueue(client, queue, "t"))
            await until(lambda: len(handled) == 2)
    finally:
        await client.close()
        await first.stop()
        if second is not None:
            await second.stop()


# -- the signal helper -------------------------------------------------------------


async def test_first_signal_drains_and_second_stops_hard(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "slow")
    started = asyncio.Event()
    finished: list[str] = []
    worker = sepp.Worker(client, [queue], 10)

    @worker.handler("slow")
    async def slow(payload: object, ctx: sepp.JobCtx) -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(ctx.id)

    async def graceful() -> None:
        with sepp.shutdown_on_signals(worker.shutdown_handle()):
            await worker.run()

    task = asyncio.ensure_future(graceful())
    await asyncio.wait_for(started.wait(), 5)
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.wait_for(task, 5)
    assert finished and worker.shutdown_handle().is_shutdown

    worker2 = sepp.Worker(client, [queue], 10)
    await enqueue(client, queue, "slow")
    started.clear()
    worker2.handle("slow", slow)

    async def hard() -> None:
        with sepp.shutdown_on_signals(worker2.shutdown_handle()):
            await worker2.run()

    task = asyncio.ensure_future(hard())
    await asyncio.wait_for(started.wait(), 5)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    # The handlers for SIGINT/SIGTERM were removed on exit.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
