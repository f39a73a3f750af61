"""Every SeppClient RPC against the in-process server: the official integration suite
(official-clients.md §8.4 cases 1-12, plus the trace-absent case), producer details
(rejections, atomic batches, schedules, priorities, queue defaults) and consumer
details (leases, nack, extend, dead letters)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from sepp_lite import (
    AttemptMismatchError,
    BatchValidationError,
    CustomEntriesTooMany,
    CustomKeyTooLong,
    CustomMapTooLarge,
    DeadLetterCause,
    EncodingNotAllowed,
    EnqueueAck,
    EnqueueRequest,
    IdempotencyKeyTooLong,
    InvalidRequest,
    InvalidRequestError,
    JobNotFoundError,
    JobRejectedError,
    JobTypeNameTooLong,
    JobTypeNotAllowed,
    JobValidationError,
    Payload,
    PayloadTooLarge,
    Priority,
    QueueFull,
    QueueNameTooLong,
    RetryDirective,
    ScheduledTooFar,
    SeppClient,
    TraceContext,
    TransportError,
    UnknownQueue,
    UnknownQueuesError,
    _otel,
)
from sepp_lite._codec.enqueue import decode_enqueue_batch_request
from sepp_lite._codec.job import decode_reserve_request
from sepp_lite._codec.lease import decode_ack_request, decode_extend_request, decode_nack_request
from sepp_lite._time import datetime_to_ms, ms_to_datetime
from sepp_lite.testing import ManualClock, QueueConfig
from tests.client_helpers import (
    START_MS,
    ScriptedServer,
    connected,
    elapsed,
    job,
    job_record,
    opts,
    reserve_reply,
    sepp_server,
    text_job,
    unique_queue,
)

pytestmark = pytest.mark.both_transports

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
START = ms_to_datetime(START_MS)


def is_uuid(text: str) -> bool:
    parts = text.split("-")
    return [len(part) for part in parts] == [8, 4, 4, 4, 12]


def manual(**config: Any) -> Any:
    """An in-process server on a ManualClock starting at START_MS."""
    return sepp_server(clock=ManualClock(START_MS), **config)


@pytest.fixture
def no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OpenTelemetry tracing, whatever other tests installed globally (and a no-op
    where it is not installed at all)."""
    monkeypatch.setattr(_otel, "AVAILABLE", False)


# -- §8.4 cases 1-12 -----------------------------------------------------------------


async def test_1_connect_and_get_server_info() -> None:
    async with manual(
        strict_queues=True,
        queues=[QueueConfig("declared")],
        dead_letter_retention_ms=5_000,
        max_payload_bytes=4096,
        allowed_encodings=["application/json"],
        max_reserve_batch=50,
    ) as server:
        async with connected(server.addr) as client:
            assert client.server_info is None
            info = await client.get_server_info()
            assert client.server_info is info
    assert info.version == "0.1.0"
    assert info.supported_protocol_versions == ["v1"]
    assert info.server_time == START
    assert info.strict_queues is True
    assert info.dead_letter_retention_enabled is True
    assert info.restricts_encodings is True
    assert info.allowed_encodings == ["application/json"]
    assert info.max_payload_bytes == 4096
    assert info.max_enqueue_batch == 256
    assert info.max_reserve_batch == 50
    assert info.max_reserve_queues == 32
    assert info.max_custom_entries == 64
    assert info.max_custom_total_bytes == 16_384
    assert info.max_custom_key_bytes == 256
    assert info.max_queue_name_bytes == 512
    assert info.max_job_type_bytes == 256
    assert info.max_idempotency_key_bytes == 256
    assert info.max_wait_timeout == timedelta(seconds=300)
    assert info.max_lease_duration == timedelta(seconds=300)
    assert info.max_schedule_horizon == timedelta(days=30)


async def test_2_enqueue_single() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        ack = await client.enqueue(job(queue))
        assert isinstance(ack, EnqueueAck)
        assert is_uuid(ack.job_id)
        assert ack.deduplicated is False
        assert server.counts(queue) == (1, 0, 0, 0)
        assert server.state.job(ack.job_id) is not None


async def test_3_enqueue_single_with_payload() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        ack = await client.enqueue(text_job(queue, b"hello world"))
        jobs = await client.reserve(opts(queue))
        assert jobs is not None
        assert jobs[0].ctx.id == ack.job_id
        assert jobs[0].payload == Payload(b"hello world", "text/plain")


async def test_4_enqueue_batch_of_three() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        results = await client.enqueue_batch([job(queue, f"t{i}") for i in range(3)])
        assert len(results) == 3
        assert all(isinstance(r, EnqueueAck) and not r.deduplicated for r in results)
        ids = [r.job_id for r in results]  # type: ignore[union-attr]
        assert len(set(ids)) == 3
        assert [server.state.job(i).record.job_type for i in ids] == ["t0", "t1", "t2"]  # type: ignore[union-attr]


