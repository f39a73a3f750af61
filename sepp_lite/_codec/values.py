"""The small messages that several families carry, both directions, written once:
PrimitiveValue and the custom map's entries, Payload, TraceContext, and Timestamps read
into datetimes.

The client-side readers and writers keep caches keyed by bytes or by value: producers
repeat queue names, encodings and custom entries from job to job, and the jobs of one
reserve share timestamps, so a dict lookup replaces most decoding and encoding. Every
cache holds immutable values and is cleared when full, so a stream of unique values
cannot grow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Optional, TypeVar, Union

from sepp_lite._codec._fields import (
    as_int64,
    check_int64,
    end_check,
    field_bytes,
    field_double,
    field_str,
    field_uint,
    key,
    read_double,
    read_len,
    read_seconds_nanos,
    read_tag,
    read_varint,
    skip_field,
    svarint64,
    to_datetime,
)
from sepp_lite._codec.schema import (
    MAP_ENTRY_KEY,
    MAP_ENTRY_VALUE,
    PAYLOAD_DATA,
    PAYLOAD_ENCODING,
    PRIMITIVE_VALUE_BOOL_VALUE,
    PRIMITIVE_VALUE_DOUBLE_VALUE,
    PRIMITIVE_VALUE_INT_VALUE,
    PRIMITIVE_VALUE_STRING_VALUE,
    TRACE_CONTEXT_TRACEPARENT,
    TRACE_CONTEXT_TRACESTATE,
)
from sepp_lite._validate import custom_value_type_error, payload_data
from sepp_lite.errors import DecodeError
from sepp_lite.types import Payload, Primitive

MISSING: object = object()
"""An unset Timestamp, told apart from ``None`` (set, but not a representable time)."""

CACHE_MAX = 4096

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V) -> V:
    """Store ``value`` in one of the codec's caches and return it. A cache that has
    reached ``CACHE_MAX`` entries is emptied first: keys can come from a peer, so no
    cache may grow without bound."""
    if len(cache) >= CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


DecodedPrimitive = Union[str, int, float, bool, None]
"""A PrimitiveValue as read; ``None`` when it sets no member (which the server refuses
and the client reports)."""

SecondsNanos = tuple[int, int]
Trace = tuple[str, Optional[str]]
"""A TraceContext as ``(traceparent, tracestate)``, tracestate ``None`` when absent."""

# ---------------------------------------------------------------------------------------
# PrimitiveValue and the custom map

_BOOL_TRUE = key(PRIMITIVE_VALUE_BOOL_VALUE) + b"\x01"
_BOOL_FALSE = key(PRIMITIVE_VALUE_BOOL_VALUE) + b"\x00"
_INT_KEY = key(PRIMITIVE_VALUE_INT_VALUE)


def write_primitive_value(key_name: str, value: object) -> bytes:
    """A PrimitiveValue body for ``custom[key_name]``; ``TypeError`` for a type the wire
    has no member for, ``ValueError`` for ints outside int64 (the rules of
    ``sepp_lite._validate.custom_map``)."""
    # bool before int: bool is a subclass of int.
    cls = value.__class__
    if cls is str:
        return field_str(PRIMITIVE_VALUE_STRING_VALUE, value)  # type: ignore[arg-type]
    if cls is bool:
        # Written even when false: the member set is the value.
        return _BOOL_TRUE if value else _BOOL_FALSE
    if cls is int:
        return _INT_KEY + svarint64(check_int64(value, f"custom[{key_name!r}]"))  # type: ignore[arg-type]
    if cls is float:
        return field_double(PRIMITIVE_VALUE_DOUBLE_VALUE, value)  # type: ignore[arg-type]
    # Subclasses (str/int enums, numpy-like scalars) are sent as their base value; for a
    # str subclass that is its characters, not its __str__ (Enum's is "Cls.NAME").
    if isinstance(value, str):
        return write_primitive_value(key_name, str.__str__(value))
    if isinstance(value, int):
        return write_primitive_value(key_name, int(value))
    if isinstance(value, float):
        return write_primitive_value(key_name, float(value))
    raise custom_value_type_error(key_name, value)


def read_primitive_value(data: bytes, pos: int, stop: int) -> DecodedPrimitive:
    """A PrimitiveValue; ``None`` when no member is set (the last member wins)."""
    value: DecodedPrimitive = None
    while pos < stop:
        tag = data[pos]
        if tag == PRIMITIVE_VALUE_STRING_VALUE:
            size = data[pos + 1]
            if size < 0x80 and pos + 2 + size <= stop:
                pos += 2 + size
                value = data[pos - size : pos].decode()
                continue
        tag, pos = read_tag(data, pos)
        if tag == PRIMITIVE_VALUE_STRING_VALUE:
            start, pos = read_len(data, pos, stop)
            value = data[start:pos].decode()
        elif tag == PRIMITIVE_VALUE_DOUBLE_VALUE:
            value, pos = read_double(data, pos, stop)
        elif tag == PRIMITIVE_VALUE_INT_VALUE:
            raw, pos = read_varint(data, pos)
            value = as_int64(raw)
        elif tag == PRIMITIVE_VALUE_BOOL_VALUE:
            raw, pos = read_varint(data, pos)
            value = raw != 0
        else:
            pos = skip_field(data, pos, stop, tag)
    end_check(pos, stop)
    return value


_ENTRY_FIELDS: dict[tuple[int, str, object, type], bytes] = {}
_CACHEABLE = frozenset({str, int, bool})


def _entry_field(tag: int, key_name: str, value: object) -> bytes:
    entry = field_str(MAP_ENTRY_KEY, key_name) + field_bytes(
        MAP_ENTRY_VALUE, write_primitive_value(key_name, value)
    )
    return field_bytes(tag, entry)


def custom_fields(tag: int, custom: Mapping[str, Primitive]) -> bytes:
    """A ``map<string, PrimitiveValue>`` field (``tag``) as repeated entries, in insertion
    order."""
    out = []
    for key_name, value in custom.items():
        cls = value.__class__
        if cls is float or cls not in _CACHEABLE:
            # -0.0 == 0.0 (equal keys, different bytes) and other types (subclasses,
            # wrong types) are encoded, or refused, without the cache.
            out.append(_entry_field(tag, key_name, value))
            continue
        cache_key = (tag, key_name, value, cls)
        encoded = _ENTRY_FIELDS.get(cache_key)
        if encoded is None:
            encoded = remember(_ENTRY_FIELDS, cache_key, _entry_field(tag, key_name, value))
        out.append(encoded)
    return b"".join(out)


def read_custom_entry(data: bytes, pos: int, stop: int) -> tuple[str, DecodedPrimitive]:
    """One map entry; the value is ``None`` when its PrimitiveValue sets nothing."""
    key_bytes, value_bytes = read_two_strings(data, pos, stop)
    if value_bytes is None:
        return key_bytes.decode(), None
    return key_bytes.decode(), read_primitive_value(value_bytes, 0, len(value_bytes))


ENTRY_CACHE: dict[bytes, tuple[str, DecodedPrimitive]] = {}
"""Decoded custom entries by their encoded bytes; :func:`cached_custom_entry` fills it
(the Job reader looks it up inline, before calling that)."""


def cached_custom_entry(data: bytes, start: int, stop: int) -> tuple[str, DecodedPrimitive]:
    return remember(ENTRY_CACHE, data[start:stop], read_custom_entry(data, start, stop))


# ---------------------------------------------------------------------------------------
# Messages of two length-delimited fields: Payload, TraceContext, map entries

# Payload, TraceContext and map entries number their fields alike (field 1 and field 2,
# both length-delimited; tests/test_codec_schema.py checks it), so one reader serves all.
_FIRST = MAP_ENTRY_KEY
_SECOND = MAP_ENTRY_VALUE


def read_two_strings(data: bytes, pos: int, stop: int) -> tuple[bytes, bytes | None]:
    """Fields 1 and 2 of a message whose fields are both length-delimited; field 2 is
    ``None`` when absent. Other fields are skipped; the last occurrence wins."""
    first = b""
    second: bytes | None = None
    while pos < stop:
        field = data[pos]
        size = data[pos + 1]
        if (field == _FIRST or field == _SECOND) and size < 0x80:
            start = pos + 2
            pos = start + size
            if pos > stop:
                raise DecodeError("length-delimited field runs past the end of its message")
        else:
            field, pos = read_tag(data, pos)
            if field != _FIRST and field != _SECOND:
                pos = skip_field(data, pos, stop, field)
                continue
            start, pos = read_len(data, pos, stop)
        if field == _FIRST:
            first = data[start:pos]
        else:
            second = data[start:pos]
    end_check(pos, stop)
    return first, second


def read_payload(data: bytes, pos: int, stop: int) -> Payload:
    body, encoding = read_two_strings(data, pos, stop)
    return Payload(body, encoding.decode() if encoding is not None else "")


def read_payload_parts(data: bytes, pos: int, stop: int) -> tuple[bytes, str]:
    """A Payload as ``(data, encoding)``, as the in-process server stores it."""
    body, encoding = read_two_strings(data, pos, stop)
    return body, encoding.decode() if encoding is not None else ""


_ENCODING_FIELDS: dict[str, bytes] = {}


def cached_str_field(cache: dict[str, bytes], field: int, value: str) -> bytes:
    """Encode a string field and remember it in ``cache`` (by value)."""
    return remember(cache, value, field_str(field, value))


def payload_field(field: int, payload: Payload) -> bytes:
    """A Payload field (``field``, length-delimited) of a checked payload."""
    data = payload.data
    if not isinstance(data, bytes):
        payload_data(data)  # bytes() of an int would be that many zeros
        data = bytes(data)
    encoding = payload.encoding
    tail = _ENCODING_FIELDS.get(encoding) if encoding else b""
    if tail is None:
        tail = cached_str_field(_ENCODING_FIELDS, PAYLOAD_ENCODING, encoding)
    if not data:
        return field_bytes(field, tail)
    size = len(data)
    head = field_uint(PAYLOAD_DATA, size)
    return field_uint(field, len(head) + size + len(tail)) + head + data + tail


def read_trace_context(data: bytes, pos: int, stop: int) -> Trace:
    traceparent, tracestate = read_two_strings(data, pos, stop)
    return traceparent.decode(), None if tracestate is None else tracestate.decode()


def write_trace_context(traceparent: str, tracestate: str | None) -> bytes:
    """A TraceContext body (an empty traceparent is left off, as protobuf does)."""
    body = field_str(TRACE_CONTEXT_TRACEPARENT, traceparent) if traceparent else b""
    if tracestate is not None:
        body += field_str(TRACE_CONTEXT_TRACESTATE, tracestate)
    return body


# ---------------------------------------------------------------------------------------
# Timestamps

_TIMESTAMPS: dict[bytes, datetime | None] = {}


def read_timestamp(data: bytes, pos: int, stop: int) -> datetime | None:
    """A Timestamp as a UTC datetime, ``None`` when not representable (see
    :func:`~sepp_lite._codec._fields.to_datetime`); cached by its bytes."""
    raw = data[pos:stop]
    try:
        return _TIMESTAMPS[raw]
    except KeyError:
        pass
    return remember(_TIMESTAMPS, raw, to_datetime(*read_seconds_nanos(data, pos, stop)))
