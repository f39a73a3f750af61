"""The lease operations, Ack, Nack and Extend: their requests (the client writes them,
the in-process server reads them) and responses (the server writes them, the client
reads them).

Every request opens with the same fence, ``job_id`` (1) and ``attempt`` (2), which must
match the delivery that holds the lease.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable, NamedTuple, Optional

from sepp_lite._codec._fields import (
    check_uint32,
    field_bool,
    field_bytes,
    field_optional_str,
    field_str,
    field_uint,
    guarded,
    ms_body,
    read_fields,
    read_into,
    read_seconds_nanos,
    read_text,
    read_uint32,
    timedelta_body,
)
from sepp_lite._codec.schema import (
    ACK_REQUEST_ATTEMPT,
    ACK_REQUEST_JOB_ID,
    ACK_REQUEST_WORKER_ID,
    ACK_RESPONSE_JOB_ID,
    EXTEND_REQUEST_ATTEMPT,
    EXTEND_REQUEST_JOB_ID,
    EXTEND_REQUEST_LEASE_DURATION,
    EXTEND_REQUEST_WORKER_ID,
    EXTEND_RESPONSE_JOB_ID,
    EXTEND_RESPONSE_LEASE_EXPIRES_AT,
    NACK_REQUEST_ATTEMPT,
    NACK_REQUEST_JOB_ID,
    NACK_REQUEST_REASON,
    NACK_REQUEST_RETRY,
    NACK_REQUEST_WORKER_ID,
    NACK_RESPONSE_DEAD_LETTERED,
    NACK_RESPONSE_JOB_ID,
    NACK_RETRY_DELAY,
    NACK_RETRY_STRATEGY_MEMBERS,
    NACK_RETRY_STRATEGY_TAGS,
)
from sepp_lite._codec.values import SecondsNanos, read_timestamp

# ---------------------------------------------------------------------------------------
# Requests: written by the client
#
# Writers raise ``TypeError``/``ValueError`` for what cannot be sent (a job id that is
# not a str, an attempt outside uint32, a negative duration).


def _fence(job_id_field: int, attempt_field: int, job_id: str, attempt: int) -> bytes:
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
    head = field_str(job_id_field, job_id) if job_id else b""
    attempt = check_uint32(attempt, "attempt")
    return head + field_uint(attempt_field, attempt) if attempt else head


def encode_ack_request(job_id: str, attempt: int, worker_id: str | None) -> bytes:
    """``AckRequest``."""
    return _fence(ACK_REQUEST_JOB_ID, ACK_REQUEST_ATTEMPT, job_id, attempt) + field_optional_str(
        ACK_REQUEST_WORKER_ID, worker_id
    )


def _empty_member(strategy: str) -> bytes:
    # google.protobuf.Empty members are sent as empty messages, which keeps them on the
    # wire (and the oneof set).
    return field_bytes(NACK_REQUEST_RETRY, field_bytes(NACK_RETRY_STRATEGY_TAGS[strategy], b""))


_NACK_DEFAULT = _empty_member("default")
_NACK_DEAD_LETTER = _empty_member("dead_letter")


def nack_retry_field(kind: str, delay: timedelta | None) -> bytes:
    """``NackRequest.retry`` for a RetryDirective's ``kind`` and ``delay``: always
    present, exactly one strategy set."""
    if kind == "after" and delay is not None:
        return field_bytes(NACK_REQUEST_RETRY, field_bytes(NACK_RETRY_DELAY, timedelta_body(delay)))
    if kind == "dead_letter":
        return _NACK_DEAD_LETTER
    return _NACK_DEFAULT


def encode_nack_request(
    job_id: str, attempt: int, reason: str | None, retry: bytes, worker_id: str | None
) -> bytes:
    """``NackRequest``; ``retry`` comes from :func:`nack_retry_field`."""
    return (
        _fence(NACK_REQUEST_JOB_ID, NACK_REQUEST_ATTEMPT, job_id, attempt)
        + field_optional_str(NACK_REQUEST_REASON, reason)
        + retry
        + field_optional_str(NACK_REQUEST_WORKER_ID, worker_id)
    )


def encode_extend_request(
    job_id: str, attempt: int, lease: timedelta, worker_id: str | None
) -> bytes:
    """``ExtendRequest``."""
    return (
        _fence(EXTEND_REQUEST_JOB_ID, EXTEND_REQUEST_ATTEMPT, job_id, attempt)
        + field_bytes(EXTEND_REQUEST_LEASE_DURATION, timedelta_body(lease))
        + field_optional_str(EXTEND_REQUEST_WORKER_ID, worker_id)
    )


# ---------------------------------------------------------------------------------------
# Requests: read by the in-process server


class LeaseIn:
    """An ``AckRequest``, ``NackRequest`` or ``ExtendRequest`` as received: the fence
    and worker id they all carry, and the fields only one of them has (``reason`` and
    ``retry`` for Nack, ``lease_duration`` for Extend). ``None`` means absent.

    ``retry`` is ``("unset",)`` for an empty NackRetry, else ``("default",)``,
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


def _read_nack_retry(data: bytes, start: int, stop: int) -> tuple[object, ...]:
    retry: tuple[object, ...] = ("unset",)
    for field, a, b in read_fields(data, start, stop):
        strategy = NACK_RETRY_STRATEGY_MEMBERS.get(field)
        if field == NACK_RETRY_DELAY:
            retry = ("delay", *read_seconds_nanos(data, a, b))
        elif strategy is not None:
            retry = (strategy,)
    return retry


Fields = dict[int, tuple[str, Callable[[bytes, int, int], object]]]

