"""HTTP/2 framing (RFC 9113 §4, §6): the numbers, and the frames a client writes.

Only what a unary gRPC client sends is built here; frames are read in
``_connection``. Every builder returns the frame's bytes, header included.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9

# Frame types.
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers.
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

# Error codes (RFC 9113 §7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xA
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC
HTTP_1_1_REQUIRED = 0xD

ERROR_NAMES = {
    NO_ERROR: "NO_ERROR",
    PROTOCOL_ERROR: "PROTOCOL_ERROR",
    INTERNAL_ERROR: "INTERNAL_ERROR",
    FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR",
    SETTINGS_TIMEOUT: "SETTINGS_TIMEOUT",
    STREAM_CLOSED: "STREAM_CLOSED",
    FRAME_SIZE_ERROR: "FRAME_SIZE_ERROR",
    REFUSED_STREAM: "REFUSED_STREAM",
    CANCEL: "CANCEL",
    COMPRESSION_ERROR: "COMPRESSION_ERROR",
    CONNECT_ERROR: "CONNECT_ERROR",
    ENHANCE_YOUR_CALM: "ENHANCE_YOUR_CALM",
    INADEQUATE_SECURITY: "INADEQUATE_SECURITY",
    HTTP_1_1_REQUIRED: "HTTP_1_1_REQUIRED",
}

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_FRAME_LIMIT = 16_777_215
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1

_HEADER = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"0x{code:x}")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEADER.pack(size >> 8, size & 0xFF, kind, flags, stream_id) + payload


def data(stream_id: int, chunk: bytes | memoryview, end: bool) -> bytes:
    """A DATA frame; ``chunk`` may be a slice of a larger request (one copy)."""
    size = len(chunk)
    flags = END_STREAM if end else 0
    return _HEADER.pack(size >> 8, size & 0xFF, DATA, flags, stream_id) + chunk


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, v) for key, v in values.items()))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def ping(payload: bytes, ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def header_frames(stream_id: int, block: bytes, max_frame: int, end_stream: bool) -> bytes:
    """HEADERS, followed by CONTINUATION frames when ``block`` is over ``max_frame``."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [frame(HEADERS, flags, stream_id, parts[0])]
    for part in parts[1:-1]:
        out.append(frame(CONTINUATION, 0, stream_id, part))
    out.append(frame(CONTINUATION, END_HEADERS, stream_id, parts[-1]))
    return b"".join(out)


def u32(payload: bytes, offset: int = 0) -> int:
    value: int = _U32.unpack_from(payload, offset)[0]
    return value


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]
