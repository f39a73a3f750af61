"""JobRejection, both directions: the client reads it inside enqueue responses, the
in-process server writes it.

Each oneof member is a small message whose fields line up with its
:class:`~sepp_lite.errors.JobRejection` dataclass, field for field, so one table
(:data:`MEMBER_FIELDS`) drives the reader and the writer of all fourteen.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, NamedTuple, cast

from sepp_lite import errors
from sepp_lite._codec._fields import (
    datetime_body,
    field_bytes,
    field_str,
    field_uint,
    read_fields,
    read_seconds_nanos,
    seconds_nanos_body,
    timedelta_body,
    to_datetime,
    to_timedelta,
)
from sepp_lite._codec.schema import (
    CUSTOM_ENTRIES_TOO_MANY_ACTUAL,
    CUSTOM_ENTRIES_TOO_MANY_LIMIT,
    CUSTOM_KEY_TOO_LONG_ACTUAL,
    CUSTOM_KEY_TOO_LONG_KEY,
    CUSTOM_KEY_TOO_LONG_LIMIT,
    CUSTOM_MAP_TOO_LARGE_ACTUAL,
    CUSTOM_MAP_TOO_LARGE_LIMIT,
    ENCODING_NOT_ALLOWED_ALLOWED,
    ENCODING_NOT_ALLOWED_ENCODING,
    IDEMPOTENCY_KEY_TOO_LONG_ACTUAL,
    IDEMPOTENCY_KEY_TOO_LONG_LIMIT,
    INVALID_REQUEST_MESSAGE,
    JOB_REJECTION_REASON_MEMBERS,
    JOB_REJECTION_REASON_TAGS,
    JOB_TYPE_NAME_TOO_LONG_ACTUAL,
    JOB_TYPE_NAME_TOO_LONG_LIMIT,
    JOB_TYPE_NOT_ALLOWED_ALLOWED,
    JOB_TYPE_NOT_ALLOWED_JOB_TYPE,
    PAYLOAD_TOO_LARGE_ACTUAL,
    PAYLOAD_TOO_LARGE_LIMIT,
    QUEUE_CLOSING_QUEUE,
    QUEUE_FULL_LIMIT,
    QUEUE_FULL_QUEUE,
    QUEUE_NAME_TOO_LONG_ACTUAL,
    QUEUE_NAME_TOO_LONG_LIMIT,
    SCHEDULED_TOO_FAR_ACTUAL,
    SCHEDULED_TOO_FAR_HORIZON,
    UNKNOWN_QUEUE_QUEUE,
)
from sepp_lite._time import EPOCH


@dataclass(frozen=True)
class RawScheduledTooFar(errors.ScheduledTooFar):
    """A ``ScheduledTooFar`` that echoes the request's Timestamp verbatim: the server
    returns it as received, which a ``datetime`` cannot always hold (nanoseconds,
    years past 9999)."""

    wire_actual: tuple[int, int] = (0, 0)
    """The request's ``scheduled_at`` as ``(seconds, nanos)``."""


class _Kind(NamedTuple):
    """How one field of a member message is read and written (proto3: a field at its
    zero value is left off, except the two always-present messages)."""

    default: Callable[[], Any]
    read: Callable[[Any, bytes, int, int], Any]
    """``(value so far, data, a, b) -> value``: a span ``a:b``, or a varint in ``a``."""
    write: Callable[[int, Any], bytes]


def _append_str(items: list[str], data: bytes, start: int, stop: int) -> list[str]:
    items.append(data[start:stop].decode())
    return items


def _write_timestamp(field: int, value: Any) -> bytes:
    # A (seconds, nanos) pair is a RawScheduledTooFar's wire value, echoed as received.
    body = seconds_nanos_body(*value) if isinstance(value, tuple) else datetime_body(value)
    return field_bytes(field, body)


_STR = _Kind(
    str,
    lambda _, data, start, stop: data[start:stop].decode(),
    lambda field, value: field_str(field, value) if value else b"",
)
_U64 = _Kind(
    int,
    lambda _, data, value, __: value,
    lambda field, value: field_uint(field, value) if value else b"",
)
_U32 = _U64._replace(read=lambda _, data, value, __: value & 0xFFFF_FFFF)
_STRS = _Kind(
    list,
    _append_str,
    lambda field, items: b"".join(field_str(field, item) for item in items),
)
_DURATION = _Kind(
    timedelta,
    lambda _, data, start, stop: to_timedelta(*read_seconds_nanos(data, start, stop)),
    lambda field, value: field_bytes(field, timedelta_body(value)),
)
_TIMESTAMP = _Kind(
    lambda: EPOCH,
    # A time before the epoch or past year 9999 reads as the epoch.
    lambda _, data, start, stop: to_datetime(*read_seconds_nanos(data, start, stop)) or EPOCH,
    _write_timestamp,
)

