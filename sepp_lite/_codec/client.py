"""The client's half of the codec: requests from domain values to bytes, responses from
bytes straight to domain values (no generated message objects in between).

Every encoder re-checks what it sends (request dataclasses are mutable, so their
``__post_init__`` checks can be bypassed) and raises ``TypeError``/``ValueError``
before anything reaches the wire. Every decoder raises only
:class:`~sepp_lite.errors.DecodeError` on bad bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Callable, Optional, TypeVar, Union

from sepp_lite import errors
from sepp_lite._codec._wire import (
    VARINT,
    as_int64,
    check_int64,
    check_uint32,
    datetime_body,
    field_bytes,
    field_double,
    field_str,
    field_uint,
    guarded,
    read_double,
    read_len,
    read_seconds_nanos,
    read_tag,
    read_varint,
    skip_field,
    svarint64,
    timedelta_body,
    to_datetime,
    to_timedelta,
)
from sepp_lite._time import EPOCH, as_utc
from sepp_lite.errors import DecodeError
from sepp_lite.types import (
    PRIORITIES,
    DeadLetterCause,
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobCtx,
    Payload,
    Primitive,
    Priority,
    ReserveOptions,
    ServerInfo,
    TraceContext,
    TraceContextError,
)

# ---------------------------------------------------------------------------------------
# Encoding requests

T = TypeVar("T")


def _trace_body(traceparent: str, tracestate: str | None) -> bytes:
    body = field_str(b"\x0a", traceparent) if traceparent else b""
    if tracestate is not None:
        body += field_str(b"\x12", tracestate)
    return body


def trace_field(traceparent: str, tracestate: str | None) -> bytes:
    """``EnqueueRequest.trace_context`` (field 7) for a context injected into jobs."""
    return field_bytes(b"\x3a", _trace_body(traceparent, tracestate))


def _primitive_body(key: str, value: object) -> bytes:
    # bool before int: bool is a subclass of int.
    cls = value.__class__
    if cls is str:
        return field_str(b"\x0a", value)  # type: ignore[arg-type]
    if cls is bool:
        return b"\x20\x01" if value else b"\x20\x00"
    if cls is int:
        return b"\x18" + svarint64(check_int64(value, f"custom[{key!r}]"))  # type: ignore[arg-type]
    if cls is float:
        return field_double(b"\x11", value)  # type: ignore[arg-type]
    # Subclasses (str/int enums, numpy-like scalars) are sent as their base value; for a
    # str subclass that is its characters, not its __str__ (Enum's is "Cls.NAME").
    if isinstance(value, str):
        return _primitive_body(key, str.__str__(value))
    if isinstance(value, int):
        return _primitive_body(key, int(value))
    if isinstance(value, float):
        return _primitive_body(key, float(value))
    raise TypeError(f"custom[{key!r}] must be str, int, float or bool, got {type(value).__name__}")


# Encoded fields by value. Producers repeat queue names, job types, encodings and custom
# entries from job to job, and a lookup is cheaper than encoding; the caches are bounded
# (cleared when full) so a stream of unique values cannot grow them.
_CACHE_MAX = 4096
_QUEUE_FIELDS: dict[str, bytes] = {}
_TYPE_FIELDS: dict[str, bytes] = {}
_ENCODING_FIELDS: dict[str, bytes] = {}
_ENTRY_FIELDS: dict[tuple[bytes, str, object, type], bytes] = {}


def _cached_str_field(cache: dict[str, bytes], tag: bytes, value: str) -> bytes:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    encoded = cache[value] = field_str(tag, value)
    return encoded


def _entry_field(tag: bytes, key: object, value: object) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"custom keys must be str, got {type(key).__name__}")
    entry = field_str(b"\x0a", key) + field_bytes(b"\x12", _primitive_body(key, value))
    return field_bytes(tag, entry)


_CACHEABLE = frozenset({str, int, bool})


def custom_fields(tag: bytes, custom: Mapping[str, Primitive]) -> bytes:
    """A ``map<string, PrimitiveValue>`` as repeated entry fields (insertion order)."""
    out = []
    for key, value in custom.items():
        cls = value.__class__
        if cls is float or cls not in _CACHEABLE:
            # -0.0 == 0.0 (equal keys, different bytes) and other types (subclasses,
            # wrong types) are encoded, or refused, without the cache.
            out.append(_entry_field(tag, key, value))
            continue
        cache_key = (tag, key, value, cls)
        encoded = _ENTRY_FIELDS.get(cache_key)
        if encoded is None:
            encoded = _entry_field(tag, key, value)
            if len(_ENTRY_FIELDS) >= _CACHE_MAX:
                _ENTRY_FIELDS.clear()
            _ENTRY_FIELDS[cache_key] = encoded
        out.append(encoded)
    return b"".join(out)


def _payload_field(payload: object) -> bytes:
    if not isinstance(payload, Payload):
        raise TypeError(f"payload must be a Payload or None, got {type(payload).__name__}")
    data = payload.data
    if not isinstance(data, bytes):
        if not isinstance(data, (bytearray, memoryview)):
            raise TypeError(f"payload.data must be bytes, got {type(data).__name__}")
        data = bytes(data)
    if not isinstance(payload.encoding, str):
        raise TypeError("payload.encoding must be a str")
    encoding = payload.encoding
    tail = _ENCODING_FIELDS.get(encoding) if encoding else b""
    if tail is None:
        tail = _cached_str_field(_ENCODING_FIELDS, b"\x12", encoding)
    if not data:
        return field_bytes(b"\x1a", tail)
    size = len(data)
    head = field_uint(b"\x0a", size)
    return field_uint(b"\x1a", len(head) + size + len(tail)) + head + data + tail


def _priority_value(priority: object) -> int:
    if isinstance(priority, Priority):
        return priority.value
    return Priority(priority).value  # type: ignore[arg-type]


def _optional_fields(job: EnqueueRequest) -> list[bytes]:
    parts = []
    key = job.idempotency_key
    if key is not None:
        if not isinstance(key, str):
            raise TypeError("idempotency_key must be a str or None")
        parts.append(field_str(b"\x22", key))
    if job.priority is not None:
        parts.append(field_uint(b"\x28", _priority_value(job.priority)))
    if job.max_attempts is not None:
        parts.append(field_uint(b"\x30", check_uint32(job.max_attempts, "max_attempts")))
    return parts


def _scheduled_field(scheduled_at: object) -> bytes:
    if not isinstance(scheduled_at, datetime):
        raise TypeError("scheduled_at must be a datetime or None")
    # Instants before the epoch are dropped, as sepp-py does: the job runs now.
    if as_utc(scheduled_at) < EPOCH:
        return b""
    return field_bytes(b"\x4a", datetime_body(scheduled_at))


def enqueue_body(job: EnqueueRequest, injected_trace: bytes = b"") -> bytes:
    """One ``EnqueueRequest`` message body. ``injected_trace`` (a field from
    :func:`trace_field`) is used when the job carries no trace context of its own."""
    queue, job_type = job.queue, job.job_type
    if queue.__class__ is not str or not queue:
        raise ValueError("queue must be a non-empty str")
    if job_type.__class__ is not str or not job_type:
        raise ValueError("job_type must be a non-empty str")
    parts = [
        _QUEUE_FIELDS.get(queue) or _cached_str_field(_QUEUE_FIELDS, b"\x0a", queue),
        _TYPE_FIELDS.get(job_type) or _cached_str_field(_TYPE_FIELDS, b"\x12", job_type),
    ]
    if job.payload is not None:
        parts.append(_payload_field(job.payload))
    if job.idempotency_key is not None or job.priority is not None or job.max_attempts is not None:
        parts += _optional_fields(job)
    tc = job.trace_context
    if tc is not None:
        if not isinstance(tc, TraceContext):
            raise TypeError("trace_context must be a TraceContext or None")
        parts.append(field_bytes(b"\x3a", _trace_body(tc.traceparent, tc.tracestate)))
    else:
        parts.append(injected_trace)
    if job.custom:
        parts.append(custom_fields(b"\x42", job.custom))
    if job.scheduled_at is not None:
        parts.append(_scheduled_field(job.scheduled_at))
    return b"".join(parts)


def encode_enqueue_batch(jobs: Sequence[EnqueueRequest], injected_trace: bytes = b"") -> bytes:
    """``EnqueueBatchRequest`` (also the request of ``EnqueueAtomic``)."""
    return b"".join([field_bytes(b"\x0a", enqueue_body(job, injected_trace)) for job in jobs])


def _duration_field(tag: bytes, value: timedelta) -> bytes:
    return field_bytes(tag, timedelta_body(value))


def _optional_str_field(tag: bytes, value: str | None) -> bytes:
    return b"" if value is None else field_str(tag, value)


def encode_reserve(opts: ReserveOptions, max_jobs: int | None = None) -> bytes:
    """``ReserveRequest``; ``max_jobs`` overrides the options' own when given."""
    parts = [field_str(b"\x0a", queue) for queue in opts.queues]
    parts.append(_duration_field(b"\x12", opts.wait_timeout))
    parts.append(_duration_field(b"\x1a", opts.lease_duration))
    parts.append(_optional_str_field(b"\x22", opts.worker_id))
    limit = opts.max_jobs if max_jobs is None else max_jobs
    if limit is not None:
        parts.append(field_uint(b"\x28", check_uint32(limit, "max_jobs")))
    return b"".join(parts)


