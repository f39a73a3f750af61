"""DrainDeadLetters: its request (the client writes it, the in-process server reads it)
and response (the server writes it, the client reads it into
:class:`~sepp_lite.types.DeadLetterRecord` values). Each record carries a Job, read and
written by :mod:`~sepp_lite._codec.job`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Optional

from sepp_lite import errors
from sepp_lite._codec._fields import (
    check_uint32,
    field_bytes,
    field_str,
    field_uint,
    guarded,
    ms_body,
    read_fields,
    read_repeated,
)
from sepp_lite._codec.job import (
    JobMessage,
    JobRecord,
    check_job,
    convert_each,
    read_job,
    time_or_fail,
    write_job,
)
from sepp_lite._codec.schema import (
    DEAD_LETTER_CAUSES,
    DEAD_LETTER_RECORD_CAUSE,
    DEAD_LETTER_RECORD_FAILED_AT,
    DEAD_LETTER_RECORD_FINAL_ATTEMPT,
    DEAD_LETTER_RECORD_JOB,
    DEAD_LETTER_RECORD_LAST_REASON,
    DRAIN_DEAD_LETTERS_REQUEST_MAX,
    DRAIN_DEAD_LETTERS_REQUEST_QUEUE,
    DRAIN_DEAD_LETTERS_RESPONSE_RECORDS,
)
from sepp_lite._codec.values import MISSING, read_timestamp
from sepp_lite.types import DeadLetterRecord

_U32 = 0xFFFF_FFFF

# ---------------------------------------------------------------------------------------
# DrainDeadLettersRequest: written by the client, read by the in-process server


def encode_drain_dead_letters_request(queue: str | None, max_records: int | None) -> bytes:
    """``DrainDeadLettersRequest``; ``ValueError`` for a count outside uint32."""
    body = b"" if queue is None else field_str(DRAIN_DEAD_LETTERS_REQUEST_QUEUE, queue)
    if max_records is not None:
        limit = check_uint32(max_records, "max_records")
        body += field_uint(DRAIN_DEAD_LETTERS_REQUEST_MAX, limit)
    return body


class DrainIn(NamedTuple):
    """A ``DrainDeadLettersRequest`` as received; ``None`` where a field is absent."""

    queue: Optional[str]
    max: Optional[int]


def _read_drain_in(data: bytes) -> DrainIn:
    queue, limit = None, None
    for field, a, b in read_fields(data, 0, len(data)):
        if field == DRAIN_DEAD_LETTERS_REQUEST_QUEUE:
            queue = data[a:b].decode()
        elif field == DRAIN_DEAD_LETTERS_REQUEST_MAX:
            limit = a & _U32
    return DrainIn(queue, limit)


def decode_drain_dead_letters_request(data: bytes) -> DrainIn:
    """``DrainDeadLettersRequest``."""
    return guarded("DrainDeadLettersRequest", _read_drain_in, data)


# ---------------------------------------------------------------------------------------
# DrainDeadLettersResponse: written by the in-process server


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


def _write_record(record: DeadLetterOut) -> bytes:
    # The job as stored: its final attempt, and the epoch for its lease expiry.
    body = field_bytes(DEAD_LETTER_RECORD_JOB, write_job(record.job, record.final_attempt, 0))
    if record.cause:
        body += field_uint(DEAD_LETTER_RECORD_CAUSE, record.cause)
    body += field_bytes(DEAD_LETTER_RECORD_FAILED_AT, ms_body(record.failed_ms))
    if record.final_attempt:
        body += field_uint(DEAD_LETTER_RECORD_FINAL_ATTEMPT, record.final_attempt)
    if record.last_reason is not None:
        body += field_str(DEAD_LETTER_RECORD_LAST_REASON, record.last_reason)
    return body


def encode_drain_dead_letters_response(records: Iterable[DeadLetterOut]) -> bytes:
    """``DrainDeadLettersResponse``."""
    return b"".join(
        [field_bytes(DRAIN_DEAD_LETTERS_RESPONSE_RECORDS, _write_record(r)) for r in records]
    )


# ---------------------------------------------------------------------------------------
# DrainDeadLettersResponse: read by the client


class DeadLetterMessage(NamedTuple):
    """A ``DeadLetterRecord`` as read off the wire; ``failed_at`` is ``MISSING`` when
    unset and ``None`` when not a representable time."""

    job: Optional[JobMessage]
    cause: int
    failed_at: object
    final_attempt: int
    last_reason: Optional[str]


def read_dead_letter_record(data: bytes, pos: int, stop: int) -> DeadLetterMessage:
    job: JobMessage | None = None
    cause = final_attempt = 0
    failed_at: object = MISSING
    last_reason: str | None = None
    for field, a, b in read_fields(data, pos, stop):
        if field == DEAD_LETTER_RECORD_JOB:
            job = read_job(data, a, b)
        elif field == DEAD_LETTER_RECORD_FAILED_AT:
            failed_at = read_timestamp(data, a, b)
        elif field == DEAD_LETTER_RECORD_LAST_REASON:
            last_reason = data[a:b].decode()
        elif field == DEAD_LETTER_RECORD_CAUSE:
            cause = a
        elif field == DEAD_LETTER_RECORD_FINAL_ATTEMPT:
            final_attempt = a & _U32
    return DeadLetterMessage(job, cause, failed_at, final_attempt, last_reason)


def dead_letter_value(record: DeadLetterMessage) -> DeadLetterRecord:
    """A drained record as a domain value; the lease expiry is not checked (the job is a
    snapshot) and unknown causes read as UNSPECIFIED."""
    job, cause, failed, final_attempt, last_reason = record
    if job is None:
        raise errors.JobConversionError("dead-letter record has no job")
    # The job's lease expiry is a placeholder in a record, and its attempt the final one.
    level, entries, context, enqueued_at = check_job(
        job.id, job.job_type, job.priority, job.trace_context, job.enqueued_at, job.custom
    )
    return DeadLetterRecord(
        job.queue, job.id, job.job_type, job.payload, level, job.max_attempts, entries,
        context, enqueued_at, job.scheduled_at,
        DEAD_LETTER_CAUSES[cause] if cause < len(DEAD_LETTER_CAUSES) else DEAD_LETTER_CAUSES[0],
        time_or_fail(failed, job.id, "failed_at"), final_attempt, last_reason,
    )  # fmt: skip


def _read_drain_response(data: bytes) -> list[DeadLetterMessage]:
    return read_repeated(data, DRAIN_DEAD_LETTERS_RESPONSE_RECORDS, read_dead_letter_record)


def decode_drain_dead_letters_response(
    data: bytes,
) -> tuple[list[DeadLetterRecord], list[errors.JobConversionError]]:
    """``DrainDeadLettersResponse``: the records, and why any were skipped."""
    messages = guarded("DrainDeadLettersResponse", _read_drain_response, data)
    return convert_each(messages, dead_letter_value)