async def test_5_enqueue_atomic_two() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        acks = await client.enqueue_atomic([job(queue), text_job(queue)])
        assert len(acks) == 2
        assert all(isinstance(a, EnqueueAck) and not a.deduplicated for a in acks)
        assert acks[0].job_id != acks[1].job_id
        assert server.counts(queue) == (2, 0, 0, 0)


async def test_6_idempotency_same_key_same_id() -> None:
    queue, other = unique_queue(), unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        first = await client.enqueue(job(queue, idempotency_key="order-17"))
        second = await client.enqueue(job(queue, "other-type", idempotency_key="order-17"))
        elsewhere = await client.enqueue(job(other, idempotency_key="order-17"))
        assert first.deduplicated is False
        assert second == EnqueueAck(first.job_id, True)
        assert elsewhere.deduplicated is False and elsewhere.job_id != first.job_id
        assert server.counts(queue) == (1, 0, 0, 0)


async def test_7_reserve_empty_queue_returns_none() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        duration, result = await elapsed(client.reserve(opts(queue, wait=0.3)))
    assert result is None
    assert 0.25 <= duration < 2.0  # the server held the long poll for the wait


async def test_8_enqueue_reserve_ack() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        ack = await client.enqueue(
            EnqueueRequest(queue, "email.send", payload=Payload(b"\x00\x01body", "bin"))
        )
        jobs = await client.reserve(opts(queue))
        assert jobs is not None and len(jobs) == 1
        ctx = jobs[0].ctx
        assert (ctx.id, ctx.job_type, ctx.queue, ctx.attempt) == (
            ack.job_id,
            "email.send",
            queue,
            1,
        )
        assert jobs[0].payload == Payload(b"\x00\x01body", "bin")
        assert server.counts(queue) == (0, 0, 1, 0)
        await client.ack(ctx)
        assert server.counts(queue) == (0, 0, 0, 0)
        with pytest.raises(JobNotFoundError):
            await client.ack(ctx)


async def test_9_nack_retry_then_ack() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        ack = await client.enqueue(job(queue))
        first = await client.reserve(opts(queue))
        assert first is not None
        assert await client.nack(first[0].ctx, RetryDirective.DEFAULT) is False
        again = await client.reserve(opts(queue))
        assert again is not None
        assert (again[0].ctx.id, again[0].ctx.attempt) == (ack.job_id, 2)
        await client.ack(again[0].ctx)
        assert server.counts(queue) == (0, 0, 0, 0)


async def test_10_nack_dead_letter() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(queue, max_attempts=1))
        jobs = await client.reserve(opts(queue))
        assert jobs is not None and jobs[0].ctx.max_attempts == 1
        assert await client.nack(jobs[0].ctx, RetryDirective.DEAD_LETTER, "bad input") is True
        assert server.counts(queue) == (0, 0, 0, 0)
        assert await client.reserve(opts(queue)) is None


async def test_11_extend_lease() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(queue))
        jobs = await client.reserve(opts(queue, lease=2))
        assert jobs is not None
        ctx = jobs[0].ctx
        now = datetime.now(timezone.utc)
        assert ctx.lease_expires_at < now + timedelta(seconds=3)
        expiry = await client.extend(ctx, timedelta(seconds=30))
        assert expiry.tzinfo is not None
        assert expiry > datetime.now(timezone.utc) + timedelta(seconds=25)
        assert expiry < datetime.now(timezone.utc) + timedelta(seconds=31)
        view = server.state.job(ctx.id)
        assert view is not None and view.lease_expires_ms == datetime_to_ms(expiry)
        await client.ack(ctx)


async def test_12_trace_context_round_trip() -> None:
    queue = unique_queue()
    trace = TraceContext(TRACEPARENT, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(queue, "with-state", trace_context=trace))
        await client.enqueue(job(queue, "bare", trace_context=TraceContext(TRACEPARENT)))
        jobs = await client.reserve(opts(queue, max_jobs=2))
    assert jobs is not None
    got = {j.ctx.job_type: j.ctx.trace_context for j in jobs}
    assert got == {"with-state": trace, "bare": TraceContext(TRACEPARENT, None)}


async def test_trace_context_absent_when_not_set(no_tracing: None) -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(queue))
        jobs = await client.reserve(opts(queue))
    assert jobs is not None
    assert jobs[0].ctx.trace_context is None


# -- producer details ----------------------------------------------------------------