def _fence(job_id: str, attempt: int) -> bytes:
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
    head = field_str(b"\x0a", job_id) if job_id else b""
    attempt = check_uint32(attempt, "attempt")
    return head + field_uint(b"\x10", attempt) if attempt else head


def encode_ack(job_id: str, attempt: int, worker_id: str | None) -> bytes:
    return _fence(job_id, attempt) + _optional_str_field(b"\x1a", worker_id)


_NACK_DEFAULT = b"\x22\x02\x0a\x00"
_NACK_DEAD_LETTER = b"\x22\x02\x1a\x00"


def nack_retry_field(kind: str, delay: timedelta | None) -> bytes:
    """``NackRequest.retry`` (field 4): always present, exactly one strategy set (the
    Empty members are sent as empty messages, which keeps them on the wire)."""
    if kind == "after" and delay is not None:
        return field_bytes(b"\x22", field_bytes(b"\x12", timedelta_body(delay)))
    if kind == "dead_letter":
        return _NACK_DEAD_LETTER
    return _NACK_DEFAULT


def encode_nack(
    job_id: str, attempt: int, reason: str | None, retry: bytes, worker_id: str | None
) -> bytes:
    """``NackRequest``; ``retry`` comes from :func:`nack_retry_field`."""
    return (
        _fence(job_id, attempt)
        + _optional_str_field(b"\x1a", reason)
        + retry
        + _optional_str_field(b"\x2a", worker_id)
    )


