"""Handlers that misbehave: one that hangs, one that raises, one that swallows
cancellation, one that raises CancelledError on its own. The worker's rules hold:
no ack or nack after its lease is lost (the server sees none); no ack after shutdown
gave up on the job, which goes back to its queue (a nack with no delay) once its
handler has stopped, unless its lease has lapsed by then; a bounded shutdown returns
on time, the job is redelivered, and the worker goes on with other jobs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

import pytest

import sepp_lite as sepp
from sepp_lite.testing import ManualClock, SeppTestServer
from tests.client_helpers import connected, on_clock, unique_queue, until, worker_running

pytestmark = pytest.mark.timeout(60)

LeaseCall = tuple[str, str, int, str]  # (rpc, job id, attempt, outcome)


@pytest.fixture
def server_options() -> dict[str, Any]:
    """conftest.py's ``server`` without dead-letter retention (a job dead-lettered by a
    failing handler leaves the queue, and its counts go back to all zeros), on a
    ``ManualClock``: leases lapse when a test moves it (the workers keep their leases by
    it too, ``on_clock``), not after fractions of a second of wall time."""
    return {"clock": ManualClock()}


def record_lease_calls(server: SeppTestServer) -> list[LeaseCall]:
    """Every ack, nack and extend that reaches the server, with how it ended."""
    calls: list[LeaseCall] = []
    for name in ("ack", "nack", "extend"):
        real = getattr(server.state, name)

        def recorded(req: Any, _real: Any = real, _name: str = name) -> Any:
            try:
                result = _real(req)
            except Exception as error:
                calls.append((_name, req.job_id, req.attempt, type(error).__name__))
                raise
            calls.append((_name, req.job_id, req.attempt, "ok"))
            return result

        setattr(server.state, name, recorded)
    return calls


def settles(calls: list[LeaseCall], attempt: int) -> list[LeaseCall]:
    return [c for c in calls if c[0] in ("ack", "nack") and c[2] == attempt]


async def steal(client: sepp.SeppClient, queue: str) -> sepp.Job:
    """Reserve the job as another consumer: it is ready again (its lease lapsed, or it
    was handed back)."""
    jobs = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0))
    assert jobs, "the job is not ready again"
    return jobs[0]


# -- a lost lease ----------------------------------------------------------------------


class AfterCancel:
    """What a handler does once it has swallowed its cancellation."""

    RETURN = "returns normally"
    RAISE = "raises"
    LINGER = "keeps running, then returns"


@pytest.mark.parametrize("after", [AfterCancel.RETURN, AfterCancel.RAISE, AfterCancel.LINGER])
async def test_a_handler_that_swallows_cancellation_after_a_lost_lease_settles_nothing(
    server: SeppTestServer, client: sepp.SeppClient, after: str
) -> None:
    queue = unique_queue("swallow")
    calls = record_lease_calls(server)
    [job_id] = [(await client.enqueue(sepp.EnqueueRequest(queue, "slow"))).job_id]
    started = asyncio.Event()
    cancelled = asyncio.Event()
    finished: list[str] = []
    # The keeper extends every 40 s but the lease is 30 s: it lapses, a thief takes the
    # job, and the keeper's extend finds an attempt mismatch: the lease is lost.
    worker = sepp.Worker(client, [queue], 30, auto_extend_interval=40, max_in_flight=1)
    on_clock(worker, server.clock)

    @worker.handler("slow")
    async def slow(payload: object, ctx: sepp.JobCtx) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()  # and carry on regardless
        if after == AfterCancel.LINGER:
            await asyncio.sleep(0.5)
        finished.append(ctx.id)
        if after == AfterCancel.RAISE:
            raise RuntimeError("after the cancellation")

    @worker.handler("quick")
    async def quick(payload: object, ctx: sepp.JobCtx) -> None:
        finished.append(ctx.id)

    async with worker_running(worker, 5) as run:
        await asyncio.wait_for(started.wait(), 5)
        await server.advance(30)
        thief = await steal(client, queue)
        assert thief.ctx.attempt == 2
        assert not cancelled.is_set()  # the keeper has not looked yet
        await server.advance(10)
        await asyncio.wait_for(cancelled.wait(), 5)
        await until(lambda: job_id in finished)
        await asyncio.sleep(0.1)  # give a settle every chance to go out
        assert settles(calls, attempt=1) == []
        assert ("extend", job_id, 1, "RpcError") in calls  # how the loss was found
        # The worker goes on with other work.
        other = await client.enqueue(sepp.EnqueueRequest(queue, "quick"))
        await until(lambda: other.job_id in finished)
        assert not run.done()
    await client.ack(thief.ctx)  # the thief's delivery was never disturbed
    assert settles(calls, attempt=1) == [("ack", other.job_id, 1, "ok")]
    assert server.counts(queue) == (0, 0, 0, 0)


async def test_a_raising_handler_whose_lease_lapsed_is_fenced_by_the_server(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Without auto-extend the worker cannot know its lease lapsed: its nack goes out,
    # and the server refuses it for the old attempt. The new delivery is untouched.
    caplog.set_level(logging.ERROR, logger="sepp_lite")
    queue = unique_queue("fenced")
    calls = record_lease_calls(server)
    job_id = (await client.enqueue(sepp.EnqueueRequest(queue, "t"))).job_id
    raised: list[int] = []
    started = asyncio.Event()
    lapsed = asyncio.Event()
    worker = sepp.Worker(client, [queue], 30, max_in_flight=1)
    on_clock(worker, server.clock)

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        started.set()
        if ctx.attempt == 1:
            await lapsed.wait()
        raised.append(ctx.attempt)
        raise sepp.HandlerError.permanent("give up")

    async with worker_running(worker, 5) as run:
        await asyncio.wait_for(started.wait(), 5)
        await server.advance(30)
        thief = await steal(client, queue)
        assert thief.ctx.attempt == 2
        lapsed.set()
        await until(lambda: raised == [1])
        await until(lambda: len(settles(calls, 1)) == 1)
        assert settles(calls, 1) == [("nack", job_id, 1, "RpcError")]  # fenced off
        assert not run.done()
    assert server.state.job(job_id) is not None  # still the thief's, in flight
    assert await client.nack(thief.ctx, sepp.RetryDirective.dead_letter()) is True
    errors = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    assert any("attempt mismatch" in m for m in errors), errors


# -- bounded shutdown -----------------------------------------------------------------


@pytest.mark.parametrize("auto_extend", [False, True], ids=["plain", "auto-extend"])
@pytest.mark.parametrize("swallows", [False, True], ids=["hangs", "hangs-and-swallows"])
async def test_bounded_shutdown_returns_on_time_and_the_job_is_handed_back(
    server: SeppTestServer,
    client: sepp.SeppClient,
    caplog: pytest.LogCaptureFixture,
    auto_extend: bool,
    swallows: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    queue = unique_queue("hung")
    calls = record_lease_calls(server)
    hung_id = (await client.enqueue(sepp.EnqueueRequest(queue, "hang"))).job_id
    started = asyncio.Event()
    release = asyncio.Event()
    handler_tasks: list[Optional[asyncio.Task[Any]]] = []
    worker = sepp.Worker(
        client, [queue], 30, max_in_flight=2, shutdown_timeout=0.3, auto_extend=auto_extend
    )
    on_clock(worker, server.clock)

    @worker.handler("hang")
    async def hang(payload: object, ctx: sepp.JobCtx) -> None:
        handler_tasks.append(asyncio.current_task())
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                if not swallows:
                    raise

    async with worker_running(worker, 5) as run:
        await asyncio.wait_for(started.wait(), 5)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        worker.shutdown_handle().shutdown()
        await asyncio.wait_for(asyncio.shield(run), 5)
        took = loop.time() - begun
    # 0.3 s of shutdown_timeout, then (for a handler that ignores its cancellation)
    # 1 s of grace before the worker leaves it behind.
    if swallows:
        assert 1.25 <= took < 2.5, took
    else:
        assert 0.25 <= took < 1.2, took
    messages = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    assert any("shutdown timeout" in m for m in messages)
    assert any("ignored cancellation" in m for m in messages) is swallows
    # The lease was extended once at shutdown (and by the keeper). A handler that
    # stopped has its job handed back at once; one that did not, keeps it.
    assert settles(calls, 1) == ([] if swallows else [("nack", hung_id, 1, "ok")])
    assert ("extend", hung_id, 1, "ok") in calls
    # Handed back, or once the lease (extended at shutdown) lapses, the job is
    # redelivered to the next consumer.
    if swallows:
        await server.advance(29.999)
        assert server.counts(queue).in_flight == 1
        await server.advance(0.001)
    async with connected(server.addr) as other:
        thief = await steal(other, queue)
        assert (thief.ctx.id, thief.ctx.attempt) == (hung_id, 2)
        # The abandoned handler finally finishes: still no settle for attempt 1 (its
        # lease has lapsed: nothing to hand back).
        release.set()
        task = handler_tasks[0]
        assert task is not None
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
        await asyncio.sleep(0.05)
        assert settles(calls, 1) == ([] if swallows else [("nack", hung_id, 1, "ok")])
        await other.ack(thief.ctx)
    assert server.counts(queue) == (0, 0, 0, 0)


async def test_a_handler_raising_cancelled_error_itself_leaves_the_job_to_its_lease(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    # CancelledError that nobody asked for is a BaseException: not a failure to nack.
    # The job task ends, the job is left to lease expiry, and the worker goes on.
    queue = unique_queue("selfcancel")
    calls = record_lease_calls(server)
    job_id = (await client.enqueue(sepp.EnqueueRequest(queue, "t"))).job_id
    attempts: list[int] = []
    worker = sepp.Worker(client, [queue], 30, max_in_flight=1)
    on_clock(worker, server.clock)
    ended = asyncio.Event()

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            asyncio.get_running_loop().call_soon(ended.set)
            raise asyncio.CancelledError()

    async with worker_running(worker, 5) as run:
        await asyncio.wait_for(ended.wait(), 5)
        await server.advance(29.999)
        assert attempts == [1] and server.counts(queue).in_flight == 1  # no settle
        await server.advance(0.001)
        await until(lambda: attempts == [1, 2], timeout=5)
        await until(lambda: server.counts(queue) == (0, 0, 0, 0))
        assert not run.done()
    assert settles(calls, 1) == []
    assert settles(calls, 2) == [("ack", job_id, 2, "ok")]
    assert server.state.totals()["lease_expired"] == 1


# -- a hard stop ------------------------------------------------------------------------


@pytest.mark.parametrize("auto_extend", [False, True], ids=["plain", "auto-extend"])
async def test_cancelling_run_hands_the_job_back_even_if_its_handler_swallows_the_cancel(
    server: SeppTestServer, client: sepp.SeppClient, auto_extend: bool
) -> None:
    # A hard stop hands every job in flight back. A handler that swallows its
    # cancellation and returns must not turn that into an ack.
    queue = unique_queue("hardstop")
    calls = record_lease_calls(server)
    job_id = (await client.enqueue(sepp.EnqueueRequest(queue, "t"))).job_id
    started = asyncio.Event()
    returned: list[str] = []
    worker = sepp.Worker(client, [queue], 30, auto_extend=auto_extend)

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # swallowed
        returned.append(ctx.id)

    run = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(started.wait(), 5)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(run, 5)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert returned == [job_id]
    assert settles(calls, 1) == [("nack", job_id, 1, "ok")]
    assert server.counts(queue) == (1, 0, 0, 0)  # ready again, its lease (30 s) unspent


async def test_cancelling_run_gives_up_on_a_handler_that_keeps_ignoring_it(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    # A handler that swallows every cancellation cannot be stopped; a hard stop still
    # returns (after a short grace), reports it, and settles nothing for it while it
    # runs: its job goes back only once it has ended.
    queue = unique_queue("stubborn")
    calls = record_lease_calls(server)
    await client.enqueue(sepp.EnqueueRequest(queue, "t"))
    started = asyncio.Event()
    release = asyncio.Event()
    worker = sepp.Worker(client, [queue], 30)

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass  # swallowed, again and again

    run = asyncio.ensure_future(worker.run())
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(started.wait(), 5)
        begun = loop.time()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(run), 5)
        assert loop.time() - begun < 2.0
        assert any("ignored cancellation" in r.getMessage() for r in caplog.records)
        assert settles(calls, 1) == []
        assert server.counts(queue) == (0, 0, 1, 0)
    finally:
        release.set()  # let the stubborn handler end, so the test leaves nothing behind
    await until(lambda: server.counts(queue) == (1, 0, 0, 0))
    assert [call[0] for call in settles(calls, 1)] == ["nack"]
