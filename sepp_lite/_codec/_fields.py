"""Protobuf wire primitives shared by every message family of the codec.

Readers take ``(data, pos)`` and return ``(value, new_pos)``; they may raise
``IndexError`` or ``UnicodeDecodeError`` on bad input, which the public entry points turn
into one :class:`~sepp_lite.errors.DecodeError` (:func:`guarded`). Writers take a field's
tag (from :mod:`~sepp_lite._codec.schema`) and return the whole field as ``bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Callable, TypeVar

from sepp_lite._codec.schema import I32, I64, LEN, TIMESTAMP_NANOS, TIMESTAMP_SECONDS, VARINT
from sepp_lite._time import EPOCH
from sepp_lite._validate import int64, non_negative_wire_duration, uint32
from sepp_lite.errors import DecodeError

T = TypeVar("T")
R = TypeVar("R")

_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_I64_MAX = (1 << 63) - 1
# datetime's range in seconds since the epoch (years 1..9999).
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799

_pack_double = struct.Struct("<d").pack
_unpack_double = struct.Struct("<d").unpack_from

# One-byte varints, precomputed: lengths and small numbers are almost always < 128.
_SMALL = [bytes((i,)) for i in range(128)]


def uvarint(value: int) -> bytes:
    """Encode a non-negative int (< 2**64) as a varint."""
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Every tag's encoding, by tag, for field numbers up to 31 (sepp.v1 stops at 18): an
# index is cheaper than encoding the tag for each field written, and a tuple (immutable)
# lets PyPy's JIT fold the lookup of a constant tag away.
_KEYS = tuple([uvarint(tag) for tag in range(32 << 3)])


def svarint64(value: int) -> bytes:
    """Encode an int64 (two's complement, ten bytes when negative)."""
    return uvarint(value & _U64)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    byte = data[pos]
    pos += 1
    if byte < 0x80:
        return byte, pos
    result = byte & 0x7F
    shift = 7
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > _U64:
                raise DecodeError("varint longer than 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than ten bytes")


def as_int64(value: int) -> int:
    return value - (1 << 64) if value > _I64_MAX else value


def as_int32(value: int) -> int:
    value &= _U32
    return value - (1 << 32) if value > 0x7FFF_FFFF else value


def read_len(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Read a length prefix; return ``(start, stop)`` of the delimited bytes."""
    size = data[pos]
    pos += 1
    if size >= 0x80:
        size, pos = read_varint(data, pos - 1)
    stop = pos + size
    if stop > end:
        raise DecodeError("length-delimited field runs past the end of its message")
    return pos, stop


def read_tag(data: bytes, pos: int) -> tuple[int, int]:
    tag = data[pos]
    if tag < 0x80:
        return tag, pos + 1
    tag, pos = read_varint(data, pos)
    if tag > _U32:
        raise DecodeError("field tag out of range")
    return tag, pos


def skip_field(data: bytes, pos: int, end: int, tag: int) -> int:
    """Skip the value of an unknown field; return the position after it."""
    wire_type = tag & 7
    if tag >> 3 == 0:
        raise DecodeError("field number 0 is not valid")
    if wire_type == VARINT:
        return read_varint(data, pos)[1]
    if wire_type == LEN:
        return read_len(data, pos, end)[1]
    if wire_type == I64:
        pos += 8
    elif wire_type == I32:
        pos += 4
    else:
        raise DecodeError(f"unsupported wire type {wire_type}")
    if pos > end:
        raise DecodeError("fixed-width field runs past the end of its message")
    return pos


def read_double(data: bytes, pos: int, end: int) -> tuple[float, int]:
    if pos + 8 > end:
        raise DecodeError("double runs past the end of its message")
    return _unpack_double(data, pos)[0], pos + 8


def end_check(pos: int, stop: int) -> None:
    if pos != stop:
        raise DecodeError("message runs past its declared length")


def read_fields(data: bytes, pos: int, stop: int) -> list[tuple[int, int, int]]:
    """The fields of one message as ``(tag, a, b)``: for length-delimited fields the
    span ``a:b``, for varints ``(value, -1)``; fixed-width fields are skipped. For the
    small messages, where clarity costs nothing measurable."""
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
    end_check(pos, stop)
    return out


def read_into(
    record: R,
    fields: Mapping[int, tuple[str, Callable[[bytes, int, int], object]]],
    data: bytes,
    pos: int,
    stop: int,
) -> R:
    """Set ``record``'s attributes from one message: ``fields`` maps a tag to the
    attribute and the reader of the field's span (or varint, see :func:`read_fields`);
    other fields are skipped, and the last occurrence of a field wins."""
    for field, a, b in read_fields(data, pos, stop):
        known = fields.get(field)
        if known is not None:
            setattr(record, known[0], known[1](data, a, b))
    return record


def read_text(data: bytes, start: int, stop: int) -> str:
    return data[start:stop].decode()


def read_uint32(data: bytes, value: int, _: int) -> int:
    """A uint32 varint from :func:`read_fields` (``(value, -1)``), as protobuf reads one
    (the low 32 bits)."""
    return value & _U32


def read_repeated(data: bytes, tag_wanted: int, read: Callable[[bytes, int, int], T]) -> list[T]:
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


def read_seconds_nanos(data: bytes, start: int, stop: int) -> tuple[int, int]:
    """Decode a google.protobuf.Timestamp or Duration body into (seconds, nanos)."""
    seconds = nanos = 0
    pos = start
    while pos < stop:
        tag, pos = read_tag(data, pos)
        if tag == TIMESTAMP_SECONDS:
            value, pos = read_varint(data, pos)
            seconds = as_int64(value)
        elif tag == TIMESTAMP_NANOS:
            value, pos = read_varint(data, pos)
            nanos = as_int32(value)
        else:
            pos = skip_field(data, pos, stop, tag)
    end_check(pos, stop)
    return seconds, nanos


def to_datetime(seconds: int, nanos: int) -> datetime | None:
    """A UTC datetime with microsecond precision, or ``None`` when the Timestamp is
    before the epoch, has negative or out-of-range nanos, or is past year 9999."""
    if seconds < 0 or not 0 <= nanos <= 999_999_999 or seconds > _MAX_SECONDS:
        return None
    return EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


def to_timedelta(seconds: int, nanos: int) -> timedelta:
    """A Duration as a timedelta; values outside timedelta's range saturate."""
    try:
        return timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError:
        return timedelta.max if seconds > 0 else timedelta.min


def seconds_nanos_body(seconds: int, nanos: int) -> bytes:
    """Encode a Timestamp or Duration body (fields left out when zero)."""
    parts = b""
    if seconds:
        parts = _KEYS[TIMESTAMP_SECONDS] + svarint64(seconds)
    if nanos:
        parts += _KEYS[TIMESTAMP_NANOS] + svarint64(nanos)
    return parts


def datetime_body(dt: datetime) -> bytes:
    """Encode an aware (or naive = UTC) datetime as a Timestamp body."""
    delta = (dt if dt.tzinfo is not None else dt.replace(tzinfo=EPOCH.tzinfo)) - EPOCH
    return seconds_nanos_body(delta.days * 86_400 + delta.seconds, delta.microseconds * 1000)


def timedelta_body(td: timedelta) -> bytes:
    """Encode a non-negative timedelta as a Duration body."""
    non_negative_wire_duration(td)
    return seconds_nanos_body(td.days * 86_400 + td.seconds, td.microseconds * 1000)


def ms_body(ms: int) -> bytes:
    """Encode integer milliseconds as a Timestamp or Duration body."""
    seconds, rest = divmod(ms, 1000)
    return seconds_nanos_body(seconds, rest * 1_000_000)


def key(tag: int) -> bytes:
    """A tag as it goes on the wire."""
    return _KEYS[tag]


def field_bytes(tag: int, value: bytes) -> bytes:
    """A length-delimited field: tag, length, value."""
    size = len(value)
    return _KEYS[tag] + (_SMALL[size] if size < 0x80 else uvarint(size)) + value


def field_str(tag: int, value: str) -> bytes:
    return field_bytes(tag, value.encode())


def field_optional_str(tag: int, value: str | None) -> bytes:
    """A string field that is left out when ``value`` is None (an optional one)."""
    return b"" if value is None else field_str(tag, value)


def field_uint(tag: int, value: int) -> bytes:
    return _KEYS[tag] + (_SMALL[value] if value < 0x80 else uvarint(value))


def field_double(tag: int, value: float) -> bytes:
    return _KEYS[tag] + _pack_double(value)


def field_bool(tag: int, value: bool) -> bytes:
    """A bool field, left off when false (proto3 implicit presence)."""
    return _KEYS[tag] + b"\x01" if value else b""


# The encoders' guards for integer fields (the rules are sepp_lite._validate's): a value
# out of range would otherwise go out as some other number.
check_uint32 = uint32
check_int64 = int64


def guarded(what: str, decode: Callable[[bytes], T], data: bytes) -> T:
    """Run a decoder, turning every way bad bytes can fail into one DecodeError."""
    try:
        return decode(data)
    except DecodeError:
        raise
    except (IndexError, UnicodeDecodeError, ValueError, OverflowError, struct.error) as exc:
        raise DecodeError(f"cannot decode {what}: {exc.__class__.__name__}: {exc}") from exc
