"""The test tools around the in-process server: ``QueueState.backlog``,
``SeppServerThread`` (the server on a thread of its own), ``run_until_drained`` (a
worker run until nothing is ready, in flight or scheduled) and
``SeppTestServer.before_call`` (a hook that can hold calls)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from typing import Optional, Union

import pytest

import sepp_lite as sepp
from sepp_lite.testing import (
    Backlog,
    ManualClock,
    QueueConfig,
    SeppServerThread,
    SeppTestServer,
    run_until_drained,
)
from tests.client_helpers import (
    job,
    opts,
    run_on_own_loop,
    unique_queue,
    until,
    worker_running,
)
from tests.server_helpers import START_MS, enqueue_ids, lease_req, make_state, reserve_req
from tests.server_helpers import job as state_job

pytestmark = pytest.mark.timeout(60)

Server = Union[SeppTestServer, SeppServerThread]


# -- QueueState.backlog -------------------------------------------------------------------


def test_backlog_counts_the_work_left_on_the_queues_asked_about() -> None:
    state, clock = make_state()
    assert state.backlog() == Backlog(0, 0, 0, None)
    enqueue_ids(state, state_job("a"), state_job("a"), state_job("b"))
    later = divmod(START_MS + 90_000, 1000)
    enqueue_ids(state, state_job("b", scheduled_at=(later[0], later[1] * 1_000_000)))
    assert state.backlog(["a"]) == Backlog(2, 0, 0, None)
    assert state.backlog(["b"]) == Backlog(1, 1, 0, START_MS + 90_000)
    assert state.backlog() == Backlog(3, 1, 0, START_MS + 90_000)
    assert state.backlog(["a", "nothing-here"]) == Backlog(2, 0, 0, None)

    [(leased, attempt, _)] = state.reserve_once(state.prepare_reserve(reserve_req("a")))
    state.nack(lease_req(leased.id, attempt, retry=("delay", 30, 0)))
    assert state.backlog(["a"]) == Backlog(1, 1, 0, START_MS + 30_000)
    state.reserve_once(state.prepare_reserve(reserve_req("a", lease=600)))
    assert state.backlog(["a"]) == Backlog(0, 1, 1, START_MS + 30_000)

    clock.advance(30)  # the retry is due: it is ready again
    assert state.backlog(["a"]) == Backlog(1, 0, 1, None)
    assert state.backlog() == Backlog(2, 1, 1, START_MS + 90_000)


# -- SeppServerThread ----------------------------------------------------------------------


@pytest.fixture
def threaded() -> Iterator[SeppServerThread]:
    with SeppServerThread(clock=ManualClock(START_MS), dead_letter_retention_ms=60_000) as srv:
        yield srv


def test_the_server_thread_serves_blocking_and_async_callers(threaded: SeppServerThread) -> None:
    queue = unique_queue("threaded")

    async def produce() -> str:
        async with await sepp.SeppClient.connect(threaded.addr) as client:
            return (await client.enqueue(job(queue))).job_id

    job_id = run_on_own_loop(produce())  # a loop of this thread's own talks to it
    assert threaded.counts(queue) == (1, 0, 0, 0)
    assert threaded.backlog([queue]) == Backlog(1, 0, 0, None)
    view = threaded.job(job_id)
    assert view is not None and view.state == "ready"
    assert threaded.totals()["enqueued"] == 1
    assert threaded.connections_accepted == 1
    assert threaded.config.dead_letter_retention_ms == 60_000


def test_call_runs_functions_and_coroutines_on_the_servers_thread(
    threaded: SeppServerThread,
) -> None:
    import threading

    main = threading.get_ident()
    assert threaded.call(threading.get_ident) != main

    async def where() -> int:
        await asyncio.sleep(0)
        return threading.get_ident()

    assert threaded.call(where) != main
    with pytest.raises(ZeroDivisionError):
        threaded.call(lambda: 1 / 0)


def test_the_clock_moves_on_the_servers_thread(threaded: SeppServerThread) -> None:
    queue = unique_queue("clock")
    assert threaded.clock.manual and threaded.clock.now_ms() == START_MS
    due = threaded.clock.now() + timedelta(minutes=5)

    async def schedule() -> None:
        async with await sepp.SeppClient.connect(threaded.addr) as client:
            await client.enqueue(job(queue, scheduled_at=due))

    run_on_own_loop(schedule())
    assert threaded.backlog([queue]) == Backlog(0, 1, 0, START_MS + 300_000)
    threaded.clock.advance(300)
    assert threaded.clock.now_ms() == START_MS + 300_000
    assert threaded.counts(queue).ready == 1


def test_start_stop_and_a_real_clock() -> None:
    server = SeppServerThread()
    with pytest.raises(RuntimeError, match="not running"):
        server.counts("q")
    with server:
        assert not server.clock.manual
        with pytest.raises(TypeError, match="ManualClock"):
            server.clock.advance(1)
        with pytest.raises(RuntimeError, match="only once"):
            server.start()
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        server.backlog()


# -- run_until_drained --------------------------------------------------------------------


@pytest.fixture(params=["same-loop", "own-thread"])
async def manual(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    """A ManualClock server on the test's loop, or on a thread of its own."""
    clock = ManualClock(START_MS)
    if request.param == "same-loop":
        async with SeppTestServer(clock=clock) as server:
            yield server
    else:
        threaded = SeppServerThread(clock=clock)
        await asyncio.to_thread(threaded.start)
        try:
            yield threaded
        finally:
            await asyncio.to_thread(threaded.stop)


