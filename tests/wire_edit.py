"""Wire-level edits of valid messages, for the unknown-field and fuzz tests.

A message is split into its raw fields; sub-messages (known from the ``queue.proto``
descriptors, map entries and well-known types included) are edited recursively and
re-framed with their new length. The edits are hypothesis strategies so failures shrink.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from tests import protobuf_ref

Draw = Callable[[st.SearchStrategy[Any]], Any]

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return uvarint(number << 3 | wire_type)


def len_field(number: int, body: bytes) -> bytes:
    return tag(number, LEN) + uvarint(len(body)) + body


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


class RawField(NamedTuple):
    number: int
    wire_type: int
    value: bytes  # the body of a LEN field, else the encoded value
    raw: bytes  # the whole field, tag included


def split(data: bytes) -> list[RawField]:
    """The fields of a well-formed message, in wire order."""
    fields = []
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value_start = pos
            _, pos = _read_varint(data, pos)
            value = data[value_start:pos]
        elif wire_type == LEN:
            size, pos = _read_varint(data, pos)
            value = data[pos : pos + size]
            pos += size
        else:
            width = 8 if wire_type == I64 else 4
            value = data[pos : pos + width]
            pos += width
        if pos > len(data) or wire_type not in (VARINT, I64, LEN, I32):
            raise ValueError("not a well-formed message")
        fields.append(RawField(number, wire_type, value, data[start:pos]))
    return fields


# ---------------------------------------------------------------------------------------
# The schema, from the descriptors

_WIRE_TYPES = {
    FieldDescriptor.TYPE_DOUBLE: I64,
    FieldDescriptor.TYPE_FIXED64: I64,
    FieldDescriptor.TYPE_SFIXED64: I64,
    FieldDescriptor.TYPE_FLOAT: I32,
    FieldDescriptor.TYPE_FIXED32: I32,
    FieldDescriptor.TYPE_SFIXED32: I32,
    FieldDescriptor.TYPE_STRING: LEN,
    FieldDescriptor.TYPE_BYTES: LEN,
    FieldDescriptor.TYPE_MESSAGE: LEN,
}


class FieldInfo(NamedTuple):
    wire_type: int
    child: Optional[str]  # full name of the sub-message type
    is_string: bool


@functools.cache
def schema(message: str) -> dict[int, FieldInfo]:
    """``sepp.v1.<name>`` (or a full name) -> its fields by number."""
    descriptor = protobuf_ref.message_class(message).DESCRIPTOR
    out = {}
    for field in descriptor.fields:
        child = field.message_type.full_name if field.message_type is not None else None
        wire_type = _WIRE_TYPES.get(field.type, VARINT)
        out[field.number] = FieldInfo(wire_type, child, field.type == FieldDescriptor.TYPE_STRING)
    return out


def full_name(message: str) -> str:
    return message if "." in message else f"sepp.v1.{message}"


# ---------------------------------------------------------------------------------------
# Recursive rewriting

Edit = Callable[[Draw, str, list[bytes]], list[bytes]]


def rewrite(draw: Draw, data: bytes, message: str, edit: Edit) -> bytes:
    """Apply ``edit`` to the field list of the message and of every sub-message."""
    message = full_name(message)
    out = []
    for field in split(data):
        info = schema(message).get(field.number)
        raw = field.raw
        if info is not None and info.child is not None and field.wire_type == LEN:
            raw = len_field(field.number, rewrite(draw, field.value, info.child, edit))
        out.append(raw)
    return b"".join(edit(draw, message, out))


def _insert(draw: Draw, fields: list[bytes], extra: list[bytes]) -> list[bytes]:
    fields = list(fields)
    for item in extra:
        fields.insert(draw(st.integers(0, len(fields))), item)
    return fields


unknown_numbers = st.integers(21, 1000)


@st.composite
def field_of_wire_type(draw: Draw, number: int, wire_type: int) -> bytes:
    if wire_type == VARINT:
        return tag(number, VARINT) + uvarint(draw(st.integers(0, (1 << 64) - 1)))
    if wire_type == I64:
        return tag(number, I64) + draw(st.binary(min_size=8, max_size=8))
    if wire_type == I32:
        return tag(number, I32) + draw(st.binary(min_size=4, max_size=4))
    return len_field(number, draw(st.binary(max_size=12)))


unknown_fields = st.builds(
    lambda number, wire_type: (number, wire_type),
    unknown_numbers,
    st.sampled_from([VARINT, I64, LEN, I32]),
).flatmap(lambda nw: field_of_wire_type(*nw))


def _add_unknown(draw: Draw, message: str, fields: list[bytes]) -> list[bytes]:
    return _insert(draw, fields, draw(st.lists(unknown_fields, max_size=2)))


def with_unknown_fields(draw: Draw, data: bytes, message: str) -> bytes:
    """``data`` with unknown fields (numbers 21..1000, wire types 0/1/2/5) inserted at the
    top level and inside every sub-message."""
    return rewrite(draw, data, message, _add_unknown)


def _add_mistyped(draw: Draw, message: str, fields: list[bytes]) -> list[bytes]:
    known = schema(message)
    extra = []
    for _ in range(draw(st.integers(1, 2)) if known else 0):
        number = draw(st.sampled_from(sorted(known)))
        wrong = [w for w in (VARINT, I64, LEN, I32) if w != known[number].wire_type]
        extra.append(draw(field_of_wire_type(number, draw(st.sampled_from(wrong)))))
    return _insert(draw, fields, extra)


def with_mistyped_fields(draw: Draw, data: bytes, message: str) -> bytes:
    """``data`` with fields that reuse a known number under the wrong wire type, which
    protobuf parsers treat as unknown fields."""
    return rewrite(draw, data, message, _add_mistyped)


# ---------------------------------------------------------------------------------------
# Malformed input

_small_numbers = st.integers(1, 25) | unknown_numbers


@st.composite
def nasty_fields(draw: Draw) -> bytes:
    """One field no valid message contains."""
    number = draw(_small_numbers)
    kind = draw(st.integers(0, 9))
    if kind == 0:  # a length far past the end of any message
        huge = draw(st.sampled_from([1 << 31, 1 << 32, 1 << 63, (1 << 64) - 1, 1 << 70]))
        return tag(number, LEN) + uvarint(huge) + draw(st.binary(max_size=4))
    if kind == 1:  # an 11-byte varint
        return tag(number, VARINT) + b"\x80" * 10 + b"\x01"
    if kind == 2:  # a 10-byte varint over 64 bits
        return tag(number, VARINT) + b"\xff" * 9 + b"\x7f"
    if kind == 3:  # group start / end
        return tag(number, draw(st.sampled_from([3, 4]))) + draw(st.binary(max_size=4))
    if kind == 4:  # field number 0
        return tag(0, draw(st.sampled_from([0, 1, 2, 5]))) + draw(st.binary(max_size=9))
    if kind == 5:  # reserved wire types
        return tag(number, draw(st.sampled_from([6, 7]))) + draw(st.binary(max_size=4))
    if kind == 6:  # a fixed-width value cut short
        return tag(number, draw(st.sampled_from([I64, I32]))) + draw(st.binary(max_size=3))
    if kind == 7:  # a tag over 32 bits
        return uvarint(draw(st.integers(1 << 32, 1 << 61)) << 3) + b"\x00"
    if kind == 8:  # a varint that never ends
        return tag(number, VARINT) + b"\x80" * draw(st.integers(1, 12))
    # a known-looking number with any wire type and payload
    return draw(field_of_wire_type(number, draw(st.sampled_from([VARINT, I64, LEN, I32]))))


def _add_nasty(draw: Draw, message: str, fields: list[bytes]) -> list[bytes]:
    if draw(st.integers(0, 3)) != 0:  # about one level in four gets one
        return fields
    return _insert(draw, fields, [draw(nasty_fields())])


def with_nasty_fields(draw: Draw, data: bytes, message: str) -> bytes:
    """``data`` with malformed fields inserted at some levels, lengths re-framed so the
    surrounding messages stay well formed."""
    return rewrite(draw, data, message, _add_nasty)


INVALID_UTF8 = [
    b"\xff",
    b"\x80",
    b"\xc3\x28",  # bad continuation
    b"\xc0\xaf",  # overlong "/"
    b"\xed\xa0\x80",  # a UTF-16 surrogate
    b"\xf4\x90\x80\x80",  # above U+10FFFF
    b"\xe2\x82",  # cut short
    b"ok\xfe",
]


def string_field_count(data: bytes, message: str) -> int:
    count = 0

    def visit(draw: Draw, name: str, fields: list[bytes]) -> list[bytes]:
        nonlocal count
        count += sum(1 for f in split(b"".join(fields)) if _is_string(name, f))
        return fields

    rewrite(lambda _: None, data, message, visit)
    return count


def _is_string(message: str, field: RawField) -> bool:
    info = schema(message).get(field.number)
    return info is not None and info.is_string and field.wire_type == LEN


def with_invalid_utf8(draw: Draw, data: bytes, message: str, index: int) -> bytes:
    """``data`` with the ``index``-th string field (in rewrite order) made invalid UTF-8."""
    seen = 0

    def corrupt(draw: Draw, name: str, fields: list[bytes]) -> list[bytes]:
        nonlocal seen
        out = []
        for raw in fields:
            field = split(raw)[0]
            if _is_string(name, field):
                if seen == index:
                    bad = draw(st.sampled_from(INVALID_UTF8))
                    cut = draw(st.integers(0, len(field.value)))
                    raw = len_field(field.number, field.value[:cut] + bad + field.value[cut:])
                seen += 1
            out.append(raw)
        return out

    return rewrite(draw, data, message, corrupt)