MEMBER_FIELDS: dict[type[errors.JobRejection], tuple[tuple[int, _Kind], ...]] = {
    errors.UnknownQueue: ((UNKNOWN_QUEUE_QUEUE, _STR),),
    errors.PayloadTooLarge: ((PAYLOAD_TOO_LARGE_LIMIT, _U64), (PAYLOAD_TOO_LARGE_ACTUAL, _U64)),
    errors.EncodingNotAllowed: (
        (ENCODING_NOT_ALLOWED_ENCODING, _STR),
        (ENCODING_NOT_ALLOWED_ALLOWED, _STRS),
    ),
    errors.JobTypeNotAllowed: (
        (JOB_TYPE_NOT_ALLOWED_JOB_TYPE, _STR),
        (JOB_TYPE_NOT_ALLOWED_ALLOWED, _STRS),
    ),
    errors.CustomEntriesTooMany: (
        (CUSTOM_ENTRIES_TOO_MANY_LIMIT, _U32),
        (CUSTOM_ENTRIES_TOO_MANY_ACTUAL, _U32),
    ),
    errors.CustomMapTooLarge: (
        (CUSTOM_MAP_TOO_LARGE_LIMIT, _U64),
        (CUSTOM_MAP_TOO_LARGE_ACTUAL, _U64),
    ),
    errors.CustomKeyTooLong: (
        (CUSTOM_KEY_TOO_LONG_KEY, _STR),
        (CUSTOM_KEY_TOO_LONG_LIMIT, _U32),
        (CUSTOM_KEY_TOO_LONG_ACTUAL, _U64),
    ),
    errors.QueueNameTooLong: (
        (QUEUE_NAME_TOO_LONG_LIMIT, _U32),
        (QUEUE_NAME_TOO_LONG_ACTUAL, _U64),
    ),
    errors.JobTypeNameTooLong: (
        (JOB_TYPE_NAME_TOO_LONG_LIMIT, _U32),
        (JOB_TYPE_NAME_TOO_LONG_ACTUAL, _U64),
    ),
    errors.IdempotencyKeyTooLong: (
        (IDEMPOTENCY_KEY_TOO_LONG_LIMIT, _U32),
        (IDEMPOTENCY_KEY_TOO_LONG_ACTUAL, _U64),
    ),
    errors.ScheduledTooFar: (
        (SCHEDULED_TOO_FAR_HORIZON, _DURATION),
        (SCHEDULED_TOO_FAR_ACTUAL, _TIMESTAMP),
    ),
    errors.InvalidRequest: ((INVALID_REQUEST_MESSAGE, _STR),),
    errors.QueueFull: ((QUEUE_FULL_QUEUE, _STR), (QUEUE_FULL_LIMIT, _U64)),
    errors.QueueClosing: ((QUEUE_CLOSING_QUEUE, _STR),),
}
"""Each member's fields as ``(tag, kind)``, in the order of its dataclass's fields."""

_CLASSES: dict[int, type[errors.JobRejection]] = {
    member: getattr(errors, name) for member, name in JOB_REJECTION_REASON_MEMBERS.items()
}
_TAGS = {getattr(errors, name): member for name, member in JOB_REJECTION_REASON_TAGS.items()}

# Every member class is a dataclass (JobRejection, their base, is not).
_ATTRIBUTES = {cls: [f.name for f in dataclasses.fields(cast(Any, cls))] for cls in MEMBER_FIELDS}


def _read_member(
    cls: type[errors.JobRejection], data: bytes, pos: int, stop: int
) -> errors.JobRejection:
    spec = MEMBER_FIELDS[cls]
    values = [kind.default() for _, kind in spec]
    for field, a, b in read_fields(data, pos, stop):
        for index, (wanted, kind) in enumerate(spec):
            if field == wanted:
                values[index] = kind.read(values[index], data, a, b)
    return cls(*values)


def read_job_rejection(data: bytes, pos: int, stop: int) -> errors.JobRejection:
    """A JobRejection; the last known oneof member wins, none gives UnknownRejection."""
    result: errors.JobRejection = errors.UnknownRejection()
    for field, start, end in read_fields(data, pos, stop):
        cls = _CLASSES.get(field)
        if cls is not None:
            result = _read_member(cls, data, start, end)
    return result


def _write_member(rejection: errors.JobRejection, cls: type[errors.JobRejection]) -> bytes:
    values = [getattr(rejection, name) for name in _ATTRIBUTES[cls]]
    if isinstance(rejection, RawScheduledTooFar):
        values[1] = rejection.wire_actual
    return b"".join(
        [kind.write(field, value) for (field, kind), value in zip(MEMBER_FIELDS[cls], values)]
    )


def write_job_rejection(rejection: errors.JobRejection) -> bytes:
    """A JobRejection body: the member the value's class stands for (nothing for
    :class:`~sepp_lite.errors.UnknownRejection`)."""
    for cls in type(rejection).__mro__:
        member = _TAGS.get(cls)
        if member is not None:
            return field_bytes(member, _write_member(rejection, cls))
    return b""
