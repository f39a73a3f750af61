"""A server that stops answering: a server subprocess frozen with SIGSTOP (its kernel
still accepts connections and bytes, nothing answers, PINGs included).

With a short ``keepalive_time``/``keepalive_timeout``, the client notices within
about their sum: calls in flight fail with a retryable TransportError instead of
hanging until their deadline. After SIGCONT (or a restart) work resumes: the same
client and the same Worker go on.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator

import pytest

import sepp_lite as sepp
from sepp_lite import TransportError
from sepp_lite._retry import is_retryable
from sepp_lite.errors import Status
from tests.client_helpers import (
    connected,
    elapsed,
    once_reconnected,
    unique_queue,
    until,
    worker_running,
)
from tests.fault_helpers import ServerProcess

pytestmark = pytest.mark.timeout(60)

KEEPALIVE = {"keepalive_time": 0.3, "keepalive_timeout": 0.3}
NOTICED_WITHIN = 0.3 + 0.3 + 0.7  # time + timeout, and slack for a loaded machine


@pytest.fixture
async def process() -> AsyncIterator[ServerProcess]:
    async with ServerProcess() as proc:
        yield proc


def assert_retryable_transport_failure(result: object, ambiguous: bool) -> None:
    assert isinstance(result, TransportError), result
    assert result.code is Status.UNAVAILABLE
    assert result.ambiguous is ambiguous
    assert is_retryable(result)
    # A call in flight lost its connection; a new call could not connect at all.
    assert ("connection lost" if ambiguous else "cannot connect") in str(result)


async def test_calls_in_flight_fail_within_the_keepalive_timeout(process: ServerProcess) -> None:
    queue = unique_queue("frozen")
    async with connected(process.addr, rpc_timeout=20, **KEEPALIVE) as client:
        await client.enqueue(sepp.EnqueueRequest(queue, "t"))
        [job] = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0)) or []
        long_poll = asyncio.ensure_future(
            elapsed(client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=15)))
        )
        await asyncio.sleep(0.1)
        process.freeze()
        # Calls sent to the frozen server: the bytes are accepted, nothing comes back.
        enqueue = asyncio.ensure_future(elapsed(client.enqueue(sepp.EnqueueRequest(queue, "t"))))
        ack = asyncio.ensure_future(elapsed(client.ack(job.ctx)))
        for call in (long_poll, enqueue, ack):
            took, result = await asyncio.wait_for(call, 10)
            assert took < NOTICED_WITHIN, (took, result)
            assert_retryable_transport_failure(result, ambiguous=True)
        # While frozen, a new call connects (the kernel accepts), hears no HTTP/2
        # settings, and fails rather than waiting out its 20 s deadline: nothing was
        # sent, so it is not ambiguous.
        took, result = await elapsed(client.get_server_info())
        assert took < NOTICED_WITHIN + 0.3
        assert_retryable_transport_failure(result, ambiguous=False)
        process.thaw()
        # Work resumes on the same client, over a new connection, once the reconnect
        # backoff has passed. (Whether the thawed server applied the calls it had
        # received before their connection went away is the server's business: the
        # client reported them as ambiguous.)
        assert (await once_reconnected(client.get_server_info)).version == "0.1.0"
        fresh = await client.enqueue(sepp.EnqueueRequest(queue, "t", priority=9))
        jobs = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=2))
        assert jobs is not None and jobs[0].ctx.id == fresh.job_id
        await client.ack(jobs[0].ctx)


async def test_without_keepalive_a_frozen_server_costs_the_deadline(
    process: ServerProcess,
) -> None:
    # The contrast: with keepalive out of the picture (the defaults, 30 s), the same
    # frozen server is noticed only by the call's own deadline.
    async with connected(process.addr, rpc_timeout=0.8) as client:
        await client.get_server_info()
        process.freeze()
        try:
            took, result = await elapsed(client.get_server_info())
        finally:
            process.thaw()
    assert isinstance(result, TransportError) and result.code is Status.DEADLINE_EXCEEDED
    assert 0.75 < took < 1.5


async def test_retry_policy_rides_out_a_freeze(process: ServerProcess) -> None:
    queue = unique_queue("ride")
    policy = sepp.RetryPolicy(max_attempts=30, initial_backoff=0.05, max_backoff=0.2)
    async with connected(process.addr, retry_policy=policy, rpc_timeout=15, **KEEPALIVE) as c:
        await c.get_server_info()
        process.freeze()
        call = asyncio.ensure_future(
            c.enqueue(sepp.EnqueueRequest(queue, "t", idempotency_key="a"))
        )
        await asyncio.sleep(1.2)  # at least one attempt has failed by keepalive
        assert not call.done()
        process.thaw()
        ack = await asyncio.wait_for(call, 10)
        again = await c.enqueue(sepp.EnqueueRequest(queue, "t", idempotency_key="a"))
        assert again.job_id == ack.job_id and again.deduplicated
        jobs = await c.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0, max_jobs=5))
        assert jobs is not None and [j.ctx.id for j in jobs] == [ack.job_id]  # one job


async def test_worker_rides_out_a_freeze_and_processes_everything(
    process: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    queue = unique_queue("wfreeze")
    handled: list[tuple[str, int]] = []
    release = asyncio.Event()
    async with (
        connected(process.addr, **KEEPALIVE) as client,
        connected(process.addr) as producer,
    ):
        worker = sepp.Worker(
            client, [queue], 1.5, wait_timeout=1, max_in_flight=4, reserve_error_backoff=0.1
        )

        @worker.handler("t")
        async def handler(payload: object, ctx: sepp.JobCtx) -> None:
            handled.append((ctx.id, ctx.attempt))
            if ctx.attempt == 1 and len(handled) <= 2:
                await release.wait()  # these two finish while the server is frozen

        ids = [(await producer.enqueue(sepp.EnqueueRequest(queue, "t"))).job_id for _ in range(2)]
        async with worker_running(worker, 10) as run:
            await until(lambda: len(handled) == 2)
            process.freeze()
            release.set()  # their acks go to the frozen server and fail
            await asyncio.sleep(1.5)
            assert not run.done()
            process.thaw()
            ids += [
                (await producer.enqueue(sepp.EnqueueRequest(queue, "t"))).job_id for _ in range(3)
            ]
            # The new jobs are processed. The two acks sent into the freeze either
            # landed when it thawed or their leases lapse (1.5 s) and the jobs come
            # back: either way everything ends acked, nothing twice.
            await until(lambda: {job_id for job_id, _ in handled} == set(ids), timeout=15)
            await asyncio.sleep(2.0)  # any lapsed lease has been redelivered by now
            worker.shutdown_handle().shutdown()
            await asyncio.wait_for(asyncio.shield(run), 10)
        leftovers = await producer.reserve(
            sepp.ReserveOptions([queue], 30, wait_timeout=2, max_jobs=10)
        )
    assert leftovers is None  # all acked: nothing is ready, nothing comes back
    redelivered = [job_id for job_id, attempt in handled if attempt > 1]
    assert set(redelivered) <= set(ids[:2])
    assert len(handled) == 5 + len(redelivered)
    messages = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    assert any(re.search(r"\b(ack|nack) failed", m) and "redelivered" in m for m in messages), (
        messages
    )
    assert any(m.startswith("reserve failed") for m in messages), messages


async def test_a_frozen_server_that_is_killed_and_restarted(process: ServerProcess) -> None:
    # Frozen, then replaced (SIGKILL, a new process on the same port, its state
    # lost): the same client fails fast while it is frozen and works with the new one.
    queue = unique_queue("replaced")
    async with connected(process.addr, rpc_timeout=20, **KEEPALIVE) as client:
        await client.enqueue(sepp.EnqueueRequest(queue, "t"))
        process.freeze()
        took, result = await elapsed(client.get_server_info())
        assert took < NOTICED_WITHIN
        assert_retryable_transport_failure(result, ambiguous=True)
        process.kill()
        took, result = await elapsed(client.get_server_info())
        assert took < 0.5 and isinstance(result, TransportError)
        assert result.ambiguous is False  # refused: nothing was sent
        await process.start()
        assert process.starts == 2
        empty = await once_reconnected(
            lambda: client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0))
        )
        assert empty is None
        fresh = await client.enqueue(sepp.EnqueueRequest(queue, "t"))
        jobs = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0))
        assert jobs is not None and jobs[0].ctx.id == fresh.job_id
