"""Header blocks: requests encoded by hand, responses decoded with ``hpack``.

Our encoder keeps no state: every field is a literal *without indexing* (or
*never indexed* for secrets), with the name taken from HPACK's static table where
it is there, and values are not Huffman-coded. So a method's block is the same for
every call and is built once (:class:`RequestHead`); the fields that vary per call
are literals appended to it (:func:`extra_fields`). No HPACK byte is composed outside
this module.

Responses go through ``hpack.Decoder``, which follows the peer's dynamic table.
We advertise a dynamic table of 0 bytes: a peer that honours it starts a block with
a table-size update to 0 and can index nothing afterwards, so a block then decodes
the same whatever came before it and its parsed form can be cached by its bytes.
Whether the peer complied is checked on the decoder's actual table size, block by
block, before anything is cached (RFC 7541 §4.2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Optional

# RFC 7541 Appendix A: static-table indexes of the names we send.
_STATIC_NAMES = {
    b":authority": 1,
    b":path": 4,
    b"authorization": 23,
    b"content-type": 31,
    b"user-agent": 58,
}
_METHOD_POST = b"\x83"  # indexed :method POST
_SCHEME = {False: b"\x86", True: b"\x87"}  # indexed :scheme http / https
TABLE_SIZE_ZERO = b"\x20"  # a dynamic table size update to 0


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 §5.1: ``value`` with an N-bit prefix, OR-ed into ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7, 0) + data


def literal(name: bytes, value: bytes, *, never_indexed: bool = False) -> bytes:
    """One field as a literal without indexing (0000xxxx) or never indexed (0001xxxx)."""
    size = len(value)
    # Short values (the per-call fields) take their one-byte length at once.
    length = bytes((size,)) if size < 127 else _integer(size, 7, 0)
    if never_indexed:
        return _name_part(name, 0x10) + length + value
    part = _PLAIN_NAMES.get(name)
    if part is None:
        part = _name_part(name, 0x00)
        if len(_PLAIN_NAMES) < 64:  # the per-call names are few; callers' are bounded
            _PLAIN_NAMES[name] = part
    return part + length + value


_PLAIN_NAMES: dict[bytes, bytes] = {}  # a literal's first byte(s) and name, by name


def _name_part(name: bytes, flag: int) -> bytes:
    index = _STATIC_NAMES.get(name)
    if index is not None:
        return _integer(index, 4, flag)
    return bytes((flag,)) + _string(name)


def field_size(name: bytes, value: bytes) -> int:
    """A field's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113 §6.5.2)."""
    return len(name) + len(value) + 32


def extra_fields(fields: Sequence[tuple[bytes, bytes]]) -> tuple[bytes, int]:
    """Fields to append to a :class:`RequestHead`'s block for one request, as literals
    without indexing, and their ``field_size`` sum (``Connection.call``'s ``extra`` and
    ``extra_size``)."""
    if len(fields) == 1:
        # The usual call (grpc-timeout alone) takes no loop: on PyPy a loop here is a
        # trace of its own, which makes the caller's objects real allocations.
        ((name, value),) = fields
        return literal(name, value), field_size(name, value)
    block = b""
    size = 0
    for name, value in fields:
        block += literal(name, value)
        size += field_size(name, value)
    return block, size


class RequestHead(NamedTuple):
    """What every request on a connection starts with, for one method."""

    block: bytes
    size: int  # the MAX_HEADER_LIST_SIZE measure of the fields in ``block``


def request_head(
    path: bytes, *, tls: bool, authority: bytes, fields: tuple[tuple[bytes, bytes], ...]
) -> RequestHead:
    """The fixed part of a request block: pseudo-headers first, then ``fields``;
    ``authorization`` is never indexed."""
    parts = [_METHOD_POST, _SCHEME[tls], literal(b":path", path), literal(b":authority", authority)]
    size = field_size(b":method", b"POST") + field_size(b":scheme", b"https" if tls else b"http")
    size += field_size(b":path", path) + field_size(b":authority", authority)
    for name, value in fields:
        parts.append(literal(name, value, never_indexed=name == b"authorization"))
        size += field_size(name, value)
    return RequestHead(b"".join(parts), size)


class ResponseHeaders(NamedTuple):
    """A decoded response or trailer block: ``:status`` and ``content-type`` (None
    when absent), and every field by name (the last one of a repeated name)."""

    http_status: Optional[bytes]
    content_type: Optional[bytes]
    fields: dict[bytes, bytes]


def parse_fields(fields: Iterable[tuple[bytes, bytes]]) -> ResponseHeaders:
    """A decoded block's fields as a :class:`ResponseHeaders`."""
    by_name = dict(fields)
    return ResponseHeaders(by_name.get(b":status"), by_name.get(b"content-type"), by_name)


_CACHE_ENTRIES = 256  # distinct cached blocks; typical peers use a handful
_CACHE_BLOCK_BYTES = 512  # larger blocks (long error messages) are not cached


class HeaderBlockError(Exception):
    """A header block that does not decode (the connection's HPACK state is lost)."""


class ResponseDecoder:
    """Decodes the peer's header blocks, caching the parsed form when that is safe."""

    def __init__(self, max_header_list_size: int) -> None:
        import hpack  # here: the first connection needs it, ``import sepp_lite`` does not

        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._errors: Any = hpack.HPACKError
        self._table = self._decoder.header_table
        self._cache: dict[bytes, ResponseHeaders] = {}

    def is_cached(self, block: bytes) -> bool:
        return block in self._cache

    def decode(self, block: bytes) -> ResponseHeaders:
        """Raises :class:`HeaderBlockError` for a block that does not decode."""
        cached = self._cache.get(block)
        if cached is not None and self._table.maxsize == 0:
            return cached
        was_empty = self._table.maxsize == 0
        try:
            fields = self._decoder.decode(block, raw=True)
        except self._errors as exc:
            raise HeaderBlockError(str(exc)) from None
        response = parse_fields(fields)
        if (
            was_empty
            and self._table.maxsize == 0
            and len(block) <= _CACHE_BLOCK_BYTES
            and len(self._cache) < _CACHE_ENTRIES
        ):
            self._cache[block] = response
        return response
