"""Reserve and the Job message: ReserveRequest (the client writes it, the in-process
server reads it), ReserveResponse and its Jobs (the server writes them, the client reads
them into :class:`~sepp_lite.types.Job` values). Dead-letter records carry a Job too
(:mod:`~sepp_lite._codec.dead_letters`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Callable, NamedTuple, Optional, TypeVar

from sepp_lite import errors
from sepp_lite._codec._fields import (
    check_uint32,
    end_check,
    field_bytes,
    field_optional_str,
    field_str,
    field_uint,
    guarded,
    ms_body,
    read_fields,
    read_repeated,
    read_seconds_nanos,
    read_tag,
    read_text,
    read_varint,
    seconds_nanos_body,
    skip_field,
    timedelta_body,
)
from sepp_lite._codec.schema import (
    JOB_ATTEMPT,
    JOB_CUSTOM,
    JOB_ENQUEUED_AT,
    JOB_ID,
    JOB_JOB_TYPE,
    JOB_LEASE_EXPIRES_AT,
    JOB_MAX_ATTEMPTS,
    JOB_PAYLOAD,
    JOB_PRIORITY,
    JOB_QUEUE,
    JOB_SCHEDULED_AT,
    JOB_TRACE_CONTEXT,
    RESERVE_REQUEST_LEASE_DURATION,
    RESERVE_REQUEST_MAX_JOBS,
    RESERVE_REQUEST_QUEUES,
    RESERVE_REQUEST_WAIT_TIMEOUT,
    RESERVE_REQUEST_WORKER_ID,
    RESERVE_RESPONSE_JOBS,
)
from sepp_lite._codec.values import (
    ENTRY_CACHE,
    MISSING,
    DecodedPrimitive,
    SecondsNanos,
    Trace,
    cached_custom_entry,
    custom_fields,
    payload_field,
    read_payload,
    read_timestamp,
    read_trace_context,
    write_trace_context,
)
from sepp_lite.errors import DecodeError
from sepp_lite.types import (
    PRIORITIES,
    Job,
    JobCtx,
    Payload,
    Primitive,
    Priority,
    ReserveOptions,
    TraceContext,
    TraceContextError,
)

T = TypeVar("T")
V = TypeVar("V")

_U32 = 0xFFFF_FFFF

# ---------------------------------------------------------------------------------------
# ReserveRequest: written by the client, read by the in-process server


def encode_reserve_request(opts: ReserveOptions, max_jobs: int | None = None) -> bytes:
    """``ReserveRequest``; ``max_jobs`` overrides the options' own when given. Raises
    ``ValueError`` for negative durations or a count outside uint32."""
    parts = [field_str(RESERVE_REQUEST_QUEUES, queue) for queue in opts.queues]
    parts.append(field_bytes(RESERVE_REQUEST_WAIT_TIMEOUT, timedelta_body(opts.wait_timeout)))
    parts.append(field_bytes(RESERVE_REQUEST_LEASE_DURATION, timedelta_body(opts.lease_duration)))
    parts.append(field_optional_str(RESERVE_REQUEST_WORKER_ID, opts.worker_id))
    limit = opts.max_jobs if max_jobs is None else max_jobs
    if limit is not None:
        parts.append(field_uint(RESERVE_REQUEST_MAX_JOBS, check_uint32(limit, "max_jobs")))
    return b"".join(parts)


class ReserveIn:
    """A ``ReserveRequest`` as received; ``None`` means the field was absent."""

    __slots__ = ("lease_duration", "max_jobs", "queues", "wait_timeout", "worker_id")

    def __init__(self) -> None:
        self.queues: list[str] = []
        self.wait_timeout: SecondsNanos | None = None
        self.lease_duration: SecondsNanos | None = None
        self.worker_id: str | None = None
        self.max_jobs: int | None = None


def _read_reserve_in(data: bytes) -> ReserveIn:
    req = ReserveIn()
    for field, a, b in read_fields(data, 0, len(data)):
        if field == RESERVE_REQUEST_QUEUES:
            req.queues.append(data[a:b].decode())
        elif field == RESERVE_REQUEST_WAIT_TIMEOUT:
            req.wait_timeout = read_seconds_nanos(data, a, b)
        elif field == RESERVE_REQUEST_LEASE_DURATION:
            req.lease_duration = read_seconds_nanos(data, a, b)
        elif field == RESERVE_REQUEST_WORKER_ID:
            req.worker_id = data[a:b].decode()
        elif field == RESERVE_REQUEST_MAX_JOBS:
            req.max_jobs = a & _U32
    return req


def decode_reserve_request(data: bytes) -> ReserveIn:
    """``ReserveRequest``."""
    return guarded("ReserveRequest", _read_reserve_in, data)


# ---------------------------------------------------------------------------------------
# Job and ReserveResponse: written by the in-process server


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
        custom: dict[str, DecodedPrimitive],
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
        """The Job body but ``attempt`` and ``lease_expires_at`` (computed once)."""
        if self._static is None:
            self._static = _write_static_job(self)
        return self._static


def _write_static_job(job: JobRecord) -> bytes:
    parts = [field_str(JOB_ID, job.id), field_str(JOB_JOB_TYPE, job.job_type)]
    if job.payload is not None:
        parts.append(payload_field(JOB_PAYLOAD, Payload(*job.payload)))
    if job.priority:
        parts.append(field_uint(JOB_PRIORITY, job.priority))
    if job.trace is not None:
        parts.append(field_bytes(JOB_TRACE_CONTEXT, write_trace_context(*job.trace)))
    parts.append(field_bytes(JOB_ENQUEUED_AT, ms_body(job.enqueued_ms)))
    if job.max_attempts:
        parts.append(field_uint(JOB_MAX_ATTEMPTS, job.max_attempts))
    if job.custom:
        # Values that set no member never get stored: validation refuses them.
        parts.append(custom_fields(JOB_CUSTOM, job.custom))  # type: ignore[arg-type]
    if job.scheduled_at is not None:
        parts.append(field_bytes(JOB_SCHEDULED_AT, seconds_nanos_body(*job.scheduled_at)))
    if job.queue:
        parts.append(field_str(JOB_QUEUE, job.queue))
    return b"".join(parts)


def write_job(job: JobRecord, attempt: int, lease_expires_ms: int) -> bytes:
    """A ``Job`` body as Reserve hands it out (or, with expiry 0, as stored in a
    dead-letter record, where ``lease_expires_at`` is the epoch placeholder)."""
    tail = field_uint(JOB_ATTEMPT, attempt) if attempt else b""
    return job.static_bytes() + tail + field_bytes(JOB_LEASE_EXPIRES_AT, ms_body(lease_expires_ms))


def encode_reserve_response(deliveries: Iterable[tuple[JobRecord, int, int]]) -> bytes:
    """``ReserveResponse`` from ``(job, attempt, lease_expires_ms)``."""
    return b"".join(
        [
            field_bytes(RESERVE_RESPONSE_JOBS, write_job(job, attempt, expiry))
            for job, attempt, expiry in deliveries
        ]
    )


# ---------------------------------------------------------------------------------------
# Job and ReserveResponse: read by the client


class JobMessage(NamedTuple):
    """A ``Job`` as read off the wire, before the client's checks. The Timestamps are
    ``MISSING`` when unset and ``None`` when not a representable time (``scheduled_at``
    is ``None`` either way)."""

    id: str
    job_type: str
    payload: Optional[Payload]
    priority: int
    trace_context: Optional[Trace]
    enqueued_at: object
    attempt: int
    max_attempts: int
    lease_expires_at: object
    custom: dict[str, DecodedPrimitive]
    scheduled_at: Optional[datetime]
    queue: str


# How read_job reads each Job field, by tag: the reader of its span; None for the
# uint32 varints (the value is the varint) and for custom (entries go to a dict).
Reader = Callable[[bytes, int, int], object]
_JOB_READERS: dict[int, Optional[Reader]] = {
    JOB_ID: read_text,
    JOB_JOB_TYPE: read_text,
    JOB_PAYLOAD: read_payload,
    JOB_PRIORITY: None,
    JOB_TRACE_CONTEXT: read_trace_context,
    JOB_ENQUEUED_AT: read_timestamp,
    JOB_ATTEMPT: None,
    JOB_MAX_ATTEMPTS: None,
    JOB_LEASE_EXPIRES_AT: read_timestamp,
    JOB_CUSTOM: None,
    JOB_SCHEDULED_AT: read_timestamp,
    JOB_QUEUE: read_text,
}
# The same as (index in JobMessage, reader), in a list indexed by a tag's first byte (a
# list index is cheaper than a dict lookup per field). JobMessage lists the fields in
# field-number order, so a field's index is its number less one.
_JOB_FIELD_AT: list[Optional[tuple[int, Optional[Reader]]]] = [
    ((first >> 3) - 1, _JOB_READERS[first]) if first in _JOB_READERS else None
    for first in range(256)
]
_CUSTOM = (JOB_CUSTOM >> 3) - 1
_JOB_DEFAULTS = JobMessage("", "", None, 0, None, MISSING, 0, 0, MISSING, {}, None, "")
# tuple.__new__ builds the record from a list in C; the generated __new__ and _make are
# Python calls, which a reserve of many jobs would pay per job.
_new_job_message = tuple.__new__


def read_job(data: bytes, pos: int, stop: int) -> JobMessage:
    """A ``Job`` body. Every field is one tag byte (all numbers are under 16) followed
    by a varint, which is the value of the uint32 fields and the length of the others:
    one loop reads both kinds, the table says where each value goes."""
    values = list(_JOB_DEFAULTS)
    custom: dict[str, DecodedPrimitive] = {}
    values[_CUSTOM] = custom
    while pos < stop:
        known = _JOB_FIELD_AT[data[pos]]
        if known is None:
            field, pos = read_tag(data, pos)
            pos = skip_field(data, pos, stop, field)
            continue
        size = data[pos + 1]
        pos += 2
        if size >= 0x80:
            size, pos = read_varint(data, pos - 1)
        index, read = known
        if index == _CUSTOM:
            start, pos = pos, pos + size
            if pos > stop:
                raise DecodeError("length-delimited field runs past the end of its message")
            entry = ENTRY_CACHE.get(data[start:pos]) or cached_custom_entry(data, start, pos)
            custom[entry[0]] = entry[1]
        elif read is None:
            values[index] = size & _U32
        else:
            start, pos = pos, pos + size
            if pos > stop:
                raise DecodeError("length-delimited field runs past the end of its message")
            # Strings are decoded here: a call per string would cost more than the rest.
            values[index] = (
                data[start:pos].decode() if read is read_text else read(data, start, pos)
            )
    end_check(pos, stop)
    return _new_job_message(JobMessage, values)


def time_or_fail(value: object, job_id: str, name: str) -> datetime:
    if value is MISSING:
        raise errors.JobConversionError(f"job {job_id} has no {name}")
    if value is None:
        raise errors.JobConversionError(f"job {job_id}: {name} is not a representable time")
    return value  # type: ignore[return-value]


def check_job(
    job_id: str,
    job_type: str,
    priority: int,
    trace: Trace | None,
    enqueued_at: object,
    custom: dict[str, DecodedPrimitive],
) -> tuple[Priority, dict[str, Primitive], Optional[TraceContext], datetime]:
    """The checks of a Job's fields shared by reserved jobs and dead-letter records, and
    what they yield: ``(priority, custom, trace_context, enqueued_at)``. A failure raises
    :class:`~sepp_lite.errors.JobConversionError` and the job is skipped."""
    if not job_id:
        raise errors.JobConversionError("job has an empty id")
    if not job_type:
        raise errors.JobConversionError(f"job {job_id} has an empty job_type")
    if priority > 9:
        raise errors.JobConversionError(f"job {job_id} has priority {priority}, over 9")
    if None in custom.values():
        key = next(k for k, v in custom.items() if v is None)
        raise errors.JobConversionError(f"job {job_id}: custom[{key!r}] sets no value")
    context = None
    if trace is not None:
        try:
            context = TraceContext(*trace)
        except TraceContextError:
            pass  # an invalid trace context is dropped; the job is still delivered
    when = time_or_fail(enqueued_at, job_id, "enqueued_at")
    return PRIORITIES[priority], custom, context, when  # type: ignore[return-value]


def job_value(job: JobMessage) -> Job:
    """A reserved job as a domain value (its ctx has no lease yet: the client binds one)."""
    # Unpacked once, not read by attribute: a NamedTuple's attributes cost a lookup each.
    (
        job_id, job_type, payload, priority, trace, enqueued, attempt, max_attempts,
        lease_expires_at, custom, scheduled_at, queue,
    ) = job  # fmt: skip
    level, entries, context, enqueued_at = check_job(
        job_id, job_type, priority, trace, enqueued, custom
    )
    lease_expiry = time_or_fail(lease_expires_at, job_id, "lease_expires_at")
    ctx = JobCtx(
        job_id, queue, job_type, level, attempt, max_attempts, enqueued_at, entries, context,
        lease_expiry, scheduled_at,
    )  # fmt: skip
    return Job(payload, ctx)


def convert_each(
    messages: Iterable[T], convert: Callable[[T], V]
) -> tuple[list[V], list[errors.JobConversionError]]:
    """Convert every decoded message; those that fail are left out and their problems
    returned beside the values."""
    values: list[V] = []
    problems: list[errors.JobConversionError] = []
    for message in messages:
        try:
            values.append(convert(message))
        except errors.JobConversionError as problem:
            problems.append(problem)
    return values, problems


def _read_reserve_response(data: bytes) -> list[JobMessage]:
    return read_repeated(data, RESERVE_RESPONSE_JOBS, read_job)


def decode_reserve_response(data: bytes) -> tuple[list[Job], list[errors.JobConversionError]]:
    """``ReserveResponse``: the jobs, and the problems of those that had to be skipped."""
    return convert_each(guarded("ReserveResponse", _read_reserve_response, data), job_value)
