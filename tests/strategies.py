"""Hypothesis strategies for the codec tests, and the reference mappings between domain
values and betterproto messages that the tests use as their oracle.

Conventions:

* Domain values (``EnqueueRequest``, rejections, ...) come from ``sepp_lite``; wire
  messages are the betterproto-generated ``pb.*`` classes (the schema-true reference).
* Timestamps are timezone-aware UTC datetimes with microsecond precision. betterproto
  2.0.0b7 drops a Timestamp equal to the epoch and a zero Duration in a plain (non-oneof)
  field, so strategies feeding betterproto say whether they may produce those.
* :func:`norm` turns any decoded value into a structure whose ``==`` is exact: bool is not
  int, ``-0.0`` is not ``0.0``, NaN equals NaN, datetimes must carry a UTC offset.
"""

from __future__ import annotations

import calendar
import dataclasses
import enum
import math
import re
import struct
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Optional, Union

import betterproto
from betterproto.lib.google.protobuf import Empty
from hypothesis import strategies as st
from hypothesis.vendor import pretty

from sepp_lite import errors
from sepp_lite._codec.job import JobRecord
from sepp_lite._proto.sepp import v1 as pb
from sepp_lite._validate import queue_name_error
from sepp_lite.types import (
    PRIORITIES,
    DeadLetterCause,
    DeadLetterRecord,
    EnqueueRequest,
    Job,
    JobCtx,
    Payload,
    Primitive,
    Priority,
    ReserveOptions,
    ServerInfo,
    TraceContext,
)

UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
# Largest duration betterproto 2.0.0b7 converts exactly: its timedelta -> Duration helper
# goes through a float of microseconds (exact below 2**53 us, about 285 years).
MAX_EXACT_DURATION = timedelta(days=36_500)
MAX_TIMESTAMP_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z


def _print_with_repr(obj: object, printer: Any, cycle: bool) -> None:
    printer.text(repr(obj))


def _register_pretty_printers() -> None:
    # Hypothesis prints dataclasses field by field, and a betterproto message raises
    # AttributeError for every unselected oneof member; betterproto's own repr is safe.
    classes = [c for c in vars(pb).values() if isinstance(c, type)]
    for cls in [*classes, Empty]:
        if issubclass(cls, betterproto.Message):
            pretty.for_type_by_name(cls.__module__, cls.__name__, _print_with_repr)


_register_pretty_printers()

# ---------------------------------------------------------------------------------------
# Scalars


def _with_edges(base: st.SearchStrategy[Any], edges: list[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(edges), base)


uint32s = _with_edges(st.integers(0, UINT32_MAX), [0, 1, 127, 128, 16_383, 16_384, UINT32_MAX])
uint64s = _with_edges(
    st.integers(0, UINT64_MAX), [0, 1, 127, 128, UINT32_MAX, UINT32_MAX + 1, 1 << 63, UINT64_MAX]
)
int64s = _with_edges(
    st.integers(INT64_MIN, INT64_MAX), [INT64_MIN, INT64_MIN + 1, -1, 0, 1, 127, 128, INT64_MAX]
)
# Valid UTF-8 only (no lone surrogates), with non-ASCII, astral-plane and NUL characters.
texts = _with_edges(
    st.text(st.characters(codec="utf-8"), max_size=12),
    ["", "a", "é", "日本語", "🙂", "\x00", "q" * 130],
)
nonempty_texts = texts.filter(bool)
byte_strings = _with_edges(st.binary(max_size=40), [b"", b"\x00", b"\xff" * 200])
doubles = _with_edges(
    st.floats(),
    [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1.7976931348623157e308],
)
primitives: st.SearchStrategy[Primitive] = st.one_of(texts, int64s, doubles, st.booleans())
custom_maps = st.dictionaries(texts, primitives, max_size=4)
# betterproto leaves an empty map key off the wire, protobuf and sepp_lite write it: the
# byte-for-byte comparisons with betterproto use non-empty keys (the empty key is pinned
# against protobuf separately).
custom_maps_nonempty_keys = st.dictionaries(nonempty_texts, primitives, max_size=4)


def _naive(year: int, *rest: int) -> datetime:
    return datetime(year, *rest)  # hypothesis takes naive bounds for aware datetimes


NAIVE_EPOCH = _naive(1970, 1, 1)
NAIVE_MAX = _naive(9999, 12, 31, 23, 59, 59, 999_999)


def datetimes(
    min_value: datetime = NAIVE_EPOCH, max_value: datetime = NAIVE_MAX
) -> st.SearchStrategy[datetime]:
    """Timezone-aware UTC datetimes (microsecond precision) within naive UTC bounds."""
    return st.datetimes(min_value=min_value, max_value=max_value, timezones=st.just(UTC))


# Strictly after the epoch: betterproto cannot send the epoch itself.
after_epoch = _with_edges(
    datetimes(min_value=_naive(1970, 1, 1, 0, 0, 0, 1)),
    [
        EPOCH + ONE_US,
        EPOCH + timedelta(seconds=1),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, UTC),
    ],
)
from_epoch = st.one_of(st.just(EPOCH), after_epoch)
_NONE_OR_AFTER_EPOCH = st.none() | after_epoch
before_epoch = _with_edges(
    datetimes(min_value=_naive(1, 1, 1), max_value=_naive(1969, 12, 31, 23, 59, 59, 999_999)),
    [EPOCH - ONE_US, datetime(1, 1, 1, tzinfo=UTC)],
)
durations = _with_edges(
    st.timedeltas(min_value=timedelta(0), max_value=MAX_EXACT_DURATION),
    [timedelta(0), ONE_US, timedelta(seconds=1), timedelta(seconds=1, microseconds=500_000)],
)
positive_durations = durations.filter(bool)