def _rejection_config() -> dict[str, Any]:
    return {
        "queues": [
            QueueConfig("small", max_payload_bytes=10),
            QueueConfig("json-only", allowed_encodings=["application/json"]),
            QueueConfig("typed", allowed_job_types=["allowed"]),
            QueueConfig(
                "few-custom",
                max_custom_entries=2,
                max_custom_key_bytes=4,
                max_custom_total_bytes=10,
            ),
            QueueConfig("near", max_schedule_horizon_ms=60_000),
            QueueConfig("tiny", max_queue_depth=1),
        ],
        "max_queue_name_bytes": 16,
        "max_job_type_bytes": 8,
        "max_idempotency_key_bytes": 8,
    }


async def test_enqueue_batch_rejections_are_values_in_order() -> None:
    plain = unique_queue("p")
    text = Payload(b"x", "text/plain")
    far = ms_to_datetime(START_MS + 3_600_000)
    cases: list[tuple[EnqueueRequest, object]] = [
        (job(plain), EnqueueAck),
        (
            job(plain, payload=Payload(b"", "text/plain")),
            InvalidRequest("payload.data must not be empty"),
        ),
        (job(plain, max_attempts=0), InvalidRequest("max_attempts must be >= 1")),
        (job(plain, idempotency_key=""), InvalidRequest("idempotency_key must not be empty")),
        (job("small", payload=Payload(b"x" * 11, "raw")), PayloadTooLarge(10, 11)),
        (job("json-only", payload=text), EncodingNotAllowed("text/plain", ["application/json"])),
        (job("typed", "other"), JobTypeNotAllowed("other", ["allowed"])),
        (job("few-custom", custom={"a": 1, "b": 2, "c": 3}), CustomEntriesTooMany(2, 3)),
        (job("few-custom", custom={"toolong": 1}), CustomKeyTooLong("toolong", 4, 7)),
        (job("few-custom", custom={"k": "x" * 20}), CustomMapTooLarge(10, 21)),
        (job("q" * 17), QueueNameTooLong(16, 17)),
        (job(plain, "t" * 9), JobTypeNameTooLong(8, 9)),
        (job(plain, idempotency_key="k" * 9), IdempotencyKeyTooLong(8, 9)),
        (job("near", scheduled_at=far), ScheduledTooFar(timedelta(seconds=60), far)),
        (job("tiny"), EnqueueAck),
        (job("tiny"), QueueFull("tiny", 1)),
        (job(plain, "last"), EnqueueAck),
    ]
    async with manual(**_rejection_config()) as server, connected(server.addr) as client:
        results = await client.enqueue_batch([request for request, _ in cases])
        assert len(results) == len(cases)
        for index, (result, (_, expected)) in enumerate(zip(results, cases)):
            if expected is EnqueueAck:
                assert isinstance(result, EnqueueAck), (index, result)
                assert result.deduplicated is False
            else:
                assert type(result) is type(expected), (index, result)
                assert result == expected, index
        assert server.counts(plain) == (2, 0, 0, 0)
        assert server.counts("tiny") == (1, 0, 0, 0)
        for queue in ("small", "json-only", "typed", "few-custom", "near"):
            assert server.counts(queue) == (0, 0, 0, 0)
        last = results[-1]
        assert isinstance(last, EnqueueAck)
        view = server.state.job(last.job_id)
        assert view is not None and view.record.job_type == "last"


async def test_unknown_queue_rejection_in_strict_mode() -> None:
    declared, undeclared = unique_queue("d"), unique_queue("u")
    async with sepp_server(strict_queues=True, queues=[QueueConfig(declared)]) as server:
        async with connected(server.addr) as client:
            results = await client.enqueue_batch([job(undeclared), job(declared)])
            assert results[0] == UnknownQueue(undeclared)
            assert isinstance(results[1], EnqueueAck)
            with pytest.raises(JobRejectedError) as info:
                await client.enqueue(job(undeclared))
            assert info.value.rejection == UnknownQueue(undeclared)
            assert undeclared in str(info.value)


async def test_enqueue_raises_job_rejected_with_the_rejection() -> None:
    async with manual(**_rejection_config()) as server, connected(server.addr) as client:
        with pytest.raises(JobRejectedError) as info:
            await client.enqueue(job("small", payload=Payload(b"y" * 15, "raw")))
        assert info.value.rejection == PayloadTooLarge(limit=10, actual=15)
        assert str(info.value) == "job rejected: payload of 15 bytes is over the limit of 10"
        assert server.counts("small") == (0, 0, 0, 0)


async def test_enqueue_atomic_failure_lists_every_index_and_writes_nothing() -> None:
    plain = unique_queue("p")
    async with manual(**_rejection_config()) as server, connected(server.addr) as client:
        with pytest.raises(BatchValidationError) as info:
            await client.enqueue_atomic(
                [
                    job(plain, max_attempts=0),
                    job(plain),
                    job("small", payload=Payload(b"z" * 12, "raw")),
                    job(plain, idempotency_key="fresh"),
                ]
            )
        assert info.value.errors == [
            JobValidationError(0, InvalidRequest("max_attempts must be >= 1")),
            JobValidationError(2, PayloadTooLarge(10, 12)),
        ]
        assert "2 job(s)" in str(info.value)
        assert server.counts(plain) == (0, 0, 0, 0)
        assert server.counts("small") == (0, 0, 0, 0)
        # nothing was written, so the key is still unused
        assert (await client.enqueue(job(plain, idempotency_key="fresh"))).deduplicated is False


