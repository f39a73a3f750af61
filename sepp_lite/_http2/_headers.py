"""Header blocks: requests encoded by hand, responses decoded with ``hpack``.

Our encoder keeps no state: every field is a literal *without indexing* (or
*never indexed* for secrets), with the name taken from HPACK's static table where
it is there, and values are not Huffman-coded. So a method's block is the same for
every call and is built once; only ``grpc-timeout`` and trace headers vary.

Responses go through ``hpack.Decoder``, which follows the peer's dynamic table.
We advertise a dynamic table of 0 bytes: a peer that honours it starts a block with
a table-size update to 0 and can index nothing afterwards, so a block then decodes
the same whatever came before it and its parsed form can be cached by its bytes.
Whether the peer complied is checked on the decoder's actual table size, block by
block, before anything is cached (RFC 7541 §4.2).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from sepp_lite._status import Status, status_of

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
    flag = 0x10 if never_indexed else 0x00
    index = _STATIC_NAMES.get(name)
    if index is not None:
        return _integer(index, 4, flag) + _string(value)
    return bytes([flag]) + _string(name) + _string(value)


def field_size(name: bytes, value: bytes) -> int:
    """A field's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113 §6.5.2)."""
    return len(name) + len(value) + 32


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


def timeout_value(seconds: float) -> bytes:
    """A ``grpc-timeout`` value (at most 8 digits and a unit), rounded up."""
    millis = max(1, -int(-seconds * 1000 // 1))
    if millis < 100_000_000:
        return b"%dm" % millis
    return b"%dS" % min(-int(-seconds // 1), 99_999_999)


class Response(NamedTuple):
    """What a response or trailer block says, as far as a gRPC client cares."""

    http_status: Optional[bytes]
    content_type: Optional[bytes]
    grpc_status: Optional[Status]
    grpc_message: str


def parse_fields(fields: list[tuple[bytes, bytes]]) -> Response:
    """The fields a gRPC client reads, from a decoded block."""
    http_status = content_type = grpc_status = None
    message = b""
    for name, value in fields:
        if name == b":status":
            http_status = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-status":
            grpc_status = _grpc_status(value)
        elif name == b"grpc-message":
            message = value
    return Response(http_status, content_type, grpc_status, _percent_decoded(message))


def _percent_decoded(message: bytes) -> str:
    """grpc-message is percent-encoded UTF-8 (gRPC's PROTOCOL-HTTP2); a ``%`` not
    followed by two hex digits stays as it is."""
    if b"%" not in message:
        return message.decode("utf-8", "replace")
    parts = message.split(b"%")
    out = bytearray(parts[0])
    for part in parts[1:]:
        if len(part) >= 2 and part[0] in _HEX and part[1] in _HEX:
            out.append(int(part[:2], 16))
            out += part[2:]
        else:
            out += b"%" + part
    return out.decode("utf-8", "replace")


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _grpc_status(value: bytes) -> Status:
    return status_of(int(value)) if value.isdigit() and len(value) < 10 else Status.UNKNOWN


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
        self._cache: dict[bytes, Response] = {}

    def is_cached(self, block: bytes) -> bool:
        return block in self._cache

    def decode(self, block: bytes) -> Response:
        """Raises :class:`HeaderBlockError` for a block that does not decode."""
        cached = self._cache.get(block)
        if cached is not None and self._table.maxsize == 0:
            return cached
        was_empty = self._table.maxsize == 0
        try:
            fields = self._decoder.decode(block, raw=True)
        except self._errors as exc:
            raise HeaderBlockError(str(exc)) from None
        response = parse_fields(fields)  # type: ignore[arg-type]
        if (
            was_empty
            and self._table.maxsize == 0
            and len(block) <= _CACHE_BLOCK_BYTES
            and len(self._cache) < _CACHE_ENTRIES
        ):
            self._cache[block] = response
        return response
