"""``_sending``: what the server takes, decided once for every sender."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sepp_lite import errors
from sepp_lite._codec.enqueue import encode_enqueue_batch_request
from sepp_lite._sending import (
    DEFAULT_BATCH_JOBS,
    MAX_BATCH_BYTES,
    MAX_MESSAGE_BYTES,
    BatchLimits,
    fit_batches,
    job_rejection,
    sent_size,
)
from sepp_lite.types import EnqueueRequest, Payload, ServerInfo, TraceContext


def info(**limits: int) -> ServerInfo:
    """A server's answer with small limits (``limits`` overriding them)."""
    values: dict[str, object] = {name: 0 for name in ServerInfo.__dataclass_fields__}
    values.update(
        version="0",
        supported_protocol_versions=[],
        allowed_encodings=[],
        server_time=datetime(2026, 1, 1, tzinfo=timezone.utc),
        max_schedule_horizon=timedelta(0),
        max_wait_timeout=timedelta(0),
        max_lease_duration=timedelta(0),
        max_enqueue_batch=4,
        max_payload_bytes=100,
        max_queue_name_bytes=10,
        max_job_type_bytes=10,
        max_idempotency_key_bytes=10,
    )
    values.update(limits)
    return ServerInfo(**values)  # type: ignore[arg-type]


def test_the_defaults_until_the_server_answers() -> None:
    limits = BatchLimits.of(None)
    assert (limits.jobs, limits.size) == (DEFAULT_BATCH_JOBS, MAX_BATCH_BYTES)
    assert (DEFAULT_BATCH_JOBS, MAX_MESSAGE_BYTES) == (256, 16 * 1024 * 1024)
    assert BatchLimits.of(info(max_enqueue_batch=7)).jobs == 7
    assert BatchLimits.of(info(max_enqueue_batch=0)).jobs == 1


def test_batches_are_cut_by_count_and_by_bytes_and_a_large_job_goes_alone() -> None:
    limits = BatchLimits(jobs=3, size=10)
    assert fit_batches([1, 1, 1, 1, 1], limits, int) == [[1, 1, 1], [1, 1]]
    assert fit_batches([4, 4, 4, 4], limits, int) == [[4, 4], [4, 4]]
    assert fit_batches([2, 20, 2], limits, int) == [[2], [20], [2]]
    assert fit_batches([], limits, int) == []
    assert limits.full(3, 0) and limits.full(1, 10) and not limits.full(2, 9)


def test_a_job_over_an_advertised_limit_gets_the_servers_rejection() -> None:
    limits = info()
    job = EnqueueRequest("q" * 11, "t", Payload(b"x" * 101, "raw"))
    assert job_rejection(job, limits) == errors.QueueNameTooLong(10, 11)
    assert job_rejection(job, limits, names=False) == errors.PayloadTooLarge(100, 101)
    assert job_rejection(EnqueueRequest("q", "t" * 12), limits) == errors.JobTypeNameTooLong(10, 12)
    keyed = EnqueueRequest("q", "t", idempotency_key="k" * 11)
    assert job_rejection(keyed, limits) == errors.IdempotencyKeyTooLong(10, 11)
    assert job_rejection(keyed, None) is None  # nothing advertised yet
    assert job_rejection(keyed, info(max_idempotency_key_bytes=0)) is None  # none advertised


def test_a_job_over_the_message_limit() -> None:
    data = b"x" * MAX_MESSAGE_BYTES
    job = EnqueueRequest("q", "t", Payload(data, "raw"))
    size = len(encode_enqueue_batch_request([job]))
    rejection = job_rejection(job, None, size=size)
    assert rejection == errors.PayloadTooLarge(MAX_MESSAGE_BYTES - (size - len(data)), len(data))
    bare = job_rejection(EnqueueRequest("q", "t"), None, size=MAX_MESSAGE_BYTES + 1)
    assert isinstance(bare, errors.InvalidRequest) and "bytes a request may carry" in bare.detail
    assert job_rejection(job, None, size=MAX_MESSAGE_BYTES) is None


@pytest.mark.parametrize("traced", [False, True])
def test_a_job_without_a_trace_context_is_measured_with_room_for_the_clients(
    traced: bool,
) -> None:
    trace = TraceContext("00-" + "a" * 32 + "-" + "b" * 16 + "-01", "k=" + "v" * 510)
    job = EnqueueRequest("q", "t", trace_context=trace if traced else None)
    alone = len(encode_enqueue_batch_request([job]))
    injected = len(encode_enqueue_batch_request([EnqueueRequest("q", "t")], _field(trace)))
    if traced:
        assert sent_size(job, alone) == alone
    else:
        assert sent_size(job, alone) >= injected


def _field(trace: TraceContext) -> bytes:
    from sepp_lite._codec.enqueue import trace_context_field

    return trace_context_field(trace.traceparent, trace.tracestate)