def now_ms(server: Server) -> int:
    return server.clock.now_ms()


async def test_retries_and_delayed_jobs_run_at_once_on_a_manual_clock(manual: Server) -> None:
    queue = unique_queue("drain")
    seen: list[tuple[str, int]] = []
    async with await sepp.SeppClient.connect(manual.addr) as client:
        await client.enqueue(job(queue, "flaky"))
        tomorrow = datetime.fromtimestamp((START_MS + 86_400_000) / 1000, timezone.utc)
        await client.enqueue(job(queue, "later", scheduled_at=tomorrow))
        worker = sepp.Worker(client, [queue], lease_duration=30)

        @worker.handler("flaky")
        async def flaky(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
            seen.append((ctx.job_type, ctx.attempt))
            if ctx.attempt < 3:
                raise sepp.HandlerError.retry_after("not yet", 3600)

        @worker.handler("later")
        async def later(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
            seen.append((ctx.job_type, ctx.attempt))

        started = time.monotonic()
        await run_until_drained(worker, manual, timeout=20)
    assert time.monotonic() - started < 15  # two hours and a day, skipped
    assert seen == [("flaky", 1), ("flaky", 2), ("flaky", 3), ("later", 1)]
    assert now_ms(manual) >= START_MS + 86_400_000
    assert worker.in_flight == 0 and worker.shutdown_handle().is_shutdown


async def test_with_the_wall_clock_it_waits_for_the_retry() -> None:
    queue = unique_queue("wall")
    attempts: list[int] = []
    async with SeppTestServer() as server, await sepp.SeppClient.connect(server.addr) as client:
        await client.enqueue(job(queue))
        worker = sepp.Worker(client, [queue], lease_duration=30)

        @worker.handler("t")
        async def handler(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                raise sepp.HandlerError.retry_after("soon", 0.3)

        await run_until_drained(worker, server, timeout=20)
        assert server.backlog([queue]) == Backlog(0, 0, 0, None)
    assert attempts == [1, 2]


async def test_other_queues_do_not_hold_it_up(manual: Server) -> None:
    mine, other = unique_queue("mine"), unique_queue("other")
    async with await sepp.SeppClient.connect(manual.addr) as client:
        await client.enqueue_batch([job(mine), job(other)])
        worker = sepp.Worker(client, [mine], lease_duration=30)
        worker.handle("t", _noop)
        await run_until_drained(worker, manual, timeout=20)
    assert _counts(manual, other) == (1, 0, 0, 0)
    assert _counts(manual, mine) == (0, 0, 0, 0)


async def test_a_job_leased_elsewhere_times_out_with_what_is_left(manual: Server) -> None:
    queue = unique_queue("held")
    async with await sepp.SeppClient.connect(manual.addr) as client:
        await client.enqueue(job(queue))
        assert await client.reserve(opts(queue))  # the test holds the lease
        worker = sepp.Worker(client, [queue], lease_duration=30)
        worker.handle("t", _noop)
        with pytest.raises(asyncio.TimeoutError) as timed_out:
            await run_until_drained(worker, manual, timeout=0.5)
    message = str(timed_out.value)
    assert "0 ready, 0 scheduled, 1 in flight (0 of them held by the worker)" in message
    assert "leased elsewhere" in message
    assert not worker.shutdown_handle().is_shutdown  # stopped by cancellation instead


async def test_it_returns_when_a_handler_stops_the_worker(manual: Server) -> None:
    queue = unique_queue("stop")
    tomorrow = datetime.fromtimestamp((START_MS + 86_400_000) / 1000, timezone.utc)
    async with await sepp.SeppClient.connect(manual.addr) as client:
        await client.enqueue_batch([job(queue, "stop"), job(queue, scheduled_at=tomorrow)])
        worker = sepp.Worker(client, [queue], lease_duration=30)
        worker.handle("t", _noop)

        @worker.handler("stop")
        async def stop(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
            worker.shutdown_handle().shutdown()

        await run_until_drained(worker, manual, timeout=20)
    ready, scheduled, in_flight, _ = _counts(manual, queue)
    assert (ready + scheduled, in_flight) == (1, 0)  # left for a worker that runs on


async def test_what_run_raises_is_raised(manual: Server) -> None:
    async with await sepp.SeppClient.connect(manual.addr) as client:
        worker = sepp.Worker(client, [unique_queue("twice")], lease_duration=30)
        async with worker_running(worker, 10):
            await asyncio.sleep(0)  # run() has begun
            with pytest.raises(RuntimeError, match="already running"):
                await run_until_drained(worker, manual, timeout=5)


class _Extensions(sepp.WorkerObserver):
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def lease_extended(self, ctx: sepp.JobCtx, outcome: str) -> None:
        self.outcomes.append(outcome)


async def _advance(server: Server, seconds: float) -> None:
    if isinstance(server, SeppServerThread):
        await asyncio.to_thread(server.clock.advance, seconds)
    else:
        await server.advance(seconds)


async def test_the_workers_lease_keeper_goes_by_the_servers_manual_clock(manual: Server) -> None:
    """The server expires leases by its manual clock, so the worker's lease keeper keeps
    time by it too: two leases' worth of that clock pass in a handler, the keeper extends
    a third of the way to each expiry (once a step), and the job runs once. On the wall
    clock the keeper saw every lease of a clock set in the past as due at once."""
    queue = unique_queue("lease")
    runs: list[int] = []
    extensions = _Extensions()
    async with await sepp.SeppClient.connect(manual.addr) as client:
        await client.enqueue(job(queue, "slow"))
        worker = sepp.Worker(client, [queue], lease_duration=30, auto_extend=True)
        worker.add_observer(extensions)

        @worker.handler("slow")
        async def slow(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
            runs.append(ctx.attempt)
            for step in range(1, 7):  # 60 s, 10 s a step
                await _advance(manual, 10)
                await until(lambda n=step: len(extensions.outcomes) >= n)  # type: ignore[misc]

        await run_until_drained(worker, manual, timeout=20)
    assert runs == [1]
    assert extensions.outcomes == ["extended"] * 6
    assert _counts(manual, queue) == (0, 0, 0, 0)


def test_the_server_counts_its_connections_and_the_worker_names_its_queues() -> None:
    async def scenario() -> None:
        async with SeppTestServer(queues=[QueueConfig("a")]) as server:
            assert server.connections_accepted == 0
            for _ in range(2):
                async with await sepp.SeppClient.connect(server.addr) as client:
                    await client.get_server_info()
                    worker = sepp.Worker(client, ["a", "b"], lease_duration=5)
                    assert worker.queues == ["a", "b"]
            assert server.connections_accepted == 2
        assert server.connections_accepted == 2

    run_on_own_loop(scenario())


# -- SeppTestServer.before_call ------------------------------------------------------------


async def test_a_before_call_hook_holds_the_calls_it_is_set_for() -> None:
    queue = unique_queue()
    held, release = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def hold() -> None:
        calls.append("EnqueueBatch")
        held.set()
        await release.wait()

    async with SeppTestServer() as server:
        server.before_call("EnqueueBatch", hold)  # after start, too
        async with await sepp.SeppClient.connect(server.addr) as client:
            enqueue = asyncio.ensure_future(client.enqueue(job(queue)))
            await asyncio.wait_for(held.wait(), 5)
            assert await client.reserve(opts(queue)) is None  # other methods are not held
            assert server.counts(queue).ready == 0 and not enqueue.done()
            release.set()
            await asyncio.wait_for(enqueue, 5)
            assert server.counts(queue).ready == 1
            server.before_call("EnqueueBatch", None)
            held.clear()
            await client.enqueue(job(queue))
    assert calls == ["EnqueueBatch"] and not held.is_set()


def test_before_call_takes_only_the_services_method_names() -> None:
    server = SeppTestServer()

    async def hook() -> None:
        pass

    for name in ("Check", "enqueue_batch", "/sepp.v1.QueueService/Ack", ""):
        with pytest.raises(ValueError, match="no sepp.v1.QueueService method named"):
            server.before_call(name, hook)
    server.before_call("Ack", hook)
    server.before_call("Ack", None)
    server.before_call("Nack", None)  # removing what is not there is fine


async def _noop(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
    pass


def _counts(server: Server, queue: str) -> tuple[int, int, int, int]:
    return tuple(server.counts(queue))  # type: ignore[return-value]