async def test_enqueue_atomic_queue_full_lists_every_job_of_the_queue() -> None:
    plain = unique_queue("p")
    async with manual(**_rejection_config()) as server, connected(server.addr) as client:
        with pytest.raises(BatchValidationError) as info:
            await client.enqueue_atomic([job("tiny"), job(plain), job("tiny")])
        assert info.value.errors == [
            JobValidationError(0, QueueFull("tiny", 1)),
            JobValidationError(2, QueueFull("tiny", 1)),
        ]
        assert server.counts("tiny") == (0, 0, 0, 0)
        assert server.counts(plain) == (0, 0, 0, 0)


@pytest.mark.parametrize("atomic", [False, True])
async def test_batch_over_server_limit_is_invalid_request(atomic: bool) -> None:
    queue = unique_queue()
    batch = [job(queue) for _ in range(257)]
    async with sepp_server() as server, connected(server.addr) as client:
        call = client.enqueue_atomic(batch) if atomic else client.enqueue_batch(batch)
        with pytest.raises(InvalidRequestError, match=r"max_enqueue_batch \(256\)") as info:
            await call
        assert info.value.code is not None and info.value.code.name == "INVALID_ARGUMENT"
        assert info.value.ambiguous is False
        assert server.counts(queue) == (0, 0, 0, 0)
        assert len(await client.enqueue_batch(batch[:256])) == 256


async def test_scheduled_job_is_not_reservable_before_due() -> None:
    queue = unique_queue()
    due = ms_to_datetime(START_MS + 10_000)
    async with manual() as server, connected(server.addr) as client:
        ack = await client.enqueue(job(queue, scheduled_at=due))
        assert server.counts(queue) == (0, 1, 0, 0)
        assert await client.reserve(opts(queue)) is None
        await server.advance(9.999)
        assert await client.reserve(opts(queue)) is None
        await server.advance(0.001)
        jobs = await client.reserve(opts(queue))
        assert jobs is not None
        assert jobs[0].ctx.id == ack.job_id
        assert jobs[0].ctx.scheduled_at == due


async def test_naive_scheduled_at_is_utc() -> None:
    queue = unique_queue()
    due = ms_to_datetime(START_MS + 5_000)
    async with manual() as server, connected(server.addr) as client:
        await client.enqueue(job(queue, scheduled_at=due.replace(tzinfo=None)))
        await server.advance(4.999)
        assert server.counts(queue) == (0, 1, 0, 0)
        await server.advance(0.001)
        assert server.counts(queue) == (1, 0, 0, 0)


async def test_priorities_order_reservation() -> None:
    queue = unique_queue()
    async with manual() as server, connected(server.addr) as client:
        await client.enqueue_batch(
            [
                job(queue, "p0", priority=0),
                job(queue, "p9", priority=9),
                job(queue, "p5", priority=Priority.P5),
                job(queue, "p3", priority=3),
                job(queue, "none"),
            ]
        )
        jobs = await client.reserve(opts(queue, max_jobs=5))
    assert jobs is not None
    assert [j.ctx.priority.value for j in jobs] == [9, 5, 3, 0, 0]
    assert [j.ctx.job_type for j in jobs][:3] == ["p9", "p5", "p3"]
    assert jobs[0].ctx.priority == Priority.P9


async def test_unset_optional_fields_use_queue_defaults() -> None:
    plain, tuned = unique_queue("p"), unique_queue("t")
    queues = [QueueConfig(tuned, default_priority=6, default_max_attempts=7)]
    async with sepp_server(queues=queues) as server, connected(server.addr) as client:
        await client.enqueue(job(plain))
        await client.enqueue(job(tuned))
        await client.enqueue(job(tuned, "explicit", priority=0, max_attempts=1))
        await client.enqueue(job(plain, "ceiling", max_attempts=500))
        got = await client.reserve(opts(plain, tuned, max_jobs=4))
    assert got is not None
    seen = {(j.ctx.queue, j.ctx.job_type): j.ctx for j in got}
    assert seen[(plain, "t")].max_attempts == 3
    assert seen[(plain, "t")].priority == Priority(0)
    assert seen[(tuned, "t")].max_attempts == 7
    assert seen[(tuned, "t")].priority == Priority(6)
    assert seen[(tuned, "explicit")].max_attempts == 1
    assert seen[(tuned, "explicit")].priority == Priority(0)
    assert seen[(plain, "ceiling")].max_attempts == 100


