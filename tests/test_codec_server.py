"""The server half of the hand-written codec (used by the in-process test server).

Requests encoded by betterproto must decode to exactly their values, presence included;
responses encoded by the server must read back in betterproto (values) and protobuf
(presence) as intended; and every client/server message pair must round-trip.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import betterproto
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sepp_lite import errors
from sepp_lite._codec.dead_letters import (
    DeadLetterOut,
    decode_drain_dead_letters_request,
    decode_drain_dead_letters_response,
    encode_drain_dead_letters_request,
    encode_drain_dead_letters_response,
)
from sepp_lite._codec.enqueue import (
    decode_enqueue_atomic_response,
    decode_enqueue_batch_request,
    decode_enqueue_batch_response,
    encode_enqueue_atomic_response,
    encode_enqueue_batch_request,
    encode_enqueue_batch_response,
    trace_context_field,
)
from sepp_lite._codec.job import (
    JobRecord,
    decode_reserve_request,
    decode_reserve_response,
    encode_reserve_request,
    encode_reserve_response,
)
from sepp_lite._codec.job_rejection import RawScheduledTooFar, write_job_rejection
from sepp_lite._codec.lease import (
    decode_ack_request,
    decode_ack_response,
    decode_extend_request,
    decode_extend_response,
    decode_nack_request,
    decode_nack_response,
    encode_ack_request,
    encode_ack_response,
    encode_extend_request,
    encode_extend_response,
    encode_nack_request,
    encode_nack_response,
    nack_retry_field,
)
from sepp_lite._codec.server_info import encode_get_server_info_response
from sepp_lite._proto.sepp import v1 as pb
from sepp_lite.types import (
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    ReserveOptions,
    ServerInfo,
    TraceContext,
)
from tests import protobuf_ref, wire_edit
from tests import strategies as s

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _slots(value: object) -> dict[str, Any]:
    return {name: getattr(value, name) for name in type(value).__slots__}  # type: ignore[attr-defined]


def _duration_or_none(td: timedelta) -> Optional[tuple[int, int]]:
    # betterproto 2.0.0b7 leaves a zero Duration in a plain field off the wire.
    return s.duration_parts(td) if td else None


# ---------------------------------------------------------------------------------------
# Server decode of betterproto-encoded requests


def _expected_enqueue_in(msg: pb.EnqueueRequest) -> dict[str, Any]:
    tc = msg.trace_context
    return {
        "custom": {key: s.primitive_from_pb(value) for key, value in msg.custom.items()},
        "idempotency_key": msg.idempotency_key,
        "job_type": msg.job_type,
        "max_attempts": msg.max_attempts,
        "payload": None if msg.payload is None else (msg.payload.data, msg.payload.encoding),
        "priority": msg.priority,
        "queue": msg.queue,
        # betterproto cannot send the epoch; the strategies never ask it to.
        "scheduled_at": None
        if msg.scheduled_at == s.EPOCH
        else s.timestamp_parts(msg.scheduled_at),
        "trace": None if tc is None else (tc.traceparent, tc.tracestate),
    }


@SOME
@given(msgs=st.lists(s.pb_enqueue_requests(), max_size=4))
def test_enqueue_batch_request_decodes_with_presence(msgs: list[pb.EnqueueRequest]) -> None:
    decoded = decode_enqueue_batch_request(bytes(pb.EnqueueBatchRequest(msgs)))
    assert s.norm([_slots(job) for job in decoded]) == s.norm(
        [_expected_enqueue_in(msg) for msg in msgs]
    )


@SOME
@given(msg=s.pb_reserve_requests)
def test_reserve_request_decodes_with_presence(msg: pb.ReserveRequest) -> None:
    decoded = decode_reserve_request(bytes(msg))
    assert s.norm(_slots(decoded)) == s.norm(
        {
            "lease_duration": _duration_or_none(msg.lease_duration),
            "max_jobs": msg.max_jobs,
            "queues": list(msg.queues),
            "wait_timeout": _duration_or_none(msg.wait_timeout),
            "worker_id": msg.worker_id,
        }
    )


def _lease_in(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"lease_duration": None, "reason": None, "retry": None}
    return {**base, **fields}


@SOME
@given(msg=s.pb_ack_requests)
def test_ack_request_decodes(msg: pb.AckRequest) -> None:
    decoded = decode_ack_request(bytes(msg))
    expected = _lease_in(job_id=msg.job_id, attempt=msg.attempt, worker_id=msg.worker_id)
    assert s.norm(_slots(decoded)) == s.norm(expected)


def _retry_value(retry: Optional[pb.NackRetry]) -> Optional[tuple[object, ...]]:
    if retry is None:
        return None
    name, value = betterproto.which_one_of(retry, "strategy")
    if name == "delay":
        return ("delay", *s.duration_parts(value))
    return (name,) if name else ("unset",)


@SOME
@given(msg=s.pb_nack_requests)
def test_nack_request_decodes_every_retry_strategy(msg: pb.NackRequest) -> None:
    decoded = decode_nack_request(bytes(msg))
    expected = _lease_in(
        job_id=msg.job_id,
        attempt=msg.attempt,
        worker_id=msg.worker_id,
        reason=msg.reason,
        retry=_retry_value(msg.retry),
    )
    assert s.norm(_slots(decoded)) == s.norm(expected)


@SOME
@given(msg=s.pb_extend_requests)
def test_extend_request_decodes(msg: pb.ExtendRequest) -> None:
    decoded = decode_extend_request(bytes(msg))
    expected = _lease_in(
        job_id=msg.job_id,
        attempt=msg.attempt,
        worker_id=msg.worker_id,
        lease_duration=_duration_or_none(msg.lease_duration),
    )
    assert s.norm(_slots(decoded)) == s.norm(expected)


@SOME
@given(msg=s.pb_drain_requests)
def test_drain_request_decodes(msg: pb.DrainDeadLettersRequest) -> None:
    assert decode_drain_dead_letters_request(bytes(msg)) == (msg.queue, msg.max)


def test_zero_durations_and_epoch_are_present_per_protobuf() -> None:
    # What betterproto cannot send: present-but-zero Durations and Timestamps.
    reserve = protobuf_ref.new("ReserveRequest", queues=["q"])
    reserve.wait_timeout.SetInParent()
    reserve.lease_duration.SetInParent()
    decoded = decode_reserve_request(reserve.SerializeToString())
    assert (decoded.wait_timeout, decoded.lease_duration) == ((0, 0), (0, 0))
    assert decode_reserve_request(b"").wait_timeout is None
    job = protobuf_ref.new("EnqueueRequest", queue="q", job_type="t")
    job.scheduled_at.SetInParent()
    batch = protobuf_ref.new("EnqueueBatchRequest", jobs=[job])
    assert decode_enqueue_batch_request(batch.SerializeToString())[0].scheduled_at == (0, 0)
    extend = protobuf_ref.new("ExtendRequest", job_id="j")
    extend.lease_duration.SetInParent()
    lease = decode_extend_request(extend.SerializeToString()).lease_duration
    assert lease == (0, 0)


# ---------------------------------------------------------------------------------------
# Server encode, read back by betterproto (values) and protobuf (presence)


def _check_job_pb(msg: pb.Job, record: JobRecord, attempt: int, expiry_ms: int) -> None:
    assert (msg.id, msg.queue, msg.job_type) == (record.id, record.queue, record.job_type)
    assert (msg.priority, msg.attempt, msg.max_attempts) == (
        record.priority,
        attempt,
        record.max_attempts,
    )
    payload = None if msg.payload is None else (msg.payload.data, msg.payload.encoding)
    assert payload == record.payload
    tc = msg.trace_context
    assert (None if tc is None else (tc.traceparent, tc.tracestate)) == record.trace
    custom = {key: s.primitive_from_pb(value) for key, value in msg.custom.items()}
    assert s.norm(custom) == s.norm(record.custom)
    assert msg.enqueued_at == s.ms_datetime(record.enqueued_ms)
    assert msg.lease_expires_at == s.ms_datetime(expiry_ms)


def _check_job_presence(ref: Any, record: JobRecord, expiry_ms: int) -> None:
    # Timestamps are always on the wire (the epoch too); scheduled_at only when set, with
    # its nanoseconds intact.
    assert ref.HasField("enqueued_at") and ref.HasField("lease_expires_at")
    assert protobuf_ref.seconds_nanos(ref.enqueued_at) == _ms_parts(record.enqueued_ms)
    assert protobuf_ref.seconds_nanos(ref.lease_expires_at) == _ms_parts(expiry_ms)
    assert ref.HasField("scheduled_at") == (record.scheduled_at is not None)
    if record.scheduled_at is not None:
        assert protobuf_ref.seconds_nanos(ref.scheduled_at) == record.scheduled_at
    assert ref.HasField("payload") == (record.payload is not None)
    assert ref.HasField("trace_context") == (record.trace is not None)
    if record.trace is not None:
        assert ref.trace_context.HasField("tracestate") == (record.trace[1] is not None)


def _ms_parts(ms: int) -> tuple[int, int]:
    seconds, rest = divmod(ms, 1000)
    return seconds, rest * 1_000_000


deliveries = st.lists(st.tuples(s.job_records(valid=False), s.uint32s, s.timestamp_ms), max_size=3)


@SOME
@given(items=deliveries)
def test_reserve_response_reads_back_in_betterproto_and_protobuf(
    items: list[tuple[JobRecord, int, int]],
) -> None:
    data = encode_reserve_response(items)
    msg = pb.ReserveResponse().parse(data)
    ref = protobuf_ref.parse("ReserveResponse", data)
    assert len(msg.jobs) == len(ref.jobs) == len(items)
    for job_msg, job_ref, (record, attempt, expiry) in zip(msg.jobs, ref.jobs, items):
        _check_job_pb(job_msg, record, attempt, expiry)
        _check_job_presence(job_ref, record, expiry)


@SOME
@given(outcomes=st.lists(st.tuples(s.texts, st.booleans()) | s.rejections, max_size=4))
def test_enqueue_batch_response_reads_back(outcomes: list[Any]) -> None:
    msg = pb.EnqueueBatchResponse().parse(encode_enqueue_batch_response(outcomes))
    decoded: list[Any] = []
    for result in msg.results:
        name, value = betterproto.which_one_of(result, "outcome")
        if name == "success":
            decoded.append((value.job_id, value.deduplicated))
        else:
            assert name == "rejection"
            decoded.append(s.rejection_from_pb(value))
    assert s.norm(decoded) == s.norm(outcomes)


@SOME
@given(rejection=s.rejections)
def test_job_rejection_body_reads_back(rejection: errors.JobRejection) -> None:
    parsed = pb.JobRejection().parse(write_job_rejection(rejection))
    assert s.norm(s.rejection_from_pb(parsed)) == s.norm(rejection)


@SOME
@given(acks=st.lists(st.tuples(s.texts, st.booleans()), max_size=4))
def test_atomic_success_reads_back(acks: list[tuple[str, bool]]) -> None:
    msg = pb.EnqueueAtomicResponse().parse(encode_enqueue_atomic_response(success=acks))
    name, value = betterproto.which_one_of(msg, "outcome")
    assert name == "success"
    assert [(r.job_id, r.deduplicated) for r in value.responses] == acks


@SOME
@given(failures=st.lists(st.tuples(s.uint32s, s.rejections), max_size=4))
def test_atomic_failure_reads_back(failures: list[tuple[int, errors.JobRejection]]) -> None:
    msg = pb.EnqueueAtomicResponse().parse(encode_enqueue_atomic_response(rejection=failures))
    name, value = betterproto.which_one_of(msg, "outcome")
    assert name == "rejection"
    decoded = [(e.index, s.rejection_from_pb(e.rejection)) for e in value.errors]
    assert s.norm(decoded) == s.norm(failures)


@SOME
@given(job_id=s.texts, dead_lettered=st.booleans(), expiry=s.timestamp_ms)
def test_ack_nack_extend_responses_read_back(job_id: str, dead_lettered: bool, expiry: int) -> None:
    assert pb.AckResponse().parse(encode_ack_response(job_id)).job_id == job_id
    nack = pb.NackResponse().parse(encode_nack_response(job_id, dead_lettered))
    assert (nack.job_id, nack.dead_lettered) == (job_id, dead_lettered)
    data = encode_extend_response(job_id, expiry)
    extend = pb.ExtendResponse().parse(data)
    assert (extend.job_id, extend.lease_expires_at) == (job_id, s.ms_datetime(expiry))
    ref = protobuf_ref.parse("ExtendResponse", data)
    assert ref.HasField("lease_expires_at")  # even at the epoch
    assert protobuf_ref.seconds_nanos(ref.lease_expires_at) == _ms_parts(expiry)


dead_letters = st.builds(
    DeadLetterOut,
    s.job_records(valid=False),
    s.causes,
    s.timestamp_ms,
    s.uint32s,
    st.none() | s.texts,
)


@SOME
@given(records=st.lists(dead_letters, max_size=3))
def test_drain_response_reads_back(records: list[DeadLetterOut]) -> None:
    data = encode_drain_dead_letters_response(records)
    msg = pb.DrainDeadLettersResponse().parse(data)
    ref = protobuf_ref.parse("DrainDeadLettersResponse", data)
    assert len(msg.records) == len(ref.records) == len(records)
    for rec_msg, rec_ref, record in zip(msg.records, ref.records, records):
        # The snapshot carries the final attempt and the epoch as its lease expiry.
        _check_job_pb(rec_msg.job, record.job, record.final_attempt, 0)
        _check_job_presence(rec_ref.job, record.job, 0)
        assert (int(rec_msg.cause), rec_msg.final_attempt) == (record.cause, record.final_attempt)
        assert rec_msg.failed_at == s.ms_datetime(record.failed_ms)
        assert rec_ref.HasField("failed_at")
        assert rec_ref.HasField("last_reason") == (record.last_reason is not None)
        assert rec_msg.last_reason == record.last_reason


@SOME
@given(
    horizon=s.durations,
    wire_actual=st.tuples(st.integers(-(2**40), 2**40), st.integers(0, 999_999_999)),
)
def test_raw_scheduled_too_far_echoes_the_request_timestamp(
    horizon: timedelta, wire_actual: tuple[int, int]
) -> None:
    rejection = RawScheduledTooFar(horizon, s.EPOCH, wire_actual=wire_actual)
    ref = protobuf_ref.parse("JobRejection", write_job_rejection(rejection))
    assert ref.WhichOneof("reason") == "scheduled_too_far"
    assert protobuf_ref.seconds_nanos(ref.scheduled_too_far.actual) == wire_actual
    assert protobuf_ref.seconds_nanos(ref.scheduled_too_far.horizon) == s.duration_parts(horizon)


_INFO_SCALARS = [
    "restricts_encodings",
    "max_payload_bytes",
    "max_custom_entries",
    "max_custom_total_bytes",
    "max_custom_key_bytes",
    "max_queue_name_bytes",
    "max_job_type_bytes",
    "max_idempotency_key_bytes",
    "max_enqueue_batch",
    "max_reserve_batch",
    "max_reserve_queues",
    "strict_queues",
    "dead_letter_retention_enabled",
]
_INFO_DURATIONS = ["max_schedule_horizon", "max_wait_timeout", "max_lease_duration"]


@SOME
@given(info=s.server_infos)
def test_server_info_encodes_per_protobuf(info: ServerInfo) -> None:
    ref = protobuf_ref.parse("GetServerInfoResponse", encode_get_server_info_response(info))
    assert ref.server_version == info.version
    assert list(ref.supported_protocol_versions) == info.supported_protocol_versions
    assert list(ref.allowed_encodings) == info.allowed_encodings
    assert ref.HasField("server_time")
    assert protobuf_ref.seconds_nanos(ref.server_time) == s.timestamp_parts(info.server_time)
    for name in _INFO_SCALARS:
        assert getattr(ref, name) == getattr(info, name), name
    for name in _INFO_DURATIONS:
        parts = protobuf_ref.seconds_nanos(getattr(ref, name))
        assert parts == s.duration_parts(getattr(info, name)), name


# ---------------------------------------------------------------------------------------
# Round trips: client encode -> server decode

_OFFSETS = [timezone(timedelta(hours=3)), timezone(timedelta(hours=-11, minutes=-30))]
scheduled_any = st.one_of(
    st.none(),
    s.from_epoch,
    s.before_epoch,
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(3000, 1, 1)),
    st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(3000, 1, 1),
        timezones=st.sampled_from(_OFFSETS),
    ),
)


def _enqueue_in_of(job: EnqueueRequest, injected: Optional[TraceContext]) -> dict[str, Any]:
    tc = job.trace_context or injected
    when = job.scheduled_at
    if when is not None:
        when = when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when
    return {
        "custom": dict(job.custom),
        "idempotency_key": job.idempotency_key,
        "job_type": job.job_type,
        "max_attempts": job.max_attempts,
        "payload": None if job.payload is None else (job.payload.data, job.payload.encoding),
        "priority": None if job.priority is None else int(job.priority),
        "queue": job.queue,
        "scheduled_at": None if when is None or when < s.EPOCH else s.timestamp_parts(when),
        "trace": None if tc is None else (tc.traceparent, tc.tracestate),
    }


@SOME
@given(
    jobs=st.lists(
        s.enqueue_requests(scheduled=scheduled_any, custom=s.custom_maps), min_size=1, max_size=4
    ),
    injected=st.none() | s.trace_contexts,
)
def test_enqueue_batch_client_to_server(
    jobs: list[EnqueueRequest], injected: Optional[TraceContext]
) -> None:
    field = (
        b"" if injected is None else trace_context_field(injected.traceparent, injected.tracestate)
    )
    decoded = decode_enqueue_batch_request(encode_enqueue_batch_request(jobs, field))
    assert s.norm([_slots(job) for job in decoded]) == s.norm(
        [_enqueue_in_of(job, injected) for job in jobs]
    )


@SOME
@given(opts=s.reserve_options, override=st.none() | s.uint32s)
def test_reserve_client_to_server(opts: ReserveOptions, override: Optional[int]) -> None:
    decoded = decode_reserve_request(encode_reserve_request(opts, override))
    assert s.norm(_slots(decoded)) == s.norm(
        {
            "lease_duration": s.duration_parts(opts.lease_duration),
            "max_jobs": opts.max_jobs if override is None else override,
            "queues": list(opts.queues),
            "wait_timeout": s.duration_parts(opts.wait_timeout),
            "worker_id": opts.worker_id,
        }
    )


@SOME
@given(
    job_id=s.texts,
    attempt=s.uint32s,
    worker_id=st.none() | s.texts,
    reason=st.none() | s.texts,
    retry=s.nack_retries,
    lease=s.durations,
)
def test_lease_requests_client_to_server(
    job_id: str,
    attempt: int,
    worker_id: Optional[str],
    reason: Optional[str],
    retry: tuple[str, Optional[timedelta]],
    lease: timedelta,
) -> None:
    common = {"job_id": job_id, "attempt": attempt, "worker_id": worker_id}
    ack = decode_ack_request(encode_ack_request(job_id, attempt, worker_id))
    assert s.norm(_slots(ack)) == s.norm(_lease_in(**common))
    kind, delay = retry
    retry_field = nack_retry_field(kind, delay)
    nack_bytes = encode_nack_request(job_id, attempt, reason, retry_field, worker_id)
    nack = decode_nack_request(nack_bytes)
    expected_retry = ("delay", *s.duration_parts(delay)) if delay is not None else (kind,)
    assert s.norm(_slots(nack)) == s.norm(_lease_in(**common, reason=reason, retry=expected_retry))
    extend_bytes = encode_extend_request(job_id, attempt, lease, worker_id)
    extend = decode_extend_request(extend_bytes)
    expected = _lease_in(**common, lease_duration=s.duration_parts(lease))
    assert s.norm(_slots(extend)) == s.norm(expected)


@SOME
@given(queue=st.none() | s.texts, limit=st.none() | s.uint32s)
def test_drain_client_to_server(queue: Optional[str], limit: Optional[int]) -> None:
    assert decode_drain_dead_letters_request(encode_drain_dead_letters_request(queue, limit)) == (
        queue,
        limit,
    )


# ---------------------------------------------------------------------------------------
# Round trips: server encode -> client decode


@SOME
@given(items=st.lists(st.tuples(s.job_records(), s.uint32s, s.timestamp_ms), max_size=4))
def test_reserve_server_to_client(items: list[tuple[JobRecord, int, int]]) -> None:
    jobs, problems = decode_reserve_response(encode_reserve_response(items))
    assert problems == []
    expected = [s.expected_job_from_record(*item) for item in items]
    assert s.norm(jobs) == s.norm(expected)


def _acceptable(record: JobRecord) -> bool:
    return bool(record.id) and bool(record.job_type) and record.priority <= 9


@SOME
@given(items=deliveries)
def test_reserve_server_to_client_skips_what_the_client_refuses(
    items: list[tuple[JobRecord, int, int]],
) -> None:
    jobs, problems = decode_reserve_response(encode_reserve_response(items))
    kept = [item for item in items if _acceptable(item[0])]
    # Invalid trace contexts are dropped (expected_job_from_record), not fatal.
    assert s.norm(jobs) == s.norm([s.expected_job_from_record(*item) for item in kept])
    assert len(problems) == len(items) - len(kept)


def _batch_value(outcome: Any) -> object:
    return EnqueueAck(*outcome) if isinstance(outcome, tuple) else outcome


@SOME
@given(outcomes=st.lists(st.tuples(s.texts, st.booleans()) | s.rejections, max_size=5))
def test_enqueue_batch_server_to_client(outcomes: list[Any]) -> None:
    decoded = decode_enqueue_batch_response(encode_enqueue_batch_response(outcomes))
    assert s.norm(decoded) == s.norm([_batch_value(o) for o in outcomes])


@pytest.mark.parametrize("index", range(len(s.rejection_variants)))
@FEW
@given(data=st.data())
def test_every_rejection_variant_round_trips(index: int, data: st.DataObject) -> None:
    rejection = data.draw(s.rejection_variants[index])
    decoded = decode_enqueue_batch_response(encode_enqueue_batch_response([rejection]))
    assert s.norm(decoded) == s.norm([rejection])


def test_unknown_rejection_round_trips() -> None:
    data = encode_enqueue_batch_response([errors.UnknownRejection()])
    assert decode_enqueue_batch_response(data) == [errors.UnknownRejection()]


def test_scheduled_too_far_before_the_epoch_reads_as_the_epoch() -> None:
    rejection = errors.ScheduledTooFar(timedelta(hours=1), s.EPOCH - timedelta(seconds=90))
    decoded = decode_enqueue_batch_response(encode_enqueue_batch_response([rejection]))
    assert decoded == [errors.ScheduledTooFar(timedelta(hours=1), s.EPOCH)]


@SOME
@given(acks=st.lists(st.tuples(s.texts, st.booleans()), max_size=4))
def test_atomic_success_server_to_client(acks: list[tuple[str, bool]]) -> None:
    decoded = decode_enqueue_atomic_response(encode_enqueue_atomic_response(success=acks))
    assert decoded == ("success", [EnqueueAck(*ack) for ack in acks])


@SOME
@given(failures=st.lists(st.tuples(s.uint32s, s.rejections), max_size=4))
def test_atomic_failure_server_to_client(failures: list[tuple[int, errors.JobRejection]]) -> None:
    decoded = decode_enqueue_atomic_response(encode_enqueue_atomic_response(rejection=failures))
    expected = ("rejection", [errors.JobValidationError(i, r) for i, r in failures])
    assert s.norm(decoded) == s.norm(expected)


@SOME
@given(job_id=s.texts, dead_lettered=st.booleans(), expiry=s.timestamp_ms)
def test_ack_nack_extend_server_to_client(job_id: str, dead_lettered: bool, expiry: int) -> None:
    assert decode_ack_response(encode_ack_response(job_id)) == job_id
    assert decode_nack_response(encode_nack_response(job_id, dead_lettered)) == (
        job_id,
        dead_lettered,
    )
    decoded = decode_extend_response(encode_extend_response(job_id, expiry))
    assert s.norm(decoded) == s.norm((job_id, s.ms_datetime(expiry)))


def _expected_dead_letter(out: DeadLetterOut) -> DeadLetterRecord:
    ctx = s.expected_job_from_record(out.job, out.final_attempt, 0).ctx
    return DeadLetterRecord(
        queue=ctx.queue,
        job_id=ctx.id,
        job_type=ctx.job_type,
        payload=s.record_payload(out.job),
        priority=ctx.priority,
        max_attempts=ctx.max_attempts,
        custom=ctx.custom,
        trace_context=ctx.trace_context,
        enqueued_at=ctx.enqueued_at,
        scheduled_at=ctx.scheduled_at,
        cause=s.cause_value(out.cause),
        failed_at=s.ms_datetime(out.failed_ms),
        final_attempt=out.final_attempt,
        last_reason=out.last_reason,
    )


valid_dead_letters = st.builds(
    DeadLetterOut,
    s.job_records(),
    s.causes,
    s.timestamp_ms,
    s.uint32s,
    st.none() | s.texts,
)


@SOME
@given(records=st.lists(valid_dead_letters, max_size=3))
def test_drain_server_to_client(records: list[DeadLetterOut]) -> None:
    decoded, problems = decode_drain_dead_letters_response(
        encode_drain_dead_letters_response(records)
    )
    assert problems == []
    assert s.norm(decoded) == s.norm([_expected_dead_letter(r) for r in records])


# ---------------------------------------------------------------------------------------
# Unknown fields in requests

SERVER_DECODERS: dict[str, Callable[[bytes], object]] = {
    "EnqueueBatchRequest": decode_enqueue_batch_request,
    "ReserveRequest": decode_reserve_request,
    "AckRequest": decode_ack_request,
    "NackRequest": decode_nack_request,
    "ExtendRequest": decode_extend_request,
    "DrainDeadLettersRequest": decode_drain_dead_letters_request,
}


def _decoded(name: str, data: bytes) -> Any:
    return s.norm(SERVER_DECODERS[name](data))


@pytest.mark.parametrize("name", sorted(SERVER_DECODERS))
@FEW
@given(data=st.data())
def test_unknown_fields_change_no_decoded_value(name: str, data: st.DataObject) -> None:
    raw = data.draw(s.MESSAGE_BYTES[name])
    edited = wire_edit.with_unknown_fields(data.draw, raw, name)
    assert _decoded(name, edited) == _decoded(name, raw)


@pytest.mark.parametrize("name", sorted(SERVER_DECODERS))
@FEW
@given(data=st.data())
def test_known_numbers_with_a_wrong_wire_type_are_unknown_fields(
    name: str, data: st.DataObject
) -> None:
    raw = data.draw(s.MESSAGE_BYTES[name])
    edited = wire_edit.with_mistyped_fields(data.draw, raw, name)
    assert _decoded(name, edited) == _decoded(name, raw)