def encode_extend(job_id: str, attempt: int, lease: timedelta, worker_id: str | None) -> bytes:
    return (
        _fence(job_id, attempt)
        + _duration_field(b"\x1a", lease)
        + _optional_str_field(b"\x22", worker_id)
    )


def encode_drain(queue: str | None, max_records: int | None) -> bytes:
    body = _optional_str_field(b"\x0a", queue)
    if max_records is not None:
        body += field_uint(b"\x10", check_uint32(max_records, "max_records"))
    return body


# ---------------------------------------------------------------------------------------
# Decoding responses


def _end_check(pos: int, stop: int) -> None:
    if pos != stop:
        raise DecodeError("message runs past its declared length")


def _primitive(data: bytes, pos: int, stop: int) -> object:
    """A PrimitiveValue; ``_MISSING`` when no member is set (the last member wins)."""
    value: object = _MISSING
    while pos < stop:
        tag = data[pos]
        if tag == 0x0A:
            size = data[pos + 1]
            if size < 0x80 and pos + 2 + size <= stop:
                pos += 2 + size
                value = data[pos - size : pos].decode()
                continue
        tag, pos = read_tag(data, pos)
        if tag == 0x0A:
            start, pos = read_len(data, pos, stop)
            value = data[start:pos].decode()
        elif tag == 0x11:
            value, pos = read_double(data, pos, stop)
        elif tag == 0x18:
            raw, pos = read_varint(data, pos)
            value = as_int64(raw)
        elif tag == 0x20:
            raw, pos = read_varint(data, pos)
            value = raw != 0
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return value


_MISSING = object()


def read_custom_entry(data: bytes, pos: int, stop: int) -> tuple[str, object]:
    """One map entry; the value is ``_MISSING`` when its PrimitiveValue sets nothing."""
    key = ""
    value: object = _MISSING
    while pos < stop:
        tag = data[pos]
        size = data[pos + 1]
        if tag in (0x0A, 0x12) and size < 0x80:
            start = pos + 2
            pos = start + size
            if pos > stop:
                raise DecodeError("length-delimited field runs past the end of its message")
        else:
            tag, pos = read_tag(data, pos)
            if tag not in (0x0A, 0x12):
                pos = skip_field(data, pos, stop, tag)
                continue
            start, pos = read_len(data, pos, stop)
        if tag == 0x0A:
            key = data[start:pos].decode()
        else:
            value = _primitive(data, start, pos)
    _end_check(pos, stop)
    return key, value


