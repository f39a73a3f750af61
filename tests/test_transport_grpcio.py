"""The default transport against grpcio's C core (a real, independent HTTP/2 stack):
every RPC, statuses, a 15 MiB batch both ways, 64 concurrent calls, auth, a Worker, and
the C core's graceful shutdown (GOAWAY(2^31-1), PING, GOAWAY(last), open calls finish)
with long polls pending and answers held back, then a restart on the same port."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import statistics
from collections import Counter

import pytest

from tests.client_helpers import NO_GRPCIO

pytest.importorskip("grpc", reason=NO_GRPCIO)

from sepp_lite import (
    AttemptMismatchError,
    EnqueueAck,
    JobNotFoundError,
    Payload,
    RetryDirective,
    UnauthenticatedError,
    UnknownQueuesError,
    Worker,
)
from sepp_lite.testing import QueueConfig, QueueState, ServerConfig
from tests.client_helpers import (
    client_records,
    connected,
    elapsed,
    hand_ctx,
    job,
    opts,
    text_job,
    unique_queue,
    until,
)
from tests.grpcio_server import GRPC_DEFAULTS, GrpcioServer
from tests.h2_tap import FrameTap


def grpcio(**config: object) -> GrpcioServer:
    return GrpcioServer(QueueState(ServerConfig().with_overrides(**config)))


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` (a stopping
    grpcio server closes its listener first, then sends GOAWAY)."""
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


# -- calls -------------------------------------------------------------------------------


async def test_every_rpc() -> None:
    queue = unique_queue()
    async with grpcio(dead_letter_retention_ms=60_000) as server:
        async with connected(server.addr) as client:
            info = await client.get_server_info()
            assert info.supported_protocol_versions == ["v1"]
            single = await client.enqueue(text_job(queue, b"one"))
            batch = await client.enqueue_batch([text_job(queue, b"two"), text_job(queue)])
            atomic = await client.enqueue_atomic([text_job(queue, b"three")])
            assert all(isinstance(ack, EnqueueAck) for ack in [single, *batch, *atomic])
            assert server.state.counts(queue).ready == 4

            jobs = await client.reserve(opts(queue, max_jobs=4))
            assert jobs is not None
            by_id = {j.ctx.id: j for j in jobs}
            ids = [single.job_id] + [ack.job_id for ack in batch + atomic]  # type: ignore[union-attr]
            assert sorted(by_id) == sorted(ids)
            assert by_id[single.job_id].payload == Payload(b"one", "text/plain")
            first, second, third, fourth = (by_id[job_id].ctx for job_id in ids)
            assert (await client.extend(first, 120)) > first.lease_expires_at
            await client.ack(first)
            assert await client.nack(second, RetryDirective.dead_letter(), "broken") is True
            assert await client.nack(third) is False
            await client.ack(fourth)

            dead = await client.drain_dead_letters(queue, 10)
            assert [record.job_id for record in dead] == [second.id]
            assert server.state.counts(queue) == (1, 0, 0, 0)


async def test_statuses_reach_the_caller() -> None:
    queue = unique_queue()
    async with grpcio(strict_queues=True, queues=[QueueConfig(queue)]) as server:
        async with connected(server.addr) as client:
            with pytest.raises(JobNotFoundError):  # NOT_FOUND
                await client.ack(hand_ctx(queue))
            await client.enqueue(job(queue))
            jobs = await client.reserve(opts(queue))
            assert jobs is not None
            ctx = jobs[0].ctx
            stale = dataclasses.replace(ctx, attempt=ctx.attempt + 1)
            with pytest.raises(AttemptMismatchError):  # FAILED_PRECONDITION on a lease
                await client.ack(stale)
            with pytest.raises(UnknownQueuesError) as info:  # FAILED_PRECONDITION on reserve
                await client.reserve(opts("undeclared"))
            assert "undeclared" in str(info.value)
            await client.ack(ctx)


async def test_api_key_is_checked_by_the_server(caplog: pytest.LogCaptureFixture) -> None:
    async with GrpcioServer(api_keys=["k-right"]) as server:
        async with connected(server.addr, api_key="k-right") as client:
            await client.get_server_info()
        for key in ("k-wrong", None):
            async with connected(server.addr, api_key=key) as client:
                with pytest.raises(UnauthenticatedError) as info:
                    await client.get_server_info()
                assert info.value.code.name == "UNAUTHENTICATED"
    assert "k-right" not in caplog.text and "k-wrong" not in caplog.text


async def test_a_15_mib_batch_goes_and_comes_back() -> None:
    # 256 jobs of 60 KiB: the request and the reserve answer are ~15 MiB, far beyond
    # grpcio's 64 KiB initial windows and 16 KiB frames.
    queue = unique_queue()
    payloads = [os.urandom(60 * 1024) for _ in range(256)]
    async with grpcio() as server, connected(server.addr, rpc_timeout=60) as client:
        acks = await client.enqueue_batch(
            [job(queue, payload=Payload(data, "application/octet-stream")) for data in payloads]
        )
        sent = {ack.job_id: data for ack, data in zip(acks, payloads)}  # type: ignore[union-attr]
        jobs = await client.reserve(opts(queue, max_jobs=256))
        assert jobs is not None
        assert {j.ctx.id: j.payload.data for j in jobs if j.payload is not None} == sent