async def test_unset_optional_fields_stay_off_the_wire(no_tracing: None) -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        await client.enqueue(job("q"))
        await client.enqueue(
            job(
                "q",
                payload=Payload(b"d", "e"),
                idempotency_key="k",
                priority=0,
                max_attempts=2,
                custom={"n": 1},
                scheduled_at=START,
            )
        )
    bare = decode_enqueue_batch_request(server.calls[0].request)[0]
    assert (bare.queue, bare.job_type) == ("q", "t")
    assert bare.payload is None
    assert bare.idempotency_key is None
    assert bare.priority is None
    assert bare.max_attempts is None
    assert bare.trace is None
    assert bare.custom == {}
    assert bare.scheduled_at is None
    full = decode_enqueue_batch_request(server.calls[1].request)[0]
    assert full.payload == (b"d", "e")
    assert full.idempotency_key == "k"
    assert full.priority == 0  # an explicit 0 is sent, not dropped
    assert full.max_attempts == 2
    assert full.custom == {"n": 1}
    assert full.scheduled_at == (START_MS // 1000, 0)


async def test_custom_values_round_trip() -> None:
    queue = unique_queue()
    custom = {"s": "text", "i": -(2**63), "big": 2**63 - 1, "f": 1.5, "t": True, "no": False}
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(queue, custom=custom))
        jobs = await client.reserve(opts(queue))
    assert jobs is not None
    got = jobs[0].ctx.custom
    assert got == custom
    assert type(got["t"]) is bool and type(got["i"]) is int and type(got["f"]) is float


# -- consumer details ----------------------------------------------------------------


async def test_reserve_max_jobs_returns_up_to_n() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue_batch([job(queue) for _ in range(5)])
        first = await client.reserve(opts(queue, max_jobs=3))
        second = await client.reserve(opts(queue, max_jobs=3))
        third = await client.reserve(opts(queue, max_jobs=3))
        assert first is not None and len(first) == 3
        assert second is not None and len(second) == 2
        assert third is None
        ids = {j.ctx.id for j in first + second}
        assert len(ids) == 5
        await client.enqueue_batch([job(queue), job(queue)])
        default = await client.reserve(opts(queue))
        assert default is not None and len(default) == 1


async def test_reserve_polls_queues_in_order() -> None:
    first, second = unique_queue("a"), unique_queue("b")
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(second, "from-second"))
        await client.enqueue(job(first, "from-first"))
        jobs = await client.reserve(opts(first, second, max_jobs=2))
    assert jobs is not None
    assert [j.ctx.job_type for j in jobs] == ["from-first", "from-second"]


async def test_lease_carries_the_reserve_worker_id() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", reserve_reply(job_record()), reserve_reply(job_record()))
        bound = await client.reserve(opts("q", worker_id="worker-7"))
        unbound = await client.reserve(opts("q"))
        assert bound is not None and unbound is not None
        ctx = bound[0].ctx
        assert ctx.lease is not None and ctx.lease.worker_id == "worker-7"
        await client.extend(ctx, 10)
        await ctx.extend(10)
        await client.nack(ctx, RetryDirective.after(1.5), "oops")
        await client.ack(ctx)
        await client.ack(unbound[0].ctx)
    reserve = decode_reserve_request(server.calls_to("Reserve")[0].request)
    assert reserve.worker_id == "worker-7"
    assert decode_reserve_request(server.calls_to("Reserve")[1].request).worker_id is None
    extends = [decode_extend_request(c.request) for c in server.calls_to("Extend")]
    assert [(e.job_id, e.attempt, e.worker_id) for e in extends] == [
        (ctx.id, 1, "worker-7"),
        (ctx.id, 1, "worker-7"),
    ]
    assert [e.lease_duration for e in extends] == [(10, 0), (10, 0)]
    nack = decode_nack_request(server.calls_to("Nack")[0].request)
    assert (nack.worker_id, nack.reason, nack.retry) == (
        "worker-7",
        "oops",
        ("delay", 1, 500_000_000),
    )
    acks = [decode_ack_request(c.request) for c in server.calls_to("Ack")]
    assert [(a.job_id, a.attempt, a.worker_id) for a in acks] == [
        (ctx.id, 1, "worker-7"),
        (ctx.id, 1, None),
    ]


