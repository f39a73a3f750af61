"""A stopping Worker hands its jobs back (a nack with no delay) over real sockets against
the in-process server: jobs reserved whose handlers had not begun when shutdown came
(also those waiting for a thread, in a plain Worker and in a TaskWorker), and jobs
whose handlers shutdown cancelled (``shutdown_timeout``, or ``run()`` cancelled) are
ready again at once, long before their leases would lapse. A job on its last attempt,
which a hand-back would dead-letter, is never handed back: it runs if it had not
begun, else it is left to its lease. A job its handler settled, or whose lease has
lapsed, is left alone."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

import pytest

import sepp_lite as sepp
from sepp_lite.tasks import Tasks
from sepp_lite.testing import ManualClock, SeppTestServer
from tests.client_helpers import (
    HANG,
    JOB_ID,
    ScriptedServer,
    connected,
    job_record,
    on_clock,
    reserve_reply,
    unique_queue,
    until,
    worker_running,
)
from tests.fault_helpers import running

pytestmark = pytest.mark.timeout(60)

LEASE_S = 60  # far longer than any test here: a job ready again was handed back


async def enqueue(client: sepp.SeppClient, queue: str, job_type: str, **kw: Any) -> str:
    return (await client.enqueue(sepp.EnqueueRequest(queue, job_type, **kw))).job_id


def view(server: SeppTestServer, job_id: str) -> tuple[str, int]:
    """``(state, attempt)`` of a live job, ``("gone", 0)`` once acked or dead."""
    job = server.state.job(job_id)
    return ("gone", 0) if job is None else (job.state, job.attempt)


class StopAtFirstStart(sepp.WorkerObserver):
    """Shuts the worker down as its first job starts: the jobs of that reserve are all
    leased to it, and none of their handlers has begun."""

    def __init__(self, worker: sepp.Worker) -> None:
        self.handle = worker.shutdown_handle()

    def job_started(self, ctx: sepp.JobCtx) -> None:
        self.handle.shutdown()


async def test_jobs_whose_handlers_had_not_begun_go_back_at_once_but_a_last_attempt_runs(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    back = [await enqueue(client, queue, "t") for _ in range(3)]
    last = await enqueue(client, queue, "t", max_attempts=1)
    ran: list[str] = []
    worker = sepp.Worker(client, [queue], LEASE_S, max_jobs=4)
    worker.add_observer(StopAtFirstStart(worker))

    @worker.handler("t")
    async def handle(payload: object, ctx: sepp.JobCtx) -> None:
        ran.append(ctx.id)

    with caplog.at_level(logging.INFO, "sepp_lite"):
        await asyncio.wait_for(worker.run(), 10)
    # On its last attempt a hand-back would dead-letter it: it runs in the drain.
    assert ran == [last] and view(server, last) == ("gone", 0)
    assert [view(server, job_id) for job_id in back] == [("ready", 2)] * 3
    assert server.counts(queue) == (3, 0, 0, 0)
    assert server.state.totals()["lease_expired"] == 0
    assert any(
        "hands 3 job(s) whose handlers had not begun back to their queues" in r.getMessage()
        for r in caplog.records
    )


@dataclass
class Job:
    n: int


@pytest.mark.parametrize("kind", ["Worker", "TaskWorker"])
async def test_jobs_waiting_for_a_thread_go_back_at_once(
    server: SeppTestServer, client: sepp.SeppClient, kind: str
) -> None:
    queue = unique_queue()
    started = threading.Event()
    release = threading.Event()
    ran: list[int] = []

    def blocking(n: int) -> None:
        ran.append(n)
        started.set()
        release.wait(20)

    if kind == "Worker":
        ids = [await enqueue(client, queue, "t") for _ in range(3)]
        worker = sepp.Worker(client, [queue], LEASE_S, max_in_flight=3, sync_threads=1)
        worker.handle("t", lambda payload, ctx: blocking(ctx.attempt))
    else:
        tasks = Tasks(queue=queue)

        @tasks.task
        def t(job: Job) -> None:
            blocking(job.n)

        ids = [(await t.enqueue(client, Job(n))).job_id for n in range(3)]
        worker = tasks.worker(client, lease_duration=LEASE_S, max_in_flight=3, sync_threads=1)
    try:
        async with worker_running(worker, 10) as run:
            await until(lambda: started.is_set() and server.counts(queue).in_flight == 3)
            worker.shutdown_handle().shutdown()
            # The two waiting for the one thread are ready again while it still runs.
            await until(lambda: server.counts(queue) == (2, 0, 1, 0))
            assert not run.done()
            release.set()
            await asyncio.wait_for(run, 10)
    finally:
        release.set()
    assert len(ran) == 1
    assert sorted(view(server, job_id) for job_id in ids) == [("gone", 0)] + [("ready", 2)] * 2
    assert server.state.totals()["lease_expired"] == 0


@pytest.mark.parametrize("how", ["shutdown_timeout", "run() cancelled"])
async def test_cancelled_handlers_hand_their_jobs_back_but_not_on_the_last_attempt(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    queue = unique_queue()
    back = await enqueue(client, queue, "hang")
    last = await enqueue(client, queue, "hang", max_attempts=1)
    cancelled: list[str] = []
    worker = sepp.Worker(client, [queue], LEASE_S, shutdown_timeout=0.2)

    @worker.handler("hang")
    async def hang(payload: object, ctx: sepp.JobCtx) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(ctx.id)
            raise

    with caplog.at_level(logging.INFO, "sepp_lite"):
        async with running(worker.run()) as run:
            await until(lambda: worker.in_flight == 2)
            if how == "shutdown_timeout":
                worker.shutdown_handle().shutdown()
                await asyncio.wait_for(run, 10)
            else:
                run.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(run, 10)
    assert sorted(cancelled) == sorted([back, last])
    assert view(server, back) == ("ready", 2)
    # A hand-back on the last attempt would dead-letter the job: it keeps its lease.
    assert view(server, last) == ("in_flight", 1)
    assert server.counts(queue).dead == 0
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"job {last}")]
    assert "attempt 1/1" in line and "left to its lease, not handed back" in line


async def test_a_job_its_handler_settled_is_not_handed_back(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    job_id = await enqueue(client, queue, "t")
    worker = sepp.Worker(client, [queue], LEASE_S, shutdown_timeout=0.2)
    acked = asyncio.Event()

    @worker.handler("t")
    async def handle(payload: object, ctx: sepp.JobCtx) -> None:
        await client.ack(ctx)
        acked.set()
        await asyncio.sleep(30)

    with caplog.at_level(logging.WARNING, "sepp_lite"):
        async with worker_running(worker, 10):
            await asyncio.wait_for(acked.wait(), 10)
    assert view(server, job_id) == ("gone", 0)
    assert (server.state.totals()["acked"], server.state.totals()["nacked"]) == (1, 0)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_job_whose_lease_lapsed_is_not_handed_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On the server's manual clock, which the worker keeps its leases by: 30 s of it
    pass in the handler, and the worker at shutdown knows the lease is gone."""
    async with SeppTestServer(clock=ManualClock()) as server, connected(server.addr) as client:
        queue = unique_queue()
        job_id = await enqueue(client, queue, "t")
        worker = sepp.Worker(client, [queue], 30, shutdown_timeout=0.1, max_in_flight=1)
        on_clock(worker, server.clock)
        started = asyncio.Event()

        @worker.handler("t")
        async def handle(payload: object, ctx: sepp.JobCtx) -> None:
            started.set()
            await asyncio.sleep(30)

        caplog.set_level(logging.INFO, "sepp_lite")
        async with worker_running(worker, 10):
            await asyncio.wait_for(started.wait(), 10)
            await server.advance(29.999)
            assert view(server, job_id) == ("in_flight", 1)
            await server.advance(0.001)
            # Its lease lapsed; another consumer takes the job (attempt 2).
            options = sepp.ReserveOptions([queue], LEASE_S, wait_timeout=0)
            jobs = await client.reserve(options)
            assert jobs is not None and (jobs[0].ctx.id, jobs[0].ctx.attempt) == (job_id, 2)
        # The stopped worker sent no nack: the other consumer's delivery is untouched.
        assert server.state.totals()["nacked"] == 0
        assert view(server, job_id) == ("in_flight", 2)
        await client.ack(jobs[0].ctx)
    assert f"job {job_id} not handed back: its lease has expired" in caplog.messages


