"""EnqueueBatch and EnqueueAtomic: EnqueueBatchRequest (the client writes it, the
in-process server reads it), EnqueueBatchResponse and EnqueueAtomicResponse (the server
writes them, the client reads them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Callable, NamedTuple, Optional, Union

from sepp_lite import errors
from sepp_lite._codec._fields import (
    check_uint32,
    datetime_body,
    field_bool,
    field_bytes,
    field_str,
    field_uint,
    guarded,
    read_fields,
    read_repeated,
    read_seconds_nanos,
    read_text,
    read_uint32,
)
from sepp_lite._codec.schema import (
    BATCH_VALIDATION_FAILURE_ERRORS,
    ENQUEUE_ATOMIC_RESPONSE_OUTCOME_MEMBERS,
    ENQUEUE_ATOMIC_RESPONSE_OUTCOME_TAGS,
    ENQUEUE_ATOMIC_RESPONSE_REJECTION,
    ENQUEUE_ATOMIC_RESPONSE_SUCCESS,
    ENQUEUE_ATOMIC_SUCCESS_RESPONSES,
    ENQUEUE_BATCH_REQUEST_JOBS,
    ENQUEUE_BATCH_RESPONSE_RESULTS,
    ENQUEUE_REQUEST_CUSTOM,
    ENQUEUE_REQUEST_IDEMPOTENCY_KEY,
    ENQUEUE_REQUEST_JOB_TYPE,
    ENQUEUE_REQUEST_MAX_ATTEMPTS,
    ENQUEUE_REQUEST_PAYLOAD,
    ENQUEUE_REQUEST_PRIORITY,
    ENQUEUE_REQUEST_QUEUE,
    ENQUEUE_REQUEST_SCHEDULED_AT,
    ENQUEUE_REQUEST_TRACE_CONTEXT,
    ENQUEUE_RESPONSE_DEDUPLICATED,
    ENQUEUE_RESPONSE_JOB_ID,
    JOB_RESULT_REJECTION,
    JOB_RESULT_SUCCESS,
    JOB_VALIDATION_ERROR_INDEX,
    JOB_VALIDATION_ERROR_REJECTION,
)
from sepp_lite._codec.values import (
    DecodedPrimitive,
    SecondsNanos,
    Trace,
    cached_str_field,
    custom_fields,
    payload_field,
    read_custom_entry,
    read_payload_parts,
    read_trace_context,
    write_trace_context,
)
from sepp_lite._sending import sent_size
from sepp_lite._time import EPOCH, as_utc
from sepp_lite.types import EnqueueAck, EnqueueRequest, Priority

# ---------------------------------------------------------------------------------------
# EnqueueBatchRequest: written by the client
#
# The writers take jobs checked by ``sepp_lite.types.check_enqueue_request`` (the client
# and the CLI run it before encoding). They keep only the guards against a value going
# out as some other value: a priority or max_attempts outside its range, a custom int
# outside int64, payload data that is not bytes-like. A field of some other wrong type
# is the checks' business: here it fails as Python fails (mostly AttributeError), with
# no message promised.

# Encoded fields by value: producers repeat queue names and job types from job to job.
_QUEUE_FIELDS: dict[str, bytes] = {}
_TYPE_FIELDS: dict[str, bytes] = {}


def trace_context_field(traceparent: str, tracestate: str | None) -> bytes:
    """``EnqueueRequest.trace_context`` for a context injected into jobs."""
    return field_bytes(ENQUEUE_REQUEST_TRACE_CONTEXT, write_trace_context(traceparent, tracestate))


def _priority_value(priority: object) -> int:
    if isinstance(priority, Priority):
        return priority.value
    return Priority(priority).value  # type: ignore[arg-type]


def _optional_fields(job: EnqueueRequest) -> list[bytes]:
    parts = []
    key = job.idempotency_key
    if key is not None:
        parts.append(field_str(ENQUEUE_REQUEST_IDEMPOTENCY_KEY, key))
    if job.priority is not None:
        parts.append(field_uint(ENQUEUE_REQUEST_PRIORITY, _priority_value(job.priority)))
    if job.max_attempts is not None:
        attempts = check_uint32(job.max_attempts, "max_attempts")
        parts.append(field_uint(ENQUEUE_REQUEST_MAX_ATTEMPTS, attempts))
    return parts


def _scheduled_field(scheduled_at: datetime) -> bytes:
    # Instants before the epoch are dropped, as sepp-py does: the job runs now.
    if as_utc(scheduled_at) < EPOCH:
        return b""
    return field_bytes(ENQUEUE_REQUEST_SCHEDULED_AT, datetime_body(scheduled_at))


def write_enqueue_request(job: EnqueueRequest, injected_trace: bytes = b"") -> bytes:
    """One ``EnqueueRequest`` body. ``injected_trace`` (a field from
    :func:`trace_context_field`) is used when the job carries no trace context of its
    own."""
    queue, job_type = job.queue, job.job_type
    parts = [
        _QUEUE_FIELDS.get(queue) or cached_str_field(_QUEUE_FIELDS, ENQUEUE_REQUEST_QUEUE, queue),
        _TYPE_FIELDS.get(job_type)
        or cached_str_field(_TYPE_FIELDS, ENQUEUE_REQUEST_JOB_TYPE, job_type),
    ]
    if job.payload is not None:
        parts.append(payload_field(ENQUEUE_REQUEST_PAYLOAD, job.payload))
    if job.idempotency_key is not None or job.priority is not None or job.max_attempts is not None:
        parts += _optional_fields(job)
    tc = job.trace_context
    if tc is not None:
        parts.append(trace_context_field(tc.traceparent, tc.tracestate))
    else:
        parts.append(injected_trace)
    if job.custom:
        parts.append(custom_fields(ENQUEUE_REQUEST_CUSTOM, job.custom))
    if job.scheduled_at is not None:
        parts.append(_scheduled_field(job.scheduled_at))
    return b"".join(parts)


def encode_enqueue_batch_request(
    jobs: Sequence[EnqueueRequest], injected_trace: bytes = b""
) -> bytes:
    """``EnqueueBatchRequest`` (the request of both enqueue RPCs)."""
    return b"".join(
        [
            field_bytes(ENQUEUE_BATCH_REQUEST_JOBS, write_enqueue_request(job, injected_trace))
            for job in jobs
        ]
    )


def batch_part_size(job: EnqueueRequest) -> int:
    """The bytes ``job`` may take in an EnqueueBatch call the client makes: its part of
    the request, with ``_sending.sent_size``'s room for the trace context the client
    adds (what ``_sending.fit_batches`` cuts a sender's jobs by)."""
    return sent_size(job, len(encode_enqueue_batch_request([job])))


# ---------------------------------------------------------------------------------------
# EnqueueBatchRequest: read by the in-process server

_U32 = 0xFFFF_FFFF


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
        self.custom: dict[str, DecodedPrimitive] = {}
        self.scheduled_at: SecondsNanos | None = None


# EnqueueRequest fields but custom: tag -> (attribute, reader of the field's span or varint).
_ENQUEUE_FIELDS: dict[int, tuple[str, Callable[[bytes, int, int], object]]] = {
    ENQUEUE_REQUEST_QUEUE: ("queue", read_text),
    ENQUEUE_REQUEST_JOB_TYPE: ("job_type", read_text),
    ENQUEUE_REQUEST_PAYLOAD: ("payload", read_payload_parts),
    ENQUEUE_REQUEST_IDEMPOTENCY_KEY: ("idempotency_key", read_text),
    ENQUEUE_REQUEST_PRIORITY: ("priority", read_uint32),
    ENQUEUE_REQUEST_MAX_ATTEMPTS: ("max_attempts", read_uint32),
    ENQUEUE_REQUEST_TRACE_CONTEXT: ("trace", read_trace_context),
    ENQUEUE_REQUEST_SCHEDULED_AT: ("scheduled_at", read_seconds_nanos),
}


def _read_enqueue_in(data: bytes, start: int, stop: int) -> EnqueueIn:
    # read_into's loop, but for custom: its entries add up rather than replace.
    job = EnqueueIn()
    for field, a, b in read_fields(data, start, stop):
        if field == ENQUEUE_REQUEST_CUSTOM:
            key, value = read_custom_entry(data, a, b)
            job.custom[key] = value
            continue
        known = _ENQUEUE_FIELDS.get(field)
        if known is not None:
            setattr(job, known[0], known[1](data, a, b))
    return job


def decode_enqueue_batch_request(data: bytes) -> list[EnqueueIn]:
    """``EnqueueBatchRequest`` (the request of both enqueue RPCs)."""

    def decode(raw: bytes) -> list[EnqueueIn]:
        return [
            _read_enqueue_in(raw, a, b)
            for field, a, b in read_fields(raw, 0, len(raw))
            if field == ENQUEUE_BATCH_REQUEST_JOBS
        ]

    return guarded("EnqueueBatchRequest", decode, data)


# ---------------------------------------------------------------------------------------
# EnqueueBatchResponse and EnqueueAtomicResponse: written by the in-process server

EnqueueOutcome = Union[tuple[str, bool], "errors.JobRejection"]
"""``(job_id, deduplicated)`` for an accepted job, else its rejection."""


def write_enqueue_response(job_id: str, deduplicated: bool) -> bytes:
    return field_str(ENQUEUE_RESPONSE_JOB_ID, job_id) + field_bool(
        ENQUEUE_RESPONSE_DEDUPLICATED, deduplicated
    )


# The rejection codec and the JobRejection classes it builds load when a rejection is
# first met, not with the client (sepp_lite/_rejections.py says why).
def _read_rejection(data: bytes, pos: int, stop: int) -> errors.JobRejection:
    from sepp_lite._codec.job_rejection import read_job_rejection

    return read_job_rejection(data, pos, stop)


def _write_rejection(rejection: errors.JobRejection) -> bytes:
    from sepp_lite._codec.job_rejection import write_job_rejection

    return write_job_rejection(rejection)


def _write_job_result(result: EnqueueOutcome) -> bytes:
    if isinstance(result, tuple):
        return field_bytes(JOB_RESULT_SUCCESS, write_enqueue_response(*result))
    return field_bytes(JOB_RESULT_REJECTION, _write_rejection(result))


def encode_enqueue_batch_response(results: Iterable[EnqueueOutcome]) -> bytes:
    """``EnqueueBatchResponse``: one JobResult per job."""
    return b"".join(
        [field_bytes(ENQUEUE_BATCH_RESPONSE_RESULTS, _write_job_result(r)) for r in results]
    )


def _write_validation_error(index: int, rejection: errors.JobRejection) -> bytes:
    head = field_uint(JOB_VALIDATION_ERROR_INDEX, index) if index else b""
    return head + field_bytes(JOB_VALIDATION_ERROR_REJECTION, _write_rejection(rejection))


def encode_enqueue_atomic_response(
    *,
    success: Iterable[tuple[str, bool]] | None = None,
    rejection: Iterable[tuple[int, errors.JobRejection]] | None = None,
) -> bytes:
    """``EnqueueAtomicResponse`` with its oneof member named as in the schema: ``success``
    (``(job_id, deduplicated)`` per job) or ``rejection`` (``(index, rejection)`` per
    refused job). Exactly one must be given."""
    if success is not None and rejection is None:
        acks = [write_enqueue_response(*ack) for ack in success]
        body = b"".join([field_bytes(ENQUEUE_ATOMIC_SUCCESS_RESPONSES, ack) for ack in acks])
        member = "success"
    elif rejection is not None and success is None:
        errs = [_write_validation_error(*failure) for failure in rejection]
        body = b"".join([field_bytes(BATCH_VALIDATION_FAILURE_ERRORS, err) for err in errs])
        member = "rejection"
    else:
        raise ValueError("give exactly one of success and rejection")
    return field_bytes(ENQUEUE_ATOMIC_RESPONSE_OUTCOME_TAGS[member], body)


# ---------------------------------------------------------------------------------------
# EnqueueBatchResponse and EnqueueAtomicResponse: read by the client


def read_enqueue_response(data: bytes, pos: int, stop: int) -> EnqueueAck:
    job_id = ""
    deduplicated = False
    for field, a, b in read_fields(data, pos, stop):
        if field == ENQUEUE_RESPONSE_JOB_ID:
            job_id = data[a:b].decode()
        elif field == ENQUEUE_RESPONSE_DEDUPLICATED:
            deduplicated = a != 0
    return EnqueueAck(job_id, deduplicated)


BatchOutcome = Union[EnqueueAck, "errors.JobRejection", None]


def _read_job_result(data: bytes, pos: int, stop: int) -> BatchOutcome:
    # The usual answer, a success with a short job id and perhaps the deduplicated
    # flag, read in one step: it is most of an EnqueueBatch answer's decoding CPU.
    # Anything else (longer lengths, other or repeated fields) takes the general path.
    size = stop - pos
    if (
        4 <= size < 0x82  # so every length here is a one-byte varint
        and data[pos] == JOB_RESULT_SUCCESS
        and data[pos + 1] == size - 2
        and data[pos + 2] == ENQUEUE_RESPONSE_JOB_ID
    ):
        n = data[pos + 3]
        if size == n + 4:
            return EnqueueAck(data[pos + 4 : stop].decode(), False)
        if (
            size == n + 6
            and data[stop - 2] == ENQUEUE_RESPONSE_DEDUPLICATED
            and data[stop - 1] < 0x80
        ):
            return EnqueueAck(data[pos + 4 : stop - 2].decode(), data[stop - 1] != 0)
    outcome: BatchOutcome = None
    for field, start, end in read_fields(data, pos, stop):
        if field == JOB_RESULT_SUCCESS:
            outcome = read_enqueue_response(data, start, end)
        elif field == JOB_RESULT_REJECTION:
            outcome = _read_rejection(data, start, end)
    return outcome


def decode_enqueue_batch_response(data: bytes) -> list[BatchOutcome]:
    """``EnqueueBatchResponse``: one outcome per job; ``None`` where none was set."""

    def decode(raw: bytes) -> list[BatchOutcome]:
        return read_repeated(raw, ENQUEUE_BATCH_RESPONSE_RESULTS, _read_job_result)

    return guarded("EnqueueBatchResponse", decode, data)


def _read_validation_error(data: bytes, pos: int, stop: int) -> errors.JobValidationError:
    index = 0
    rejection: errors.JobRejection = errors.UnknownRejection()
    for field, a, b in read_fields(data, pos, stop):
        if field == JOB_VALIDATION_ERROR_INDEX:
            index = a & _U32
        elif field == JOB_VALIDATION_ERROR_REJECTION:
            rejection = _read_rejection(data, a, b)
    return errors.JobValidationError(index, rejection)


class AtomicOutcome(NamedTuple):
    """An ``EnqueueAtomicResponse``: its oneof member's name and what that carries."""

    member: str
    """``"success"`` or ``"rejection"``."""
    items: list[object]
    """:class:`~sepp_lite.types.EnqueueAck` values or
    :class:`~sepp_lite.errors.JobValidationError` values, by ``member``."""


# How each EnqueueAtomicResponse member is read: its repeated field and its items' reader.
_ATOMIC_ITEMS: dict[int, tuple[int, Callable[[bytes, int, int], object]]] = {
    ENQUEUE_ATOMIC_RESPONSE_SUCCESS: (ENQUEUE_ATOMIC_SUCCESS_RESPONSES, read_enqueue_response),
    ENQUEUE_ATOMIC_RESPONSE_REJECTION: (BATCH_VALIDATION_FAILURE_ERRORS, _read_validation_error),
}


def _read_atomic_response(data: bytes) -> Optional[AtomicOutcome]:
    outcome = None
    for field, start, end in read_fields(data, 0, len(data)):
        items = _ATOMIC_ITEMS.get(field)
        if items is not None:
            repeated, read = items
            member = ENQUEUE_ATOMIC_RESPONSE_OUTCOME_MEMBERS[field]
            outcome = AtomicOutcome(member, read_repeated(data[start:end], repeated, read))
    return outcome


def decode_enqueue_atomic_response(data: bytes) -> Optional[AtomicOutcome]:
    """``EnqueueAtomicResponse`` as ``("success", [EnqueueAck...])`` or
    ``("rejection", [JobValidationError...])``, or ``None`` with no outcome set."""
    return guarded("EnqueueAtomicResponse", _read_atomic_response, data)