@pytest.mark.parametrize(
    ("directive", "reason", "expected_retry", "expected_reason"),
    [
        (RetryDirective.DEFAULT, "", ("default",), None),
        (RetryDirective.default(), "flaky", ("default",), "flaky"),
        (RetryDirective.DEAD_LETTER, "", ("dead_letter",), None),
        (RetryDirective.after(0), "", ("delay", 0, 0), None),
        (RetryDirective.after(timedelta(seconds=90)), "later", ("delay", 90, 0), "later"),
    ],
)
async def test_nack_always_sends_a_directive_and_drops_empty_reason(
    directive: RetryDirective,
    reason: str,
    expected_retry: tuple[object, ...],
    expected_reason: str | None,
) -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", reserve_reply(job_record()))
        jobs = await client.reserve(opts("q"))
        assert jobs is not None
        await client.nack(jobs[0].ctx, directive, reason)
    nack = decode_nack_request(server.calls_to("Nack")[0].request)
    assert nack.retry == expected_retry
    assert nack.reason == expected_reason


async def test_job_ctx_extend_updates_known_expiry_client_extend_does_not() -> None:
    queue = unique_queue()
    async with manual() as server, connected(server.addr) as client:
        await client.enqueue(job(queue))
        jobs = await client.reserve(opts(queue, lease=30))
        assert jobs is not None
        ctx = jobs[0].ctx
        assert ctx.lease is not None
        assert ctx.lease_expires_at == ms_to_datetime(START_MS + 30_000)
        assert ctx.lease.known_expiry_ms == START_MS + 30_000
        await server.advance(5)
        expiry = await client.extend(ctx, 60)
        assert expiry == ms_to_datetime(START_MS + 65_000)
        assert ctx.lease.known_expiry_ms == START_MS + 30_000
        expiry = await ctx.extend(timedelta(seconds=90))
        assert expiry == ms_to_datetime(START_MS + 95_000)
        assert ctx.lease.known_expiry_ms == START_MS + 95_000
        assert ctx.lease_expires_at == ms_to_datetime(START_MS + 30_000)  # a snapshot
        view = server.state.job(ctx.id)
        assert view is not None and view.lease_expires_ms == START_MS + 95_000


async def test_ack_after_lease_expiry_is_job_not_found() -> None:
    queue = unique_queue()
    async with manual() as server, connected(server.addr) as client:
        await client.enqueue(job(queue))
        jobs = await client.reserve(opts(queue, lease=10))
        assert jobs is not None
        await server.advance(10)
        assert server.counts(queue) == (1, 0, 0, 0)
        with pytest.raises(JobNotFoundError):
            await client.ack(jobs[0].ctx)
        with pytest.raises(JobNotFoundError):
            await client.extend(jobs[0].ctx, 5)
        with pytest.raises(JobNotFoundError):
            await client.nack(jobs[0].ctx)


async def test_ack_of_old_attempt_after_redelivery_is_attempt_mismatch() -> None:
    queue = unique_queue()
    async with manual() as server, connected(server.addr) as client:
        await client.enqueue(job(queue))
        old = await client.reserve(opts(queue, lease=10))
        assert old is not None
        await server.advance(10)
        new = await client.reserve(opts(queue, lease=10))
        assert new is not None
        assert (new[0].ctx.id, new[0].ctx.attempt) == (old[0].ctx.id, 2)
        with pytest.raises(AttemptMismatchError):
            await client.ack(old[0].ctx)
        with pytest.raises(AttemptMismatchError):
            await old[0].ctx.extend(5)
        await client.ack(new[0].ctx)
        assert server.counts(queue) == (0, 0, 0, 0)


async def test_nack_returns_dead_lettered_on_last_attempt() -> None:
    queue = unique_queue()
    async with sepp_server(dead_letter_retention_ms=60_000) as server:
        async with connected(server.addr) as client:
            await client.enqueue(job(queue, max_attempts=2))
            first = await client.reserve(opts(queue))
            assert first is not None
            assert await client.nack(first[0].ctx, reason="one") is False
            second = await client.reserve(opts(queue))
            assert second is not None and second[0].ctx.attempt == 2
            assert await client.nack(second[0].ctx, reason="two") is True
            assert server.counts(queue) == (0, 0, 0, 1)
            records = await client.drain_dead_letters(queue)
    assert len(records) == 1
    assert records[0].cause is DeadLetterCause.ATTEMPTS_EXHAUSTED
    assert records[0].final_attempt == 2
    assert records[0].last_reason == "two"


async def test_nack_after_delay_schedules_the_retry() -> None:
    queue = unique_queue()
    async with manual() as server, connected(server.addr) as client:
        await client.enqueue(job(queue))
        jobs = await client.reserve(opts(queue))
        assert jobs is not None
        assert await client.nack(jobs[0].ctx, RetryDirective.after(5)) is False
        assert server.counts(queue) == (0, 1, 0, 0)
        assert await client.reserve(opts(queue)) is None
        await server.advance(5)
        again = await client.reserve(opts(queue))
        assert again is not None and again[0].ctx.attempt == 2


