"""The server's half of the codec, for the in-process server: requests from bytes into
small wire structs that keep field presence, responses from server state to bytes.

Decoders raise only :class:`~sepp_lite.errors.DecodeError` on bad bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable, Optional, Union

from sepp_lite import errors
from sepp_lite._codec._wire import (
    LEN,
    VARINT,
    as_int64,
    datetime_body,
    field_bytes,
    field_str,
    field_uint,
    guarded,
    ms_body,
    read_double,
    read_len,
    read_seconds_nanos,
    read_tag,
    read_varint,
    seconds_nanos_body,
    skip_field,
    timedelta_body,
    uvarint,
)
from sepp_lite._codec.client import custom_fields
from sepp_lite._time import EPOCH
from sepp_lite.errors import DecodeError
from sepp_lite.types import ServerInfo

SecondsNanos = tuple[int, int]
Trace = tuple[str, Optional[str]]
Custom = dict[str, Union[str, int, float, bool, None]]
"""A custom map as received; ``None`` marks a PrimitiveValue with no member set."""

_U32 = 0xFFFF_FFFF


def _fields(data: bytes, pos: int, stop: int) -> list[tuple[int, int, int]]:
    """The fields of one message as ``(tag, a, b)``: for length-delimited fields the
    span ``a:b``, for varints ``(value, -1)``; fixed-width fields are skipped."""
    out = []
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag < 8:
            raise DecodeError("field number 0 is not valid")
        wire_type = tag & 7
        if wire_type == LEN:
            start, pos = read_len(data, pos, stop)
            out.append((tag, start, pos))
        elif wire_type == VARINT:
            value, pos = read_varint(data, pos)
            out.append((tag, value, -1))
        else:
            pos = skip_field(data, pos, stop, tag)
    if pos != stop:
        raise DecodeError("message runs past its declared length")
    return out


def _text(data: bytes, start: int, stop: int) -> str:
    return data[start:stop].decode()


def _two_texts(data: bytes, start: int, stop: int) -> tuple[str, Optional[str]]:
    """Fields 1 (string) and 2 (optional string) of Payload-like messages."""
    first, second = "", None
    for tag, a, b in _fields(data, start, stop):
        if tag == 0x0A:
            first = _text(data, a, b)
        elif tag == 0x12:
            second = _text(data, a, b)
    return first, second


def _payload(data: bytes, start: int, stop: int) -> tuple[bytes, str]:
    body, encoding = b"", ""
    for tag, a, b in _fields(data, start, stop):
        if tag == 0x0A:
            body = data[a:b]
        elif tag == 0x12:
            encoding = _text(data, a, b)
    return body, encoding


def _primitive(data: bytes, start: int, stop: int) -> Union[str, int, float, bool, None]:
    value: Union[str, int, float, bool, None] = None
    pos = start
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag == 0x0A:
            a, pos = read_len(data, pos, stop)
            value = _text(data, a, pos)
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
    if pos != stop:
        raise DecodeError("message runs past its declared length")
    return value


def _custom_entry(data: bytes, start: int, stop: int) -> tuple[str, object]:
    key: str = ""
    value: object = None
    for tag, a, b in _fields(data, start, stop):
        if tag == 0x0A:
            key = _text(data, a, b)
        elif tag == 0x12:
            value = _primitive(data, a, b)
    return key, value


class EnqueueIn:
    """One ``EnqueueRequest`` as received; ``None`` means the field was absent."""

    __slots__ = (
        "custom",
        "idempotency_key",
        "job_type",
        "max_attempts",
        "payload",
        "priority",
        "queue",
        "scheduled_at",
        "trace",
    )

    def __init__(self) -> None:
        self.queue = ""
        self.job_type = ""
        self.payload: tuple[bytes, str] | None = None
        self.idempotency_key: str | None = None
        self.priority: int | None = None
        self.max_attempts: int | None = None
        self.trace: Trace | None = None
        self.custom: Custom = {}
        self.scheduled_at: SecondsNanos | None = None


def _custom_into(job: EnqueueIn, data: bytes, a: int, b: int) -> None:
    key, value = _custom_entry(data, a, b)
    job.custom[key] = value  # type: ignore[assignment]


# EnqueueRequest fields: tag -> (attribute, reader of the field's span or varint).
_ENQUEUE_FIELDS: dict[int, tuple[str, Callable[[bytes, int, int], object]]] = {
    0x0A: ("queue", _text),
    0x12: ("job_type", _text),
    0x1A: ("payload", _payload),
    0x22: ("idempotency_key", _text),
    0x28: ("priority", lambda _, value, __: value & _U32),
    0x30: ("max_attempts", lambda _, value, __: value & _U32),
    0x3A: ("trace", _two_texts),
    0x4A: ("scheduled_at", read_seconds_nanos),
}


def _enqueue_in(data: bytes, start: int, stop: int) -> EnqueueIn:
    job = EnqueueIn()
    for tag, a, b in _fields(data, start, stop):
        if tag == 0x42:
            _custom_into(job, data, a, b)
            continue
        known = _ENQUEUE_FIELDS.get(tag)
        if known is not None:
            setattr(job, known[0], known[1](data, a, b))
    return job


def _repeated(data: bytes, tag_wanted: int) -> list[tuple[int, int]]:
    return [(a, b) for tag, a, b in _fields(data, 0, len(data)) if tag == tag_wanted]


def decode_enqueue_batch(data: bytes) -> list[EnqueueIn]:
    """``EnqueueBatchRequest`` (the request of both enqueue RPCs)."""

    def decode(raw: bytes) -> list[EnqueueIn]:
        return [_enqueue_in(raw, a, b) for a, b in _repeated(raw, 0x0A)]

    return guarded("EnqueueBatchRequest", decode, data)


class ReserveIn:
    __slots__ = ("lease_duration", "max_jobs", "queues", "wait_timeout", "worker_id")

    def __init__(self) -> None:
        self.queues: list[str] = []
        self.wait_timeout: SecondsNanos | None = None
        self.lease_duration: SecondsNanos | None = None
        self.worker_id: str | None = None
        self.max_jobs: int | None = None


def decode_reserve(data: bytes) -> ReserveIn:
    """``ReserveRequest``."""

    def decode(raw: bytes) -> ReserveIn:
        req = ReserveIn()
        for tag, a, b in _fields(raw, 0, len(raw)):
            if tag == 0x0A:
                req.queues.append(_text(raw, a, b))
            elif tag == 0x12:
                req.wait_timeout = read_seconds_nanos(raw, a, b)
            elif tag == 0x1A:
                req.lease_duration = read_seconds_nanos(raw, a, b)
            elif tag == 0x22:
                req.worker_id = _text(raw, a, b)
            elif tag == 0x28:
                req.max_jobs = a & _U32
        return req

    return guarded("ReserveRequest", decode, data)


class LeaseIn:
    """``AckRequest``, ``NackRequest`` or ``ExtendRequest``.

    ``retry`` (Nack) is ``None`` when absent, else ``("unset",)``, ``("default",)``,
    ``("dead_letter",)`` or ``("delay", seconds, nanos)``.
    """

    __slots__ = ("attempt", "job_id", "lease_duration", "reason", "retry", "worker_id")

    def __init__(self) -> None:
        self.job_id = ""
        self.attempt = 0
        self.worker_id: str | None = None
        self.reason: str | None = None
        self.retry: tuple[object, ...] | None = None
        self.lease_duration: SecondsNanos | None = None


def _nack_retry(data: bytes, start: int, stop: int) -> tuple[object, ...]:
    retry: tuple[object, ...] = ("unset",)
    for tag, a, b in _fields(data, start, stop):
        if tag == 0x0A:
            retry = ("default",)
        elif tag == 0x12:
            retry = ("delay", *read_seconds_nanos(data, a, b))
        elif tag == 0x1A:
            retry = ("dead_letter",)
    return retry


# Where each RPC keeps worker_id, and its third and fourth fields.
_WORKER_TAG = {"ack": 0x1A, "nack": 0x2A, "extend": 0x22}


def decode_lease_request(kind: str, data: bytes) -> LeaseIn:
    """``AckRequest`` (``kind="ack"``), ``NackRequest`` or ``ExtendRequest``."""
    worker_tag = _WORKER_TAG[kind]

    def decode(raw: bytes) -> LeaseIn:
        req = LeaseIn()
        for tag, a, b in _fields(raw, 0, len(raw)):
            if tag == 0x0A:
                req.job_id = _text(raw, a, b)
            elif tag == 0x10:
                req.attempt = a & _U32
            elif tag == worker_tag:
                req.worker_id = _text(raw, a, b)
            elif kind == "nack" and tag == 0x1A:
                req.reason = _text(raw, a, b)
            elif kind == "nack" and tag == 0x22:
                req.retry = _nack_retry(raw, a, b)
            elif kind == "extend" and tag == 0x1A:
                req.lease_duration = read_seconds_nanos(raw, a, b)
        return req

    return guarded(f"{kind.capitalize()}Request", decode, data)


def decode_drain(data: bytes) -> tuple[Optional[str], Optional[int]]:
    """``DrainDeadLettersRequest``: ``(queue, max)``, ``None`` where absent."""

    def decode(raw: bytes) -> tuple[Optional[str], Optional[int]]:
        queue, limit = None, None
        for tag, a, b in _fields(raw, 0, len(raw)):
            if tag == 0x0A:
                queue = _text(raw, a, b)
            elif tag == 0x10:
                limit = a & _U32
        return queue, limit

    return guarded("DrainDeadLettersRequest", decode, data)


# ---------------------------------------------------------------------------------------
# Encoding responses


class JobRecord:
    """A stored job's fixed fields. Its encoding without ``attempt`` and
    ``lease_expires_at`` is computed once and reused for every delivery."""

    __slots__ = (
        "_static",
        "custom",
        "enqueued_ms",
        "id",
        "job_type",
        "max_attempts",
        "payload",
        "priority",
        "queue",
        "scheduled_at",
        "trace",
    )

    def __init__(
        self,
        job_id: str,
        queue: str,
        job_type: str,
        *,
        payload: tuple[bytes, str] | None,
        priority: int,
        trace: Trace | None,
        enqueued_ms: int,
        max_attempts: int,
        custom: Custom,
        scheduled_at: SecondsNanos | None,
    ) -> None:
        self.id = job_id
        self.queue = queue
        self.job_type = job_type
        self.payload = payload
        self.priority = priority
        self.trace = trace
        self.enqueued_ms = enqueued_ms
        self.max_attempts = max_attempts
        self.custom = custom
        self.scheduled_at = scheduled_at
        self._static: bytes | None = None

    def static_bytes(self) -> bytes:
        if self._static is None:
            self._static = _static_job_fields(self)
        return self._static


def _static_job_fields(job: JobRecord) -> bytes:
    parts = [field_str(b"\x0a", job.id), field_str(b"\x12", job.job_type)]
    if job.payload is not None:
        body, encoding = job.payload
        inner = (field_bytes(b"\x0a", body) if body else b"") + (
            field_str(b"\x12", encoding) if encoding else b""
        )
        parts.append(field_bytes(b"\x1a", inner))
    if job.priority:
        parts.append(field_uint(b"\x20", job.priority))
    if job.trace is not None:
        traceparent, tracestate = job.trace
        inner = field_str(b"\x0a", traceparent) if traceparent else b""
        if tracestate is not None:
            inner += field_str(b"\x12", tracestate)
        parts.append(field_bytes(b"\x2a", inner))
    parts.append(field_bytes(b"\x32", ms_body(job.enqueued_ms)))
    if job.max_attempts:
        parts.append(field_uint(b"\x40", job.max_attempts))
    if job.custom:
        # Values that set no member never get stored: validation refuses them.
        parts.append(custom_fields(b"\x52", job.custom))  # type: ignore[arg-type]
    if job.scheduled_at is not None:
        parts.append(field_bytes(b"\x5a", seconds_nanos_body(*job.scheduled_at)))
    if job.queue:
        parts.append(field_str(b"\x62", job.queue))
    return b"".join(parts)


def job_bytes(job: JobRecord, attempt: int, lease_expires_ms: int) -> bytes:
    """A ``Job`` message body as Reserve hands it out (or, with expiry 0, as stored in a
    dead-letter record, where ``lease_expires_at`` is the epoch placeholder)."""
    tail = field_uint(b"\x38", attempt) if attempt else b""
    return job.static_bytes() + tail + field_bytes(b"\x4a", ms_body(lease_expires_ms))


def encode_reserve(jobs: Iterable[tuple[JobRecord, int, int]]) -> bytes:
    """``ReserveResponse`` from ``(job, attempt, lease_expires_ms)``."""
    return b"".join(
        [field_bytes(b"\x0a", job_bytes(job, attempt, expiry)) for job, attempt, expiry in jobs]
    )


def _enqueue_response(job_id: str, deduplicated: bool) -> bytes:
    return field_str(b"\x0a", job_id) + (b"\x10\x01" if deduplicated else b"")


def _limit_actual(limit: int, actual: int, first: int = 0x08, second: int = 0x10) -> bytes:
    out = field_uint(bytes((first,)), limit) if limit else b""
    return out + (field_uint(bytes((second,)), actual) if actual else b"")


def _str_and_list(first: str, rest: Sequence[str]) -> bytes:
    body = field_str(b"\x0a", first) if first else b""
    return body + b"".join(field_str(b"\x12", item) for item in rest)


def _opt_str(tag: bytes, value: str) -> bytes:
    return field_str(tag, value) if value else b""


def rejection_body(rejection: errors.JobRejection) -> bytes:
    """A ``JobRejection`` message body (the oneof member set by the value's type)."""
    number, body = _rejection_member(rejection)
    return field_bytes(bytes((number << 3 | 2,)), body) if number else b""


def _rejection_member(r: errors.JobRejection) -> tuple[int, bytes]:  # noqa: C901 - a table
    if isinstance(r, errors.UnknownQueue):
        return 1, _opt_str(b"\x0a", r.queue)
    if isinstance(r, errors.PayloadTooLarge):
        return 2, _limit_actual(r.limit, r.actual)
    if isinstance(r, errors.EncodingNotAllowed):
        return 3, _str_and_list(r.encoding, r.allowed)
    if isinstance(r, errors.JobTypeNotAllowed):
        return 4, _str_and_list(r.job_type, r.allowed)
    if isinstance(r, errors.CustomEntriesTooMany):
        return 5, _limit_actual(r.limit, r.actual)
    if isinstance(r, errors.CustomMapTooLarge):
        return 6, _limit_actual(r.limit, r.actual)
    if isinstance(r, errors.CustomKeyTooLong):
        return 7, _opt_str(b"\x0a", r.key) + _limit_actual(r.limit, r.actual, 0x10, 0x18)
    if isinstance(r, errors.QueueNameTooLong):
        return 8, _limit_actual(r.limit, r.actual)
    if isinstance(r, errors.JobTypeNameTooLong):
        return 9, _limit_actual(r.limit, r.actual)
    if isinstance(r, errors.IdempotencyKeyTooLong):
        return 10, _limit_actual(r.limit, r.actual)
    if isinstance(r, errors.ScheduledTooFar):
        if isinstance(r, RawScheduledTooFar):
            actual = seconds_nanos_body(*r.wire_actual)
        else:
            delta = r.actual - EPOCH
            actual = seconds_nanos_body(
                delta.days * 86_400 + delta.seconds, delta.microseconds * 1000
            )
        return 11, field_bytes(b"\x0a", timedelta_body(r.horizon)) + field_bytes(b"\x12", actual)
    if isinstance(r, errors.InvalidRequest):
        return 12, _opt_str(b"\x0a", r.detail)
    if isinstance(r, errors.QueueFull):
        return 13, _opt_str(b"\x0a", r.queue) + (field_uint(b"\x10", r.limit) if r.limit else b"")
    if isinstance(r, errors.QueueClosing):
        return 14, _opt_str(b"\x0a", r.queue)
    return 0, b""


@dataclass(frozen=True)
class RawScheduledTooFar(errors.ScheduledTooFar):
    """A ``ScheduledTooFar`` that echoes the request's Timestamp verbatim: the server
    returns it as received, which a ``datetime`` cannot always hold (nanoseconds,
    years past 9999)."""

    wire_actual: tuple[int, int] = (0, 0)
    """The request's ``scheduled_at`` as ``(seconds, nanos)``."""


EnqueueOutcome = Union[tuple[str, bool], errors.JobRejection]
"""``(job_id, deduplicated)`` for an accepted job, else its rejection."""


def encode_enqueue_batch(results: Iterable[EnqueueOutcome]) -> bytes:
    """``EnqueueBatchResponse``: one JobResult per job."""
    parts = []
    for result in results:
        if isinstance(result, tuple):
            inner = field_bytes(b"\x0a", _enqueue_response(*result))
        else:
            inner = field_bytes(b"\x12", rejection_body(result))
        parts.append(field_bytes(b"\x0a", inner))
    return b"".join(parts)


def encode_atomic_success(acks: Iterable[tuple[str, bool]]) -> bytes:
    body = b"".join(field_bytes(b"\x0a", _enqueue_response(*ack)) for ack in acks)
    return field_bytes(b"\x0a", body)


def encode_atomic_failure(failures: Iterable[tuple[int, errors.JobRejection]]) -> bytes:
    body = b"".join(
        field_bytes(
            b"\x0a",
            (field_uint(b"\x08", index) if index else b"")
            + field_bytes(b"\x12", rejection_body(rejection)),
        )
        for index, rejection in failures
    )
    return field_bytes(b"\x12", body)


def encode_ack(job_id: str) -> bytes:
    return _opt_str(b"\x0a", job_id)


def encode_nack(job_id: str, dead_lettered: bool) -> bytes:
    return _opt_str(b"\x0a", job_id) + (b"\x10\x01" if dead_lettered else b"")


def encode_extend(job_id: str, lease_expires_ms: int) -> bytes:
    return _opt_str(b"\x0a", job_id) + field_bytes(b"\x12", ms_body(lease_expires_ms))


class DeadLetterOut:
    """One record for ``DrainDeadLettersResponse``."""

    __slots__ = ("cause", "failed_ms", "final_attempt", "job", "last_reason")

    def __init__(
        self,
        job: JobRecord,
        cause: int,
        failed_ms: int,
        final_attempt: int,
        last_reason: str | None,
    ) -> None:
        self.job = job
        self.cause = cause
        self.failed_ms = failed_ms
        self.final_attempt = final_attempt
        self.last_reason = last_reason


def encode_drain(records: Iterable[DeadLetterOut]) -> bytes:
    parts = []
    for record in records:
        body = field_bytes(b"\x0a", job_bytes(record.job, record.final_attempt, 0))
        if record.cause:
            body += field_uint(b"\x10", record.cause)
        body += field_bytes(b"\x1a", ms_body(record.failed_ms))
        if record.final_attempt:
            body += field_uint(b"\x20", record.final_attempt)
        if record.last_reason is not None:
            body += field_str(b"\x2a", record.last_reason)
        parts.append(field_bytes(b"\x0a", body))
    return b"".join(parts)


def _repeated_strs(tag: bytes, items: Iterable[str]) -> bytes:
    return b"".join(field_str(tag, item) for item in items)


def encode_server_info(info: ServerInfo) -> bytes:
    """``GetServerInfoResponse``; fields at their zero value are left out, as protobuf
    encoders do, except the three Durations and the server time, always written."""
    parts = [
        _opt_str(b"\x0a", info.version),
        _repeated_strs(b"\x12", info.supported_protocol_versions),
        field_bytes(b"\x1a", datetime_body(info.server_time)),
        b"\x20\x01" if info.restricts_encodings else b"",
        _repeated_strs(b"\x2a", info.allowed_encodings),
    ]
    numbers = (
        (6, info.max_payload_bytes),
        (7, info.max_custom_entries),
        (8, info.max_custom_total_bytes),
        (9, info.max_custom_key_bytes),
        (10, info.max_queue_name_bytes),
        (11, info.max_job_type_bytes),
        (12, info.max_idempotency_key_bytes),
        (14, info.max_enqueue_batch),
        (15, info.max_reserve_batch),
        (16, info.max_reserve_queues),
    )
    parts += [field_uint(uvarint(number << 3), value) for number, value in numbers if value]
    parts.append(field_bytes(b"\x6a", timedelta_body(info.max_schedule_horizon)))
    parts.append(field_bytes(b"\x8a\x01", timedelta_body(info.max_wait_timeout)))
    parts.append(field_bytes(b"\x92\x01", timedelta_body(info.max_lease_duration)))
    parts.append(b"\x98\x01\x01" if info.strict_queues else b"")
    parts.append(b"\xa0\x01\x01" if info.dead_letter_retention_enabled else b"")
    return b"".join(parts)