def _two_strings(data: bytes, pos: int, stop: int) -> tuple[bytes, bytes | None]:
    """Fields 1 and 2 of a message whose fields are both length-delimited; field 2 is
    ``None`` when absent."""
    first = b""
    second: bytes | None = None
    while pos < stop:
        tag = data[pos]
        size = data[pos + 1]
        if tag in (0x0A, 0x12) and size < 0x80:
            start = pos + 2
            pos = start + size
            if pos > stop:
                raise DecodeError("length-delimited field runs past the end of its message")
        else:
            tag, pos = read_tag(data, pos)
            if tag not in (0x0A, 0x12):
                pos = skip_field(data, pos, stop, tag)
                continue
            start, pos = read_len(data, pos, stop)
        if tag == 0x0A:
            first = data[start:pos]
        else:
            second = data[start:pos]
    _end_check(pos, stop)
    return first, second


def _payload(data: bytes, pos: int, stop: int) -> Payload:
    body, encoding = _two_strings(data, pos, stop)
    return Payload(body, encoding.decode() if encoding is not None else "")


def _trace(data: bytes, pos: int, stop: int) -> tuple[str, str | None]:
    traceparent, tracestate = _two_strings(data, pos, stop)
    return traceparent.decode(), None if tracestate is None else tracestate.decode()


# Decoded timestamps by their encoded bytes: the jobs of one reserve share a lease
# expiry, and jobs enqueued together share an enqueue time. datetimes are immutable.
_TIMESTAMPS: dict[bytes, datetime | None] = {}
_TIMESTAMPS_MAX = 4096


def _timestamp(data: bytes, pos: int, stop: int) -> datetime | None:
    raw = data[pos:stop]
    try:
        return _TIMESTAMPS[raw]
    except KeyError:
        pass
    when = to_datetime(*read_seconds_nanos(data, pos, stop))
    if len(_TIMESTAMPS) >= _TIMESTAMPS_MAX:
        _TIMESTAMPS.clear()
    _TIMESTAMPS[raw] = when
    return when


# Decoded custom entries by their encoded bytes, for the same reason as timestamps: jobs
# of one producer tend to carry the same few entries. Keys and values are immutable.
_ENTRIES: dict[bytes, tuple[str, object]] = {}


def _remember_entry(data: bytes, start: int, stop: int) -> tuple[str, object]:
    entry = read_custom_entry(data, start, stop)
    if len(_ENTRIES) >= _TIMESTAMPS_MAX:
        _ENTRIES.clear()
    _ENTRIES[data[start:stop]] = entry
    return entry


# A decoded Job message as a tuple, in this order (timestamps are ``_MISSING`` when
# unset and ``None`` when not representable).
JobTuple = tuple[
    str, str, Optional[Payload], int, Optional[tuple[str, Optional[str]]], object,
    int, int, object, dict[str, object], Optional[datetime], str,
]  # fmt: skip


def read_job(data: bytes, pos: int, stop: int) -> JobTuple:  # noqa: C901 - one flat loop
    job_id = job_type = queue = ""
    payload: Payload | None = None
    trace: tuple[str, str | None] | None = None
    scheduled_at: datetime | None = None
    enqueued_at: object = _MISSING
    lease_expires_at: object = _MISSING
    priority = attempt = max_attempts = 0
    custom: dict[str, object] = {}
    while pos < stop:
        tag = data[pos]
        pos += 1
        if tag & 7 == 2 and tag < 0x68:
            size = data[pos]
            pos += 1
            if size >= 0x80:
                size, pos = read_varint(data, pos - 1)
            start = pos
            pos += size
            if pos > stop:
                raise DecodeError("length-delimited field runs past the end of its message")
            if tag == 0x0A:
                job_id = data[start:pos].decode()
            elif tag == 0x12:
                job_type = data[start:pos].decode()
            elif tag == 0x1A:
                payload = _payload(data, start, pos)
            elif tag == 0x2A:
                trace = _trace(data, start, pos)
            elif tag == 0x32:
                enqueued_at = _timestamp(data, start, pos)
            elif tag == 0x4A:
                lease_expires_at = _timestamp(data, start, pos)
            elif tag == 0x52:
                entry = _ENTRIES.get(data[start:pos])
                if entry is None:
                    entry = _remember_entry(data, start, pos)
                custom[entry[0]] = entry[1]
            elif tag == 0x5A:
                scheduled_at = _timestamp(data, start, pos)
            elif tag == 0x62:
                queue = data[start:pos].decode()
        elif tag == 0x20 or tag == 0x38 or tag == 0x40:
            raw = data[pos]
            pos += 1
            if raw >= 0x80:
                raw, pos = read_varint(data, pos - 1)
                raw &= 0xFFFF_FFFF
            if tag == 0x20:
                priority = raw
            elif tag == 0x38:
                attempt = raw
            else:
                max_attempts = raw
        else:
            tag, pos = read_tag(data, pos - 1)
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return (
        job_id, job_type, payload, priority, trace, enqueued_at,
        attempt, max_attempts, lease_expires_at, custom, scheduled_at, queue,
    )  # fmt: skip


