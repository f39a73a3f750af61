"""The in-process server over real sockets (127.0.0.1), with the generated stub."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from betterproto.lib.google.protobuf import Empty
from grpclib.client import Channel, UnaryStreamMethod
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from sepp_lite._codec.dead_letters import (
    decode_drain_dead_letters_response,
    encode_drain_dead_letters_request,
)
from sepp_lite._proto.sepp import v1 as pb
from sepp_lite._time import EPOCH
from sepp_lite.testing import ConfigError, ManualClock, QueueConfig, SeppTestServer
from tests.client_helpers import until
from tests.server_helpers import START_MS, UUID0, raw_call, raw_channel

LEASE = timedelta(seconds=30)
START = EPOCH + timedelta(milliseconds=START_MS)
MISSING = "missing API key; expected an `authorization: Bearer <key>` header"


@pytest.fixture
def server_options() -> dict[str, Any]:
    """conftest.py's ``server`` on a ManualClock from START_MS, so expected times are
    literals, keeping dead letters 60 s."""
    return {"clock": ManualClock(START_MS), "dead_letter_retention_ms": 60_000}


@pytest.fixture
async def stub(server: SeppTestServer) -> AsyncIterator[pb.QueueServiceStub]:
    channel = Channel(server.host, server.port)
    yield pb.QueueServiceStub(channel)
    channel.close()


def batch(*jobs: pb.EnqueueRequest) -> pb.EnqueueBatchRequest:
    return pb.EnqueueBatchRequest(jobs=list(jobs))


def enq(queue: str = "q", job_type: str = "t", **kw: Any) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, job_type=job_type, **kw)


def reserve_request(*queues: str, **kw: Any) -> pb.ReserveRequest:
    kw.setdefault("lease_duration", LEASE)
    return pb.ReserveRequest(queues=list(queues or ("q",)), **kw)


async def grpc_error(call: Any) -> GRPCError:
    with pytest.raises(GRPCError) as info:
        await call
    return info.value


# -- the RPCs ------------------------------------------------------------------------------


async def test_enqueue_reserve_ack_round_trip(server: SeppTestServer, stub):
    trace = pb.TraceContext(
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate=""
    )
    custom = {"s": pb.PrimitiveValue(string_value="x"), "i": pb.PrimitiveValue(int_value=-3)}
    reply = await stub.enqueue_batch(
        batch(
            enq(
                payload=pb.Payload(data=b"body", encoding="json"),
                trace_context=trace,
                custom=custom,
                priority=7,
            )
        )
    )
    [result] = reply.results
    job_id = result.success.job_id
    assert result.success.deduplicated is False
    await server.advance(0.25)
    [job] = (await stub.reserve(reserve_request(max_jobs=5))).jobs
    assert (job.id, job.queue, job.job_type, job.priority) == (job_id, "q", "t", 7)
    assert (job.payload.data, job.payload.encoding) == (b"body", "json")
    assert (job.trace_context.traceparent, job.trace_context.tracestate) == (trace.traceparent, "")
    assert job.custom["s"].string_value == "x" and job.custom["i"].int_value == -3
    assert (job.attempt, job.max_attempts) == (1, 3)
    assert job.enqueued_at == START
    assert job.lease_expires_at == START + timedelta(milliseconds=250) + LEASE
    assert server.counts("q") == (0, 0, 1, 0)
    assert (await stub.ack(pb.AckRequest(job_id=job_id, attempt=1))).job_id == job_id
    assert server.counts("q") == (0, 0, 0, 0)


async def test_nack_extend_and_lease_expiry_over_the_wire(server: SeppTestServer, stub):
    [result] = (await stub.enqueue_batch(batch(enq(max_attempts=2)))).results
    job_id = result.success.job_id
    await stub.reserve(reserve_request())
    extended = await stub.extend(
        pb.ExtendRequest(job_id=job_id, attempt=1, lease_duration=timedelta(seconds=2))
    )
    assert extended.lease_expires_at == START + timedelta(seconds=2)
    await server.advance(2)
    err = await grpc_error(stub.ack(pb.AckRequest(job_id=job_id, attempt=1)))
    assert (err.status, err.message) == (Status.NOT_FOUND, "job not found")
    [job] = (await stub.reserve(reserve_request())).jobs
    assert job.attempt == 2
    err = await grpc_error(stub.nack(pb.NackRequest(job_id=job_id, attempt=1)))
    assert (err.status, err.message) == (Status.FAILED_PRECONDITION, "attempt mismatch")
    retry = pb.NackRetry(dead_letter=Empty())
    reply = await stub.nack(pb.NackRequest(job_id=job_id, attempt=2, reason="no", retry=retry))
    assert (reply.job_id, reply.dead_lettered) == (job_id, True)
    [record] = (await stub.drain_dead_letters(pb.DrainDeadLettersRequest(max=10))).records
    assert (record.job.id, record.job.queue, record.job.attempt) == (job_id, "q", 2)
    assert record.cause == pb.DeadLetterCause.REJECTED
    assert (record.failed_at, record.final_attempt, record.last_reason) == (
        START + timedelta(seconds=2),
        2,
        "no",
    )
    assert server.counts("q") == (0, 0, 0, 0)


async def test_dead_letter_record_bytes_carry_the_epoch_lease_placeholder(
    server: SeppTestServer, stub
):
    [result] = (await stub.enqueue_batch(batch(enq(max_attempts=1)))).results
    await stub.reserve(reserve_request(lease_duration=timedelta(seconds=1)))
    await server.advance(1)
    async with raw_channel(server) as channel:
        data = await raw_call(
            channel, "DrainDeadLetters", encode_drain_dead_letters_request(None, 5)
        )
    records, problems = decode_drain_dead_letters_response(data)
    assert problems == []
    [record] = records
    assert (record.job_id, record.queue, record.final_attempt) == (result.success.job_id, "q", 1)
    assert record.cause.name == "LEASE_EXPIRED" and record.last_reason is None
    assert record.failed_at == START + timedelta(seconds=1)
    # Job.lease_expires_at (field 9) is present and empty: the epoch.
    assert b"\x4a\x00" in data


async def test_enqueue_atomic_over_the_wire(server: SeppTestServer, stub):
    reply = await stub.enqueue_atomic(batch(enq(), enq(priority=10), enq(queue="a/b")))
    errors = reply.rejection.errors
    assert [e.index for e in errors] == [1, 2]
    assert errors[0].rejection.invalid_request.message == "priority must be <= 9"
    assert errors[1].rejection.invalid_request.message == "queue must not contain '/'"
    assert server.counts("q") == (0, 0, 0, 0)
    reply = await stub.enqueue_atomic(batch(enq(idempotency_key="k"), enq(idempotency_key="k")))
    first, second = reply.success.responses
    assert (first.job_id, first.deduplicated, second.deduplicated) == (second.job_id, False, True)


async def test_rejections_decode_on_the_client(stub):
    scheduled = datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=timezone.utc)
    reply = await stub.enqueue_batch(
        batch(
            enq(scheduled_at=scheduled),
            enq(payload=pb.Payload(data=b"x" * (1_048_577), encoding="raw")),
            enq(queue="é" * 300),
        )
    )
    too_far, too_large, long_name = (r.rejection for r in reply.results)
    assert too_far.scheduled_too_far.horizon == timedelta(days=30)
    assert too_far.scheduled_too_far.actual == scheduled
    assert (too_large.payload_too_large.limit, too_large.payload_too_large.actual) == (
        1_048_576,
        1_048_577,
    )
    assert (long_name.queue_name_too_long.limit, long_name.queue_name_too_long.actual) == (512, 600)


async def test_whole_request_errors_and_statuses(stub):
    err = await grpc_error(stub.enqueue_batch(batch()))
    assert (err.status, err.message) == (
        Status.INVALID_ARGUMENT,
        "batch must contain at least one job",
    )
    err = await grpc_error(stub.enqueue_atomic(batch(*[enq()] * 257)))
    assert (err.status, err.message) == (
        Status.INVALID_ARGUMENT,
        "batch exceeds max_enqueue_batch (256)",
    )
    err = await grpc_error(stub.reserve(reserve_request(*["q"] * 33)))
    assert err.message == "reserve exceeds max_reserve_queues (32)"
    err = await grpc_error(stub.reserve(reserve_request("x" * 513)))
    assert err.message == f'queue name "{"x" * 513}" exceeds max_queue_name_bytes (512)'
    err = await grpc_error(stub.reserve(pb.ReserveRequest(queues=["q"])))
    assert (err.status, err.message) == (Status.INVALID_ARGUMENT, "lease_duration is required")
    err = await grpc_error(stub.ack(pb.AckRequest(job_id="nope", attempt=1)))
    assert (err.status, err.message) == (Status.INVALID_ARGUMENT, "job_id must be a UUID")
    err = await grpc_error(
        stub.extend(pb.ExtendRequest(job_id=UUID0, attempt=1, lease_duration=LEASE))
    )
    assert (err.status, err.message) == (Status.NOT_FOUND, "job not found")
    err = await grpc_error(stub.drain_dead_letters(pb.DrainDeadLettersRequest(queue="")))
    assert (err.status, err.message) == (Status.INVALID_ARGUMENT, "queue must not be empty")
    err = await grpc_error(stub.nack(pb.NackRequest(job_id=UUID0, attempt=1, retry=pb.NackRetry())))
    assert (err.status, err.message) == (Status.INVALID_ARGUMENT, "retry strategy is required")


async def test_strict_mode_over_the_wire():
    async with SeppTestServer(strict_queues=True, queues=[QueueConfig("a")]) as server:
        async with Channel(server.host, server.port) as channel:
            stub = pb.QueueServiceStub(channel)
            err = await grpc_error(stub.reserve(reserve_request("a", "b", 'c"')))
            assert (err.status, err.message) == (
                Status.FAILED_PRECONDITION,
                'queue(s) not declared (strict mode): ["b", "c\\""]',
            )
            reply = await stub.enqueue_batch(batch(enq("b"), enq("a")))
            assert reply.results[0].rejection.unknown_queue.queue == "b"
            assert reply.results[1].success.job_id
            info = await stub.get_server_info(pb.GetServerInfoRequest())
            assert info.strict_queues is True


async def test_server_info_defaults(stub):
    info = await stub.get_server_info(pb.GetServerInfoRequest())
    assert (info.server_version, info.supported_protocol_versions) == ("0.1.0", ["v1"])
    assert info.server_time == START
    assert (info.max_payload_bytes, info.max_enqueue_batch, info.max_reserve_queues) == (
        1_048_576,
        256,
        32,
    )
    assert (info.max_wait_timeout, info.max_lease_duration) == (
        timedelta(minutes=5),
        timedelta(minutes=5),
    )
    assert info.dead_letter_retention_enabled is True  # the fixture keeps dead letters


# -- long poll, shutdown, disconnects ------------------------------------------------------


async def test_long_poll_wakes_within_100ms_of_an_enqueue():
    async with SeppTestServer() as server, Channel(server.host, server.port) as channel:
        stub = pb.QueueServiceStub(channel)
        poll = asyncio.ensure_future(
            stub.reserve(reserve_request(wait_timeout=timedelta(seconds=5)))
        )
        await until(lambda: server.state.waiter_count == 1)
        await asyncio.sleep(0.05)
        assert not poll.done()
        await stub.enqueue_batch(batch(enq()))
        enqueued = time.monotonic()
        reply = await asyncio.wait_for(poll, 5)
        assert time.monotonic() - enqueued < 0.1
        assert len(reply.jobs) == 1


async def test_long_poll_deadline_with_a_manual_clock(server: SeppTestServer, stub):
    poll = asyncio.ensure_future(stub.reserve(reserve_request(wait_timeout=timedelta(seconds=5))))
    await until(lambda: server.state.waiter_count == 1)
    await server.advance(4.999)
    assert not poll.done()
    await server.advance(0.001)
    assert (await asyncio.wait_for(poll, 2)).jobs == []
    assert server.state.waiter_count == 0


async def test_concurrent_long_polls_each_get_a_job(server: SeppTestServer, stub):
    polls = [
        asyncio.ensure_future(stub.reserve(reserve_request(wait_timeout=timedelta(seconds=60))))
        for _ in range(5)
    ]
    await until(lambda: server.state.waiter_count == 5)
    await stub.enqueue_batch(batch(*[enq() for _ in range(5)]))
    replies = await asyncio.wait_for(asyncio.gather(*polls), 5)
    assert sorted(len(r.jobs) for r in replies) == [1] * 5
    assert len({r.jobs[0].id for r in replies}) == 5


async def test_shutdown_answers_a_pending_long_poll_empty():
    server = await SeppTestServer().start()
    channel = Channel(server.host, server.port)
    try:
        stub = pb.QueueServiceStub(channel)
        poll = asyncio.ensure_future(
            stub.reserve(reserve_request(wait_timeout=timedelta(seconds=60)))
        )
        await until(lambda: server.state.waiter_count == 1)
        started = time.monotonic()
        await server.stop()
        reply = await asyncio.wait_for(poll, 2)
        assert reply.jobs == []
        assert time.monotonic() - started < 1.0
        assert server.service.active_calls == 0
    finally:
        channel.close()
        await server.stop()


async def test_client_disconnect_during_a_long_poll_leaves_nothing_behind(server, stub):
    channel = Channel(server.host, server.port)
    poll = asyncio.ensure_future(
        pb.QueueServiceStub(channel).reserve(reserve_request(wait_timeout=timedelta(seconds=60)))
    )
    await until(lambda: server.state.waiter_count == 1)
    channel.close()
    with pytest.raises(StreamTerminatedError):
        await poll
    await until(lambda: server.state.waiter_count == 0 and server.service.active_calls == 0)
    # A client deadline shorter than the wait cancels the server's call too.
    with pytest.raises(asyncio.TimeoutError):
        await stub.reserve(reserve_request(wait_timeout=timedelta(seconds=60)), timeout=0.2)
    await until(lambda: server.state.waiter_count == 0 and server.service.active_calls == 0)
    assert server.state.stats()["queues"] == 0
    assert server.clock.pending_timers() == 0
    # Only this test's own task is left: no handler or waiter task leaked.
    await asyncio.sleep(0.05)
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftover == []


# -- auth ----------------------------------------------------------------------------------


async def _all_rpcs(stub: pb.QueueServiceStub, metadata: Any) -> list[Any]:
    """Call every RPC; return each result or GRPCError."""
    calls = [
        stub.enqueue_batch(batch(enq()), metadata=metadata),
        stub.enqueue_atomic(batch(enq()), metadata=metadata),
        stub.reserve(reserve_request(), metadata=metadata),
        stub.ack(pb.AckRequest(job_id=UUID0, attempt=1), metadata=metadata),
        stub.nack(pb.NackRequest(job_id=UUID0, attempt=1), metadata=metadata),
        stub.extend(
            pb.ExtendRequest(job_id=UUID0, attempt=1, lease_duration=LEASE), metadata=metadata
        ),
        stub.drain_dead_letters(pb.DrainDeadLettersRequest(), metadata=metadata),
        stub.get_server_info(pb.GetServerInfoRequest(), metadata=metadata),
    ]
    return await asyncio.gather(*calls, return_exceptions=True)


def _statuses(results: list[Any]) -> list[Any]:
    return [(r.status, r.message) if isinstance(r, GRPCError) else "ok" for r in results]


async def test_auth_on_every_rpc():
    async with SeppTestServer(api_keys={"worker": "good-key", "producer": "other"}) as server:
        async with Channel(server.host, server.port) as channel:
            stub = pb.QueueServiceStub(channel)
            missing = [(Status.UNAUTHENTICATED, MISSING)] * 8
            invalid = [(Status.UNAUTHENTICATED, "invalid API key")] * 8
            assert _statuses(await _all_rpcs(stub, None)) == missing
            for header in ("bearer good-key", "Bearergood-key", "Basic good-key", "good-key"):
                assert _statuses(await _all_rpcs(stub, {"authorization": header})) == missing
            for header in ("Bearer bad", "Bearer  good-key", "Bearer good-key ", "Bearer "):
                assert _statuses(await _all_rpcs(stub, {"authorization": header})) == invalid
            ok = _statuses(await _all_rpcs(stub, {"authorization": "Bearer good-key"}))
            assert ok[:3] == ["ok"] * 3 and ok[7] == "ok"
            assert ok[3:6] == [(Status.NOT_FOUND, "job not found")] * 3
            assert _statuses(await _all_rpcs(stub, {"authorization": "Bearer other"}))[7] == "ok"


async def test_auth_runs_before_decoding_and_health_is_open():
    async with SeppTestServer(api_keys=["k"]) as server, raw_channel(server) as channel:
        err = await grpc_error(raw_call(channel, "Ack", b"\xff\xff"))
        assert (err.status, err.message) == (Status.UNAUTHENTICATED, MISSING)
        good = {"authorization": "Bearer k"}
        err = await grpc_error(raw_call(channel, "Ack", b"\xff\xff", metadata=good))
        assert err.status == Status.INTERNAL
        reply = await raw_call(channel, "Check", b"", service="grpc.health.v1.Health")
        assert reply == b"\x08\x01"
        # Unknown methods of the service are behind auth too; other services are not.
        err = await grpc_error(raw_call(channel, "Purge", b""))
        assert (err.status, err.message) == (Status.UNAUTHENTICATED, MISSING)
        err = await grpc_error(raw_call(channel, "Get", b"", service="other.Service"))
        assert err.status == Status.UNIMPLEMENTED


def test_authorization_values_that_are_not_visible_ascii_count_as_missing():
    from sepp_lite.testing import QueueState, RpcError
    from sepp_lite.testing._dispatch import Dispatch

    dispatch = Dispatch(QueueState(), frozenset({"k", "k\t"}))
    for value in ("Bearer k\x7f", "Bearer k\x00", "Bearer kü", "\tBearer k"):
        with pytest.raises(RpcError) as info:
            dispatch.authorize(value)
        assert info.value.code.name == "UNAUTHENTICATED"
        assert info.value.message == MISSING, value
    dispatch.authorize("Bearer k\t")  # tab is allowed, like space
    with pytest.raises(RpcError) as info:
        dispatch.authorize("Bearer  k")
    assert info.value.message == "invalid API key"


async def test_empty_key_list_rejects_everything_and_auth_off_ignores_the_header():
    async with SeppTestServer(api_keys=[]) as server, Channel(server.host, server.port) as ch:
        stub = pb.QueueServiceStub(ch)
        statuses = _statuses(await _all_rpcs(stub, {"authorization": "Bearer anything"}))
        assert statuses == [(Status.UNAUTHENTICATED, "invalid API key")] * 8
    async with SeppTestServer() as server, Channel(server.host, server.port) as ch:
        stub = pb.QueueServiceStub(ch)
        info = await stub.get_server_info(
            pb.GetServerInfoRequest(), metadata={"authorization": "junk"}
        )
        assert info.server_version == "0.1.0"


# -- transport-level errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "rpc",
    [
        "EnqueueBatch",
        "EnqueueAtomic",
        "Reserve",
        "Ack",
        "Nack",
        "Extend",
        "DrainDeadLetters",
        "GetServerInfo",
    ],
)
async def test_undecodable_protobuf_is_internal(server: SeppTestServer, rpc: str):
    async with raw_channel(server) as channel:
        for bad in (b"\x0a\x05ab", b"\x0a", b"\x07", b"\x0a\x02\xff\xfe"):
            if (
                rpc in ("GetServerInfo", "Ack", "Nack", "Extend", "DrainDeadLetters")
                and bad == b"\x0a\x02\xff\xfe"
            ):
                continue  # an invalid string only fails where the field is read
            err = await grpc_error(raw_call(channel, rpc, bad))
            assert err.status == Status.INTERNAL, (rpc, bad)
            assert err.message.startswith("failed to decode Protobuf message: "), err.message
    assert server.service.active_calls == 0


async def test_oversized_request_is_out_of_range(server: SeppTestServer):
    limit = 16 * 1024 * 1024
    async with raw_channel(server) as channel:
        err = await grpc_error(raw_call(channel, "EnqueueBatch", b"\x00" * (limit + 1)))
        assert (err.status, err.message) == (
            Status.OUT_OF_RANGE,
            f"Error, decoded message length too large: found {limit + 1} bytes, "
            f"the limit is: {limit} bytes",
        )
        # Exactly the limit is decoded (and found to be garbage).
        err = await grpc_error(raw_call(channel, "EnqueueBatch", b"\x00" * limit))
        assert err.status == Status.INTERNAL


async def test_unknown_methods_are_unimplemented(server: SeppTestServer):
    async with raw_channel(server) as channel:
        err = await grpc_error(raw_call(channel, "Purge", b""))
        assert (err.status, err.message) == (Status.UNIMPLEMENTED, None)
        err = await grpc_error(raw_call(channel, "Get", b"", service="other.Service"))
        assert err.status == Status.UNIMPLEMENTED
        err = await grpc_error(
            raw_call(channel, "Check", b"\x0a\x01x", service="grpc.health.v1.Health")
        )
        assert (err.status, err.message) == (Status.NOT_FOUND, "service not registered")


async def test_health_watch_reports_once_and_ends_at_shutdown():
    """Watch, as tonic-health serves it: the status at once (SERVICE_UNKNOWN rather
    than an error for another service), no API key needed, then the stream stays open
    until the server shuts down, when it ends with OK."""
    server = await SeppTestServer(api_keys=["k"]).start()
    try:
        async with raw_channel(server) as channel:
            watch = UnaryStreamMethod(channel, "/grpc.health.v1.Health/Watch", bytes, bytes)
            requests = {
                b"": b"\x08\x01",
                b"\x0a\x14sepp.v1.QueueService": b"\x08\x01",
                b"\x0a\x05other": b"\x08\x03",
            }
            async with contextlib.AsyncExitStack() as streams:
                opened = []
                for request, status in requests.items():
                    stream = await streams.enter_async_context(watch.open(timeout=10))
                    await stream.send_message(request, end=True)
                    assert await stream.recv_message() == status
                    opened.append(stream)
                pending = [asyncio.ensure_future(s.recv_message()) for s in opened]
                done, _ = await asyncio.wait(pending, timeout=0.2)
                assert not done  # nothing more while the server runs
                assert server.service.active_calls == 3
                server.service.close()  # what stop() does first
                assert await asyncio.gather(*pending) == [None, None, None]
                for stream in opened:
                    await stream.recv_trailing_metadata()  # raises unless OK
            # A watch opened after that ends at once; garbage is refused.
            assert await watch(b"", timeout=5) == [b"\x08\x01"]
            err = await grpc_error(watch(b"\xff", timeout=5))
            assert err.status == Status.INTERNAL
    finally:
        await server.stop()


async def test_an_open_health_watch_does_not_delay_shutdown():
    server = await SeppTestServer().start()
    async with raw_channel(server) as channel:
        watch = UnaryStreamMethod(channel, "/grpc.health.v1.Health/Watch", bytes, bytes)
        async with watch.open(timeout=10) as stream:
            await stream.send_message(b"", end=True)
            assert await stream.recv_message() == b"\x08\x01"
            started = time.monotonic()
            await server.stop()
            assert time.monotonic() - started < 1.0  # not the 2 s drain of running calls
            assert server.service.active_calls == 0


# -- TLS -------------------------------------------------------------------------------------


def _client_context(ca: Any) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    context.set_alpn_protocols(["h2"])
    return context


async def test_tls_with_pem_bytes_and_with_files(tmp_path):
    from tests.pki import CA  # imported here: a missing openssl fails this test only

    ca = CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
    key = cert.private_key_pem.bytes()
    (tmp_path / "cert.pem").write_bytes(chain)
    (tmp_path / "key.pem").write_bytes(key)
    sources = [(chain, key), (str(tmp_path / "cert.pem"), tmp_path / "key.pem")]
    for cert_source, key_source in sources:
        async with SeppTestServer(tls_cert=cert_source, tls_key=key_source) as server:
            async with Channel(server.host, server.port, ssl=_client_context(ca)) as channel:
                stub = pb.QueueServiceStub(channel)
                info = await stub.get_server_info(pb.GetServerInfoRequest())
                assert info.server_version == "0.1.0"
            async with Channel(server.host, server.port) as plaintext:
                with pytest.raises((StreamTerminatedError, ConnectionError, asyncio.TimeoutError)):
                    await pb.QueueServiceStub(plaintext).get_server_info(
                        pb.GetServerInfoRequest(), timeout=2
                    )


async def test_accepted_connections_use_tcp_nodelay(server: SeppTestServer, stub):
    # Without TCP_NODELAY each response waits out Nagle plus a delayed ACK (40 ms).
    await stub.get_server_info(pb.GetServerInfoRequest())
    # The accepted sockets' options are no part of SeppTestServer's API: reach in to its
    # grpclib server and the connections it keeps, and to grpclib's transports.
    grpc_server = server._grpc
    assert grpc_server is not None
    sockets = [p.connection._transport.get_extra_info("socket") for p in grpc_server._protocols]
    assert sockets and all(
        s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1 for s in sockets
    )


async def test_unloadable_tls_material_is_a_config_error(tmp_path):
    server = SeppTestServer(tls_cert=b"-----BEGIN nonsense", tls_key=tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match="cannot load the TLS certificate and key"):
        await server.start()
    assert not server.running


# -- lifecycle -------------------------------------------------------------------------------


async def test_lifecycle_and_addresses():
    server = SeppTestServer(port=0)
    with pytest.raises(TypeError, match="ManualClock"):
        await server.advance(1)
    await server.start()
    try:
        assert server.port > 0 and server.addr == f"127.0.0.1:{server.port}"
        with pytest.raises(RuntimeError):
            await server.start()
    finally:
        await server.stop()
    await server.stop()
    assert not server.running
    with pytest.raises(TypeError, match="unknown server settings"):
        SeppTestServer(no_such_setting=1)
    assert SeppTestServer(max_queue_depth=5).config.limits.max_queue_depth == 5