async def test_nack_reason_empty_vs_text_in_dead_letters() -> None:
    queue = unique_queue()
    async with manual(dead_letter_retention_ms=600_000) as server:
        async with connected(server.addr) as client:
            await client.enqueue_batch([job(queue, "silent"), job(queue, "loud")])
            jobs = await client.reserve(opts(queue, max_jobs=2))
            assert jobs is not None
            by_type = {j.ctx.job_type: j.ctx for j in jobs}
            assert await client.nack(by_type["silent"], RetryDirective.DEAD_LETTER) is True
            await server.advance(1)
            assert await client.nack(by_type["loud"], RetryDirective.DEAD_LETTER, "boom") is True
            records = await client.drain_dead_letters(queue, max_records=10)
    assert [r.job_type for r in records] == ["silent", "loud"]
    assert records[0].last_reason is None
    assert records[1].last_reason == "boom"
    assert all(r.cause is DeadLetterCause.REJECTED for r in records)


async def test_drain_dead_letters_oldest_first_with_details_and_replay() -> None:
    queue, other = unique_queue("a"), unique_queue("b")
    trace = TraceContext(TRACEPARENT, "k=v")
    async with manual(dead_letter_retention_ms=600_000) as server:
        async with connected(server.addr) as client:
            await client.enqueue(
                job(
                    queue,
                    "exhausted",
                    payload=Payload(b"data", "application/json"),
                    priority=7,
                    max_attempts=1,
                    custom={"tenant": "acme", "n": 3},
                    trace_context=trace,
                    idempotency_key="once",
                )
            )
            await client.enqueue(job(other, "elsewhere"))
            await client.enqueue(job(queue, "expired", max_attempts=1))
            await client.enqueue(job(queue, "rejected"))
            first = await client.reserve(opts(queue))
            assert first is not None and first[0].ctx.job_type == "exhausted"
            await client.nack(first[0].ctx, reason="gave up")  # t0, last attempt
            await server.advance(1)
            rest = await client.reserve(opts(other, queue, lease=2, max_jobs=3))
            assert rest is not None
            by_type = {j.ctx.job_type: j.ctx for j in rest}
            await client.nack(by_type["elsewhere"], RetryDirective.DEAD_LETTER)  # t0 + 1 s
            await server.advance(1)
            await client.nack(by_type["rejected"], RetryDirective.DEAD_LETTER, "no")  # t0 + 2 s
            await server.advance(1)  # "expired" lease lapses at t0 + 3 s
            assert server.counts(queue) == (0, 0, 0, 3)
            records = await client.drain_dead_letters(queue, max_records=10)
            assert server.counts(queue) == (0, 0, 0, 0)
            assert server.counts(other) == (0, 0, 0, 1)
            assert await client.drain_dead_letters(queue, max_records=10) == []

            assert [r.job_type for r in records] == ["exhausted", "rejected", "expired"]
            assert [r.cause for r in records] == [
                DeadLetterCause.ATTEMPTS_EXHAUSTED,
                DeadLetterCause.REJECTED,
                DeadLetterCause.LEASE_EXPIRED,
            ]
            assert [r.failed_at for r in records] == [
                ms_to_datetime(START_MS),
                ms_to_datetime(START_MS + 2_000),
                ms_to_datetime(START_MS + 3_000),
            ]
            assert [r.final_attempt for r in records] == [1, 1, 1]
            assert [r.last_reason for r in records] == ["gave up", "no", None]
            exhausted = records[0]
            assert exhausted.queue == queue
            assert exhausted.job_id == first[0].ctx.id
            assert exhausted.payload == Payload(b"data", "application/json")
            assert exhausted.priority == Priority(7)
            assert exhausted.max_attempts == 1
            assert exhausted.custom == {"tenant": "acme", "n": 3}
            assert exhausted.trace_context == trace
            assert exhausted.enqueued_at == START
            assert exhausted.scheduled_at is None

            replay = exhausted.to_enqueue_request()
            assert replay.idempotency_key is None
            ack = await client.enqueue(replay)
            assert ack.job_id != exhausted.job_id and ack.deduplicated is False
            again = await client.reserve(opts(queue))
            assert again is not None
            ctx = again[0].ctx
            assert (ctx.id, ctx.job_type, ctx.priority, ctx.max_attempts, ctx.attempt) == (
                ack.job_id,
                "exhausted",
                Priority(7),
                1,
                1,
            )
            assert again[0].payload == Payload(b"data", "application/json")
            assert ctx.custom == {"tenant": "acme", "n": 3}
            assert ctx.trace_context == trace


async def test_drain_all_queues_and_max_records() -> None:
    first, second = unique_queue("a"), unique_queue("b")
    async with manual(dead_letter_retention_ms=600_000) as server:
        async with connected(server.addr) as client:
            for queue in (first, second, first):
                await client.enqueue(job(queue, max_attempts=1))
                jobs = await client.reserve(opts(queue))
                assert jobs is not None
                await client.nack(jobs[0].ctx)
                await server.advance(1)
            one = await client.drain_dead_letters()
            assert [r.queue for r in one] == [first]
            rest = await client.drain_dead_letters(max_records=5)
            assert [r.queue for r in rest] == [second, first]
            assert [r.failed_at for r in one + rest] == [
                ms_to_datetime(START_MS + 1000 * i) for i in range(3)
            ]