_ACK_REQUEST: Fields = {
    ACK_REQUEST_JOB_ID: ("job_id", read_text),
    ACK_REQUEST_ATTEMPT: ("attempt", read_uint32),
    ACK_REQUEST_WORKER_ID: ("worker_id", read_text),
}
_NACK_REQUEST: Fields = {
    NACK_REQUEST_JOB_ID: ("job_id", read_text),
    NACK_REQUEST_ATTEMPT: ("attempt", read_uint32),
    NACK_REQUEST_REASON: ("reason", read_text),
    NACK_REQUEST_RETRY: ("retry", _read_nack_retry),
    NACK_REQUEST_WORKER_ID: ("worker_id", read_text),
}
_EXTEND_REQUEST: Fields = {
    EXTEND_REQUEST_JOB_ID: ("job_id", read_text),
    EXTEND_REQUEST_ATTEMPT: ("attempt", read_uint32),
    EXTEND_REQUEST_LEASE_DURATION: ("lease_duration", read_seconds_nanos),
    EXTEND_REQUEST_WORKER_ID: ("worker_id", read_text),
}


def _decode_lease_in(message: str, fields: Fields, data: bytes) -> LeaseIn:
    return guarded(message, lambda raw: read_into(LeaseIn(), fields, raw, 0, len(raw)), data)


def decode_ack_request(data: bytes) -> LeaseIn:
    """``AckRequest``."""
    return _decode_lease_in("AckRequest", _ACK_REQUEST, data)


def decode_nack_request(data: bytes) -> LeaseIn:
    """``NackRequest``."""
    return _decode_lease_in("NackRequest", _NACK_REQUEST, data)


def decode_extend_request(data: bytes) -> LeaseIn:
    """``ExtendRequest``."""
    return _decode_lease_in("ExtendRequest", _EXTEND_REQUEST, data)


# ---------------------------------------------------------------------------------------
# Responses: written by the in-process server


def _job_id_field(field: int, job_id: str) -> bytes:
    return field_str(field, job_id) if job_id else b""


def encode_ack_response(job_id: str) -> bytes:
    """``AckResponse``."""
    return _job_id_field(ACK_RESPONSE_JOB_ID, job_id)


def encode_nack_response(job_id: str, dead_lettered: bool) -> bytes:
    """``NackResponse``."""
    return _job_id_field(NACK_RESPONSE_JOB_ID, job_id) + field_bool(
        NACK_RESPONSE_DEAD_LETTERED, dead_lettered
    )


def encode_extend_response(job_id: str, lease_expires_ms: int) -> bytes:
    """``ExtendResponse`` with the new expiry in milliseconds since the epoch."""
    return _job_id_field(EXTEND_RESPONSE_JOB_ID, job_id) + field_bytes(
        EXTEND_RESPONSE_LEASE_EXPIRES_AT, ms_body(lease_expires_ms)
    )


# ---------------------------------------------------------------------------------------
# Responses: read by the client
#
# Only the last occurrence of a field is decoded, as protobuf keeps only the last.


def _last_spans(data: bytes, *wanted: int) -> list[tuple[int, int] | None]:
    """The span (or varint, as ``(value, -1)``) of the last occurrence of each wanted
    field, ``None`` where it is absent."""
    last: dict[int, tuple[int, int]] = {}
    for field, a, b in read_fields(data, 0, len(data)):
        last[field] = (a, b)
    return [last.get(field) for field in wanted]


def _text_at(data: bytes, span: tuple[int, int] | None) -> str:
    return "" if span is None else data[span[0] : span[1]].decode()


def _read_ack_response(raw: bytes) -> str:
    return _text_at(raw, _last_spans(raw, ACK_RESPONSE_JOB_ID)[0])


def decode_ack_response(data: bytes) -> str:
    """``AckResponse``: the job id."""
    # A Worker reads one per job. The usual answer, the job id field alone with a
    # one-byte length, is read in one step; anything else takes the general path.
    if len(data) >= 2 and data[0] == ACK_RESPONSE_JOB_ID and data[1] == len(data) - 2 < 0x80:
        try:
            return data[2:].decode()
        except UnicodeDecodeError:
            pass  # the general path says how it is malformed
    return guarded("AckResponse", _read_ack_response, data)


class NackResult(NamedTuple):
    """A ``NackResponse``."""

    job_id: str
    dead_lettered: bool


def decode_nack_response(data: bytes) -> NackResult:
    """``NackResponse``: the job id and whether the job was dead-lettered."""

    def decode(raw: bytes) -> NackResult:
        job_id, flag = _last_spans(raw, NACK_RESPONSE_JOB_ID, NACK_RESPONSE_DEAD_LETTERED)
        return NackResult(_text_at(raw, job_id), flag is not None and flag[0] != 0)

    return guarded("NackResponse", decode, data)


class ExtendResult(NamedTuple):
    """An ``ExtendResponse``; ``lease_expires_at`` is ``None`` when unset or not a
    representable time."""

    job_id: str
    lease_expires_at: Optional[datetime]


def decode_extend_response(data: bytes) -> ExtendResult:
    """``ExtendResponse``: the job id and the new expiry."""

    def decode(raw: bytes) -> ExtendResult:
        job_id, expiry = _last_spans(raw, EXTEND_RESPONSE_JOB_ID, EXTEND_RESPONSE_LEASE_EXPIRES_AT)
        when = None if expiry is None else read_timestamp(raw, *expiry)
        return ExtendResult(_text_at(raw, job_id), when)

    return guarded("ExtendResponse", decode, data)