def _time_or_fail(value: object, job_id: str, name: str) -> datetime:
    if value is _MISSING:
        raise errors.JobConversionError(f"job {job_id} has no {name}")
    if value is None:
        raise errors.JobConversionError(f"job {job_id}: {name} is not a representable time")
    return value  # type: ignore[return-value]


def _checked_common(
    job: JobTuple,
) -> tuple[Priority, dict[str, Primitive], TraceContext | None, datetime]:
    """The checks shared by reserved jobs and dead-letter records; a failure raises
    :class:`~sepp_lite.errors.JobConversionError` and the job is skipped."""
    job_id, job_type, priority = job[0], job[1], job[3]
    if not job_id:
        raise errors.JobConversionError("job has an empty id")
    if not job_type:
        raise errors.JobConversionError(f"job {job_id} has an empty job_type")
    if priority > 9:
        raise errors.JobConversionError(f"job {job_id} has priority {priority}, over 9")
    custom = job[9]
    if _MISSING in custom.values():
        key = next(k for k, v in custom.items() if v is _MISSING)
        raise errors.JobConversionError(f"job {job_id}: custom[{key!r}] sets no value")
    context = None
    trace = job[4]
    if trace is not None:
        try:
            context = TraceContext(*trace)
        except TraceContextError:
            pass  # an invalid trace context is dropped; the job is still delivered
    enqueued_at = job[5]
    when = _time_or_fail(enqueued_at, job_id, "enqueued_at")
    return PRIORITIES[priority], custom, context, when  # type: ignore[return-value]


def job_value(job: JobTuple) -> Job:
    """A reserved job as a domain value (its ctx has no lease yet: the client binds one)."""
    priority, custom, context, enqueued_at = _checked_common(job)
    lease_expires_at = _time_or_fail(job[8], job[0], "lease_expires_at")
    ctx = JobCtx(
        job[0], job[11], job[1], priority, job[6], job[7],
        enqueued_at, custom, context, lease_expires_at, job[10],
    )  # fmt: skip
    return Job(job[2], ctx)


def _repeated(data: bytes, tag_wanted: int, read: Callable[[bytes, int, int], T]) -> list[T]:
    """Every occurrence of one repeated message field at the top level of ``data``."""
    items = []
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = read_tag(data, pos)
        if tag == tag_wanted:
            start, pos = read_len(data, pos, end)
            items.append(read(data, start, pos))
        else:
            pos = skip_field(data, pos, end, tag)
    return items


def _reserve_response(data: bytes) -> list[JobTuple]:
    return _repeated(data, 0x0A, read_job)


def decode_reserve(data: bytes) -> tuple[list[Job], list[errors.JobConversionError]]:
    """``ReserveResponse``: the jobs, and the problems of those that had to be skipped."""
    jobs: list[Job] = []
    problems: list[errors.JobConversionError] = []
    for raw in guarded("ReserveResponse", _reserve_response, data):
        try:
            jobs.append(job_value(raw))
        except errors.JobConversionError as problem:
            problems.append(problem)
    return jobs, problems


def _enqueue_response(data: bytes, pos: int, stop: int) -> EnqueueAck:
    job_id = ""
    deduplicated = False
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag == 0x0A:
            start, pos = read_len(data, pos, stop)
            job_id = data[start:pos].decode()
        elif tag == 0x10:
            raw, pos = read_varint(data, pos)
            deduplicated = raw != 0
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return EnqueueAck(job_id, deduplicated)


def _fields_of(data: bytes, pos: int, stop: int) -> dict[int, object]:
    """Decode a small message generically: tag -> last value (length-delimited fields as
    (start, stop) spans, varints as ints). Keyed by tag, not field number, so a field
    sent with an unexpected wire type is ignored, as protobuf does."""
    fields: dict[int, object] = {}
    while pos < stop:
        tag, pos = read_tag(data, pos)
        wire_type = tag & 7
        if wire_type == 2:
            start, pos = read_len(data, pos, stop)
            fields[tag] = (start, pos)
        elif wire_type == VARINT:
            fields[tag], pos = read_varint(data, pos)
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return fields


def _span_str(data: bytes, span: object) -> str:
    if not isinstance(span, tuple):
        return ""
    start, stop = span
    return data[int(start) : int(stop)].decode()