async def test_a_hand_back_the_server_does_not_answer_is_given_up_after_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ScriptedServer() as server:
        server.script("Reserve", reserve_reply(job_record(job_type="hang"), lease_s=LEASE_S))
        server.script("Nack", HANG)
        async with connected(server.addr) as client:
            worker = sepp.Worker(client, ["q"], LEASE_S, shutdown_timeout=0.1)
            started = asyncio.Event()

            @worker.handler("hang")
            async def hang(payload: object, ctx: sepp.JobCtx) -> None:
                started.set()
                await asyncio.sleep(30)

            with caplog.at_level(logging.WARNING, "sepp_lite"):
                async with worker_running(worker, 10) as run:
                    await asyncio.wait_for(started.wait(), 10)
                    loop = asyncio.get_running_loop()
                    begun = loop.time()
                    worker.shutdown_handle().shutdown()
                    await asyncio.wait_for(run, 10)
                    took = loop.time() - begun
        assert len(server.calls_to("Nack")) == 1
    # 0.1 s of shutdown_timeout, then the hand-back's bound of 2 s.
    assert 2.0 <= took < 3.5, took
    assert any(
        r.getMessage() == f"job {JOB_ID} not handed back (no answer within 2 s); it is "
        "redelivered when its lease expires"
        for r in caplog.records
    )