async def test_drain_with_retention_off_returns_empty() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue(job(queue, max_attempts=1))
        jobs = await client.reserve(opts(queue))
        assert jobs is not None
        assert await client.nack(jobs[0].ctx, reason="x") is True
        assert await client.drain_dead_letters(queue, max_records=10) == []
        assert await client.drain_dead_letters() == []
        info = await client.get_server_info()
        assert info.dead_letter_retention_enabled is False


async def test_reserve_in_strict_mode_on_undeclared_queue() -> None:
    declared, undeclared = unique_queue("d"), unique_queue("u")
    async with sepp_server(strict_queues=True, queues=[QueueConfig(declared)]) as server:
        async with connected(server.addr) as client:
            assert await client.reserve(opts(declared)) is None
            with pytest.raises(UnknownQueuesError) as info:
                await client.reserve(opts(declared, undeclared))
    # The server's words once, its list of names kept.
    assert str(info.value) == f'queues not declared on the server (strict mode): ["{undeclared}"]'
    assert info.value.server_message == f'queue(s) not declared (strict mode): ["{undeclared}"]'


async def test_reserve_long_poll_wakes_on_enqueue() -> None:
    queue = unique_queue()
    async with sepp_server() as server:
        async with connected(server.addr) as consumer, connected(server.addr) as producer:
            waiting = asyncio.ensure_future(elapsed(consumer.reserve(opts(queue, wait=10))))
            await asyncio.sleep(0.1)
            ack = await producer.enqueue(job(queue))
            duration, jobs = await asyncio.wait_for(waiting, 5)
    assert duration < 2
    assert isinstance(jobs, list) and jobs[0].ctx.id == ack.job_id


async def test_many_concurrent_calls_share_one_client() -> None:
    queue = unique_queue()
    async with sepp_server() as server, connected(server.addr) as client:
        acks = await asyncio.gather(*(client.enqueue(job(queue, f"t{i}")) for i in range(300)))
        assert len({ack.job_id for ack in acks}) == 300
        assert server.counts(queue) == (300, 0, 0, 0)
        batches = await asyncio.gather(
            *(client.reserve(opts(queue, max_jobs=30)) for _ in range(10))
        )
        reserved = [j for batch in batches for j in (batch or [])]
        assert sorted(j.ctx.id for j in reserved) == sorted(ack.job_id for ack in acks)
        await asyncio.gather(*(client.ack(j.ctx) for j in reserved))
        assert server.counts(queue) == (0, 0, 0, 0)


async def test_megabyte_payload_round_trip() -> None:
    queue = unique_queue()
    data = bytes(range(256)) * 4096  # 1 MiB, the server's default payload limit
    async with sepp_server() as server, connected(server.addr) as client:
        await client.enqueue_batch([text_job(queue, data), text_job(queue, data[::-1])])
        jobs = await client.reserve(opts(queue, max_jobs=2))
    assert jobs is not None
    assert sorted(j.payload.data for j in jobs if j.payload) == sorted([data, data[::-1]])


async def test_unicode_names_values_and_reasons_round_trip() -> None:
    queue = unique_queue("очередь-")
    custom = {"ключ": "значение ✓", "emoji🙂": "🚀", "naïve": 1.25}
    async with sepp_server(dead_letter_retention_ms=60_000) as server:
        async with connected(server.addr) as client:
            await client.enqueue(job(queue, "тип.задачи", custom=custom, max_attempts=1))
            jobs = await client.reserve(opts(queue, worker_id="wörker-1"))
            assert jobs is not None
            ctx = jobs[0].ctx
            assert (ctx.queue, ctx.job_type, ctx.custom) == (queue, "тип.задачи", custom)
            assert await client.nack(ctx, reason="сбой: ☠") is True
            records = await client.drain_dead_letters(queue)
    assert [(r.queue, r.job_type, r.last_reason) for r in records] == [
        (queue, "тип.задачи", "сбой: ☠")
    ]


async def test_close_fails_an_in_flight_reserve_promptly() -> None:
    queue = unique_queue()
    async with sepp_server() as server:
        client = await SeppClient.connect(server.addr)
        try:
            waiting = asyncio.ensure_future(elapsed(client.reserve(opts(queue, wait=10))))
            await asyncio.sleep(0.1)
        finally:
            await client.close()
        duration, result = await asyncio.wait_for(waiting, 5)
    assert isinstance(result, (TransportError, RuntimeError)), result
    assert duration < 1.0