def _span_strs(data: bytes, pos: int, stop: int, tag_wanted: int) -> tuple[str, list[str]]:
    """Field 1 (a string) and repeated field 2 (strings) of a rejection message."""
    first = ""
    rest = []
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag == 0x0A:
            start, pos = read_len(data, pos, stop)
            first = data[start:pos].decode()
        elif tag == tag_wanted:
            start, pos = read_len(data, pos, stop)
            rest.append(data[start:pos].decode())
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return first, rest


def _limit_actual(fields: dict[int, object], limit: int = 1, actual: int = 2) -> tuple[int, int]:
    lim = fields.get(limit << 3, 0)
    act = fields.get(actual << 3, 0)
    if not isinstance(lim, int) or not isinstance(act, int):
        return 0, 0
    return lim, act


def _varint_pair(data: bytes, pos: int, stop: int, narrow: bool) -> tuple[int, int]:
    limit, actual = _limit_actual(_fields_of(data, pos, stop))
    return (limit & 0xFFFF_FFFF, actual & 0xFFFF_FFFF) if narrow else (limit, actual)


def _scheduled_too_far(data: bytes, pos: int, stop: int) -> errors.JobRejection:
    horizon = timedelta(0)
    actual = EPOCH
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag in (0x0A, 0x12):
            start, pos = read_len(data, pos, stop)
            seconds, nanos = read_seconds_nanos(data, start, pos)
            if tag == 0x0A:
                horizon = to_timedelta(seconds, nanos)
            else:
                actual = to_datetime(seconds, nanos) or EPOCH
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return errors.ScheduledTooFar(horizon, actual)


def _rejection_variant(number: int, data: bytes, pos: int, stop: int) -> errors.JobRejection:
    if number == 1:
        return errors.UnknownQueue(_span_strs(data, pos, stop, 0)[0])
    if number in (2, 6):
        cls = errors.PayloadTooLarge if number == 2 else errors.CustomMapTooLarge
        return cls(*_varint_pair(data, pos, stop, narrow=False))
    if number in (3, 4):
        first, allowed = _span_strs(data, pos, stop, 0x12)
        if number == 3:
            return errors.EncodingNotAllowed(first, allowed)
        return errors.JobTypeNotAllowed(first, allowed)
    if number == 5:
        return errors.CustomEntriesTooMany(*_varint_pair(data, pos, stop, narrow=True))
    if number == 7:
        fields = _fields_of(data, pos, stop)
        limit, actual = _limit_actual(fields, 2, 3)
        return errors.CustomKeyTooLong(
            _span_str(data, fields.get(0x0A)), limit & 0xFFFF_FFFF, actual
        )
    if number in (8, 9, 10):
        limit, actual = _varint_pair(data, pos, stop, narrow=False)
        cls2 = {
            8: errors.QueueNameTooLong,
            9: errors.JobTypeNameTooLong,
            10: errors.IdempotencyKeyTooLong,
        }[number]
        return cls2(limit & 0xFFFF_FFFF, actual)
    if number == 11:
        return _scheduled_too_far(data, pos, stop)
    return _other_variant(number, data, pos, stop)


def _other_variant(number: int, data: bytes, pos: int, stop: int) -> errors.JobRejection:
    if number == 12:
        return errors.InvalidRequest(_span_strs(data, pos, stop, 0)[0])
    if number == 13:
        fields = _fields_of(data, pos, stop)
        limit = fields.get(0x10, 0)
        return errors.QueueFull(
            _span_str(data, fields.get(0x0A)), limit if isinstance(limit, int) else 0
        )
    if number == 14:
        return errors.QueueClosing(_span_strs(data, pos, stop, 0)[0])
    return errors.UnknownRejection()


def read_rejection(data: bytes, pos: int, stop: int) -> errors.JobRejection:
    """A JobRejection; the last known oneof member wins, none gives UnknownRejection."""
    result: errors.JobRejection = errors.UnknownRejection()
    while pos < stop:
        tag, pos = read_tag(data, pos)
        number = tag >> 3
        if tag & 7 == 2 and 1 <= number <= 14:
            start, pos = read_len(data, pos, stop)
            result = _rejection_variant(number, data, start, pos)
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return result


BatchOutcome = Union[EnqueueAck, errors.JobRejection, None]


def _job_result(data: bytes, pos: int, stop: int) -> BatchOutcome:
    outcome: BatchOutcome = None
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag in (0x0A, 0x12):
            start, pos = read_len(data, pos, stop)
            if tag == 0x0A:
                outcome = _enqueue_response(data, start, pos)
            else:
                outcome = read_rejection(data, start, pos)
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return outcome