def timestamp_parts(dt: datetime) -> tuple[int, int]:
    """``(seconds, nanos)`` of a Timestamp, computed independently of the codec."""
    return calendar.timegm(dt.utctimetuple()), dt.microsecond * 1000


def duration_parts(td: timedelta) -> tuple[int, int]:
    whole = td.days * 86_400 + td.seconds
    return whole, td.microseconds * 1000


# ---------------------------------------------------------------------------------------
# Trace contexts

_TRACEPARENT = re.compile(r"[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}")


def is_valid_traceparent(value: str) -> bool:
    """The W3C rule as the spec states it (4 hex fields, ids not all zeros)."""
    if not _TRACEPARENT.fullmatch(value):
        return False
    return value[3:35].strip("0") != "" and value[36:52].strip("0") != ""


def _hex(size: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdefABCDEF", min_size=size, max_size=size)


traceparents = st.builds(
    lambda v, t, s, f: f"{v}-{t}-{s}-{f}",
    _hex(2),
    _hex(32).filter(lambda h: h.strip("0") != ""),
    _hex(16).filter(lambda h: h.strip("0") != ""),
    _hex(2),
)
invalid_traceparents = st.one_of(
    st.sampled_from(
        [
            "",
            "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
            "00-" + "1" * 32 + "-" + "0" * 16 + "-01",
            "00-" + "1" * 32 + "-" + "1" * 16 + "-01-00",
            "0-" + "1" * 32 + "-" + "1" * 16 + "-01",
            "00-" + "g" * 32 + "-" + "1" * 16 + "-01",
        ]
    ),
    texts.filter(lambda t: not is_valid_traceparent(t)),
)
trace_contexts = st.builds(TraceContext, traceparents, st.none() | texts)
payloads = st.builds(Payload, byte_strings, texts)

# ---------------------------------------------------------------------------------------
# Producer-side requests


@st.composite
def enqueue_requests(
    draw: st.DrawFn,
    scheduled: st.SearchStrategy[Optional[datetime]] = _NONE_OR_AFTER_EPOCH,
    custom: st.SearchStrategy[dict[str, Primitive]] = custom_maps_nonempty_keys,
) -> EnqueueRequest:
    """Every optional field independently absent or present (zero values included)."""
    return EnqueueRequest(
        queue=draw(nonempty_texts),
        job_type=draw(nonempty_texts),
        payload=draw(st.none() | payloads),
        idempotency_key=draw(st.none() | texts),
        priority=draw(st.none() | st.integers(0, 9) | st.sampled_from(PRIORITIES)),
        max_attempts=draw(st.none() | uint32s),
        custom=draw(custom),
        trace_context=draw(st.none() | trace_contexts),
        scheduled_at=draw(scheduled),
    )


# ReserveOptions refuses names the server refuses ("/", ".", control characters).
queue_names = nonempty_texts.filter(lambda name: queue_name_error(name) is None)
reserve_options = st.builds(
    ReserveOptions,
    queues=st.lists(queue_names, min_size=1, max_size=4),
    lease_duration=positive_durations,
    wait_timeout=durations,
    worker_id=st.none() | nonempty_texts,
    max_jobs=st.none() | st.integers(1, UINT32_MAX),
)
# (kind, delay) as the client passes them to nack_retry_field.
nack_retries = st.one_of(
    st.just(("default", None)),
    st.just(("dead_letter", None)),
    st.tuples(st.just("after"), durations),
)

# ---------------------------------------------------------------------------------------
# Rejections


def _builds(cls: type, *args: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(cls, *args)


_str_lists = st.lists(texts, max_size=3)
rejection_variants: list[st.SearchStrategy[errors.JobRejection]] = [
    _builds(errors.UnknownQueue, texts),
    _builds(errors.PayloadTooLarge, uint64s, uint64s),
    _builds(errors.EncodingNotAllowed, texts, _str_lists),
    _builds(errors.JobTypeNotAllowed, texts, _str_lists),
    _builds(errors.CustomEntriesTooMany, uint32s, uint32s),
    _builds(errors.CustomMapTooLarge, uint64s, uint64s),
    _builds(errors.CustomKeyTooLong, texts, uint32s, uint64s),
    _builds(errors.QueueNameTooLong, uint32s, uint64s),
    _builds(errors.JobTypeNameTooLong, uint32s, uint64s),
    _builds(errors.IdempotencyKeyTooLong, uint32s, uint64s),
    _builds(errors.ScheduledTooFar, durations, from_epoch),
    _builds(errors.InvalidRequest, texts),
    _builds(errors.QueueFull, texts, uint64s),
    _builds(errors.QueueClosing, texts),
]
known_rejections = st.one_of(rejection_variants)
rejections = st.one_of(known_rejections, st.just(errors.UnknownRejection()))


def rejection_to_pb(rejection: errors.JobRejection) -> pb.JobRejection:  # noqa: C901 - a table
    """The JobRejection message for a domain rejection (nothing set for UnknownRejection)."""
    r: Any = rejection
    if isinstance(r, errors.UnknownQueue):
        return pb.JobRejection(unknown_queue=pb.UnknownQueue(r.queue))
    if isinstance(r, errors.PayloadTooLarge):
        return pb.JobRejection(payload_too_large=pb.PayloadTooLarge(r.limit, r.actual))
    if isinstance(r, errors.EncodingNotAllowed):
        return pb.JobRejection(encoding_not_allowed=pb.EncodingNotAllowed(r.encoding, r.allowed))
    if isinstance(r, errors.JobTypeNotAllowed):
        return pb.JobRejection(job_type_not_allowed=pb.JobTypeNotAllowed(r.job_type, r.allowed))
    if isinstance(r, errors.CustomEntriesTooMany):
        return pb.JobRejection(custom_entries_too_many=pb.CustomEntriesTooMany(r.limit, r.actual))
    if isinstance(r, errors.CustomMapTooLarge):
        return pb.JobRejection(custom_map_too_large=pb.CustomMapTooLarge(r.limit, r.actual))
    if isinstance(r, errors.CustomKeyTooLong):
        return pb.JobRejection(custom_key_too_long=pb.CustomKeyTooLong(r.key, r.limit, r.actual))
    if isinstance(r, errors.QueueNameTooLong):
        return pb.JobRejection(queue_name_too_long=pb.QueueNameTooLong(r.limit, r.actual))
    if isinstance(r, errors.JobTypeNameTooLong):
        return pb.JobRejection(job_type_name_too_long=pb.JobTypeNameTooLong(r.limit, r.actual))
    if isinstance(r, errors.IdempotencyKeyTooLong):
        return pb.JobRejection(idempotency_key_too_long=pb.IdempotencyKeyTooLong(r.limit, r.actual))
    if isinstance(r, errors.ScheduledTooFar):
        return pb.JobRejection(scheduled_too_far=pb.ScheduledTooFar(r.horizon, r.actual))
    if isinstance(r, errors.InvalidRequest):
        return pb.JobRejection(invalid_request=pb.InvalidRequest(r.detail))
    if isinstance(r, errors.QueueFull):
        return pb.JobRejection(queue_full=pb.QueueFull(r.queue, r.limit))
    if isinstance(r, errors.QueueClosing):
        return pb.JobRejection(queue_closing=pb.QueueClosing(r.queue))
    assert isinstance(r, errors.UnknownRejection), r
    return pb.JobRejection()


_REJECTION_CLASSES: dict[str, type] = {
    "unknown_queue": errors.UnknownQueue,
    "payload_too_large": errors.PayloadTooLarge,
    "encoding_not_allowed": errors.EncodingNotAllowed,
    "job_type_not_allowed": errors.JobTypeNotAllowed,
    "custom_entries_too_many": errors.CustomEntriesTooMany,
    "custom_map_too_large": errors.CustomMapTooLarge,
    "custom_key_too_long": errors.CustomKeyTooLong,
    "queue_name_too_long": errors.QueueNameTooLong,
    "job_type_name_too_long": errors.JobTypeNameTooLong,
    "idempotency_key_too_long": errors.IdempotencyKeyTooLong,
    "scheduled_too_far": errors.ScheduledTooFar,
    "invalid_request": errors.InvalidRequest,
    "queue_full": errors.QueueFull,
    "queue_closing": errors.QueueClosing,
}


def rejection_from_pb(msg: pb.JobRejection) -> errors.JobRejection:
    """The domain rejection of a parsed JobRejection (fields in declaration order)."""
    name, member = betterproto.which_one_of(msg, "reason")
    if not name:
        return errors.UnknownRejection()
    values = [getattr(member, f.name) for f in dataclasses.fields(member)]
    values = [list(v) if isinstance(v, list) else v for v in values]
    return _REJECTION_CLASSES[name](*values)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------
# Domain values <-> betterproto messages


def primitive_to_pb(value: Primitive) -> pb.PrimitiveValue:
    if isinstance(value, bool):
        return pb.PrimitiveValue(bool_value=value)
    if isinstance(value, int):
        return pb.PrimitiveValue(int_value=value)
    if isinstance(value, float):
        return pb.PrimitiveValue(double_value=value)
    return pb.PrimitiveValue(string_value=value)


def primitive_from_pb(value: pb.PrimitiveValue) -> Optional[Primitive]:
    """The set member's value, ``None`` when no member is set."""
    name, member = betterproto.which_one_of(value, "value")
    return member if name else None


def custom_to_pb(custom: Mapping[str, Primitive]) -> dict[str, pb.PrimitiveValue]:
    return {key: primitive_to_pb(value) for key, value in custom.items()}


def trace_to_pb(tc: Optional[TraceContext]) -> Optional[pb.TraceContext]:
    return None if tc is None else pb.TraceContext(tc.traceparent, tc.tracestate)


def payload_to_pb(payload: Optional[Payload]) -> Optional[pb.Payload]:
    return None if payload is None else pb.Payload(payload.data, payload.encoding)


def enqueue_request_to_pb(
    job: EnqueueRequest, injected: Optional[TraceContext] = None
) -> pb.EnqueueRequest:
    """The message a conforming client sends for ``job`` (``injected`` stands in for a
    missing trace context). Pre-epoch ``scheduled_at`` is dropped, naive means UTC."""
    msg = pb.EnqueueRequest(
        queue=job.queue,
        job_type=job.job_type,
        payload=payload_to_pb(job.payload),
        idempotency_key=job.idempotency_key,
        priority=None if job.priority is None else int(job.priority),
        max_attempts=job.max_attempts,
        trace_context=trace_to_pb(job.trace_context or injected),
        custom=custom_to_pb(job.custom),
    )
    if job.scheduled_at is not None:
        when = job.scheduled_at
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
        if when >= EPOCH:
            msg.scheduled_at = when
    return msg


# ---------------------------------------------------------------------------------------
# Response messages (what a server sends), as betterproto messages


def _set_custom(draw: st.DrawFn) -> dict[str, pb.PrimitiveValue]:
    return custom_to_pb(draw(custom_maps))


@st.composite
def pb_jobs(draw: st.DrawFn, lease: bool = True) -> pb.Job:
    """A Job the client must accept. ``lease=False`` may leave ``lease_expires_at`` unset
    (dead-letter snapshots). The trace context may be invalid: it is dropped, not fatal."""
    trace = draw(
        st.none()
        | st.builds(pb.TraceContext, traceparents | invalid_traceparents, st.none() | texts)
    )
    msg = pb.Job(
        id=draw(nonempty_texts),
        job_type=draw(nonempty_texts),
        payload=draw(st.none() | st.builds(pb.Payload, byte_strings, texts)),
        priority=draw(st.integers(0, 9)),
        trace_context=trace,
        enqueued_at=draw(after_epoch),
        attempt=draw(uint32s),
        max_attempts=draw(uint32s),
        custom=_set_custom(draw),
        queue=draw(texts),
    )
    if lease or draw(st.booleans()):
        msg.lease_expires_at = draw(after_epoch)
    scheduled = draw(st.none() | after_epoch)
    if scheduled is not None:
        msg.scheduled_at = scheduled
    return msg


def _trace_from_pb(msg: pb.Job) -> Optional[TraceContext]:
    tc = msg.trace_context
    if tc is None or not is_valid_traceparent(tc.traceparent):
        return None
    return TraceContext(tc.traceparent, tc.tracestate)


def _custom_from_pb(msg: pb.Job) -> dict[str, Primitive]:
    custom = {key: primitive_from_pb(value) for key, value in msg.custom.items()}
    assert None not in custom.values()
    return custom  # type: ignore[return-value]


def _scheduled_from_pb(msg: pb.Job) -> Optional[datetime]:
    # Strategies only set scheduled_at after the epoch; the epoch means "unset" here.
    return None if msg.scheduled_at == EPOCH else msg.scheduled_at


def expected_job(msg: pb.Job) -> Job:
    """The Job the client must produce for a valid ``pb_jobs()`` message."""
    payload = None if msg.payload is None else Payload(msg.payload.data, msg.payload.encoding)
    ctx = JobCtx(
        id=msg.id,
        queue=msg.queue,
        job_type=msg.job_type,
        priority=Priority(msg.priority),
        attempt=msg.attempt,
        max_attempts=msg.max_attempts,
        enqueued_at=msg.enqueued_at,
        custom=_custom_from_pb(msg),
        trace_context=_trace_from_pb(msg),
        lease_expires_at=msg.lease_expires_at,
        scheduled_at=_scheduled_from_pb(msg),
    )
    return Job(payload=payload, ctx=ctx)


# Ways to make a valid Job undecodable, with a word its problem message must contain.
JOB_DEFECTS: dict[str, str] = {
    "empty_id": "id",
    "empty_job_type": "job_type",
    "priority_over_9": "priority",
    "enqueued_at_unset": "enqueued_at",
    "enqueued_at_before_epoch": "enqueued_at",
    "lease_unset": "lease_expires_at",
    "lease_before_epoch": "lease_expires_at",
    "custom_without_member": "custom",
}


@st.composite
def break_job(draw: st.DrawFn, msg: pb.Job, defect: str) -> pb.Job:
    """``msg`` with one defect the client must skip the job for."""
    if defect == "empty_id":
        msg.id = ""
    elif defect == "empty_job_type":
        msg.job_type = ""
    elif defect == "priority_over_9":
        msg.priority = draw(st.integers(10, UINT32_MAX))
    elif defect == "enqueued_at_unset":
        msg.enqueued_at = EPOCH  # betterproto leaves the epoch off the wire: unset
    elif defect == "enqueued_at_before_epoch":
        msg.enqueued_at = draw(before_epoch)
    elif defect == "lease_unset":
        msg.lease_expires_at = EPOCH
    elif defect == "lease_before_epoch":
        msg.lease_expires_at = draw(before_epoch)
    else:  # betterproto would drop an entry with an empty key and no value at all
        msg.custom[draw(nonempty_texts)] = pb.PrimitiveValue()
    return msg


causes = st.one_of(st.integers(0, 4), st.integers(5, (1 << 31) - 1))
CAUSES = [
    DeadLetterCause.UNSPECIFIED,
    DeadLetterCause.ATTEMPTS_EXHAUSTED,
    DeadLetterCause.REJECTED,
    DeadLetterCause.LEASE_EXPIRED,
    DeadLetterCause.ADMIN,
]


def cause_value(number: int) -> DeadLetterCause:
    return CAUSES[number] if 0 <= number < len(CAUSES) else DeadLetterCause.UNSPECIFIED


@st.composite
def pb_dead_letter_records(draw: st.DrawFn) -> pb.DeadLetterRecord:
    """A record the client must accept (its job's lease expiry is not checked)."""
    return pb.DeadLetterRecord(
        job=draw(pb_jobs(lease=False)),
        cause=draw(causes),
        failed_at=draw(after_epoch),
        final_attempt=draw(uint32s),
        last_reason=draw(st.none() | texts),
    )


def expected_record(msg: pb.DeadLetterRecord) -> DeadLetterRecord:
    job = expected_job(msg.job)
    ctx = job.ctx
    return DeadLetterRecord(
        queue=ctx.queue,
        job_id=ctx.id,
        job_type=ctx.job_type,
        payload=job.payload,
        priority=ctx.priority,
        max_attempts=ctx.max_attempts,
        custom=ctx.custom,
        trace_context=ctx.trace_context,
        enqueued_at=ctx.enqueued_at,
        scheduled_at=ctx.scheduled_at,
        cause=cause_value(int(msg.cause)),
        failed_at=msg.failed_at,
        final_attempt=msg.final_attempt,
        last_reason=msg.last_reason,
    )


# One outcome of an EnqueueBatch: an ack, a rejection, or None (no outcome set).
BatchOutcome = Union[tuple[str, bool], errors.JobRejection, None]
batch_outcomes: st.SearchStrategy[BatchOutcome] = st.one_of(
    st.tuples(texts, st.booleans()), rejections, st.none()
)


def job_result_to_pb(outcome: BatchOutcome) -> pb.JobResult:
    if outcome is None:
        return pb.JobResult()
    if isinstance(outcome, tuple):
        return pb.JobResult(success=pb.EnqueueResponse(*outcome))
    return pb.JobResult(rejection=rejection_to_pb(outcome))


server_infos = st.builds(
    ServerInfo,
    version=nonempty_texts,
    supported_protocol_versions=st.lists(texts, max_size=3),
    server_time=after_epoch,
    restricts_encodings=st.booleans(),
    allowed_encodings=st.lists(texts, max_size=3),
    max_payload_bytes=uint64s,
    max_custom_entries=uint32s,
    max_custom_total_bytes=uint64s,
    max_custom_key_bytes=uint32s,
    max_queue_name_bytes=uint32s,
    max_job_type_bytes=uint32s,
    max_idempotency_key_bytes=uint32s,
    max_schedule_horizon=durations,
    max_enqueue_batch=uint32s,
    max_reserve_batch=uint32s,
    max_reserve_queues=uint32s,
    max_wait_timeout=durations,
    max_lease_duration=durations,
    strict_queues=st.booleans(),
    dead_letter_retention_enabled=st.booleans(),
)


def server_info_to_pb(info: ServerInfo) -> pb.GetServerInfoResponse:
    fields = dataclasses.asdict(info)
    fields["server_version"] = fields.pop("version")
    return pb.GetServerInfoResponse(**fields)


# ---------------------------------------------------------------------------------------
# Request messages (what a client sends), as betterproto messages, presence included


@st.composite
def pb_enqueue_requests(draw: st.DrawFn) -> pb.EnqueueRequest:
    """Any EnqueueRequest a (possibly non-conforming) client can send: empty strings,
    priorities over 9, custom values with no member, scheduled_at before 1970."""
    custom = custom_to_pb(draw(custom_maps))
    # betterproto drops an entry whose key and value are both empty: non-empty keys here.
    for key in draw(st.lists(nonempty_texts, max_size=2)):
        custom[key] = pb.PrimitiveValue()
    msg = pb.EnqueueRequest(
        queue=draw(texts),
        job_type=draw(texts),
        payload=draw(st.none() | st.builds(pb.Payload, byte_strings, texts)),
        idempotency_key=draw(st.none() | texts),
        priority=draw(st.none() | uint32s),
        max_attempts=draw(st.none() | uint32s),
        trace_context=draw(st.none() | st.builds(pb.TraceContext, texts, st.none() | texts)),
        custom=custom,
    )
    scheduled = draw(st.none() | after_epoch | before_epoch)
    if scheduled is not None:
        msg.scheduled_at = scheduled
    return msg


pb_reserve_requests = st.builds(
    pb.ReserveRequest,
    queues=st.lists(texts, max_size=4),
    wait_timeout=durations,
    lease_duration=durations,
    worker_id=st.none() | texts,
    max_jobs=st.none() | uint32s,
)
pb_ack_requests = st.builds(pb.AckRequest, texts, uint32s, st.none() | texts)
pb_nack_retries = st.one_of(
    st.none(),
    st.builds(pb.NackRetry),  # present, nothing selected
    st.builds(lambda: pb.NackRetry(default=Empty())),
    st.builds(lambda: pb.NackRetry(dead_letter=Empty())),
    st.builds(lambda d: pb.NackRetry(delay=d), durations),
)
pb_nack_requests = st.builds(
    pb.NackRequest, texts, uint32s, st.none() | texts, pb_nack_retries, st.none() | texts
)
pb_extend_requests = st.builds(pb.ExtendRequest, texts, uint32s, durations, st.none() | texts)
pb_drain_requests = st.builds(pb.DrainDeadLettersRequest, st.none() | texts, st.none() | uint32s)

# ---------------------------------------------------------------------------------------
# Server-side values


@st.composite
def job_records(draw: st.DrawFn, valid: bool = True) -> JobRecord:
    """A stored job as the in-process server keeps it. ``valid=False`` also allows what
    the client must refuse or drop (priority over 9, empty strings, bad trace contexts)."""
    traceparent = traceparents | invalid_traceparents if not valid else traceparents
    trace = st.none() | st.tuples(traceparent, st.none() | texts)
    scheduled = st.none() | st.tuples(
        st.integers(0, MAX_TIMESTAMP_SECONDS), st.integers(0, 999_999_999)
    )
    return JobRecord(
        draw(nonempty_texts if valid else texts),
        draw(texts),
        draw(nonempty_texts if valid else texts),
        payload=draw(st.none() | st.tuples(byte_strings, texts)),
        priority=draw(st.integers(0, 9) if valid else uint32s),
        trace=draw(trace),
        enqueued_ms=draw(st.integers(0, MAX_TIMESTAMP_SECONDS * 1000)),
        max_attempts=draw(uint32s),
        custom=draw(custom_maps),  # type: ignore[arg-type]
        scheduled_at=draw(scheduled),
    )


timestamp_ms = st.integers(0, MAX_TIMESTAMP_SECONDS * 1000 + 999)


def ms_datetime(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def record_scheduled(record: JobRecord) -> Optional[datetime]:
    if record.scheduled_at is None:
        return None
    seconds, nanos = record.scheduled_at
    return EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


def record_trace(record: JobRecord) -> Optional[TraceContext]:
    if record.trace is None or not is_valid_traceparent(record.trace[0]):
        return None
    return TraceContext(*record.trace)


def record_payload(record: JobRecord) -> Optional[Payload]:
    return None if record.payload is None else Payload(*record.payload)


def expected_job_from_record(record: JobRecord, attempt: int, expiry_ms: int) -> Job:
    ctx = JobCtx(
        id=record.id,
        queue=record.queue,
        job_type=record.job_type,
        priority=Priority(record.priority),
        attempt=attempt,
        max_attempts=record.max_attempts,
        enqueued_at=ms_datetime(record.enqueued_ms),
        custom=dict(record.custom),  # type: ignore[arg-type]
        trace_context=record_trace(record),
        lease_expires_at=ms_datetime(expiry_ms),
        scheduled_at=record_scheduled(record),
    )
    return Job(payload=record_payload(record), ctx=ctx)


# ---------------------------------------------------------------------------------------
# Exact comparison


def _norm_float(value: float) -> tuple[str, object]:
    return ("float", "nan" if math.isnan(value) else struct.pack("<d", value))


def _norm_mapping(value: Mapping[Any, Any]) -> tuple[str, object]:
    items = sorted(((norm(k), norm(v)) for k, v in value.items()), key=repr)
    return ("map", tuple(items))


def norm(value: Any) -> Any:  # noqa: C901 - one branch per kind of value
    """``value`` as nested tuples tagged with types, so that ``==`` is exact."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.name)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return _norm_float(value)
    if isinstance(value, datetime):
        return ("datetime", value, value.utcoffset())
    if isinstance(value, timedelta):
        return ("timedelta", value)
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    if dataclasses.is_dataclass(value):
        fields = [f.name for f in dataclasses.fields(value) if f.compare]
        return (type(value).__name__, tuple((n, norm(getattr(value, n))) for n in fields))
    if isinstance(value, Mapping):
        return _norm_mapping(value)
    if isinstance(value, (list, tuple)):
        # A NamedTuple record (the codec's decoded pairs) compares as the tuple it is.
        kind = "list" if isinstance(value, list) else "tuple"
        return (kind, tuple(norm(v) for v in value))
    slots = getattr(type(value), "__slots__", None)
    if slots is not None:
        return (type(value).__name__, tuple((s, norm(getattr(value, s))) for s in slots))
    raise TypeError(f"norm() does not know {type(value).__name__}")


# ---------------------------------------------------------------------------------------
# Valid encodings of every message a codec decoder reads, by message name

any_pb_jobs = st.one_of(
    pb_jobs(),
    st.tuples(pb_jobs(), st.sampled_from(sorted(JOB_DEFECTS))).flatmap(
        lambda job_defect: break_job(*job_defect)
    ),
)
_validation_errors = st.builds(
    lambda index, rejection: pb.JobValidationError(index, rejection_to_pb(rejection)),
    uint32s,
    rejections,
)
_atomic_responses = st.one_of(
    st.just(pb.EnqueueAtomicResponse()),
    st.builds(
        lambda acks: pb.EnqueueAtomicResponse(
            success=pb.EnqueueAtomicSuccess([pb.EnqueueResponse(*ack) for ack in acks])
        ),
        st.lists(st.tuples(texts, st.booleans()), max_size=3),
    ),
    st.builds(
        lambda errs: pb.EnqueueAtomicResponse(rejection=pb.BatchValidationFailure(errs)),
        st.lists(_validation_errors, max_size=3),
    ),
)


@st.composite
def _records_any(draw: st.DrawFn) -> pb.DeadLetterRecord:
    record = draw(pb_dead_letter_records())
    defect = draw(st.sampled_from(["none", "no_job", "failed_unset", "failed_before_epoch"]))
    if defect == "no_job":
        record.job = None
    elif defect == "failed_unset":
        record.failed_at = EPOCH
    elif defect == "failed_before_epoch":
        record.failed_at = draw(before_epoch)
    return record


def _encoded(strategy: st.SearchStrategy[betterproto.Message]) -> st.SearchStrategy[bytes]:
    return strategy.map(bytes)


MESSAGE_BYTES: dict[str, st.SearchStrategy[bytes]] = {
    # responses (decoded by the client)
    "ReserveResponse": _encoded(st.builds(pb.ReserveResponse, st.lists(any_pb_jobs, max_size=3))),
    "EnqueueBatchResponse": _encoded(
        st.builds(
            pb.EnqueueBatchResponse, st.lists(batch_outcomes.map(job_result_to_pb), max_size=4)
        )
    ),
    "EnqueueAtomicResponse": _encoded(_atomic_responses),
    "AckResponse": _encoded(st.builds(pb.AckResponse, texts)),
    "NackResponse": _encoded(st.builds(pb.NackResponse, texts, st.booleans())),
    "ExtendResponse": _encoded(
        st.builds(pb.ExtendResponse, texts, st.one_of(after_epoch, before_epoch, st.just(EPOCH)))
    ),
    "DrainDeadLettersResponse": _encoded(
        st.builds(pb.DrainDeadLettersResponse, st.lists(_records_any(), max_size=3))
    ),
    "GetServerInfoResponse": _encoded(server_infos.map(server_info_to_pb)),
    # requests (decoded by the in-process server)
    "EnqueueBatchRequest": _encoded(
        st.builds(pb.EnqueueBatchRequest, st.lists(pb_enqueue_requests(), max_size=3))
    ),
    "ReserveRequest": _encoded(pb_reserve_requests),
    "AckRequest": _encoded(pb_ack_requests),
    "NackRequest": _encoded(pb_nack_requests),
    "ExtendRequest": _encoded(pb_extend_requests),
    "DrainDeadLettersRequest": _encoded(pb_drain_requests),
}
