"""The server crashes and comes back while producers and workers run.

With the state kept (``RestartableServer``: every connection reset, the port closed,
then the same port again with the same ``QueueState``, as a real server restarts from
its disk): workers keep going (reserve errors are backed off, never fatal), producers
with a retry policy and idempotency keys enqueue every job exactly once, and every
job is processed. With the state lost (a server subprocess killed with SIGKILL and
started again on its port): the same worker and producer go on with the new server.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

import sepp_lite as sepp
from sepp_lite import EnqueueAck, RetryPolicy, SeppClient, TransportError
from sepp_lite._retry import is_retryable
from tests.client_helpers import connected, once_reconnected, unique_queue, until, worker_running
from tests.fault_helpers import RestartableServer, ServerProcess, running

pytestmark = pytest.mark.timeout(60)

PRODUCERS = 3
JOBS_EACH = 120
BATCH = 4
PATIENT = RetryPolicy(max_attempts=200, initial_backoff=0.02, max_backoff=0.1)


# Not conftest.py's server: these tests crash and restart it.
@pytest.fixture
async def server() -> AsyncIterator[RestartableServer]:
    async with RestartableServer() as srv:
        yield srv


async def produce(
    addr: str, queue: str, producer: int, acks: dict[str, EnqueueAck], errors: list[BaseException]
) -> None:
    """Enqueue JOBS_EACH keyed jobs in small batches, spread over about 2 s."""
    try:
        async with connected(addr, retry_policy=PATIENT, rpc_timeout=20) as client:
            for start in range(0, JOBS_EACH, BATCH):
                keys = [f"p{producer}-{n}" for n in range(start, start + BATCH)]
                batch = [
                    sepp.EnqueueRequest(queue, "t", idempotency_key=key, max_attempts=10)
                    for key in keys
                ]
                results = await client.enqueue_batch(batch)
                for key, result in zip(keys, results):
                    assert isinstance(result, EnqueueAck), result
                    acks[key] = result
                await asyncio.sleep(0.05)
    except BaseException as error:
        errors.append(error)
        raise


def crash_after(
    server: RestartableServer, method: str, nth: int, restarts: list[asyncio.Future[None]]
) -> None:
    """Make the ``nth`` call of ``server.state.<method>`` that did something crash the
    server right after it committed, before its answer is written; it restarts 0.3 s
    later. Calls that did nothing (an empty reserve) do not count."""
    real = getattr(server.state, method)
    done = 0
    fired = False

    def commit_then_crash(*args: Any) -> Any:
        nonlocal done, fired
        result = real(*args)
        if result != []:
            done += 1
            busy = bool(restarts) and not restarts[-1].done()
            if done >= nth and not fired and not busy:
                fired = True
                server.reset_connections()
                restarts.append(asyncio.ensure_future(server.restart(downtime=0.3)))
        return result

    setattr(server.state, method, commit_then_crash)


async def test_restarts_lose_no_job_and_duplicate_none(
    server: RestartableServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    queue = unique_queue("restart")
    total = PRODUCERS * JOBS_EACH
    acks: dict[str, EnqueueAck] = {}
    errors: list[BaseException] = []
    handled: list[tuple[str, int]] = []
    restarts: list[asyncio.Future[None]] = []
    # Three crashes land right after a commit whose answer is then lost (an enqueue, a
    # reserve that leased jobs, an ack); one more lands at a time of its own. Each
    # restart takes 0.3 s.
    crash_after(server, "enqueue_batch", 20, restarts)
    crash_after(server, "reserve_once", 25, restarts)
    crash_after(server, "ack", 150, restarts)
    clients = [
        await SeppClient.connect(server.addr, retry_policy=PATIENT, rpc_timeout=10)
        for _ in range(2)
    ]
    workers = [
        sepp.Worker(c, [queue], 2, wait_timeout=1, max_in_flight=8, reserve_error_backoff=0.05)
        for c in clients
    ]

    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        handled.append((ctx.id, ctx.attempt))
        await asyncio.sleep(0.002)

    for worker in workers:
        worker.handle("t", handler)
    try:
        async with running(worker_tasks(workers)) as runs:
            producing = asyncio.gather(
                *(produce(server.addr, queue, p, acks, errors) for p in range(PRODUCERS))
            )
            async with running(producing):
                await asyncio.sleep(1.0)
                await until(lambda: not restarts or restarts[-1].done())
                restarts.append(asyncio.ensure_future(server.restart(downtime=0.3)))
                await restarts[-1]
                assert not runs.done(), "a worker stopped"
                await asyncio.wait_for(asyncio.shield(producing), 30)
            assert errors == []
            await until(lambda: server.state.totals()["acked"] >= total, timeout=20)
            await until(lambda: len(restarts) == 4 and all(r.done() for r in restarts))
            assert not runs.done()
            for worker in workers:
                worker.shutdown_handle().shutdown()
            await asyncio.wait_for(asyncio.shield(runs), 10)
            assert runs.result() == [None, None]  # both returned normally
    finally:
        for client in clients:
            await client.close()
        await asyncio.gather(*restarts, return_exceptions=True)

    totals = server.state.totals()
    # Exactly once: each key made one job, and the server created no other; the batch
    # whose answer was lost came back deduplicated when retried.
    assert len(acks) == total
    ids = {ack.job_id for ack in acks.values()}
    assert len(ids) == total
    assert totals["enqueued"] == total
    assert totals["deduplicated"] >= BATCH
    for key, ack in acks.items():
        record = server.state.dedup_record(queue, key)
        assert record is not None and record[0] == ack.job_id
    # Every job processed and acked once; nothing left behind.
    assert totals["acked"] == total
    assert totals["dead_lettered"] == totals["nacked"] == 0
    assert server.counts(queue) == (0, 0, 0, 0)
    assert {job_id for job_id, _ in handled} == ids
    # A job ran again only when its lease had lapsed: the jobs of the reserve whose
    # answer was lost.
    assert totals["lease_expired"] >= 1
    assert totals["delivered"] == total + totals["lease_expired"]
    attempts = Counter(job_id for job_id, _ in handled)
    assert sum(n - 1 for n in attempts.values()) <= totals["lease_expired"]
    # The crashes really hit traffic: connections were reset, calls retried, reserves
    # failed and were backed off, and the ack whose answer was lost was not repeated
    # on the server (its retry found the job gone, which the worker logs).
    assert server.crashes == 4 and server.aborted >= 4
    messages = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    assert any(m.startswith("retrying EnqueueBatch") for m in messages)
    assert any(m.startswith("retrying Ack") for m in messages)
    assert any(m.startswith("reserve failed") for m in messages)
    assert any("a retried call had already settled it" in m for m in messages)


async def worker_tasks(workers: list[sepp.Worker]) -> list[None]:
    return list(await asyncio.gather(*(worker.run() for worker in workers)))


async def test_a_retried_enqueue_whose_first_answer_was_lost_is_deduplicated(
    server: RestartableServer,
) -> None:
    # The crash lands after the server committed the batch, before its answer got out:
    # the retry gets the same job ids back, marked deduplicated.
    queue = unique_queue("lost")
    real_enqueue = server.state.enqueue_batch
    crashed: list[int] = []

    def commit_then_crash(jobs: Any) -> Any:
        result = real_enqueue(jobs)
        if not crashed:
            crashed.append(server.reset_connections())  # before the answer is written
        return result

    server.state.enqueue_batch = commit_then_crash  # type: ignore[method-assign]
    async with connected(server.addr, retry_policy=PATIENT, rpc_timeout=10) as client:
        jobs = [sepp.EnqueueRequest(queue, "t", idempotency_key=f"k{n}") for n in range(3)]
        results = await client.enqueue_batch(jobs)
    assert crashed == [1]
    assert [type(r) for r in results] == [EnqueueAck] * 3
    assert all(r.deduplicated for r in results)  # type: ignore[union-attr]
    totals = server.state.totals()
    assert (totals["enqueued"], totals["deduplicated"]) == (3, 3)
    assert server.counts(queue) == (3, 0, 0, 0)
    assert server.connections == 2


async def test_a_keyless_enqueue_whose_answer_was_lost_is_not_retried(
    server: RestartableServer,
) -> None:
    # Without idempotency keys the client cannot know whether the batch landed, so it
    # does not repeat it: one job on the server, and an ambiguous error.
    queue = unique_queue("keyless")
    real_enqueue = server.state.enqueue_batch

    def commit_then_crash(jobs: Any) -> Any:
        result = real_enqueue(jobs)
        server.reset_connections()
        return result

    server.state.enqueue_batch = commit_then_crash  # type: ignore[method-assign]
    async with connected(server.addr, retry_policy=PATIENT, rpc_timeout=10) as client:
        with pytest.raises(TransportError) as info:
            await client.enqueue(sepp.EnqueueRequest(queue, "t"))
    assert info.value.ambiguous is True
    assert is_retryable(info.value, all_keyed=False) is False
    assert server.state.totals()["enqueued"] == 1
    assert server.counts(queue) == (1, 0, 0, 0)


async def test_in_flight_calls_fail_fast_and_retryably_when_the_server_crashes(
    server: RestartableServer,
) -> None:
    queue = unique_queue("crash")
    async with connected(server.addr, rpc_timeout=10) as client:
        long_poll = asyncio.ensure_future(
            client.reserve(sepp.ReserveOptions([queue], 10, wait_timeout=8))
        )
        await until(lambda: server.state.waiter_count == 1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await server.crash()
        with pytest.raises(TransportError) as info:
            await asyncio.wait_for(long_poll, 5)
        assert loop.time() - start < 0.5
        assert info.value.code is not None and info.value.code.name == "UNAVAILABLE"
        assert is_retryable(info.value)
        # While it is down: refused at once, not retried without a policy.
        start = loop.time()
        with pytest.raises(TransportError) as refused:
            await client.get_server_info()
        assert loop.time() - start < 0.5
        assert refused.value.ambiguous is False
        assert isinstance(refused.value.__cause__, ConnectionRefusedError)
        await server.start()
        assert (await once_reconnected(client.get_server_info)).version == "0.1.0"
    assert server.state.waiter_count == 0  # the crashed long poll left nothing behind


async def test_work_resumes_after_a_server_process_is_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    queue = unique_queue("kill")
    handled: list[str] = []
    process = ServerProcess()
    await process.start()
    try:
        client = await SeppClient.connect(process.addr, keepalive_time=1, keepalive_timeout=1)
        producer = await SeppClient.connect(process.addr, retry_policy=PATIENT, rpc_timeout=10)
        try:
            worker = sepp.Worker(client, [queue], 5, wait_timeout=1, reserve_error_backoff=0.05)

            @worker.handler("t")
            async def handler(payload: object, ctx: sepp.JobCtx) -> None:
                handled.append(ctx.id)

            async with worker_running(worker, 10) as run:
                first = [await producer.enqueue(sepp.EnqueueRequest(queue, "t")) for _ in range(5)]
                await until(lambda: len(handled) == 5)
                process.kill()  # SIGKILL: its in-memory jobs are gone
                await asyncio.sleep(0.4)
                assert not run.done()
                failures = [
                    r for r in caplog.records if r.getMessage().startswith("reserve failed")
                ]
                assert failures, "the worker should be failing and backing off"
                # A producer call made while it is down rides out the outage.
                pending = asyncio.ensure_future(producer.enqueue(sepp.EnqueueRequest(queue, "t")))
                await asyncio.sleep(0.2)
                assert not pending.done()
                await process.start()  # the same port, a fresh state
                late = await asyncio.wait_for(pending, 10)
                second = [await producer.enqueue(sepp.EnqueueRequest(queue, "t")) for _ in range(4)]
                await until(lambda: len(handled) == 10, timeout=10)
                assert not run.done()
                worker.shutdown_handle().shutdown()
                await asyncio.wait_for(asyncio.shield(run), 10)
        finally:
            await client.close()
            await producer.close()
    finally:
        process.kill()
    assert process.starts == 2
    expected = [a.job_id for a in first] + [late.job_id] + [a.job_id for a in second]
    assert sorted(handled) == sorted(expected)