def _batch_response(data: bytes) -> list[BatchOutcome]:
    return _repeated(data, 0x0A, _job_result)


def decode_enqueue_batch(data: bytes) -> list[BatchOutcome]:
    """``EnqueueBatchResponse``: one outcome per job; ``None`` where none was set."""
    return guarded("EnqueueBatchResponse", _batch_response, data)


def _validation_error(data: bytes, pos: int, stop: int) -> errors.JobValidationError:
    index = 0
    rejection: errors.JobRejection = errors.UnknownRejection()
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag == 0x08:
            raw, pos = read_varint(data, pos)
            index = raw & 0xFFFF_FFFF
        elif tag == 0x12:
            start, pos = read_len(data, pos, stop)
            rejection = read_rejection(data, start, pos)
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return errors.JobValidationError(index, rejection)


AtomicOutcome = Union[list[EnqueueAck], list[errors.JobValidationError], None]


def _atomic_response(data: bytes) -> tuple[str, list[object]] | None:
    outcome: tuple[str, list[object]] | None = None
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = read_tag(data, pos)
        if tag in (0x0A, 0x12):
            start, pos = read_len(data, pos, end)
            body = data[start:pos]
            if tag == 0x0A:
                outcome = ("success", _repeated(body, 0x0A, _enqueue_response))
            else:
                outcome = ("rejection", _repeated(body, 0x0A, _validation_error))
        else:
            pos = skip_field(data, pos, end, tag)
    return outcome


def decode_enqueue_atomic(data: bytes) -> tuple[str, list[object]] | None:
    """``EnqueueAtomicResponse`` as ``("success", [EnqueueAck...])`` or
    ``("rejection", [JobValidationError...])``, or ``None`` with no outcome set."""
    return guarded("EnqueueAtomicResponse", _atomic_response, data)


def _simple(data: bytes) -> dict[int, object]:
    return _fields_of(data, 0, len(data))


def decode_ack(data: bytes) -> str:
    """``AckResponse``: the job id."""

    def decode(raw: bytes) -> str:
        return _span_str(raw, _simple(raw).get(0x0A))

    return guarded("AckResponse", decode, data)


def decode_nack(data: bytes) -> tuple[str, bool]:
    """``NackResponse``: the job id and whether the job was dead-lettered."""

    def decode(raw: bytes) -> tuple[str, bool]:
        fields = _simple(raw)
        return _span_str(raw, fields.get(0x0A)), bool(fields.get(0x10, 0))

    return guarded("NackResponse", decode, data)


def decode_extend(data: bytes) -> tuple[str, Optional[datetime]]:
    """``ExtendResponse``: the job id and the new expiry (``None`` if unset or not
    representable)."""

    def decode(raw: bytes) -> tuple[str, Optional[datetime]]:
        fields = _simple(raw)
        expiry = fields.get(0x12)
        when = None
        if isinstance(expiry, tuple):
            when = _timestamp(raw, *expiry)
        return _span_str(raw, fields.get(0x0A)), when

    return guarded("ExtendResponse", decode, data)


_CAUSES = (
    DeadLetterCause.UNSPECIFIED,
    DeadLetterCause.ATTEMPTS_EXHAUSTED,
    DeadLetterCause.REJECTED,
    DeadLetterCause.LEASE_EXPIRED,
    DeadLetterCause.ADMIN,
)

RecordTuple = tuple[Optional[JobTuple], int, object, int, Optional[str]]


def _record(data: bytes, pos: int, stop: int) -> RecordTuple:
    job: JobTuple | None = None
    cause = final_attempt = 0
    failed_at: object = _MISSING
    last_reason: str | None = None
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag in (0x0A, 0x1A, 0x2A):
            start, pos = read_len(data, pos, stop)
            if tag == 0x0A:
                job = read_job(data, start, pos)
            elif tag == 0x1A:
                failed_at = _timestamp(data, start, pos)
            else:
                last_reason = data[start:pos].decode()
        elif tag in (0x10, 0x20):
            raw, pos = read_varint(data, pos)
            if tag == 0x10:
                cause = raw
            else:
                final_attempt = raw & 0xFFFF_FFFF
        else:
            pos = skip_field(data, pos, stop, tag)
    _end_check(pos, stop)
    return job, cause, failed_at, final_attempt, last_reason


