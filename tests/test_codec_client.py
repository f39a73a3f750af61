"""The client half of the hand-written codec against the schema-true references.

Requests must encode byte for byte as betterproto encodes the same message (where
betterproto 2.0.0b7 is right) and with exact presence per the Google protobuf runtime
(where betterproto cannot tell: zero Durations, epoch Timestamps, Empty oneof members).
Responses encoded by betterproto must decode to the domain values the official clients
produce, with the decode rules of spec/official-clients.md §4.2 and §4.6.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Optional

import pytest
from betterproto.lib.google.protobuf import Empty
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sepp_lite import errors
from sepp_lite._codec.dead_letters import (
    decode_drain_dead_letters_response,
    encode_drain_dead_letters_request,
)
from sepp_lite._codec.enqueue import (
    decode_enqueue_atomic_response,
    decode_enqueue_batch_response,
    encode_enqueue_batch_request,
    trace_context_field,
    write_enqueue_request,
)
from sepp_lite._codec.job import decode_reserve_response, encode_reserve_request
from sepp_lite._codec.lease import (
    decode_ack_response,
    decode_extend_response,
    decode_nack_response,
    encode_ack_request,
    encode_extend_request,
    encode_nack_request,
    nack_retry_field,
)
from sepp_lite._codec.server_info import (
    decode_get_server_info_response,
    encode_get_server_info_response,
)
from sepp_lite._proto.sepp import v1 as pb
from sepp_lite.types import (
    DeadLetterCause,
    EnqueueAck,
    EnqueueRequest,
    Primitive,
    Priority,
    PriorityOutOfRangeError,
    ReserveOptions,
    TraceContext,
    check_enqueue_request,
)
from tests import protobuf_ref, wire_edit
from tests import strategies as s

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# ---------------------------------------------------------------------------------------
# Encoding requests: EnqueueBatchRequest


@SOME
@given(
    jobs=st.lists(s.enqueue_requests(), min_size=1, max_size=4),
    injected=st.none() | s.trace_contexts,
)
def test_enqueue_batch_bytes_equal_betterproto(
    jobs: list[EnqueueRequest], injected: Optional[TraceContext]
) -> None:
    injected_field = (
        b"" if injected is None else trace_context_field(injected.traceparent, injected.tracestate)
    )
    ours = encode_enqueue_batch_request(jobs, injected_field)
    expected = pb.EnqueueBatchRequest([s.enqueue_request_to_pb(job, injected) for job in jobs])
    assert ours == bytes(expected)


@SOME
@given(job=s.enqueue_requests())
def test_enqueue_request_body_bytes_equal_betterproto(job: EnqueueRequest) -> None:
    assert write_enqueue_request(job) == bytes(s.enqueue_request_to_pb(job))


_OFFSETS = [timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
scheduled_any = st.one_of(
    st.none(),
    s.from_epoch,
    s.before_epoch,
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(3000, 1, 1)),  # naive
    st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(3000, 1, 1),
        timezones=st.sampled_from(_OFFSETS),
    ),
)
_MEMBERS = {bool: "bool_value", int: "int_value", float: "double_value", str: "string_value"}


def _same_primitive(ref_value: Any, value: Primitive) -> bool:
    if isinstance(value, float):
        if math.isnan(value):
            return math.isnan(ref_value)
        return struct.pack("<d", ref_value) == struct.pack("<d", value)
    return bool(ref_value == value)


def _check_custom(ref: Any, custom: dict[str, Primitive]) -> None:
    assert set(ref.custom) == set(custom)
    for key, value in custom.items():
        member = ref.custom[key].WhichOneof("value")
        assert member == _MEMBERS[type(value)], (key, value, member)
        assert _same_primitive(getattr(ref.custom[key], member), value)


def _expected_scheduled(job: EnqueueRequest) -> Optional[datetime]:
    when = job.scheduled_at
    if when is None:
        return None
    when = when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when
    return when if when >= s.EPOCH else None


def _check_optional(ref: Any, name: str, value: object) -> None:
    assert ref.HasField(name) == (value is not None), name
    if value is not None:
        assert getattr(ref, name) == value, name


@SOME
@given(job=s.enqueue_requests(scheduled=scheduled_any, custom=s.custom_maps))
def test_enqueue_request_values_and_presence_per_protobuf(job: EnqueueRequest) -> None:
    ref = protobuf_ref.parse("EnqueueRequest", write_enqueue_request(job))
    assert (ref.queue, ref.job_type) == (job.queue, job.job_type)
    assert ref.HasField("payload") == (job.payload is not None)
    if job.payload is not None:
        assert (ref.payload.data, ref.payload.encoding) == (job.payload.data, job.payload.encoding)
    _check_optional(ref, "idempotency_key", job.idempotency_key)
    _check_optional(ref, "priority", None if job.priority is None else int(job.priority))
    _check_optional(ref, "max_attempts", job.max_attempts)
    assert ref.HasField("trace_context") == (job.trace_context is not None)
    if job.trace_context is not None:
        assert ref.trace_context.traceparent == job.trace_context.traceparent
        _check_optional(ref.trace_context, "tracestate", job.trace_context.tracestate)
    _check_custom(ref, dict(job.custom))
    # A Timestamp at the epoch is still present (betterproto could not show this).
    scheduled = _expected_scheduled(job)
    assert ref.HasField("scheduled_at") == (scheduled is not None)
    if scheduled is not None:
        assert protobuf_ref.seconds_nanos(ref.scheduled_at) == s.timestamp_parts(scheduled)


def test_empty_custom_key_is_written_as_protobuf_writes_it() -> None:
    # betterproto leaves an empty map key off the wire; protobuf (and sepp_lite) write it.
    ref = protobuf_ref.new("EnqueueRequest", queue="q", job_type="t")
    ref.custom[""].string_value = ""
    job = EnqueueRequest("q", "t", custom={"": ""})
    assert write_enqueue_request(job) == ref.SerializeToString()
    assert pb.EnqueueRequest().parse(write_enqueue_request(job)).custom[""].string_value == ""


@FEW
@given(job=s.enqueue_requests(scheduled=st.none()), when=s.before_epoch)
def test_scheduled_at_before_the_epoch_is_left_off(job: EnqueueRequest, when: datetime) -> None:
    without = write_enqueue_request(job)
    job.scheduled_at = when
    assert write_enqueue_request(job) == without
    assert not protobuf_ref.parse("EnqueueRequest", without).HasField("scheduled_at")


@FEW
@given(job=s.enqueue_requests(scheduled=s.from_epoch))
def test_naive_scheduled_at_is_read_as_utc(job: EnqueueRequest) -> None:
    aware = write_enqueue_request(job)
    assert job.scheduled_at is not None
    job.scheduled_at = job.scheduled_at.replace(tzinfo=None)
    assert write_enqueue_request(job) == aware


def test_injected_trace_is_used_only_for_jobs_without_their_own() -> None:
    own = TraceContext("00-" + "a" * 32 + "-" + "b" * 16 + "-01", "k=v")
    injected = trace_context_field(TRACEPARENT, None)
    jobs = [EnqueueRequest("q", "t", trace_context=own), EnqueueRequest("q", "t")]
    ref = protobuf_ref.parse("EnqueueBatchRequest", encode_enqueue_batch_request(jobs, injected))
    first, second = ref.jobs
    assert (first.trace_context.traceparent, first.trace_context.tracestate) == (
        own.traceparent,
        "k=v",
    )
    assert second.trace_context.traceparent == TRACEPARENT
    assert not second.trace_context.HasField("tracestate")
    plain = protobuf_ref.parse("EnqueueRequest", write_enqueue_request(EnqueueRequest("q", "t")))
    assert not plain.HasField("trace_context")


# ---------------------------------------------------------------------------------------
# Encoding requests: Reserve, Ack, Nack, Extend, Drain


@SOME
@given(opts=s.reserve_options, override=st.none() | s.uint32s)
def test_reserve_request_per_betterproto_and_protobuf(
    opts: ReserveOptions, override: Optional[int]
) -> None:
    data = encode_reserve_request(opts, override)
    max_jobs = opts.max_jobs if override is None else override
    msg = pb.ReserveRequest().parse(data)
    assert msg.queues == list(opts.queues)
    assert (msg.wait_timeout, msg.lease_duration) == (opts.wait_timeout, opts.lease_duration)
    assert (msg.worker_id, msg.max_jobs) == (opts.worker_id, max_jobs)
    # betterproto 2.0.0b7 drops a zero Duration on encode and reads unset as 0, so only the
    # protobuf runtime shows that both durations are always on the wire, zero included.
    ref = protobuf_ref.parse("ReserveRequest", data)
    assert ref.HasField("wait_timeout") and ref.HasField("lease_duration")
    assert protobuf_ref.seconds_nanos(ref.wait_timeout) == s.duration_parts(opts.wait_timeout)
    assert protobuf_ref.seconds_nanos(ref.lease_duration) == s.duration_parts(opts.lease_duration)
    assert ref.HasField("worker_id") == (opts.worker_id is not None)
    assert ref.HasField("max_jobs") == (max_jobs is not None)
    if opts.wait_timeout:  # no zero Duration: the bytes must be betterproto's exactly
        expected = pb.ReserveRequest(
            list(opts.queues), opts.wait_timeout, opts.lease_duration, opts.worker_id, max_jobs
        )
        assert data == bytes(expected)


@SOME
@given(job_id=s.texts, attempt=s.uint32s, worker_id=st.none() | s.texts)
def test_ack_request_bytes_equal_betterproto(
    job_id: str, attempt: int, worker_id: Optional[str]
) -> None:
    assert encode_ack_request(job_id, attempt, worker_id) == bytes(
        pb.AckRequest(job_id, attempt, worker_id)
    )


def _pb_retry(kind: str, delay: Optional[timedelta]) -> pb.NackRetry:
    if kind == "after":
        return pb.NackRetry(delay=delay)
    if kind == "dead_letter":
        return pb.NackRetry(dead_letter=Empty())
    return pb.NackRetry(default=Empty())


_STRATEGY_MEMBER = {"default": "default", "dead_letter": "dead_letter", "after": "delay"}


@SOME
@given(
    job_id=s.texts,
    attempt=s.uint32s,
    reason=st.none() | s.texts,
    retry=s.nack_retries,
    worker_id=st.none() | s.texts,
)
def test_nack_request_bytes_equal_betterproto(
    job_id: str,
    attempt: int,
    reason: Optional[str],
    retry: tuple[str, Optional[timedelta]],
    worker_id: Optional[str],
) -> None:
    kind, delay = retry
    data = encode_nack_request(job_id, attempt, reason, nack_retry_field(kind, delay), worker_id)
    # Inside a oneof betterproto keeps a zero delay and the Empty members: bytes equal.
    expected = pb.NackRequest(job_id, attempt, reason, _pb_retry(kind, delay), worker_id)
    assert data == bytes(expected)
    ref = protobuf_ref.parse("NackRequest", data)
    assert ref.HasField("retry")
    assert ref.retry.WhichOneof("strategy") == _STRATEGY_MEMBER[kind]
    if delay is not None:
        assert protobuf_ref.seconds_nanos(ref.retry.delay) == s.duration_parts(delay)
    assert ref.HasField("reason") == (reason is not None)


@SOME
@given(job_id=s.texts, attempt=s.uint32s, lease=s.durations, worker_id=st.none() | s.texts)
def test_extend_request_per_betterproto_and_protobuf(
    job_id: str, attempt: int, lease: timedelta, worker_id: Optional[str]
) -> None:
    data = encode_extend_request(job_id, attempt, lease, worker_id)
    msg = pb.ExtendRequest().parse(data)
    assert (msg.job_id, msg.attempt, msg.lease_duration, msg.worker_id) == (
        job_id,
        attempt,
        lease,
        worker_id,
    )
    ref = protobuf_ref.parse("ExtendRequest", data)
    assert ref.HasField("lease_duration")
    assert protobuf_ref.seconds_nanos(ref.lease_duration) == s.duration_parts(lease)
    if lease:  # betterproto 2.0.0b7 drops a zero Duration; sepp_lite keeps it
        assert data == bytes(pb.ExtendRequest(job_id, attempt, lease, worker_id))


@SOME
@given(queue=st.none() | s.texts, limit=st.none() | s.uint32s)
def test_drain_request_bytes_equal_betterproto(queue: Optional[str], limit: Optional[int]) -> None:
    assert encode_drain_dead_letters_request(queue, limit) == bytes(
        pb.DrainDeadLettersRequest(queue, limit)
    )


# ---------------------------------------------------------------------------------------
# Validation before encoding

negative_durations = st.timedeltas(max_value=-s.ONE_US)


@FEW
@given(delay=negative_durations)
def test_negative_nack_delay_is_refused(delay: timedelta) -> None:
    with pytest.raises(ValueError):
        nack_retry_field("after", delay)


@FEW
@given(lease=negative_durations)
def test_negative_extend_lease_is_refused(lease: timedelta) -> None:
    with pytest.raises(ValueError):
        encode_extend_request("job", 1, lease, None)


@pytest.mark.parametrize("field", ["wait_timeout", "lease_duration"])
def test_negative_reserve_durations_are_refused(field: str) -> None:
    opts = ReserveOptions(["q"], lease_duration=timedelta(seconds=30))
    setattr(opts, field, timedelta(microseconds=-1))  # mutable: __post_init__ bypassed
    with pytest.raises(ValueError):
        encode_reserve_request(opts)


@pytest.mark.parametrize(
    "value",
    [None, b"x", bytearray(b"x"), [1], {"a": 1}, (1,), Decimal("1.5"), 1j, object(), s.EPOCH],
    ids=lambda v: type(v).__name__,
)
def test_custom_values_of_other_types_raise_type_error(value: object) -> None:
    job = EnqueueRequest("q", "t", custom={"k": value})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        write_enqueue_request(job)


def test_custom_keys_must_be_str() -> None:
    # A check, not an encoder guard: a key that is not a str cannot be encoded at all.
    job = EnqueueRequest("q", "t", custom={1: "v"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="custom keys must be str"):
        check_enqueue_request(job)


@FEW
@given(value=st.integers(min_value=s.INT64_MAX + 1) | st.integers(max_value=s.INT64_MIN - 1))
def test_custom_int_outside_int64_is_refused(value: int) -> None:
    with pytest.raises(ValueError):
        write_enqueue_request(EnqueueRequest("q", "t", custom={"k": value}))


@pytest.mark.parametrize(
    ("value", "member"),
    [(True, "bool_value"), (False, "bool_value"), (1, "int_value"), (0, "int_value")],
)
def test_bool_custom_is_bool_value_and_int_is_int_value(value: Primitive, member: str) -> None:
    body = write_enqueue_request(EnqueueRequest("q", "t", custom={"k": value}))
    ref = protobuf_ref.parse("EnqueueRequest", body)
    assert ref.custom["k"].WhichOneof("value") == member
    assert getattr(ref.custom["k"], member) == value
    expected = protobuf_ref.new("EnqueueRequest", queue="q", job_type="t")
    setattr(expected.custom["k"], member, value)
    assert body == expected.SerializeToString()


class _Colour(enum.IntEnum):
    RED = 7


class _Mode(str, enum.Enum):
    FAST = "fast"


class _Ratio(float):
    pass


@pytest.mark.parametrize(
    ("value", "member", "plain"),
    [
        (_Colour.RED, "int_value", 7),
        (_Ratio(0.25), "double_value", 0.25),
        (_Mode.FAST, "string_value", "fast"),
    ],
    ids=["IntEnum", "float-subclass", "str-Enum"],
)
def test_custom_value_subclasses_encode_their_base_value(
    value: Primitive, member: str, plain: Primitive
) -> None:
    # protobuf (and so sepp-py) stores the value of a str/int/float subclass, not str(x).
    body = write_enqueue_request(EnqueueRequest("q", "t", custom={"k": value}))
    ref = protobuf_ref.parse("EnqueueRequest", body)
    assert ref.custom["k"].WhichOneof("value") == member
    assert getattr(ref.custom["k"], member) == plain


def test_priority_bool_is_refused() -> None:
    with pytest.raises(PriorityOutOfRangeError):
        EnqueueRequest("q", "t", priority=True)
    job = EnqueueRequest("q", "t")
    job.priority = True  # mutable: __post_init__ bypassed, the encoder re-checks
    with pytest.raises(ValueError):
        write_enqueue_request(job)


@pytest.mark.parametrize("priority", [-1, 10, 2**32, 1.0, "3"])
def test_out_of_range_priority_is_refused_by_the_encoder(priority: object) -> None:
    job = EnqueueRequest("q", "t")
    job.priority = priority  # type: ignore[assignment]
    with pytest.raises(ValueError):
        write_enqueue_request(job)


@pytest.mark.parametrize("max_attempts", [-1, 2**32, True, "3", 1.0])
def test_out_of_range_max_attempts_is_refused(max_attempts: object) -> None:
    job = EnqueueRequest("q", "t")
    job.max_attempts = max_attempts  # type: ignore[assignment]
    with pytest.raises(ValueError):
        write_enqueue_request(job)


@pytest.mark.parametrize("field", ["queue", "job_type"])
def test_empty_queue_or_job_type_is_refused_when_sent(field: str) -> None:
    # A check, not an encoder guard: an empty name goes out as what it is.
    job = EnqueueRequest("q", "t")
    setattr(job, field, "")
    with pytest.raises(ValueError, match=f"{field} must be a non-empty str"):
        check_enqueue_request(job)


_FENCED: dict[str, Callable[[int], bytes]] = {
    "ack": lambda attempt: encode_ack_request("job", attempt, None),
    "nack": lambda attempt: encode_nack_request(
        "job", attempt, None, nack_retry_field("default", None), None
    ),
    "extend": lambda attempt: encode_extend_request("job", attempt, timedelta(seconds=1), None),
}


@pytest.mark.parametrize("attempt", [-1, -128, 2**32])
@pytest.mark.parametrize("kind", sorted(_FENCED))
def test_attempt_outside_uint32_is_refused(kind: str, attempt: int) -> None:
    # The codec re-checks what it sends; an attempt outside uint32 must not reach the wire
    # as some other number.
    with pytest.raises(ValueError):
        _FENCED[kind](attempt)


@pytest.mark.parametrize("limit", [-1, 2**32, True])
def test_out_of_range_counts_are_refused(limit: int) -> None:
    with pytest.raises(ValueError):
        encode_drain_dead_letters_request(None, limit)
    with pytest.raises(ValueError):
        encode_reserve_request(ReserveOptions(["q"], timedelta(seconds=1)), limit)


# ---------------------------------------------------------------------------------------
# Decoding responses: Reserve


@SOME
@given(msgs=st.lists(s.pb_jobs(), max_size=4))
def test_reserve_response_decodes_to_jobs(msgs: list[pb.Job]) -> None:
    expected = [s.expected_job(msg) for msg in msgs]
    jobs, problems = decode_reserve_response(bytes(pb.ReserveResponse(msgs)))
    assert problems == []
    assert s.norm(jobs) == s.norm(expected)
    assert all(job.ctx.lease is None for job in jobs)


@SOME
@given(
    data=st.data(),
    entries=st.lists(
        st.tuples(s.pb_jobs(), st.none() | st.sampled_from(sorted(s.JOB_DEFECTS))),
        min_size=1,
        max_size=5,
    ),
)
def test_bad_jobs_are_skipped_and_reported(
    data: st.DataObject, entries: list[tuple[pb.Job, Optional[str]]]
) -> None:
    expected = [s.expected_job(msg) for msg, defect in entries if defect is None]
    defects = [defect for _, defect in entries if defect is not None]
    msgs = [
        msg if defect is None else data.draw(s.break_job(msg, defect)) for msg, defect in entries
    ]
    jobs, problems = decode_reserve_response(bytes(pb.ReserveResponse(msgs)))
    assert s.norm(jobs) == s.norm(expected)
    assert len(problems) == len(defects)
    for problem, defect in zip(problems, defects):
        assert isinstance(problem, errors.JobConversionError)
        assert s.JOB_DEFECTS[defect] in str(problem), (defect, str(problem))


_ANY_SECONDS = st.integers(-(10**12), s.MAX_TIMESTAMP_SECONDS + 10**9)
_ANY_NANOS = st.integers(-(2**31), 2**31 - 1)
_VALID_PARTS = st.tuples(
    st.integers(0, s.MAX_TIMESTAMP_SECONDS), st.integers(0, 999_999_999)
) | st.sampled_from([(0, 0), (0, 1), (0, 999), (s.MAX_TIMESTAMP_SECONDS, 999_999_999)])
_ANY_PARTS = _VALID_PARTS | st.tuples(_ANY_SECONDS, _ANY_NANOS)


def _valid_time(parts: Optional[tuple[int, int]]) -> Optional[datetime]:
    if parts is None:
        return None
    seconds, nanos = parts
    if not (0 <= seconds <= s.MAX_TIMESTAMP_SECONDS and 0 <= nanos <= 999_999_999):
        return None
    return s.EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


def _set_time(msg: Any, name: str, parts: Optional[tuple[int, int]]) -> None:
    if parts is not None:
        field = getattr(msg, name)
        field.SetInParent()  # present even at (0, 0)
        field.seconds, field.nanos = parts


@SOME
@given(
    enqueued=st.none() | _ANY_PARTS,
    lease=st.none() | _ANY_PARTS,
    scheduled=st.none() | _ANY_PARTS,
)
def test_job_timestamps_presence_range_and_truncation(
    enqueued: Optional[tuple[int, int]],
    lease: Optional[tuple[int, int]],
    scheduled: Optional[tuple[int, int]],
) -> None:
    # Built with protobuf: betterproto cannot send the epoch or nanosecond precision.
    job = protobuf_ref.new("Job", id="j", job_type="t")
    for name, parts in (("enqueued_at", enqueued), ("lease_expires_at", lease)):
        _set_time(job, name, parts)
    _set_time(job, "scheduled_at", scheduled)
    response = protobuf_ref.new("ReserveResponse")
    response.jobs.append(job)
    jobs, problems = decode_reserve_response(response.SerializeToString())
    enqueued_at, lease_expires_at = _valid_time(enqueued), _valid_time(lease)
    if enqueued_at is None or lease_expires_at is None:
        assert jobs == []
        assert len(problems) == 1
        bad = "enqueued_at" if enqueued_at is None else "lease_expires_at"
        assert bad in str(problems[0])
        return
    assert problems == []
    (ctx,) = [j.ctx for j in jobs]
    assert s.norm(ctx.enqueued_at) == s.norm(enqueued_at)
    assert s.norm(ctx.lease_expires_at) == s.norm(lease_expires_at)
    # An invalid or pre-epoch scheduled_at becomes None; the job is still delivered.
    assert s.norm(ctx.scheduled_at) == s.norm(_valid_time(scheduled))


def test_priority_is_read_as_uint32() -> None:
    # uint32 on the wire: a varint over 32 bits keeps its low 32 bits, as protobuf reads it.
    job = (
        wire_edit.len_field(1, b"j")
        + wire_edit.len_field(2, b"t")
        + b"\x20"
        + wire_edit.uvarint(9 + (5 << 32))
        + wire_edit.len_field(6, b"\x08\x01")
        + wire_edit.len_field(9, b"\x08\x01")
    )
    assert protobuf_ref.parse("Job", job).priority == 9
    jobs, problems = decode_reserve_response(wire_edit.len_field(1, job))
    assert problems == []
    assert jobs[0].ctx.priority == Priority(9)


# ---------------------------------------------------------------------------------------
# Decoding responses: enqueue


def _outcome_value(outcome: s.BatchOutcome) -> object:
    return EnqueueAck(*outcome) if isinstance(outcome, tuple) else outcome


@SOME
@given(outcomes=st.lists(s.batch_outcomes, max_size=5))
def test_enqueue_batch_response_decodes_every_outcome(outcomes: list[s.BatchOutcome]) -> None:
    data = bytes(pb.EnqueueBatchResponse([s.job_result_to_pb(o) for o in outcomes]))
    assert s.norm(decode_enqueue_batch_response(data)) == s.norm(
        [_outcome_value(o) for o in outcomes]
    )


def _success(*fields: bytes) -> bytes:
    return wire_edit.len_field(1, wire_edit.len_field(1, b"".join(fields)))


def _dedup(value: int) -> bytes:
    return wire_edit.tag(2, 0) + wire_edit.uvarint(value)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        # The shapes the short path reads, and the ones next to them it leaves alone.
        (_success(wire_edit.len_field(1, b"id-1")), EnqueueAck("id-1", False)),
        (_success(wire_edit.len_field(1, b"id-2"), _dedup(1)), EnqueueAck("id-2", True)),
        (_success(wire_edit.len_field(1, b"id-3"), _dedup(0)), EnqueueAck("id-3", False)),
        (_success(wire_edit.len_field(1, b"id-4"), _dedup(2)), EnqueueAck("id-4", True)),
        (_success(wire_edit.len_field(1, b"id\x10\x01")), EnqueueAck("id\x10\x01", False)),
        (_success(_dedup(1), wire_edit.len_field(1, b"id-5")), EnqueueAck("id-5", True)),
        (
            _success(wire_edit.len_field(1, b"x"), wire_edit.len_field(1, b"id-6")),
            EnqueueAck("id-6", False),
        ),
        (_success(wire_edit.len_field(1, b"id-7"), _dedup(300)), EnqueueAck("id-7", True)),
        (_success(wire_edit.len_field(1, b"i" * 125)), EnqueueAck("i" * 125, False)),
        (_success(wire_edit.len_field(1, b"i" * 200), _dedup(1)), EnqueueAck("i" * 200, True)),
        (_success(), EnqueueAck("", False)),
    ],
)
def test_enqueue_results_read_the_same_on_the_short_path_and_off_it(
    result: bytes, expected: EnqueueAck
) -> None:
    assert decode_enqueue_batch_response(result * 3) == [expected] * 3


_DEFAULT_VARIANTS: list[tuple[str, Any, errors.JobRejection]] = [
    ("unknown_queue", pb.UnknownQueue, errors.UnknownQueue("")),
    ("payload_too_large", pb.PayloadTooLarge, errors.PayloadTooLarge(0, 0)),
    ("encoding_not_allowed", pb.EncodingNotAllowed, errors.EncodingNotAllowed("", [])),
    ("job_type_not_allowed", pb.JobTypeNotAllowed, errors.JobTypeNotAllowed("", [])),
    ("custom_entries_too_many", pb.CustomEntriesTooMany, errors.CustomEntriesTooMany(0, 0)),
    ("custom_map_too_large", pb.CustomMapTooLarge, errors.CustomMapTooLarge(0, 0)),
    ("custom_key_too_long", pb.CustomKeyTooLong, errors.CustomKeyTooLong("", 0, 0)),
    ("queue_name_too_long", pb.QueueNameTooLong, errors.QueueNameTooLong(0, 0)),
    ("job_type_name_too_long", pb.JobTypeNameTooLong, errors.JobTypeNameTooLong(0, 0)),
    ("idempotency_key_too_long", pb.IdempotencyKeyTooLong, errors.IdempotencyKeyTooLong(0, 0)),
    ("scheduled_too_far", pb.ScheduledTooFar, errors.ScheduledTooFar(timedelta(0), s.EPOCH)),
    ("invalid_request", pb.InvalidRequest, errors.InvalidRequest("")),
    ("queue_full", pb.QueueFull, errors.QueueFull("", 0)),
    ("queue_closing", pb.QueueClosing, errors.QueueClosing("")),
]


@pytest.mark.parametrize(("member", "message", "expected"), _DEFAULT_VARIANTS)
def test_every_rejection_variant_with_default_fields(
    member: str, message: Any, expected: errors.JobRejection
) -> None:
    # An empty variant message (every field at its default) still selects its variant.
    result = pb.JobResult(rejection=pb.JobRejection(**{member: message()}))
    data = bytes(pb.EnqueueBatchResponse([result]))
    assert s.norm(decode_enqueue_batch_response(data)) == s.norm([expected])


def test_unknown_rejection_member_is_an_unknown_rejection() -> None:
    # JobRejection field 15 (a newer server's variant) and an empty JobRejection.
    for rejection in (wire_edit.len_field(15, wire_edit.len_field(1, b"q")), b""):
        result = wire_edit.len_field(1, wire_edit.len_field(2, rejection))
        assert decode_enqueue_batch_response(result) == [errors.UnknownRejection()]


AtomicOutcome = Optional[tuple[str, list[Any]]]
atomic_outcomes: st.SearchStrategy[AtomicOutcome] = st.one_of(
    st.none(),
    st.tuples(st.just("success"), st.lists(st.tuples(s.texts, st.booleans()), max_size=3)),
    st.tuples(st.just("rejection"), st.lists(st.tuples(s.uint32s, s.rejections), max_size=3)),
)


def _atomic_pb(outcome: AtomicOutcome) -> pb.EnqueueAtomicResponse:
    if outcome is None:
        return pb.EnqueueAtomicResponse()
    kind, items = outcome
    if kind == "success":
        acks = [pb.EnqueueResponse(*item) for item in items]
        return pb.EnqueueAtomicResponse(success=pb.EnqueueAtomicSuccess(acks))
    errs = [pb.JobValidationError(i, s.rejection_to_pb(r)) for i, r in items]
    return pb.EnqueueAtomicResponse(rejection=pb.BatchValidationFailure(errs))


def _atomic_expected(outcome: AtomicOutcome) -> object:
    if outcome is None:
        return None
    kind, items = outcome
    if kind == "success":
        return ("success", [EnqueueAck(*item) for item in items])
    return ("rejection", [errors.JobValidationError(i, r) for i, r in items])


@SOME
@given(outcome=atomic_outcomes)
def test_enqueue_atomic_response_decodes_both_outcomes_and_none(outcome: AtomicOutcome) -> None:
    decoded = decode_enqueue_atomic_response(bytes(_atomic_pb(outcome)))
    assert s.norm(decoded) == s.norm(_atomic_expected(outcome))


def test_validation_error_without_rejection_is_unknown_rejection() -> None:
    data = bytes(
        pb.EnqueueAtomicResponse(rejection=pb.BatchValidationFailure([pb.JobValidationError(3)]))
    )
    assert decode_enqueue_atomic_response(data) == (
        "rejection",
        [errors.JobValidationError(3, errors.UnknownRejection())],
    )


# ---------------------------------------------------------------------------------------
# Decoding responses: Ack, Nack, Extend


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", ""),
        (b"\x0a\x00", ""),
        (b"\x0a\x03abc", "abc"),
        (b"\x0a\x7f" + b"x" * 127, "x" * 127),  # the longest one-byte length
        (b"\x0a\x80\x01" + b"y" * 128, "y" * 128),  # a two-byte length
        (b"\x0a\x01a\x0a\x01b", "b"),  # the last occurrence wins
        (b"\x0a\x01a\x10\x05", "a"),  # an unknown field after the id
        (b"\x10\x05\x0a\x01a", "a"),  # and before it
        (b"\x0a\x02\xc3\xa9", "\u00e9"),
    ],
)
def test_ack_response_shapes_read_in_one_step_or_not(raw: bytes, expected: str) -> None:
    # The one-step read of the usual answer (the job id alone) and the general path
    # agree with protobuf on every shape around it.
    assert decode_ack_response(raw) == expected == pb.AckResponse().parse(raw).job_id


@pytest.mark.parametrize("raw", [b"\x0a\x02\xff\xfe", b"\x0a\x05ab", b"\x0a"])
def test_ack_response_that_cannot_be_read_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(errors.DecodeError):
        decode_ack_response(raw)


@SOME
@given(job_id=s.texts, dead_lettered=st.booleans())
def test_ack_and_nack_responses(job_id: str, dead_lettered: bool) -> None:
    assert decode_ack_response(bytes(pb.AckResponse(job_id))) == job_id
    assert decode_nack_response(bytes(pb.NackResponse(job_id, dead_lettered))) == (
        job_id,
        dead_lettered,
    )


@SOME
@given(job_id=s.texts, expiry=st.none() | s.after_epoch)
def test_extend_response(job_id: str, expiry: Optional[datetime]) -> None:
    msg = pb.ExtendResponse(job_id)
    if expiry is not None:
        msg.lease_expires_at = expiry
    assert s.norm(decode_extend_response(bytes(msg))) == s.norm((job_id, expiry))


@SOME
@given(parts=_ANY_PARTS)
def test_extend_response_expiry_per_protobuf(parts: tuple[int, int]) -> None:
    msg = protobuf_ref.new("ExtendResponse", job_id="j")
    _set_time(msg, "lease_expires_at", parts)
    assert s.norm(decode_extend_response(msg.SerializeToString())) == s.norm(
        ("j", _valid_time(parts))
    )


# ---------------------------------------------------------------------------------------
# Decoding responses: DrainDeadLetters

RECORD_DEFECTS = {
    "no_job": "no job",
    "failed_unset": "failed_at",
    "failed_before_epoch": "failed_at",
}
RECORD_JOB_DEFECTS = sorted(d for d in s.JOB_DEFECTS if not d.startswith("lease"))


@st.composite
def _record_with_defect(draw: st.DrawFn) -> tuple[pb.DeadLetterRecord, Optional[str]]:
    record = draw(s.pb_dead_letter_records())
    if draw(st.booleans()):  # the snapshot's lease expiry is never checked
        record.job.lease_expires_at = draw(st.sampled_from([s.EPOCH]) | s.before_epoch)
    defect = draw(st.none() | st.sampled_from(sorted(RECORD_DEFECTS) + RECORD_JOB_DEFECTS))
    if defect == "no_job":
        record.job = None
    elif defect == "failed_unset":
        record.failed_at = s.EPOCH
    elif defect == "failed_before_epoch":
        record.failed_at = draw(s.before_epoch)
    elif defect is not None:
        record.job = draw(s.break_job(record.job, defect))
    return record, defect


@SOME
@given(entries=st.lists(_record_with_defect(), max_size=4))
def test_drain_response_decodes_records_and_skips_bad_ones(
    entries: list[tuple[pb.DeadLetterRecord, Optional[str]]],
) -> None:
    expected = [s.expected_record(r) for r, defect in entries if defect is None]
    defects = [defect for _, defect in entries if defect is not None]
    data = bytes(pb.DrainDeadLettersResponse([r for r, _ in entries]))
    records, problems = decode_drain_dead_letters_response(data)
    assert s.norm(records) == s.norm(expected)
    assert len(problems) == len(defects)
    for problem, defect in zip(problems, defects):
        word = RECORD_DEFECTS.get(defect) or s.JOB_DEFECTS[defect]
        assert word in str(problem), (defect, str(problem))


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        (0, DeadLetterCause.UNSPECIFIED),
        (1, DeadLetterCause.ATTEMPTS_EXHAUSTED),
        (2, DeadLetterCause.REJECTED),
        (3, DeadLetterCause.LEASE_EXPIRED),
        (4, DeadLetterCause.ADMIN),
        (5, DeadLetterCause.UNSPECIFIED),
        (2**31 - 1, DeadLetterCause.UNSPECIFIED),
        (-1, DeadLetterCause.UNSPECIFIED),
    ],
)
def test_dead_letter_causes_and_last_reason_presence(cause: int, expected: DeadLetterCause) -> None:
    records = []
    for reason in (None, "", "boom"):
        record = protobuf_ref.new("DeadLetterRecord", cause=cause, final_attempt=3)
        if reason is not None:
            record.last_reason = reason
        record.job.id, record.job.job_type = "j", "t"
        record.job.enqueued_at.seconds = record.failed_at.seconds = 1
        records.append(record)
    response = protobuf_ref.new("DrainDeadLettersResponse", records=records)
    decoded, problems = decode_drain_dead_letters_response(response.SerializeToString())
    assert problems == []
    assert [r.cause for r in decoded] == [expected] * 3
    assert [r.last_reason for r in decoded] == [None, "", "boom"]
    assert [r.final_attempt for r in decoded] == [3] * 3


# ---------------------------------------------------------------------------------------
# GetServerInfo


@SOME
@given(info=s.server_infos)
def test_server_info_decodes_and_round_trips(info: Any) -> None:
    assert s.norm(decode_get_server_info_response(bytes(s.server_info_to_pb(info)))) == s.norm(info)
    assert s.norm(decode_get_server_info_response(encode_get_server_info_response(info))) == s.norm(
        info
    )


@pytest.mark.parametrize(
    "problem", ["empty_version", "time_before_epoch", "time_unset", "time_bad_nanos"]
)
def test_unusable_server_info_is_malformed(problem: str) -> None:
    msg = protobuf_ref.new("GetServerInfoResponse", server_version="1.0")
    msg.server_time.SetInParent()  # the epoch itself is a valid server time
    assert decode_get_server_info_response(msg.SerializeToString()).server_time == s.EPOCH
    if problem == "empty_version":
        msg.server_version = ""
    elif problem == "time_before_epoch":
        msg.server_time.seconds = -5
    elif problem == "time_unset":
        msg.ClearField("server_time")
    else:
        msg.server_time.nanos = -1
    with pytest.raises(errors.MalformedServerInfoError):
        decode_get_server_info_response(msg.SerializeToString())


def test_server_info_durations_cache_stays_bounded() -> None:
    """Limits are cached by their bytes; a server that sends a new value in every answer
    must not grow that cache past CACHE_MAX, and every answer still reads right."""
    from sepp_lite._codec import server_info
    from sepp_lite._codec.values import CACHE_MAX

    msg = protobuf_ref.new("GetServerInfoResponse", server_version="1.0")
    msg.server_time.seconds = 5
    for seconds in range(CACHE_MAX + 50):
        msg.max_wait_timeout.seconds = seconds
        msg.max_wait_timeout.nanos = seconds % 7 * 1000
        info = decode_get_server_info_response(msg.SerializeToString())
        assert info.max_wait_timeout == timedelta(seconds=seconds, microseconds=seconds % 7)
        assert len(server_info._DURATION_CACHE) <= CACHE_MAX


def test_negative_server_info_durations_read_as_zero() -> None:
    msg = protobuf_ref.new("GetServerInfoResponse", server_version="1.0")
    msg.server_time.seconds = 5
    msg.max_wait_timeout.seconds = -5
    msg.max_lease_duration.seconds = 7
    info = decode_get_server_info_response(msg.SerializeToString())
    assert info.max_wait_timeout == timedelta(0)
    assert info.max_lease_duration == timedelta(seconds=7)


# ---------------------------------------------------------------------------------------
# Unknown fields

CLIENT_DECODERS: dict[str, Callable[[bytes], object]] = {
    "ReserveResponse": decode_reserve_response,
    "EnqueueBatchResponse": decode_enqueue_batch_response,
    "EnqueueAtomicResponse": decode_enqueue_atomic_response,
    "AckResponse": decode_ack_response,
    "NackResponse": decode_nack_response,
    "ExtendResponse": decode_extend_response,
    "DrainDeadLettersResponse": decode_drain_dead_letters_response,
    "GetServerInfoResponse": decode_get_server_info_response,
}


@pytest.mark.parametrize("name", sorted(CLIENT_DECODERS))
@FEW
@given(data=st.data())
def test_unknown_fields_change_no_decoded_value(name: str, data: st.DataObject) -> None:
    decode = CLIENT_DECODERS[name]
    raw = data.draw(s.MESSAGE_BYTES[name])
    edited = wire_edit.with_unknown_fields(data.draw, raw, name)
    assert s.norm(decode(edited)) == s.norm(decode(raw))


# Shrinking through nested rewrites is slow, and the pinned examples below already show
# each known divergence in its smallest form: report failures unshrunk.
UNSHRUNK = settings(FEW, phases=[Phase.explicit, Phase.reuse, Phase.generate])


@pytest.mark.parametrize("name", sorted(CLIENT_DECODERS))
@UNSHRUNK
@given(data=st.data())
def test_known_numbers_with_a_wrong_wire_type_are_unknown_fields(
    name: str, data: st.DataObject
) -> None:
    decode = CLIENT_DECODERS[name]
    raw = data.draw(s.MESSAGE_BYTES[name])
    edited = wire_edit.with_mistyped_fields(data.draw, raw, name)
    assert s.norm(decode(edited)) == s.norm(decode(raw))


_L = wire_edit.len_field


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("AckResponse", _L(1, b"a") + b"\x08\x05", "a"),
        ("NackResponse", _L(1, b"a") + _L(2, b""), ("a", False)),
        ("ExtendResponse", _L(1, b"a") + b"\x08\x05" + b"\x10\x01", ("a", None)),
        (
            "EnqueueBatchResponse",
            _L(1, _L(2, _L(2, b"\x08\x05" + _L(2, b"")))),
            [errors.PayloadTooLarge(5, 0)],
        ),
        (
            "EnqueueBatchResponse",
            _L(1, _L(2, _L(7, _L(1, b"k") + b"\x10\x03" + _L(3, b"")))),
            [errors.CustomKeyTooLong("k", 3, 0)],
        ),
        (
            "EnqueueBatchResponse",
            _L(1, _L(2, _L(13, _L(1, b"q") + b"\x08\x01"))),
            [errors.QueueFull("q", 0)],
        ),
    ],
    ids=["ack-id-varint", "nack-flag-len", "extend", "payload-limit", "key-actual", "queue-full"],
)
def test_mistyped_known_fields_read_as_protobuf_reads_them(
    name: str, data: bytes, expected: object
) -> None:
    protobuf_ref.parse(name, data)  # well formed for protobuf: the odd fields are unknown
    assert s.norm(CLIENT_DECODERS[name](data)) == s.norm(expected)
