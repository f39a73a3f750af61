"""GetServerInfo: GetServerInfoRequest (empty; the in-process server checks that it
parses) and GetServerInfoResponse (the server writes it, the client reads it into a
:class:`~sepp_lite.types.ServerInfo`).
"""

from __future__ import annotations

from datetime import timedelta

from sepp_lite import errors
from sepp_lite._codec._fields import (
    datetime_body,
    field_bool,
    field_bytes,
    field_str,
    field_uint,
    guarded,
    read_fields,
    read_len,
    read_seconds_nanos,
    read_tag,
    read_varint,
    skip_field,
    timedelta_body,
    to_datetime,
    to_timedelta,
)
from sepp_lite._codec.schema import (
    GET_SERVER_INFO_RESPONSE_ALLOWED_ENCODINGS,
    GET_SERVER_INFO_RESPONSE_DEAD_LETTER_RETENTION_ENABLED,
    GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_ENTRIES,
    GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_KEY_BYTES,
    GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_TOTAL_BYTES,
    GET_SERVER_INFO_RESPONSE_MAX_ENQUEUE_BATCH,
    GET_SERVER_INFO_RESPONSE_MAX_IDEMPOTENCY_KEY_BYTES,
    GET_SERVER_INFO_RESPONSE_MAX_JOB_TYPE_BYTES,
    GET_SERVER_INFO_RESPONSE_MAX_LEASE_DURATION,
    GET_SERVER_INFO_RESPONSE_MAX_PAYLOAD_BYTES,
    GET_SERVER_INFO_RESPONSE_MAX_QUEUE_NAME_BYTES,
    GET_SERVER_INFO_RESPONSE_MAX_RESERVE_BATCH,
    GET_SERVER_INFO_RESPONSE_MAX_RESERVE_QUEUES,
    GET_SERVER_INFO_RESPONSE_MAX_SCHEDULE_HORIZON,
    GET_SERVER_INFO_RESPONSE_MAX_WAIT_TIMEOUT,
    GET_SERVER_INFO_RESPONSE_RESTRICTS_ENCODINGS,
    GET_SERVER_INFO_RESPONSE_SERVER_TIME,
    GET_SERVER_INFO_RESPONSE_SERVER_VERSION,
    GET_SERVER_INFO_RESPONSE_STRICT_QUEUES,
    GET_SERVER_INFO_RESPONSE_SUPPORTED_PROTOCOL_VERSIONS,
)
from sepp_lite._codec.values import MISSING, remember
from sepp_lite.types import ServerInfo

# ServerInfo attributes by GetServerInfoResponse tag, per kind of field.
_UINT64S = {
    GET_SERVER_INFO_RESPONSE_MAX_PAYLOAD_BYTES: "max_payload_bytes",
    GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_TOTAL_BYTES: "max_custom_total_bytes",
}
_UINT32S = {
    GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_ENTRIES: "max_custom_entries",
    GET_SERVER_INFO_RESPONSE_MAX_CUSTOM_KEY_BYTES: "max_custom_key_bytes",
    GET_SERVER_INFO_RESPONSE_MAX_QUEUE_NAME_BYTES: "max_queue_name_bytes",
    GET_SERVER_INFO_RESPONSE_MAX_JOB_TYPE_BYTES: "max_job_type_bytes",
    GET_SERVER_INFO_RESPONSE_MAX_IDEMPOTENCY_KEY_BYTES: "max_idempotency_key_bytes",
    GET_SERVER_INFO_RESPONSE_MAX_ENQUEUE_BATCH: "max_enqueue_batch",
    GET_SERVER_INFO_RESPONSE_MAX_RESERVE_BATCH: "max_reserve_batch",
    GET_SERVER_INFO_RESPONSE_MAX_RESERVE_QUEUES: "max_reserve_queues",
}
_FLAGS = {
    GET_SERVER_INFO_RESPONSE_RESTRICTS_ENCODINGS: "restricts_encodings",
    GET_SERVER_INFO_RESPONSE_STRICT_QUEUES: "strict_queues",
    GET_SERVER_INFO_RESPONSE_DEAD_LETTER_RETENTION_ENABLED: "dead_letter_retention_enabled",
}
_DURATIONS = {
    GET_SERVER_INFO_RESPONSE_MAX_SCHEDULE_HORIZON: "max_schedule_horizon",
    GET_SERVER_INFO_RESPONSE_MAX_WAIT_TIMEOUT: "max_wait_timeout",
    GET_SERVER_INFO_RESPONSE_MAX_LEASE_DURATION: "max_lease_duration",
}
_LISTS = {
    GET_SERVER_INFO_RESPONSE_SUPPORTED_PROTOCOL_VERSIONS: "supported_protocol_versions",
    GET_SERVER_INFO_RESPONSE_ALLOWED_ENCODINGS: "allowed_encodings",
}

# ---------------------------------------------------------------------------------------
# GetServerInfoRequest: read by the in-process server


def decode_get_server_info_request(data: bytes) -> None:
    """Raise :class:`~sepp_lite.errors.DecodeError` unless ``data`` parses as a protobuf
    message (its fields unknown, so ignored), as prost decodes ``GetServerInfoRequest``."""
    guarded("GetServerInfoRequest", lambda raw: read_fields(raw, 0, len(raw)), data)


# ---------------------------------------------------------------------------------------
# GetServerInfoResponse: written by the in-process server


