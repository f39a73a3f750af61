"""Client-side checks: every bad argument fails with a clear error before anything is
sent. Each test runs against a recording server and asserts it saw no call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from sepp_lite import (
    EmptyBatchError,
    EnqueueRequest,
    Payload,
    Priority,
    PriorityOutOfRangeError,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    SeppClient,
    TraceContext,
    TraceContextError,
)
from tests.client_helpers import (
    ScriptedServer,
    connected,
    hand_ctx,
    job,
    job_record,
    opts,
    reserve_reply,
    server_info_bytes,
)


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[ScriptedServer, SeppClient]]:
    """A connected client and the recording server; on teardown the server must have
    seen no call at all."""
    async with ScriptedServer() as server, connected(server.addr) as client:
        yield server, client
        assert server.calls == []


async def test_the_recorder_sees_calls() -> None:
    # Guards the "no call" assertions below: a call does get recorded.
    async with ScriptedServer() as server, connected(server.addr) as client:
        await client.enqueue(job("q"))
        await client.drain_dead_letters(max_records=1)
        assert [call.method for call in server.calls] == ["EnqueueBatch", "DrainDeadLetters"]


# -- batches -------------------------------------------------------------------------


async def test_empty_batches_fail_before_any_rpc(
    recorded: tuple[ScriptedServer, SeppClient],
) -> None:
    _, client = recorded
    with pytest.raises(EmptyBatchError, match="empty batch"):
        await client.enqueue_batch([])
    with pytest.raises(EmptyBatchError):
        await client.enqueue_batch(iter(()))
    with pytest.raises(EmptyBatchError):
        await client.enqueue_atomic([])
    with pytest.raises(EmptyBatchError):
        await client.enqueue_atomic(job("q") for _ in range(0))


# -- EnqueueRequest ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"queue": "", "job_type": "t"}, "queue"),
        ({"queue": "q", "job_type": ""}, "job_type"),
        ({"queue": None, "job_type": "t"}, "queue"),
    ],
)
def test_enqueue_request_needs_queue_and_job_type(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EnqueueRequest(**fields)


@pytest.mark.parametrize("priority", [10, -1, True, False, 1.0, "3", 100])
def test_enqueue_request_priority_out_of_range(priority: object) -> None:
    with pytest.raises(PriorityOutOfRangeError) as info:
        EnqueueRequest("q", "t", priority=priority)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert info.value.value is priority
    assert "0 to 9" in str(info.value)


@pytest.mark.parametrize("priority", [0, 9, Priority.P4])
def test_enqueue_request_priority_in_range(priority: Any) -> None:
    assert isinstance(EnqueueRequest("q", "t", priority=priority).priority, Priority)


@pytest.mark.parametrize(
    ("attribute", "value", "error", "match"),
    [
        ("queue", "", ValueError, "queue"),
        ("job_type", "", ValueError, "job_type"),
        ("priority", 10, PriorityOutOfRangeError, "0 to 9"),
        ("priority", -1, PriorityOutOfRangeError, "0 to 9"),
        ("priority", True, PriorityOutOfRangeError, "0 to 9"),
        ("custom", {"k": None}, TypeError, "custom"),
        ("custom", {"k": [1]}, TypeError, "custom"),
        ("custom", {"k": b"bytes"}, TypeError, "custom"),
        ("custom", {"k": {"nested": 1}}, TypeError, "custom"),
        ("custom", {1: "value"}, TypeError, "custom keys"),
        ("custom", {"k": 2**63}, ValueError, "64-bit"),
        ("custom", {"k": -(2**63) - 1}, ValueError, "64-bit"),
        ("payload", b"raw bytes", TypeError, "Payload"),
        ("max_attempts", -1, ValueError, "max_attempts"),
        ("max_attempts", 2**32, ValueError, "max_attempts"),
        ("idempotency_key", 17, TypeError, "idempotency_key"),
        ("scheduled_at", "tomorrow", TypeError, "scheduled_at"),
        ("trace_context", "00-abc", TypeError, "trace_context"),
    ],
)
async def test_bad_job_fails_before_any_rpc(
    recorded: tuple[ScriptedServer, SeppClient],
    attribute: str,
    value: object,
    error: type[Exception],
    match: str,
) -> None:
    _, client = recorded
    good, bad = job("q"), job("q")
    setattr(bad, attribute, value)  # EnqueueRequest is mutable: checked again when sent
    with pytest.raises(error, match=match):
        await client.enqueue(bad)
    with pytest.raises(error, match=match):
        await client.enqueue_batch([good, good, bad])
    with pytest.raises(error, match=match):
        await client.enqueue_atomic([good, bad])


async def test_a_bad_job_raises_the_same_once_the_limits_are_known() -> None:
    # The payload limit check used to read payload.data before the job was checked:
    # a payload that is not a Payload raised AttributeError only on an informed client.
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("GetServerInfo", server_info_bytes(max_payload_bytes=64))
        await client.get_server_info()
        calls = len(server.calls)
        bad = EnqueueRequest("q", "t", payload=b"raw")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="payload must be a Payload or None"):
            await client.enqueue(bad)
        with pytest.raises(TypeError, match="payload must be a Payload or None"):
            await client.enqueue_atomic([job("q", payload=Payload(b"x" * 65, "raw")), bad])
        assert len(server.calls) == calls


async def test_custom_value_errors_name_the_key(
    recorded: tuple[ScriptedServer, SeppClient],
) -> None:
    _, client = recorded
    with pytest.raises(TypeError, match="'tenant'") as info:
        await client.enqueue(job("q", custom={"ok": 1, "tenant": object()}))
    assert "object" in str(info.value)
    with pytest.raises(ValueError, match="'big'"):
        await client.enqueue(job("q", custom={"big": 2**64}))


# -- ReserveOptions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"queues": []}, ValueError, "at least one queue"),
        ({"queues": ["a", ""]}, ValueError, "index 1"),
        ({"queues": ["", "b"]}, ValueError, "index 0"),
        ({"queues": "abc"}, TypeError, "not a str"),
        ({"lease_duration": timedelta(0)}, ValueError, "lease_duration"),
        ({"lease_duration": 0}, ValueError, "lease_duration"),
        ({"lease_duration": timedelta(seconds=-1)}, ValueError, "lease_duration"),
        ({"lease_duration": -0.5}, ValueError, "lease_duration"),
        ({"wait_timeout": timedelta(seconds=-1)}, ValueError, "wait_timeout"),
        ({"wait_timeout": -1}, ValueError, "wait_timeout"),
        ({"max_jobs": 0}, ValueError, "max_jobs"),
        ({"max_jobs": -3}, ValueError, "max_jobs"),
        ({"max_jobs": True}, ValueError, "max_jobs"),
        ({"worker_id": ""}, ValueError, "worker_id"),
    ],
)
def test_bad_reserve_options(fields: dict[str, Any], error: type[Exception], match: str) -> None:
    base: dict[str, Any] = {"queues": ["q"], "lease_duration": timedelta(seconds=30)}
    with pytest.raises(error, match=match):
        ReserveOptions(**{**base, **fields})


def test_reserve_options_defaults() -> None:
    options = ReserveOptions(["q"], 2.5)  # type: ignore[arg-type]
    assert options.lease_duration == timedelta(seconds=2.5)
    assert options.wait_timeout == timedelta(seconds=30)
    assert options.worker_id is None and options.max_jobs is None


@pytest.mark.parametrize(
    ("attribute", "value", "match"),
    [
        ("max_jobs", 0, "max_jobs"),
        ("queues", [], "at least one queue"),
        ("queues", ["ok", ""], "index 1"),
        ("lease_duration", timedelta(0), "lease_duration"),
        ("wait_timeout", timedelta(seconds=-2), "wait_timeout"),
        ("worker_id", "", "worker_id"),
    ],
)
async def test_reserve_rechecks_mutated_options_before_any_rpc(
    recorded: tuple[ScriptedServer, SeppClient], attribute: str, value: object, match: str
) -> None:
    _, client = recorded
    options = opts("q")
    setattr(options, attribute, value)
    with pytest.raises(ValueError, match=match):
        await client.reserve(options)


async def test_reserve_takes_only_reserve_options(
    recorded: tuple[ScriptedServer, SeppClient],
) -> None:
    _, client = recorded
    with pytest.raises(TypeError, match="ReserveOptions"):
        await client.reserve({"queues": ["q"]})  # type: ignore[arg-type]


# -- durations and directives --------------------------------------------------------


@pytest.mark.parametrize("extension", [-1, 0, timedelta(seconds=-5), timedelta(0), "10"])
async def test_bad_extend_fails_before_any_rpc(
    recorded: tuple[ScriptedServer, SeppClient], extension: Any
) -> None:
    _, client = recorded
    with pytest.raises((ValueError, TypeError), match="extension"):
        await client.extend(hand_ctx(), extension)


async def test_job_ctx_extend_checks_duration_and_lease() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        server.script("Reserve", reserve_reply(job_record()))
        jobs = await client.reserve(opts("q"))
        assert jobs is not None
        calls_before = len(server.calls)
        with pytest.raises(ValueError, match="extension"):
            await jobs[0].ctx.extend(-1)
        with pytest.raises(ValueError, match="extension"):
            await jobs[0].ctx.extend(timedelta(0))
        with pytest.raises(RuntimeError, match="no lease"):
            await hand_ctx().extend(10)
        assert len(server.calls) == calls_before


@pytest.mark.parametrize("delay", [-1, timedelta(seconds=-0.001), float("nan")])
def test_retry_directive_after_rejects_negative_delay(delay: Any) -> None:
    with pytest.raises(ValueError, match="delay"):
        RetryDirective.after(delay)


def test_retry_directive_shapes() -> None:
    with pytest.raises(ValueError, match="kind"):
        RetryDirective("later")
    with pytest.raises(ValueError, match="needs a delay"):
        RetryDirective("after")
    with pytest.raises(ValueError, match="takes no delay"):
        RetryDirective("dead_letter", timedelta(seconds=1))
    assert RetryDirective.after(2).delay == timedelta(seconds=2)


async def test_bad_nack_arguments_fail_before_any_rpc(
    recorded: tuple[ScriptedServer, SeppClient],
) -> None:
    _, client = recorded
    with pytest.raises(TypeError, match="RetryDirective"):
        await client.nack(hand_ctx(), "default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reason"):
        await client.nack(hand_ctx(), RetryDirective.DEFAULT, None)  # type: ignore[arg-type]


def test_retry_policy_checks_and_floors() -> None:
    with pytest.raises(ValueError, match="initial_backoff"):
        RetryPolicy(initial_backoff=-1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_backoff"):
        RetryPolicy(max_backoff=timedelta(seconds=-1))
    policy = RetryPolicy(max_attempts=0, multiplier=0.5)
    assert (policy.max_attempts, policy.multiplier) == (1, 1.0)
    default = RetryPolicy()
    assert (default.max_attempts, default.initial_backoff, default.max_backoff) == (
        1,
        timedelta(milliseconds=100),
        timedelta(seconds=10),
    )
    assert (default.multiplier, default.jitter) == (2.0, True)


# -- trace context -------------------------------------------------------------------


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-abc",
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ],
)
def test_invalid_traceparent(traceparent: str) -> None:
    with pytest.raises(TraceContextError, match="traceparent") as info:
        TraceContext(traceparent)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "FF-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00",
    ],
)
def test_valid_traceparent(traceparent: str) -> None:
    assert TraceContext(traceparent, "a=b").traceparent == traceparent


def test_tracestate_must_be_text() -> None:
    with pytest.raises(TraceContextError):
        TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 5)  # type: ignore[arg-type]


# -- drain ---------------------------------------------------------------------------


async def test_drain_zero_returns_empty_without_rpc(
    recorded: tuple[ScriptedServer, SeppClient],
) -> None:
    _, client = recorded
    assert await client.drain_dead_letters(max_records=0) == []
    assert await client.drain_dead_letters("q", max_records=0) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_records": -1}, "max_records"),
        ({"max_records": True}, "max_records"),
        ({"max_records": 1.5}, "max_records"),
        ({"queue": ""}, "queue"),
    ],
)
async def test_bad_drain_arguments(
    recorded: tuple[ScriptedServer, SeppClient], kwargs: dict[str, Any], match: str
) -> None:
    _, client = recorded
    with pytest.raises(ValueError, match=match):
        await client.drain_dead_letters(**kwargs)


async def test_payload_and_scheduled_at_edge_values_are_sent() -> None:
    # Not refused client-side: an empty payload (the server refuses it) and a
    # pre-epoch schedule (dropped, the job runs now), as sepp-py does.
    async with ScriptedServer() as server, connected(server.addr) as client:
        await client.enqueue(
            EnqueueRequest(
                "q",
                "t",
                payload=Payload(b"", "text/plain"),
                scheduled_at=datetime(1969, 12, 31, tzinfo=timezone.utc),
            )
        )
    from sepp_lite._codec.enqueue import decode_enqueue_batch_request

    sent = decode_enqueue_batch_request(server.calls[0].request)[0]
    assert sent.payload == (b"", "text/plain")
    assert sent.scheduled_at is None