async def test_64_concurrent_calls_share_one_connection() -> None:
    queue = unique_queue()
    async with grpcio() as server, connected(server.addr) as client:
        results = await asyncio.gather(
            *(client.enqueue(text_job(queue, str(n).encode())) for n in range(64)),
            *(client.get_server_info() for _ in range(64)),
        )
        assert len({ack.job_id for ack in results[:64]}) == 64
        assert server.state.counts(queue).ready == 64
        assert len(set(server.peers)) == 1, Counter(server.peers)


async def test_a_worker_processes_jobs() -> None:
    queue = unique_queue()
    seen: list[str] = []

    async def handler(payload: object, ctx: object) -> None:
        seen.append(ctx.id)  # type: ignore[attr-defined]

    async with grpcio() as server, connected(server.addr) as client:
        acks = await client.enqueue_batch([text_job(queue, str(n).encode()) for n in range(50)])
        worker = Worker(client, [queue], 30, max_in_flight=8)
        worker.handle("t", handler)
        await asyncio.wait_for(worker.run(until_idle=True), 30)
        assert sorted(seen) == sorted(ack.job_id for ack in acks)
        assert server.state.counts(queue) == (0, 0, 0, 0)
        assert server.state.totals()["acked"] == 50


# -- graceful shutdown --------------------------------------------------------------------


async def test_graceful_shutdown_answers_a_pending_long_poll_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    queue = unique_queue()
    async with grpcio() as server, connected(server.addr) as client:
        await client.get_server_info()
        mark = len(caplog.records)
        poll = asyncio.ensure_future(elapsed(client.reserve(opts(queue, wait=20))))
        await server.wait_calls(2)
        await server.stop(grace=5)
        seconds, result = await asyncio.wait_for(poll, 10)
        assert result is None, result
        assert seconds < 10
        assert client_records(caplog.records[mark:]) == []


async def test_graceful_shutdown_delivers_every_answer_in_flight_then_restarts() -> None:
    queue = unique_queue()
    async with grpcio() as server, connected(server.addr) as client:
        await client.enqueue_batch([text_job(queue) for _ in range(16)])
        server.hold()
        reserves = [client.reserve(opts(queue, lease=60)) for _ in range(16)]
        # enqueue_batch: one call each (concurrent enqueue() calls would share calls).
        enqueues = [client.enqueue_batch([text_job(queue)]) for _ in range(16)]
        calls = asyncio.gather(*reserves, *enqueues, client.get_server_info())
        await server.wait_calls(1 + 16 + 16 + 1)  # the first enqueue_batch, then these
        stopping = asyncio.ensure_future(server.stop(grace=10))
        await until(lambda: not accepts(server.port))
        server.release()
        results = await asyncio.wait_for(calls, 15)
        await asyncio.wait_for(stopping, 15)
        delivered = [jobs[0].ctx for jobs in results[:16]]
        assert all(isinstance(acks[0], EnqueueAck) for acks in results[16:32])
        assert server.state.counts(queue) == (16, 0, 16, 0)

        async with GrpcioServer(server.state, port=server.port) as again:
            await asyncio.gather(*(client.ack(ctx) for ctx in delivered))
            assert (await client.get_server_info()).version
            assert again.peers and set(again.peers).isdisjoint(server.peers)
        assert server.state.counts(queue) == (16, 0, 0, 0)
        assert server.state.totals()["lease_expired"] == 0


# -- keepalive ------------------------------------------------------------------------------


async def test_sepp_like_server_never_punishes_keepalive_pings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Pings every 0.2 s for 1.5 s, idle: 7 pings; the sepp server (no ping strikes)
    # takes them all on one connection.
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    async with grpcio() as server, FrameTap(server.port) as tap:
        async with connected(tap.addr, keepalive_time=0.2, keepalive_timeout=5) as client:
            await client.get_server_info()
            await asyncio.sleep(1.5)  # the scenario: an idle connection, time passing
            await client.get_server_info()
        assert tap.count("PING", to_server=True) >= 3
        assert tap.goaways() == []
        assert len(set(server.peers)) == 1
    assert client_records(caplog.records, above=logging.INFO) == []


async def test_grpcio_default_ping_policy_sends_too_many_pings_and_client_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # grpc's default server policy allows no ping without calls (and one per 5 min
    # with calls) and sends GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings") at the third
    # strike. The client must take it as a drain, warn, ping less (each time: the
    # second connection, idle too, may be told again), and carry on.
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    async with GrpcioServer(options=GRPC_DEFAULTS) as server, FrameTap(server.port) as tap:
        async with connected(tap.addr, keepalive_time=0.2, keepalive_timeout=5) as client:
            await client.get_server_info()
            goaway = await tap.wait_goaway(timeout=10)
            assert (goaway.error_code, goaway.debug) == (11, b"too_many_pings")
            await client.get_server_info()
            await until(lambda: len(tap.pings_sent(2)) >= 4, timeout=10)
        assert len(set(server.peers)) == 2
        before, after = (statistics.median(gaps(tap.pings_sent(n))) for n in (1, 2))
        assert after > 1.5 * before, (before, after)  # 0.2 s, then 0.4 s: doubled
    told = [goaway for goaway in tap.goaways() if goaway.debug == b"too_many_pings"]
    warnings = client_records(caplog.records, above=logging.INFO)
    # One warning per GOAWAY the client read; the second connection's may come as the
    # client is closing it, seen by the tap but never read.
    assert 1 <= len(warnings) <= len(told), (warnings, told)
    assert all(r.levelno == logging.WARNING for r in warnings), warnings