def record_value(record: RecordTuple) -> DeadLetterRecord:
    """A drained record as a domain value; the lease expiry is not checked (the job is a
    snapshot) and unknown causes read as UNSPECIFIED."""
    job, cause, failed_at, final_attempt, last_reason = record
    if job is None:
        raise errors.JobConversionError("dead-letter record has no job")
    priority, custom, context, enqueued_at = _checked_common(job)
    failed = _time_or_fail(failed_at, job[0], "failed_at")
    return DeadLetterRecord(
        job[11], job[0], job[1], job[2], priority, job[7], custom, context,
        enqueued_at, job[10], _CAUSES[cause] if cause < len(_CAUSES) else _CAUSES[0],
        failed, final_attempt, last_reason,
    )  # fmt: skip


def decode_drain(
    data: bytes,
) -> tuple[list[DeadLetterRecord], list[errors.JobConversionError]]:
    """``DrainDeadLettersResponse``: the records, and why any were skipped."""
    raws = guarded("DrainDeadLettersResponse", lambda raw: _repeated(raw, 0x0A, _record), data)
    records: list[DeadLetterRecord] = []
    problems: list[errors.JobConversionError] = []
    for raw in raws:
        try:
            records.append(record_value(raw))
        except errors.JobConversionError as problem:
            problems.append(problem)
    return records, problems


# ---------------------------------------------------------------------------------------
# GetServerInfoResponse

# Field numbers of the GetServerInfoResponse fields that are plain numbers or bools.
_INFO_NUMBERS = {
    6: "max_payload_bytes",
    7: "max_custom_entries",
    8: "max_custom_total_bytes",
    9: "max_custom_key_bytes",
    10: "max_queue_name_bytes",
    11: "max_job_type_bytes",
    12: "max_idempotency_key_bytes",
    14: "max_enqueue_batch",
    15: "max_reserve_batch",
    16: "max_reserve_queues",
}
_INFO_FLAGS = {4: "restricts_encodings", 19: "strict_queues", 20: "dead_letter_retention_enabled"}
_INFO_DURATIONS = {13: "max_schedule_horizon", 17: "max_wait_timeout", 18: "max_lease_duration"}
_UINT32_FIELDS = frozenset({7, 9, 10, 11, 12, 14, 15, 16})


def _server_info_fields(data: bytes) -> dict[str, object]:
    values: dict[str, object] = {
        "version": "",
        "supported_protocol_versions": [],
        "server_time": _MISSING,
        "allowed_encodings": [],
        **{name: 0 for name in _INFO_NUMBERS.values()},
        **{name: False for name in _INFO_FLAGS.values()},
        **{name: timedelta(0) for name in _INFO_DURATIONS.values()},
    }
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = read_tag(data, pos)
        number = tag >> 3
        if tag & 7 == VARINT and (number in _INFO_NUMBERS or number in _INFO_FLAGS):
            raw, pos = read_varint(data, pos)
            if number in _INFO_FLAGS:
                values[_INFO_FLAGS[number]] = raw != 0
            else:
                values[_INFO_NUMBERS[number]] = (
                    raw & 0xFFFF_FFFF if number in _UINT32_FIELDS else raw
                )
        elif tag & 7 == 2 and number in (1, 2, 3, 5, 13, 17, 18):
            start, pos = read_len(data, pos, end)
            _server_info_span(values, number, data, start, pos)
        else:
            pos = skip_field(data, pos, end, tag)
    return values


def _server_info_span(
    values: dict[str, object], number: int, data: bytes, start: int, stop: int
) -> None:
    if number == 1:
        values["version"] = data[start:stop].decode()
    elif number in (2, 5):
        key = "supported_protocol_versions" if number == 2 else "allowed_encodings"
        values[key].append(data[start:stop].decode())  # type: ignore[attr-defined]
    elif number == 3:
        values["server_time"] = to_datetime(*read_seconds_nanos(data, start, stop))
    else:
        # Durations: an unset one reads as zero and a negative one is clamped to zero.
        duration = to_timedelta(*read_seconds_nanos(data, start, stop))
        values[_INFO_DURATIONS[number]] = max(duration, timedelta(0))


def decode_server_info(data: bytes) -> ServerInfo:
    """``GetServerInfoResponse``; raise :class:`~sepp_lite.errors.MalformedServerInfoError`
    when the version is empty or the server time is unset or not representable."""
    values = guarded("GetServerInfoResponse", _server_info_fields, data)
    problem = None
    if not values["version"]:
        problem = "server_version is empty"
    elif values["server_time"] is _MISSING:
        problem = "server_time is unset"
    elif values["server_time"] is None:
        problem = "server_time is not a representable time"
    if problem is not None:
        raise errors.MalformedServerInfoError(errors.ServerInfoError(problem))
    return ServerInfo(**values)  # type: ignore[arg-type]