def encode_get_server_info_response(info: ServerInfo) -> bytes:
    """``GetServerInfoResponse``; fields at their zero value are left out, as protobuf
    encoders do, except the three Durations and the server time, always written."""
    parts = [
        field_str(GET_SERVER_INFO_RESPONSE_SERVER_VERSION, info.version) if info.version else b"",
        *[
            field_str(GET_SERVER_INFO_RESPONSE_SUPPORTED_PROTOCOL_VERSIONS, version)
            for version in info.supported_protocol_versions
        ],
        field_bytes(GET_SERVER_INFO_RESPONSE_SERVER_TIME, datetime_body(info.server_time)),
        field_bool(GET_SERVER_INFO_RESPONSE_RESTRICTS_ENCODINGS, info.restricts_encodings),
        *[
            field_str(GET_SERVER_INFO_RESPONSE_ALLOWED_ENCODINGS, encoding)
            for encoding in info.allowed_encodings
        ],
    ]
    for field, name in sorted({**_UINT64S, **_UINT32S}.items()):
        value = getattr(info, name)
        if value:
            parts.append(field_uint(field, value))
    parts += [field_bytes(f, timedelta_body(getattr(info, name))) for f, name in _DURATIONS.items()]
    parts.append(field_bool(GET_SERVER_INFO_RESPONSE_STRICT_QUEUES, info.strict_queues))
    parts.append(
        field_bool(
            GET_SERVER_INFO_RESPONSE_DEAD_LETTER_RETENTION_ENABLED,
            info.dead_letter_retention_enabled,
        )
    )
    return b"".join(parts)


# ---------------------------------------------------------------------------------------
# GetServerInfoResponse: read by the client

_ZERO = timedelta(0)
# What each field sets: the attribute and how its value is read (one lookup per field).
_UINT, _UINT32, _FLAG, _LIST, _DURATION, _TEXT, _TIME = range(7)
_READERS: dict[int, tuple[int, str]] = {
    **{tag: (_UINT, name) for tag, name in _UINT64S.items()},
    **{tag: (_UINT32, name) for tag, name in _UINT32S.items()},
    **{tag: (_FLAG, name) for tag, name in _FLAGS.items()},
    **{tag: (_LIST, name) for tag, name in _LISTS.items()},
    **{tag: (_DURATION, name) for tag, name in _DURATIONS.items()},
    GET_SERVER_INFO_RESPONSE_SERVER_VERSION: (_TEXT, "version"),
    GET_SERVER_INFO_RESPONSE_SERVER_TIME: (_TIME, "server_time"),
}
# Unset fields read as protobuf's zero values (the lists are made fresh per answer).
_DEFAULTS: dict[str, object] = {
    "version": "",
    "server_time": MISSING,
    **{name: 0 for name in (*_UINT64S.values(), *_UINT32S.values())},
    **{name: False for name in _FLAGS.values()},
    **{name: _ZERO for name in _DURATIONS.values()},
}


_DURATION_CACHE: dict[bytes, timedelta] = {}


def _duration(data: bytes, start: int, stop: int) -> timedelta:
    """A limit's Duration; an unset one reads as zero and a negative one is clamped to
    zero. Cached by its bytes: a server sends the same limits in every answer."""
    raw = data[start:stop]
    value = _DURATION_CACHE.get(raw)
    if value is None:
        value = remember(
            _DURATION_CACHE, raw, max(to_timedelta(*read_seconds_nanos(data, start, stop)), _ZERO)
        )
    return value


def _read_server_info(data: bytes) -> dict[str, object]:
    # One pass over the fields, without read_fields' list of spans: a Worker asks once,
    # but a health check may ask every few seconds, and this answer has 16 fields.
    # _READERS is keyed by the whole tag, so a field of an unexpected wire type is skipped.
    values = dict(_DEFAULTS)
    for name in _LISTS.values():
        values[name] = []
    pos, stop = 0, len(data)
    while pos < stop:
        tag, pos = read_tag(data, pos)
        known = _READERS.get(tag)
        if known is None:
            pos = skip_field(data, pos, stop, tag)
            continue
        kind, name = known
        if kind <= _FLAG:
            a, pos = read_varint(data, pos)
            if kind == _UINT:
                values[name] = a
            elif kind == _UINT32:
                values[name] = a & 0xFFFF_FFFF
            else:
                values[name] = a != 0
            continue
        a, pos = read_len(data, pos, stop)
        if kind == _LIST:
            values[name].append(data[a:pos].decode())  # type: ignore[attr-defined]
        elif kind == _DURATION:
            values[name] = _duration(data, a, pos)
        elif kind == _TEXT:
            values[name] = data[a:pos].decode()
        else:
            values[name] = to_datetime(*read_seconds_nanos(data, a, pos))
    return values


def decode_get_server_info_response(data: bytes) -> ServerInfo:
    """``GetServerInfoResponse``; raise :class:`~sepp_lite.errors.MalformedServerInfoError`
    when the version is empty or the server time is unset or not representable."""
    values = guarded("GetServerInfoResponse", _read_server_info, data)
    problem = None
    if not values["version"]:
        problem = "server_version is empty"
    elif values["server_time"] is MISSING:
        problem = "server_time is unset"
    elif values["server_time"] is None:
        problem = "server_time is not a representable time"
    if problem is not None:
        raise errors.MalformedServerInfoError(errors.ServerInfoError(problem))
    return ServerInfo(**values)  # type: ignore[arg-type]
