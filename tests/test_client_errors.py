"""SeppClient failures: the status mapping per RPC kind, the retry policy and its one
deadline, transport failures (lost, refused, garbled connections), the receive limit,
deadlines sent to the server, and malformed jobs in answers."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Callable

import pytest
from grpclib.exceptions import GRPCError

from sepp_lite import (
    AttemptMismatchError,
    BatchResultCountMismatchError,
    ClientError,
    ConnectError,
    DeadLetterCause,
    EnqueueAck,
    InvalidRequestError,
    JobNotFoundError,
    MalformedResponseError,
    MalformedServerInfoError,
    OverloadedError,
    RequestTooLargeError,
    ResponseTooLargeError,
    RetryPolicy,
    SeppClient,
    SeppError,
    ServerInternalError,
    TransportError,
    UnauthenticatedError,
    UnexpectedStatusError,
    UnknownQueuesError,
    UnknownRejection,
)
from sepp_lite._codec.dead_letters import DeadLetterOut, encode_drain_dead_letters_response
from sepp_lite._codec.enqueue import encode_enqueue_atomic_response, encode_enqueue_batch_response
from sepp_lite._codec.job import JobRecord
from sepp_lite._codec.lease import encode_ack_response
from sepp_lite._retry import backoff_delays, call_with_retry
from sepp_lite._status import CallFailure
from sepp_lite._wire.transport import ReconnectBackoff
from sepp_lite.errors import Status
from sepp_lite.testing import SeppTestServer
from sepp_lite.types import JobCtx
from tests.client_helpers import (
    DROP,
    HANG,
    JOB_ID,
    NO_REPLY,
    START_MS,
    ScriptedServer,
    SilentServer,
    connected,
    elapsed,
    hand_ctx,
    job,
    job_record,
    opts,
    reserve_reply,
    sepp_server,
    server_info_bytes,
    text_job,
    unique_queue,
)

pytestmark = pytest.mark.both_transports
# The retry decision sits above the transport: its many cases run over connect() only
# (test_retryable_status_retried_up_to_max_attempts covers retries over both).
RETRY_DECISION = pytest.mark.connect_only

ERROR_STATUSES = [status for status in Status if status is not Status.OK]
RETRYABLE = [
    Status.UNAVAILABLE,
    Status.DEADLINE_EXCEEDED,
    Status.ABORTED,
    Status.RESOURCE_EXHAUSTED,
]
NOT_RETRYABLE = [status for status in ERROR_STATUSES if status not in RETRYABLE]
AMBIGUOUS = {Status.DEADLINE_EXCEEDED, Status.ABORTED}

GENERIC: dict[Status, type[SeppError]] = {
    Status.UNAVAILABLE: TransportError,
    Status.DEADLINE_EXCEEDED: TransportError,
    Status.ABORTED: TransportError,
    Status.CANCELLED: TransportError,
    Status.UNAUTHENTICATED: UnauthenticatedError,
    Status.PERMISSION_DENIED: UnauthenticatedError,
    Status.RESOURCE_EXHAUSTED: OverloadedError,
    Status.INVALID_ARGUMENT: InvalidRequestError,
    Status.INTERNAL: ServerInternalError,
    Status.DATA_LOSS: ServerInternalError,
    Status.UNKNOWN: ServerInternalError,
}


def expected_error(status: Status, kind: str) -> type[SeppError]:
    if kind == "lease" and status is Status.NOT_FOUND:
        return JobNotFoundError
    if kind == "lease" and status is Status.FAILED_PRECONDITION:
        return AttemptMismatchError
    if kind == "reserve" and status is Status.FAILED_PRECONDITION:
        return UnknownQueuesError
    if status is Status.OUT_OF_RANGE:  # sepp's answer to a request over its size limit
        return RequestTooLargeError
    return GENERIC.get(status, UnexpectedStatusError)


def policy(attempts: int, backoff: float = 0.001, **kwargs: object) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=attempts,
        initial_backoff=timedelta(seconds=backoff),
        jitter=False,
        **kwargs,  # type: ignore[arg-type]
    )


def fail(status: Status, times: int = 1, message: str = "scripted") -> list[GRPCError]:
    return [GRPCError(status, f"{message} {status.name}") for _ in range(times)]


def ctx() -> JobCtx:
    return hand_ctx()


Rpc = Callable[[SeppClient], Awaitable[object]]

RPCS: list[tuple[str, str, Rpc]] = [
    ("GetServerInfo", "generic", lambda c: c.get_server_info()),
    ("EnqueueBatch", "generic", lambda c: c.enqueue_batch([job("q"), job("q")])),
    ("EnqueueBatch", "generic", lambda c: c.enqueue(job("q"))),
    ("EnqueueAtomic", "generic", lambda c: c.enqueue_atomic([job("q")])),
    ("DrainDeadLetters", "generic", lambda c: c.drain_dead_letters("q", 5)),
    ("Ack", "lease", lambda c: c.ack(ctx())),
    ("Nack", "lease", lambda c: c.nack(ctx())),
    ("Extend", "lease", lambda c: c.extend(ctx(), 5)),
    ("Reserve", "reserve", lambda c: c.reserve(opts("q", wait=1))),
]


# -- the status mapping (official-clients.md §5.2) -----------------------------------


@pytest.mark.parametrize("status", ERROR_STATUSES, ids=lambda s: s.name)
async def test_status_maps_to_error_per_rpc_kind(status: Status) -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        for method, kind, call in RPCS:
            message = f"details for {method}"
            server.script(method, GRPCError(status, message))
            with pytest.raises(SeppError) as info:
                await call(client)
            error = info.value
            expected = expected_error(status, kind)
            assert type(error) is expected, (method, status, error)
            assert isinstance(error.__cause__, CallFailure) and error.__cause__.status is status
            if isinstance(error, ClientError):
                assert error.code is status
                assert error.ambiguous is (status in AMBIGUOUS)
                assert message in str(error)
            if isinstance(error, UnexpectedStatusError):
                assert error.status_message == message
                assert str(error) == f"the server answered {status.name}: {message}"
            if isinstance(error, UnknownQueuesError):
                assert str(error) == f"queues not declared on the server: {message}"
        assert len(server.calls) == len(RPCS)


# -- the retry policy ----------------------------------------------------------------


async def test_retry_is_off_by_default() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        for method, _, call in RPCS:
            server.script(method, *fail(Status.UNAVAILABLE))
            with pytest.raises(TransportError):
                await call(client)
        assert len(server.calls) == len(RPCS)


@pytest.mark.parametrize("status", RETRYABLE, ids=lambda s: s.name)
async def test_retryable_status_retried_up_to_max_attempts(status: Status) -> None:
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(3)) as c:
        server.script("GetServerInfo", *fail(status, 2))
        assert (await c.get_server_info()).version == "0.1.0"
        assert len(server.calls) == 3
        server.script("GetServerInfo", *[GRPCError(status, f"try {n}") for n in range(1, 5)])
        with pytest.raises(ClientError) as info:
            await c.get_server_info()
        assert len(server.calls) == 6
        assert info.value.code is status
        assert str(info.value) == "try 3"  # the last attempt's error
        # the next logical call starts counting again: "try 4" fails, then success
        assert (await c.get_server_info()).version == "0.1.0"
        assert len(server.calls) == 8


@RETRY_DECISION
@pytest.mark.parametrize("status", NOT_RETRYABLE, ids=lambda s: s.name)
async def test_other_statuses_are_never_retried(status: Status) -> None:
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(5)) as c:
        for method, _, call in RPCS:
            server.script(method, *fail(status))
            with pytest.raises(SeppError):
                await call(c)
        assert len(server.calls) == len(RPCS)


@RETRY_DECISION
@pytest.mark.parametrize(
    ("method", "call"),
    [(method, call) for method, _, call in RPCS if method not in ("Reserve", "DrainDeadLetters")],
)
async def test_retried_rpcs(method: str, call: Rpc) -> None:
    # Every job in these enqueues is keyless, so only non-ambiguous codes: UNAVAILABLE.
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(4)) as c:
        server.script(method, *fail(Status.UNAVAILABLE, 3))
        await call(c)
        assert [call.method for call in server.calls] == [method] * 4


@RETRY_DECISION
@pytest.mark.parametrize("method", ["Reserve", "DrainDeadLetters"])
@pytest.mark.parametrize("status", RETRYABLE, ids=lambda s: s.name)
async def test_reserve_and_drain_are_never_retried(method: str, status: Status) -> None:
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(5)) as c:
        server.script(method, *fail(status, 4))
        with pytest.raises(ClientError) as info:
            if method == "Reserve":
                await c.reserve(opts("q"))
            else:
                await c.drain_dead_letters(max_records=10)
        assert info.value.code is status
        assert len(server.calls) == 1


KEYLESS_CASES: list[tuple[str, Callable[[SeppClient], Awaitable[object]]]] = [
    ("EnqueueBatch", lambda c: c.enqueue(job("q"))),
    ("EnqueueBatch", lambda c: c.enqueue(job("q", idempotency_key=""))),
    ("EnqueueBatch", lambda c: c.enqueue_batch([job("q", idempotency_key="a"), job("q")])),
    ("EnqueueAtomic", lambda c: c.enqueue_atomic([job("q"), job("q", idempotency_key="b")])),
    ("EnqueueAtomic", lambda c: c.enqueue_atomic([job("q", idempotency_key="")])),
]
KEYED_CASES: list[tuple[str, Callable[[SeppClient], Awaitable[object]]]] = [
    ("EnqueueBatch", lambda c: c.enqueue(job("q", idempotency_key="k"))),
    ("EnqueueBatch", lambda c: c.enqueue_batch([job("q", idempotency_key=f"k{i}") for i in "ab"])),
    ("EnqueueAtomic", lambda c: c.enqueue_atomic([job("q", idempotency_key="k")])),
]


@RETRY_DECISION
@pytest.mark.parametrize("status", [Status.DEADLINE_EXCEEDED, Status.ABORTED], ids=str)
@pytest.mark.parametrize("case", range(len(KEYLESS_CASES)))
async def test_keyless_enqueue_does_not_retry_ambiguous_codes(case: int, status: Status) -> None:
    method, call = KEYLESS_CASES[case]
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(4)) as c:
        server.script(method, *fail(status, 3))
        with pytest.raises(TransportError) as info:
            await call(c)
        assert info.value.ambiguous is True
        assert len(server.calls) == 1


@RETRY_DECISION
@pytest.mark.parametrize("status", [Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED], ids=str)
@pytest.mark.parametrize("case", range(len(KEYLESS_CASES)))
async def test_keyless_enqueue_retries_unambiguous_codes(case: int, status: Status) -> None:
    method, call = KEYLESS_CASES[case]
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(4)) as c:
        server.script(method, *fail(status, 3))
        await call(c)
        assert len(server.calls) == 4


@RETRY_DECISION
@pytest.mark.parametrize("status", [Status.DEADLINE_EXCEEDED, Status.ABORTED], ids=str)
@pytest.mark.parametrize("case", range(len(KEYED_CASES)))
async def test_keyed_enqueue_retries_ambiguous_codes(case: int, status: Status) -> None:
    method, call = KEYED_CASES[case]
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(4)) as c:
        server.script(method, *fail(status, 3))
        await call(c)
        assert len(server.calls) == 4


@RETRY_DECISION
@pytest.mark.parametrize("method", ["Ack", "Nack", "Extend", "GetServerInfo"])
async def test_ambiguous_codes_are_retried_outside_enqueue(method: str) -> None:
    call = next(call for name, _, call in RPCS if name == method)
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(3)) as c:
        server.script(method, *fail(Status.ABORTED), *fail(Status.DEADLINE_EXCEEDED))
        await call(c)
        assert len(server.calls) == 3


async def test_each_retry_logs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(3)) as c:
        server.script("Ack", *fail(Status.UNAVAILABLE), *fail(Status.RESOURCE_EXHAUSTED))
        await c.ack(ctx())
    warnings = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    assert len(warnings) == 2
    assert "Ack" in warnings[0] and "attempt 1" in warnings[0] and "UNAVAILABLE" in warnings[0]
    assert "attempt 2" in warnings[1] and "RESOURCE_EXHAUSTED" in warnings[1]


async def test_backoff_delays_are_waited() -> None:
    slow = policy(3, backoff=0.1)  # waits 0.1 then 0.2 s
    async with ScriptedServer() as server, connected(server.addr, retry_policy=slow) as c:
        server.script("GetServerInfo", *fail(Status.UNAVAILABLE, 2))
        duration, result = await elapsed(c.get_server_info())
    assert not isinstance(result, Exception)
    assert 0.29 <= duration < 1.0


# -- backoff_delays and call_with_retry (unit) ---------------------------------------


def take(n: int, p: RetryPolicy, jitter: Callable[[], float] = random.random) -> list[float]:
    delays = backoff_delays(p, jitter)
    return [round(next(delays), 9) for _ in range(n)]


def test_backoff_without_jitter_doubles_up_to_the_cap() -> None:
    p = RetryPolicy(initial_backoff=timedelta(milliseconds=100), max_backoff=1.0, jitter=False)  # type: ignore[arg-type]
    assert take(7, p) == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_backoff_default_policy_values() -> None:
    assert take(4, RetryPolicy(jitter=False)) == [0.1, 0.2, 0.4, 0.8]
    assert take(9, RetryPolicy(jitter=False))[-1] == 10.0
    assert take(3, RetryPolicy(jitter=False, multiplier=3)) == [0.1, 0.3, 0.9]


def test_first_backoff_is_not_capped() -> None:
    p = RetryPolicy(initial_backoff=timedelta(seconds=5), max_backoff=1.0, jitter=False)  # type: ignore[arg-type]
    assert take(3, p) == [5.0, 1.0, 1.0]


def test_backoff_jitter_scales_each_base() -> None:
    p = RetryPolicy(initial_backoff=0.1, max_backoff=0.4)  # type: ignore[arg-type]
    assert take(4, p, lambda: 0.0) == [0.05, 0.1, 0.2, 0.2]
    top = take(4, p, lambda: 0.999999)
    assert all(0.999 * base < got < base for got, base in zip(top, [0.1, 0.2, 0.4, 0.4]))


def test_backoff_jitter_stays_in_half_open_range() -> None:
    p = RetryPolicy(initial_backoff=1.0, max_backoff=1.0)  # type: ignore[arg-type]
    delays = backoff_delays(p)
    samples = [next(delays) for _ in range(2000)]
    assert all(0.5 <= d < 1.0 for d in samples)
    assert min(samples) < 0.55 and max(samples) > 0.95  # the whole range is used


def _failing(
    times: int, status: Status = Status.UNAVAILABLE
) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) <= times:
            error = TransportError("down")
            error.code = status
            error.ambiguous = status in AMBIGUOUS
            raise error
        return "ok"

    return calls, attempt


async def test_call_with_retry_sleeps_the_backoff_sequence() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(round(seconds, 9))

    calls, attempt = _failing(3)
    p = RetryPolicy(max_attempts=5, jitter=False)
    result = await call_with_retry("Op", attempt, p, time.monotonic() + 60, sleep=sleep)
    assert result == "ok"
    assert len(calls) == 4
    assert slept == [0.1, 0.2, 0.4]


async def test_call_with_retry_stops_before_the_deadline() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    calls, attempt = _failing(10)
    p = RetryPolicy(max_attempts=10, jitter=False)
    with pytest.raises(TransportError):
        # (the fake sleep takes no time) a 0.1 s backoff fits, the next one of 0.2 s not
        await call_with_retry("Op", attempt, p, time.monotonic() + 0.15, sleep=sleep)
    assert len(calls) == 2
    assert slept == [0.1]


async def test_call_with_retry_keyless_skips_ambiguous() -> None:
    calls, attempt = _failing(1, Status.ABORTED)
    p = RetryPolicy(max_attempts=3, jitter=False)
    with pytest.raises(TransportError):
        await call_with_retry("Op", attempt, p, time.monotonic() + 60, all_keyed=False)
    assert len(calls) == 1
    calls, attempt = _failing(1, Status.ABORTED)
    assert await call_with_retry("Op", attempt, p, time.monotonic() + 60) == "ok"
    assert len(calls) == 2


# -- one deadline across attempts ----------------------------------------------------


async def test_one_deadline_across_attempts() -> None:
    retrying = policy(5, backoff=0.01)
    async with ScriptedServer() as server:
        async with connected(server.addr, retry_policy=retrying, rpc_timeout=0.6) as c:
            server.script("GetServerInfo", *fail(Status.UNAVAILABLE), HANG, HANG, HANG)
            duration, result = await elapsed(c.get_server_info())
    assert isinstance(result, TransportError)
    assert result.code is Status.DEADLINE_EXCEEDED
    assert 0.5 <= duration < 1.1  # not 5 x 0.6 s
    assert len(server.calls) == 2
    for call in server.calls:  # a grpc-timeout hint no longer than the call's (rounded up)
        assert call.timeout is not None and 0 < call.timeout <= 1.0


async def test_hanging_server_costs_one_timeout_not_attempts_times_timeout() -> None:
    retrying = policy(4, backoff=0.01)
    async with ScriptedServer() as server:
        async with connected(server.addr, retry_policy=retrying, rpc_timeout=0.4) as c:
            server.script("Ack", HANG, HANG, HANG, HANG)
            duration, result = await elapsed(c.ack(ctx()))
    assert isinstance(result, TransportError)
    assert result.ambiguous is True
    assert 0.35 <= duration < 0.9
    assert len(server.calls) == 1


async def test_rpc_timeout_and_reserve_deadline_reach_the_server() -> None:
    async with ScriptedServer() as server:
        async with connected(server.addr) as c:
            await c.get_server_info()
            await c.reserve(opts("q", wait=2))
            await c.ack(ctx())
        async with connected(server.addr, rpc_timeout=timedelta(seconds=7)) as c:
            await c.get_server_info()
            await c.reserve(opts("q", wait=0))
    timeouts = [call.timeout for call in server.calls]
    assert all(t is not None for t in timeouts)
    default_info, reserve, ack, short_info, reserve_now = timeouts  # type: ignore[misc]
    assert 29.5 < default_info <= 30.001
    assert 11.5 < reserve <= 12.001  # wait + 10 s, not the rpc timeout
    assert 29.5 < ack <= 30.001
    assert 6.5 < short_info <= 7.001
    assert 9.5 < reserve_now <= 10.001


# -- transport failures --------------------------------------------------------------


async def test_connection_closed_mid_call_is_ambiguous_transport_error() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("EnqueueBatch", DROP)
        with pytest.raises(TransportError) as info:
            await client.enqueue(job("q"))
        assert info.value.ambiguous is True
        assert info.value.code is Status.UNAVAILABLE
        assert len(server.calls) == 1  # the request did reach the server
        assert isinstance(await client.enqueue(job("q")), EnqueueAck)  # reconnects


async def test_lost_connection_retry_needs_idempotency_keys() -> None:
    async with ScriptedServer() as server, connected(server.addr, retry_policy=policy(3)) as c:
        server.script("EnqueueBatch", DROP)
        with pytest.raises(TransportError):
            await c.enqueue(job("q"))
        assert len(server.calls) == 1
        server.script("EnqueueBatch", DROP)
        assert isinstance(await c.enqueue(job("q", idempotency_key="k")), EnqueueAck)
        assert len(server.calls) == 3
        server.script("Ack", DROP, DROP)
        await c.ack(ctx())
        assert len(server.calls) == 6


async def test_garbled_answer_fails_the_connect_at_once() -> None:
    frame = b"\x00\x00\x04\x09\x00\x00\x00\x00\x00garbage" * 4  # a CONTINUATION on stream 0
    async with SilentServer(reply=frame) as silent:
        duration, result = await elapsed(
            SeppClient.connect(f"127.0.0.1:{silent.port}", connect_timeout=5)
        )
    assert isinstance(result, ConnectError), result
    assert "not SETTINGS" in result.reason
    assert duration < 1.0


@pytest.mark.connect_only  # the default transport's reconnect backoff and counters
async def test_server_stopped_then_back_on_the_same_port() -> None:
    # As grpc's channel: a failed connect attempt backs off (about 1 s first); calls in
    # the meantime fail at once, and the first call after the backoff connects again.
    first = SeppTestServer()
    await first.start()
    port = first.port
    try:
        async with connected(first.addr) as client:
            assert (await client.get_server_info()).version == "0.1.0"
            await first.stop()
            with pytest.raises(TransportError) as info:
                await client.get_server_info()
            assert info.value.code is Status.UNAVAILABLE
            assert info.value.ambiguous is False
            assert "connection refused" in str(info.value)
            async with sepp_server(port=port) as second:
                took, early = await elapsed(client.get_server_info())
                assert isinstance(early, TransportError) and took < 0.5
                assert "next attempt in" in str(early)
                await asyncio.sleep(ReconnectBackoff.INITIAL * (1 + ReconnectBackoff.JITTER) + 0.05)
                queue = unique_queue()
                await client.enqueue(job(queue))
                assert second.counts(queue) == (1, 0, 0, 0)
                assert client.connections_opened == 2
    finally:
        await first.stop()


async def test_retry_policy_rides_out_a_short_outage() -> None:
    first = SeppTestServer()
    await first.start()
    port = first.port
    # The connect backoff (about 1 s) makes calls fail at once until it has passed.
    patient = policy(60, backoff=0.05, multiplier=1.0)
    queue = unique_queue()
    try:
        async with connected(first.addr, retry_policy=patient) as client:
            await first.stop()
            call = asyncio.ensure_future(client.enqueue(job(queue)))  # keyless: refused is safe
            try:
                await asyncio.sleep(0.2)
                assert not call.done()
                async with sepp_server(port=port) as second:
                    ack = await asyncio.wait_for(asyncio.shield(call), 5)
                    assert second.counts(queue) == (1, 0, 0, 0)
                    assert second.state.job(ack.job_id) is not None
            finally:
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
    finally:
        await first.stop()


# -- the receive limit ---------------------------------------------------------------


@pytest.mark.connect_only
async def test_response_over_receive_limit() -> None:
    queue = unique_queue()
    async with sepp_server() as server:
        async with connected(server.addr, max_receive_message_bytes=1000) as client:
            await client.enqueue(text_job(queue, b"p" * 2000))
            with pytest.raises(ResponseTooLargeError) as info:
                await client.reserve(opts(queue))
            assert isinstance(info.value, MalformedResponseError)
            assert info.value.limit == 1000
            assert info.value.size > 2000
            assert "max_receive_message_bytes (1000)" in str(info.value)
            assert server.counts(queue) == (0, 0, 1, 0)  # leased, as the message warns
            await client.enqueue(text_job(queue, b"small"))
            jobs = await client.reserve(opts(queue))
            assert jobs is not None and jobs[0].payload is not None
            assert jobs[0].payload.data == b"small"


async def test_default_receive_limit_is_16_mib() -> None:
    five_mib = reserve_reply(job_record(payload=(b"x" * (5 << 20), "raw")))
    sixteen_mib = reserve_reply(job_record(payload=(b"x" * (16 << 20), "raw")))
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", five_mib, sixteen_mib)
        jobs = await client.reserve(opts("q"))  # over grpc's usual 4 MiB
        assert jobs is not None and jobs[0].payload is not None
        assert len(jobs[0].payload.data) == 5 << 20
        with pytest.raises(ResponseTooLargeError) as info:
            await client.reserve(opts("q"))
    assert info.value.limit == 16 * 1024 * 1024
    assert info.value.size == len(sixteen_mib)


# -- malformed answers ---------------------------------------------------------------

OTHER_ID = "7f2d2e0b-2222-4333-8444-555566667777"
THIRD_ID = "8a3e3f0c-3333-4444-8555-666677778888"


@pytest.mark.parametrize(
    "bad",
    [
        job_record(""),
        job_record(OTHER_ID, priority=12),
        job_record(OTHER_ID, job_type=""),
    ],
    ids=["empty-id", "priority-12", "empty-job-type"],
)
async def test_malformed_job_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture, bad: JobRecord
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    good_first, good_last = job_record(JOB_ID), job_record(THIRD_ID, priority=9)
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", reserve_reply(good_first, bad, good_last))
        jobs = await client.reserve(opts("q", max_jobs=3))
    assert jobs is not None
    assert [j.ctx.id for j in jobs] == [JOB_ID, THIRD_ID]
    assert jobs[1].ctx.priority.value == 9
    assert all(j.ctx.lease is not None for j in jobs)
    warnings = [r for r in caplog.records if r.name == "sepp_lite"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "malformed job" in warnings[0].getMessage()


async def test_all_malformed_jobs_give_none(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    bad = [job_record(""), job_record(OTHER_ID, priority=10), job_record(THIRD_ID, job_type="")]
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", reserve_reply(*bad))
        assert await client.reserve(opts("q", max_jobs=3)) is None
    assert len([r for r in caplog.records if r.name == "sepp_lite"]) == 3


async def test_malformed_dead_letter_record_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    records = [
        DeadLetterOut(job_record(JOB_ID), 1, START_MS, 3, "r1"),
        DeadLetterOut(job_record(""), 2, START_MS, 1, None),
        DeadLetterOut(job_record(THIRD_ID), 3, START_MS + 5, 2, None),
    ]
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("DrainDeadLetters", encode_drain_dead_letters_response(records))
        drained = await client.drain_dead_letters(max_records=3)
    assert [(r.job_id, r.cause, r.final_attempt, r.last_reason) for r in drained] == [
        (JOB_ID, DeadLetterCause.ATTEMPTS_EXHAUSTED, 3, "r1"),
        (THIRD_ID, DeadLetterCause.LEASE_EXPIRED, 2, None),
    ]
    assert len([r for r in caplog.records if r.name == "sepp_lite"]) == 1


async def test_undecodable_answer_is_malformed_response() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", b"\x0a\xff\xff\xff\xff\x0f")  # a length past the end
        server.script("EnqueueBatch", encode_enqueue_batch_response([("a", False), ("b", False)]))
        with pytest.raises(MalformedResponseError):
            await client.reserve(opts("q"))
        with pytest.raises(BatchResultCountMismatchError) as info:
            await client.enqueue(job("q"))
        assert (info.value.expected, info.value.got) == (1, 2)
        assert str(info.value) == "sent 1 jobs but the server returned 2 results"


@pytest.mark.parametrize("method", ["GetServerInfo", "Ack"])
async def test_ok_without_a_response_message_is_a_client_error(method: str) -> None:
    call = next(call for name, _, call in RPCS if name == method)
    async with ScriptedServer() as server, connected(server.addr, rpc_timeout=5) as client:
        server.script(method, NO_REPLY)
        duration, result = await elapsed(call(client))
    assert isinstance(result, ClientError), result
    assert duration < 1.0


async def test_malformed_or_unknown_outcomes() -> None:
    no_outcome = b"\x0a\x00"  # one JobResult with neither success nor rejection
    unknown_member = b"\x0a\x05\x12\x03\x9a\x06\x00"  # a rejection with field 99 only
    empty_rejection = b"\x0a\x02\x12\x00"  # a rejection with no member set
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("EnqueueBatch", no_outcome, unknown_member + empty_rejection)
        server.script(
            "EnqueueAtomic",
            b"",
            encode_enqueue_atomic_response(success=[("a", False), ("b", False)]),
        )
        server.script("Extend", encode_ack_response(JOB_ID))  # no lease_expires_at
        server.script("GetServerInfo", server_info_bytes(version=""))
        with pytest.raises(MalformedResponseError, match="no outcome"):
            await client.enqueue(job("q"))
        assert await client.enqueue_batch([job("q"), job("q")]) == [
            UnknownRejection(),
            UnknownRejection(),
        ]
        with pytest.raises(MalformedResponseError, match="no outcome"):
            await client.enqueue_atomic([job("q")])
        with pytest.raises(BatchResultCountMismatchError):
            await client.enqueue_atomic([job("q")])
        with pytest.raises(MalformedResponseError, match="lease expiry"):
            await client.extend(ctx(), 5)
        with pytest.raises(MalformedServerInfoError):
            await client.get_server_info()
        assert client.server_info is None
