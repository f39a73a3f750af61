"""A scripted HTTP/2 server peer that frames by hand, for the client transport's tests.

h2's state machine is not used for sending: it refuses to send anything after its own
GOAWAY, and the point is to send what real peers send (GOAWAY, then the answers of the
streams still open) and what hostile peers send (anything at all). Frames are built with
``struct``, header blocks with ``hpack.Encoder``, and every frame the client sends is
parsed and recorded by hand (header blocks decoded with ``hpack.Decoder``, keeping
which fields were never-indexed and which HPACK representation carried each).

* :class:`H2Peer`: the server. A first SETTINGS as configured (or none), the client's
  SETTINGS ACKed (or not), PINGs answered (or not), its own receive windows opened as
  configured (at once, or a few bytes at a time), and each request answered with the
  actions its ``handler`` returns (:func:`valid_answer` by default).
* Actions: :class:`Headers`, :class:`Data`, :class:`Reset`, :class:`GoAway`,
  :class:`Ping`, :class:`Settings`, :class:`WindowUpdate`,
  :class:`Raw`, :class:`RawFrame`, :class:`Flood`, :class:`Sleep`, :class:`Signal`,
  :class:`WaitUntil`, :class:`Close`, :class:`Abort`, :class:`Hang`.
* :class:`PeerConnection`: what one connection saw, both ways, in order
  (``timeline``), its requests, and the client's protocol ``violations`` as the peer
  judged them; :meth:`PeerConnection.lowest_windows` replays the timeline to check
  the client's flow control. ``read_rate`` (from :class:`H2Peer`, or changed with
  :meth:`PeerConnection.read_at`) makes it a slow reader, or one that reads nothing:
  the socket backs up on the client's side while the peer still writes.
* :func:`silent_peer`, :func:`http1_peer`, :func:`tls_context` (a TLS server is an
  :class:`H2Peer` with ``tls=tls_context()``), :func:`alerting_tls_peer` for the connect
  cases.

Everything a peer starts is stopped when its ``async with`` ends; it binds 127.0.0.1
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import inspect
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import hpack

from tests.client_helpers import SilentServer, default_reply
from tests.fault_helpers import abort_with_reset, as_text
from tests.pki import ca_pem as pki_ca_pem
from tests.pki import server_context

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20


class FrameType(enum.IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 1
    ENABLE_PUSH = 2
    MAX_CONCURRENT_STREAMS = 3
    INITIAL_WINDOW_SIZE = 4
    MAX_FRAME_SIZE = 5
    MAX_HEADER_LIST_SIZE = 6


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    SETTINGS_TIMEOUT = 4
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    CONNECT_ERROR = 10
    ENHANCE_YOUR_CALM = 11
    INADEQUATE_SECURITY = 12
    HTTP_1_1_REQUIRED = 13


# What a gRPC server typically announces; tests pass their own.
DEFAULT_SETTINGS: Mapping[int, int] = {
    Setting.MAX_CONCURRENT_STREAMS: 100,
    Setting.INITIAL_WINDOW_SIZE: 1 << 20,
}
OK_HEADERS = ((":status", "200"), ("content-type", "application/grpc"))


def frame_header(length: int, type_: int, flags: int, stream_id: int) -> bytes:
    """A 9-byte frame header; ``length`` may lie (hostile frames)."""
    return struct.pack(">I", length)[1:] + bytes((type_, flags)) + struct.pack(">I", stream_id)


def frame_bytes(type_: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return frame_header(len(payload), type_, flags, stream_id) + payload


def settings_payload(values: Mapping[int, int]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in values.items())


def _settings_values(payload: bytes) -> dict[int, int]:
    pairs = (struct.unpack_from(">HI", payload, at) for at in range(0, len(payload) - 5, 6))
    return {key: value for key, value in pairs}


def grpc_message(message: bytes, *, declared: Optional[int] = None, compressed: int = 0) -> bytes:
    """A gRPC length-prefixed message; ``declared`` overrides the length prefix."""
    size = len(message) if declared is None else declared
    return bytes((compressed,)) + struct.pack(">I", size) + message


# ---------------------------------------------------------------------------------------
# What was seen


@dataclass
class Frame:
    """One frame on the wire; ``inbound`` when the client sent it. Outbound DATA,
    HEADERS and CONTINUATION payloads are not kept (a flood would keep them all)."""

    inbound: bool
    type: int
    flags: int
    stream_id: int
    payload: bytes
    length: int
    at: float

    @property
    def name(self) -> str:
        try:
            return FrameType(self.type).name
        except ValueError:
            return f"UNKNOWN({self.type:#x})"

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    @property
    def error_code(self) -> int:
        """The code of a RST_STREAM or GOAWAY."""
        offset = 4 if self.type == FrameType.GOAWAY else 0
        return int(struct.unpack_from(">I", self.payload, offset)[0])

    @property
    def last_stream_id(self) -> int:
        return int(struct.unpack_from(">I", self.payload)[0]) & MAX_STREAM_ID

    @property
    def debug_data(self) -> bytes:
        return self.payload[8:]

    @property
    def increment(self) -> int:
        return int(struct.unpack_from(">I", self.payload)[0]) & MAX_WINDOW

    @property
    def settings(self) -> dict[int, int]:
        return _settings_values(self.payload)

    def __repr__(self) -> str:
        way = "in" if self.inbound else "out"
        return (
            f"<{way} {self.name} flags={self.flags:#x} stream={self.stream_id} len={self.length}>"
        )


@dataclass(frozen=True)
class Field:
    name: str
    value: str
    never_indexed: bool


@dataclass
class HeaderBlock:
    """A request header block as it came: its fields, the HPACK entries that carried
    them (``(kind, integer, offset)``, see :func:`hpack_entries`; size updates have no
    field), and how many frames (HEADERS + CONTINUATION) carried it."""

    stream_id: int
    raw: bytes
    fields: list[Field]
    entries: list[tuple[str, int, int]]
    frames: int

    @property
    def representations(self) -> list[tuple[str, int]]:
        return [(kind, value) for kind, value, _ in self.entries]

    def entry_of(self, name: str) -> tuple[str, int, int]:
        """The HPACK entry that carried the first field called ``name``."""
        fields = [e for e in self.entries if e[0] != "size_update"]
        return fields[next(i for i, f in enumerate(self.fields) if f.name == name)]

    def get(self, name: str) -> Optional[str]:
        return next((f.value for f in self.fields if f.name == name), None)

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


@dataclass
class Request:
    """One request stream: its header block and body, as far as they came."""

    conn: PeerConnection
    stream_id: int
    headers: HeaderBlock
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False  # the client's END_STREAM arrived
    reset_code: Optional[int] = None  # the client's RST_STREAM
    answered: bool = False  # the peer ended or reset its side

    @property
    def method(self) -> str:
        return (self.headers.get(":path") or "").rsplit("/", 1)[-1]

    @property
    def message(self) -> bytes:
        """The gRPC message without its 5-byte prefix."""
        return bytes(self.body[5:])

    def __repr__(self) -> str:
        return f"<Request {self.method} stream={self.stream_id} conn={self.conn.index}>"


# ---------------------------------------------------------------------------------------
# Actions


@dataclass
class Headers:
    """A header block: ``split`` cuts it into HEADERS + CONTINUATION frames of at most
    that many bytes; ``pad`` pads the HEADERS frame; ``priority`` sets the PRIORITY
    flag; ``block`` sends these bytes instead of encoding ``headers``;
    ``end_headers=False`` leaves the block open (for CONTINUATION floods)."""

    headers: Sequence[tuple[str, str]] = OK_HEADERS
    end: bool = False
    split: Optional[int] = None
    pad: int = 0
    priority: bool = False
    block: Optional[bytes] = None
    end_headers: bool = True
    stream: Optional[int] = None


@dataclass
class Data:
    """DATA frames with these bytes, at most ``split`` bytes each (and never over the
    client's MAX_FRAME_SIZE), each padded with ``pad`` bytes. With ``flow`` the peer
    waits for the client's windows as an honest peer does."""

    data: bytes
    end: bool = False
    split: Optional[int] = None
    pad: int = 0
    flow: bool = True
    stream: Optional[int] = None


@dataclass
class Reset:
    code: int = ErrorCode.INTERNAL_ERROR
    stream: Optional[int] = None


@dataclass
class GoAway:
    """GOAWAY; ``last_stream_id`` None means the highest stream the client opened."""

    last_stream_id: Optional[int] = None
    code: int = ErrorCode.NO_ERROR
    debug: bytes = b""


@dataclass
class Ping:
    """A PING (or a PING ACK); ``wait_ack`` waits (up to 10 s) for the client's ACK."""

    payload: bytes = b"peer-png"
    ack: bool = False
    wait_ack: bool = False


@dataclass
class Settings:
    """A SETTINGS frame; the client's ACK applies it to the peer's checks."""

    values: Mapping[int, int] = field(default_factory=dict)
    ack: bool = False


@dataclass
class WindowUpdate:
    increment: int
    stream: Optional[int] = 0  # None: the request's stream


@dataclass
class RawFrame:
    """Any frame, written as given (``length`` overrides the header's length field)."""

    type: int
    flags: int = 0
    payload: bytes = b""
    stream: Optional[int] = None
    length: Optional[int] = None


@dataclass
class Raw:
    """Bytes written as they are."""

    data: bytes


@dataclass
class Flood:
    """``count`` frames of one type with the same payload, written as fast as the
    socket takes them (one payload object, so the peer's memory stays flat). DATA with
    ``flow`` waits for the client's windows and stops when they stay shut for
    ``stall`` seconds. The flood stops when the client resets its stream (unless
    ``ignore_reset``) and when the connection closes."""

    type: int
    payload: bytes
    count: int
    flags: int = 0
    flow: bool = False
    stall: float = 1.0
    ignore_reset: bool = False
    stream: Optional[int] = None


@dataclass
class Sleep:
    seconds: float


@dataclass
class Signal:
    """Set ``event``: tells the test the script got this far."""

    event: asyncio.Event


@dataclass
class WaitUntil:
    """Wait until ``predicate()`` holds (checked on every frame in or out)."""

    predicate: Callable[[], object]
    timeout: float = 10.0


@dataclass
class Close:
    """Close the TCP connection after what was written (FIN); ``half`` only shuts the
    peer's sending side, so the client can still say something (a GOAWAY)."""

    half: bool = False


@dataclass
class Abort:
    """Reset the TCP connection (RST)."""


@dataclass
class Hang:
    """Stop here; the stream stays as it is."""


Action = Union[
    Headers,
    Data,
    Reset,
    GoAway,
    Ping,
    Settings,
    WindowUpdate,
    RawFrame,
    Raw,
    Flood,
    Sleep,
    Signal,
    WaitUntil,
    Close,
    Abort,
    Hang,
]
Handler = Callable[[Request], Union[Sequence[Action], Awaitable[Sequence[Action]]]]


def answer(message: bytes, *, status: int = 0, grpc_message_text: str = "") -> list[Action]:
    """A well-formed unary gRPC answer carrying ``message``."""
    return [Headers(), Data(grpc_message(message)), trailers(status, grpc_message_text)]


def trailers(status: int = 0, message: str = "") -> Headers:
    fields = [("grpc-status", str(status))]
    if message:
        fields.append(("grpc-message", message))
    return Headers(fields, end=True)


def valid_answer(request: Request) -> list[Action]:
    """A correct answer to any of the eight RPCs (one result per job for enqueues)."""
    return answer(default_reply(request.method, request.message))


@dataclass(frozen=True)
class Refill:
    """How the peer opens its receive windows again: by what it received, at once
    (``step=None``), or ``step`` bytes per WINDOW_UPDATE with ``delay`` seconds
    between them (a slow reader)."""

    step: Optional[int] = None
    delay: float = 0.0


# ---------------------------------------------------------------------------------------
# HPACK representations


def _hpack_int(data: bytes, pos: int, bits: int) -> tuple[int, int]:
    limit = (1 << bits) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _skip_string(data: bytes, pos: int) -> int:
    size, pos = _hpack_int(data, pos, 7)
    return pos + size


_KINDS = (
    (0x80, "indexed", 7),
    (0x40, "incremental", 6),
    (0x20, "size_update", 5),
    (0x10, "never_indexed", 4),
    (0x00, "not_indexed", 4),
)


def hpack_entries(block: bytes) -> list[tuple[str, int, int]]:
    """Each entry of an HPACK block as ``(kind, integer, offset)``: ``indexed``
    (index), ``incremental`` / ``never_indexed`` / ``not_indexed`` (name index, 0 for
    a literal name) or ``size_update`` (new size), and where the entry starts.
    RFC 7541 §6."""
    out = []
    pos = 0
    while pos < len(block):
        start = pos
        kind, bits = next((k, b) for mask, k, b in _KINDS if block[pos] & mask == mask)
        value, pos = _hpack_int(block, pos, bits)
        if kind not in ("indexed", "size_update"):
            if value == 0:
                pos = _skip_string(block, pos)
            pos = _skip_string(block, pos)
        out.append((kind, value, start))
    if pos != len(block):
        raise ValueError("HPACK block ends inside an entry")
    return out


# ---------------------------------------------------------------------------------------
# One connection


class PeerConnection(asyncio.Protocol):
    """One accepted connection: parses and records what the client sends, answers
    the protocol's housekeeping, and plays the scripts of its requests."""

    def __init__(self, peer: H2Peer, index: int) -> None:
        self.peer = peer
        self.index = index
        self.timeline: list[Frame] = []
        self.requests: dict[int, Request] = {}
        self.violations: list[str] = []
        self.open: set[int] = set()  # streams the client opened that the peer has not closed
        self.max_open = 0
        self.client_eof = False  # the client closed its side (not the peer)
        self.closed = asyncio.Event()
        self.goaway_sent = False
        self.streams_after_goaway: list[int] = []
        self.flooded = 0  # bytes of payload written by Flood actions
        self.transport: Optional[asyncio.Transport] = None
        self.read_rate = peer.read_rate  # bytes a second; None: at once; 0: nothing
        self.received = 0  # bytes read from the client
        self._resume: Optional[asyncio.TimerHandle] = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._inbound = 0
        self._greeted = False  # the first SETTINGS counts at once, later ones from the ACK
        self._settings_sent = False
        self._acks_owed = 0
        self._block: Optional[tuple[int, int, bytearray, int]] = (
            None  # stream, flags, bytes, frames
        )
        self._last_stream = 0
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 30  # the limit is checked here, not there
        table = (peer.settings or {}).get(Setting.HEADER_TABLE_SIZE)
        if table is not None:
            self._decoder.max_allowed_table_size = table
        self._encoder = hpack.Encoder()
        self._pending: list[dict[int, int]] = []  # SETTINGS sent, not yet ACKed
        self._limits: dict[int, int] = dict(peer.settings or {})
        self._client_settings: dict[int, int] = {}
        self._send_window = DEFAULT_WINDOW  # the client's connection window for us
        self._stream_windows: dict[int, int] = {}
        self._window_changed = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._owed: dict[int, int] = {}
        self._owed_changed = asyncio.Event()
        self._ping_acks: dict[bytes, asyncio.Event] = {}
        self._handlers: dict[int, Callable[[int, int, bytes], None]] = {
            FrameType.DATA: self._on_data,
            FrameType.HEADERS: self._on_headers,
            FrameType.CONTINUATION: self._on_continuation,
            FrameType.RST_STREAM: self._on_rst_stream,
            FrameType.SETTINGS: self._on_settings,
            FrameType.PING: self._on_ping,
            FrameType.WINDOW_UPDATE: self._on_window_update,
            FrameType.PUSH_PROMISE: self._on_push_promise,
        }

    # -- what the tests read ---------------------------------------------------------

    def frames(self, type_: Optional[int] = None, *, inbound: bool = True) -> list[Frame]:
        return [
            f for f in self.timeline if f.inbound is inbound and (type_ is None or f.type == type_)
        ]

    def resets(self) -> list[tuple[int, int]]:
        """``(stream, code)`` of every RST_STREAM the client sent."""
        return [(f.stream_id, f.error_code) for f in self.frames(FrameType.RST_STREAM)]

    def goaways(self) -> list[tuple[int, int, bytes]]:
        """``(last_stream_id, code, debug)`` of every GOAWAY the client sent."""
        gone = self.frames(FrameType.GOAWAY)
        return [(f.last_stream_id, f.error_code, f.debug_data) for f in gone]

    @property
    def unacked_settings(self) -> int:
        """SETTINGS frames the peer sent after its first that the client has not ACKed."""
        return len(self._pending)

    def lowest_windows(self) -> dict[int, int]:
        """Replays the timeline: the lowest value each of the peer's receive windows
        reached (key 0: the connection). Negative means the client sent more DATA
        than the peer had allowed."""
        return _WindowReplay(self.peer.settings or {}).run(self.timeline)

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # A peer told to send no SETTINGS sends nothing else first either.
        if self.peer.settings is not None:
            self._write_frame(FrameType.SETTINGS, 0, 0, settings_payload(self.peer.settings))
            if self.peer.connection_window > DEFAULT_WINDOW:
                increment = self.peer.connection_window - DEFAULT_WINDOW
                self._write_frame(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", increment))
        self._greeted = True
        if self.peer.on_connect:
            self.peer.spawn(self._play_actions(list(self.peer.on_connect), None))
        if self.peer.refill.step is not None:
            self.peer.spawn(self._refill_slowly())

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self._pace(len(data))
        self._buffer += data
        if not self._preface_seen and not self._read_preface():
            return
        for type_, flags, stream_id, payload in self._frames():
            self._record(True, type_, flags, stream_id, payload, len(payload))
            self._check_frame(type_, flags, stream_id, len(payload))
            handler = self._handlers.get(type_)
            if handler is not None:
                handler(flags, stream_id, payload)
        if self.peer.refill.step is None:
            self._pay_owed()
        self.peer.notify()

    def eof_received(self) -> Optional[bool]:
        self.client_eof = True
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._resume is not None:
            self._resume.cancel()
        self.closed.set()
        self._writable.set()
        self._window_changed.set()
        self._owed_changed.set()
        for event in self._ping_acks.values():
            event.set()
        self.peer.notify()

    def read_at(self, rate: Optional[float]) -> None:
        """Read ``rate`` bytes a second from now on (None: as fast as they come; 0:
        nothing more until told otherwise)."""
        self.read_rate = rate
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self.transport is None or self.transport.is_closing():
            return
        if rate == 0:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _pace(self, size: int) -> None:
        """After a read, wait as long as ``read_rate`` says before the next one."""
        rate = self.read_rate
        if rate is None or self.transport is None or self.transport.is_closing():
            return
        self.transport.pause_reading()
        if rate > 0:
            loop = asyncio.get_running_loop()
            self._resume = loop.call_later(size / rate, self._resume_reading)

    def _resume_reading(self) -> None:
        self._resume = None
        if self.transport is not None and not self.transport.is_closing() and self.read_rate:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- reading -------------------------------------------------------------------------

    def _read_preface(self) -> bool:
        if len(self._buffer) < len(PREFACE):
            if not PREFACE.startswith(bytes(self._buffer)):
                self._bad_preface()
            return False
        if bytes(self._buffer[: len(PREFACE)]) != PREFACE:
            self._bad_preface()
            return False
        del self._buffer[: len(PREFACE)]
        self._preface_seen = True
        return True

    def _bad_preface(self) -> None:
        # A real server answers a bad preface with GOAWAY(PROTOCOL_ERROR) and closes.
        self.violations.append(f"bad connection preface {bytes(self._buffer[:24])!r}")
        self._buffer.clear()
        self._write_frame(FrameType.GOAWAY, 0, 0, struct.pack(">II", 0, ErrorCode.PROTOCOL_ERROR))
        assert self.transport is not None
        self.transport.close()

    def _frames(self) -> Iterator[tuple[int, int, int, bytes]]:
        buffer = self._buffer
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                return
            type_, flags = buffer[3], buffer[4]
            stream_id = int.from_bytes(buffer[5:9], "big") & MAX_STREAM_ID
            payload = bytes(buffer[9 : 9 + length])
            del buffer[: 9 + length]
            yield type_, flags, stream_id, payload

    def _check_frame(self, type_: int, flags: int, stream_id: int, length: int) -> None:
        limit = self._limits.get(Setting.MAX_FRAME_SIZE, DEFAULT_FRAME_SIZE)
        if length > limit:
            self.violations.append(f"{FrameType(type_).name} of {length} bytes over {limit}")
        self._inbound += 1
        if self._inbound == 1 and type_ != FrameType.SETTINGS:
            self.violations.append(f"first frame is {type_}, not SETTINGS")
        if self._block is not None and type_ != FrameType.CONTINUATION:
            self.violations.append(f"frame {type_} inside the header block of {self._block[0]}")

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        start = 0
        end = len(payload)
        if flags & PADDED:
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        self._block = (stream_id, flags, bytearray(payload[start:end]), 1)
        if flags & END_HEADERS:
            self._end_block()

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream_id:
            self.violations.append(f"CONTINUATION on stream {stream_id} without a header block")
            return
        sid, first_flags, fragment, count = self._block
        fragment += payload
        self._block = (sid, first_flags, fragment, count + 1)
        if flags & END_HEADERS:
            self._end_block()

    def _end_block(self) -> None:
        assert self._block is not None
        stream_id, flags, fragment, count = self._block
        self._block = None
        block = self._decode_block(stream_id, bytes(fragment), count)
        if block is None:
            return
        if stream_id in self.requests:
            self.violations.append(f"a second header block on stream {stream_id}")
            return
        self._open_stream(stream_id, block)
        if flags & END_STREAM:
            self._request_ended(self.requests[stream_id])

    def _decode_block(self, stream_id: int, raw: bytes, count: int) -> Optional[HeaderBlock]:
        try:
            entries = hpack_entries(raw)
            decoded = self._decoder.decode(raw, raw=True)
        except (hpack.HPACKError, ValueError, IndexError) as exc:
            self.violations.append(f"header block of stream {stream_id} does not decode: {exc}")
            return None
        fields = [
            Field(as_text(t[0]), as_text(t[1]), isinstance(t, hpack.NeverIndexedHeaderTuple))
            for t in decoded
        ]
        limit = self._limits.get(Setting.MAX_HEADER_LIST_SIZE)
        size = sum(len(f.name) + len(f.value) + 32 for f in fields)
        if limit is not None and size > limit:
            self.violations.append(f"header list of {size} bytes over {limit}")
        return HeaderBlock(stream_id, raw, fields, entries, count)

    def _open_stream(self, stream_id: int, block: HeaderBlock) -> None:
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            self.violations.append(f"stream {stream_id} after {self._last_stream}")
        self._last_stream = max(self._last_stream, stream_id)
        if self.goaway_sent:
            self.streams_after_goaway.append(stream_id)
        self.requests[stream_id] = Request(self, stream_id, block)
        self._stream_windows[stream_id] = self._client_settings.get(
            Setting.INITIAL_WINDOW_SIZE, DEFAULT_WINDOW
        )
        self.open.add(stream_id)
        self.max_open = max(self.max_open, len(self.open))
        limit = self._limits.get(Setting.MAX_CONCURRENT_STREAMS)
        if limit is not None and len(self.open) > limit:
            self.violations.append(f"stream {stream_id} makes {len(self.open)} open, limit {limit}")

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        request = self.requests.get(stream_id)
        if request is None or request.ended:
            self.violations.append(f"DATA on stream {stream_id}, which is not open for it")
            return
        start, end = (1, len(payload) - payload[0]) if flags & PADDED else (0, len(payload))
        request.body += payload[start:end]
        self._owe(0, len(payload))
        if flags & END_STREAM:
            self._request_ended(request)
        else:
            self._owe(stream_id, len(payload))

    def _request_ended(self, request: Request) -> None:
        request.ended = True
        self._owed.pop(request.stream_id, None)
        self.peer.spawn(self._play(request))

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        request = self.requests.get(stream_id)
        if request is not None:
            request.reset_code = int.from_bytes(payload[:4], "big")
        self.open.discard(stream_id)
        self._owed.pop(stream_id, None)
        self._window_changed.set()

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & ACK:
            if self._pending:
                self._apply_acked(self._pending.pop(0))
            return
        self._apply_client_settings(_settings_values(payload))
        if not self.peer.ack_settings:
            return
        if self._settings_sent:
            self._write_frame(FrameType.SETTINGS, ACK, 0, b"")
        else:  # our own SETTINGS must be the first frame we send: ACK after it
            self._acks_owed += 1

    def _apply_acked(self, values: dict[int, int]) -> None:
        self._limits.update(values)
        if Setting.HEADER_TABLE_SIZE in values:
            self._decoder.max_allowed_table_size = values[Setting.HEADER_TABLE_SIZE]

    def _apply_client_settings(self, values: dict[int, int]) -> None:
        old = self._client_settings.get(Setting.INITIAL_WINDOW_SIZE, DEFAULT_WINDOW)
        self._client_settings.update(values)
        delta = self._client_settings.get(Setting.INITIAL_WINDOW_SIZE, DEFAULT_WINDOW) - old
        for stream_id in self._stream_windows:
            self._stream_windows[stream_id] += delta
        if Setting.HEADER_TABLE_SIZE in values:
            self._encoder.header_table_size = values[Setting.HEADER_TABLE_SIZE]
        self._window_changed.set()

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & ACK:
            event = self._ping_acks.get(payload)
            if event is not None:
                event.set()
        elif self.peer.answer_pings:
            self._write_frame(FrameType.PING, ACK, 0, payload)

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        increment = int.from_bytes(payload[:4], "big") & MAX_WINDOW
        if increment == 0:
            self.violations.append(f"WINDOW_UPDATE of 0 on stream {stream_id}")
        if stream_id == 0:
            self._send_window += increment
        elif stream_id in self._stream_windows:
            self._stream_windows[stream_id] += increment
        self._window_changed.set()

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.violations.append("PUSH_PROMISE from the client")

    # -- our receive windows -------------------------------------------------------------

    def _owe(self, stream_id: int, size: int) -> None:
        if size:
            self._owed[stream_id] = self._owed.get(stream_id, 0) + size
            self._owed_changed.set()

    def _pay_owed(self, step: Optional[int] = None) -> None:
        for stream_id, owed in list(self._owed.items()):
            paid = owed if step is None else min(step, owed)
            self._write_frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">I", paid))
            if owed > paid:
                self._owed[stream_id] = owed - paid
            else:
                del self._owed[stream_id]

    async def _refill_slowly(self) -> None:
        step, delay = self.peer.refill.step, self.peer.refill.delay
        while not self.closed.is_set():
            await self._owed_changed.wait()
            self._owed_changed.clear()
            while self._owed and not self.closed.is_set():
                self._pay_owed(step)
                self.peer.notify()
                await asyncio.sleep(delay)

    # -- writing -------------------------------------------------------------------------

    @property
    def writing(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def _record(
        self, inbound: bool, type_: int, flags: int, stream_id: int, payload: bytes, length: int
    ) -> None:
        keep = inbound or type_ not in (FrameType.DATA, FrameType.HEADERS, FrameType.CONTINUATION)
        at = asyncio.get_running_loop().time()
        self.timeline.append(
            Frame(inbound, type_, flags, stream_id, payload if keep else b"", length, at)
        )

    def _write_frame(self, type_: int, flags: int, stream_id: int, payload: bytes) -> None:
        if not self.writing:
            return
        assert self.transport is not None
        self.transport.write(frame_header(len(payload), type_, flags, stream_id))
        self.transport.write(payload)
        self._record(False, type_, flags, stream_id, payload, len(payload))
        self._sent(type_, flags, stream_id, payload)

    def _sent(self, type_: int, flags: int, stream_id: int, payload: bytes) -> None:
        if type_ == FrameType.SETTINGS and not flags & ACK:
            self._settings_sent_now()
            if self._greeted:
                self._pending.append(_settings_values(payload))
        elif type_ == FrameType.GOAWAY:
            self.goaway_sent = True
        ends = type_ == FrameType.RST_STREAM or (
            type_ in (FrameType.DATA, FrameType.HEADERS) and flags & END_STREAM
        )
        if ends and stream_id in self.requests:
            self.open.discard(stream_id)
            self.requests[stream_id].answered = True

    def _settings_sent_now(self) -> None:
        self._settings_sent = True
        owed, self._acks_owed = self._acks_owed, 0
        for _ in range(owed):
            self._write_frame(FrameType.SETTINGS, ACK, 0, b"")

    async def drain(self) -> None:
        await self._writable.wait()

    # -- scripts ---------------------------------------------------------------------------

    async def _play(self, request: Request) -> None:
        actions = self.peer.handler(request)
        if inspect.isawaitable(actions):
            actions = await actions
        await self._play_actions(list(actions), request.stream_id)

    async def _play_actions(self, actions: list[Action], stream_id: Optional[int]) -> None:
        for action in actions:
            if not self.writing and not isinstance(action, (Sleep, WaitUntil, Signal)):
                return
            if not await self.act(action, stream_id):
                return
            self.peer.notify()

    async def act(self, action: Action, stream_id: Optional[int] = None) -> bool:
        """Perform one action (``stream_id``: the stream of actions that name none);
        False when the script must stop there."""
        perform = _PERFORM[type(action)]
        return await perform(self, action, stream_id)

    def _stream(self, action: Any, default: Optional[int]) -> int:
        stream_id = action.stream if action.stream is not None else default
        if stream_id is None:
            raise AssertionError(f"{action!r} needs a stream")
        return int(stream_id)

    async def _act_headers(self, action: Headers, default: Optional[int]) -> bool:
        stream_id = self._stream(action, default)
        block = action.block
        if block is None:
            block = self._encoder.encode([(n, v) for n, v in action.headers])
        limit = action.split or len(block) or 1
        first, rest = block[:limit], block[limit:]
        flags = (END_STREAM if action.end else 0) | (
            END_HEADERS if action.end_headers and not rest else 0
        )
        payload = first
        if action.priority:
            flags |= PRIORITY_FLAG
            payload = struct.pack(">IB", 0, 15) + payload
        if action.pad:
            flags |= PADDED
            payload = bytes((action.pad,)) + payload + b"\0" * action.pad
        self._write_frame(FrameType.HEADERS, flags, stream_id, payload)
        while rest:
            piece, rest = rest[:limit], rest[limit:]
            last = END_HEADERS if action.end_headers and not rest else 0
            self._write_frame(FrameType.CONTINUATION, last, stream_id, piece)
        return True

    async def _act_data(self, action: Data, default: Optional[int]) -> bool:
        stream_id = self._stream(action, default)
        data = memoryview(action.data)
        overhead = action.pad + 1 if action.pad else 0
        while True:
            size = min(len(data), action.split or len(data), self._client_frame_size() - overhead)
            if action.flow and (size or overhead):
                size = await self._window(stream_id, size, overhead, stall=None)
                if size < 0:
                    return False
            chunk, data = data[:size], data[size:]
            last = not data
            self._write_data(stream_id, bytes(chunk), action.end and last, action.pad)
            await self.drain()
            if last:
                return True

    def _write_data(self, stream_id: int, chunk: bytes, end: bool, pad: int) -> None:
        flags = END_STREAM if end else 0
        payload = chunk
        if pad:
            flags |= PADDED
            payload = bytes((pad,)) + chunk + b"\0" * pad
        self._write_frame(FrameType.DATA, flags, stream_id, payload)
        self._send_window -= len(payload)
        if stream_id in self._stream_windows:
            self._stream_windows[stream_id] -= len(payload)

    def _client_frame_size(self) -> int:
        return self._client_settings.get(Setting.MAX_FRAME_SIZE, DEFAULT_FRAME_SIZE)

    async def _window(
        self,
        stream_id: int,
        want: int,
        overhead: int,
        stall: Optional[float],
        need: int = 1,
        ignore_reset: bool = False,
    ) -> int:
        """Wait until the client's windows let ``overhead`` plus ``need`` data bytes
        through; the data bytes allowed (up to ``want``), or -1 when they never will."""
        while True:
            room = min(self._send_window, self._stream_windows.get(stream_id, 0)) - overhead
            if room >= min(want, need):
                return min(want, room)
            request = self.requests.get(stream_id)
            reset = request is not None and request.reset_code is not None
            if self.closed.is_set() or (reset and not ignore_reset):
                return -1
            self._window_changed.clear()
            try:
                await asyncio.wait_for(self._window_changed.wait(), stall)
            except asyncio.TimeoutError:
                return -1

    async def _act_reset(self, action: Reset, default: Optional[int]) -> bool:
        stream_id = self._stream(action, default)
        self._write_frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">I", action.code))
        return True

    async def _act_goaway(self, action: GoAway, default: Optional[int]) -> bool:
        last = self._last_stream if action.last_stream_id is None else action.last_stream_id
        payload = struct.pack(">II", last, action.code) + action.debug
        self._write_frame(FrameType.GOAWAY, 0, 0, payload)
        return True

    async def _act_ping(self, action: Ping, default: Optional[int]) -> bool:
        event = self._ping_acks.setdefault(action.payload, asyncio.Event())
        self._write_frame(FrameType.PING, ACK if action.ack else 0, 0, action.payload)
        if action.wait_ack:
            await asyncio.wait_for(event.wait(), 10)
        return True

    async def _act_settings(self, action: Settings, default: Optional[int]) -> bool:
        payload = b"" if action.ack else settings_payload(action.values)
        self._write_frame(FrameType.SETTINGS, ACK if action.ack else 0, 0, payload)
        return True

    async def _act_window_update(self, action: WindowUpdate, default: Optional[int]) -> bool:
        stream_id = self._stream(action, default)
        self._write_frame(
            FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">I", action.increment)
        )
        return True

    async def _act_frame(self, action: RawFrame, default: Optional[int]) -> bool:
        stream_id = action.stream if action.stream is not None else (default or 0)
        if action.length is None:
            self._write_frame(action.type, action.flags, stream_id, action.payload)
        else:
            await self._act_raw(
                Raw(
                    frame_header(action.length, action.type, action.flags, stream_id)
                    + action.payload
                ),
                default,
            )
        return True

    async def _act_raw(self, action: Raw, default: Optional[int]) -> bool:
        if self.writing:
            assert self.transport is not None
            self.transport.write(action.data)
        return True

    async def _act_flood(self, action: Flood, default: Optional[int]) -> bool:
        stream_id = action.stream if action.stream is not None else (default or 0)
        size = len(action.payload)
        header = frame_header(size, action.type, action.flags, stream_id)
        flow = action.flow and action.type == FrameType.DATA
        request = self.requests.get(stream_id)
        for _ in range(action.count):
            if request is not None and request.reset_code is not None and not action.ignore_reset:
                return True
            if flow and not await self._flood_window(action, stream_id, size):
                return self.writing  # the windows stayed shut: the flood is over
            if not self.writing:
                return False
            assert self.transport is not None
            self.transport.writelines((header, action.payload))
            self.flooded += size
            await self.drain()
        return True

    async def _flood_window(self, action: Flood, stream_id: int, size: int) -> bool:
        room = await self._window(
            stream_id, size, 0, action.stall, need=size, ignore_reset=action.ignore_reset
        )
        if room < 0:
            return False
        self._send_window -= size
        self._stream_windows[stream_id] = self._stream_windows.get(stream_id, 0) - size
        return True

    async def _act_sleep(self, action: Sleep, default: Optional[int]) -> bool:
        await asyncio.sleep(action.seconds)
        return True

    async def _act_signal(self, action: Signal, default: Optional[int]) -> bool:
        action.event.set()
        return True

    async def _act_wait_until(self, action: WaitUntil, default: Optional[int]) -> bool:
        await self.peer.wait_until(action.predicate, action.timeout)
        return True

    async def _act_close(self, action: Close, default: Optional[int]) -> bool:
        if self.writing:
            assert self.transport is not None
            if action.half:
                self.transport.write_eof()
            else:
                self.transport.close()
        return False

    async def _act_abort(self, action: Abort, default: Optional[int]) -> bool:
        if self.transport is not None:
            abort_with_reset(self.transport)
        return False

    async def _act_hang(self, action: Hang, default: Optional[int]) -> bool:
        return False


_PERFORM: dict[type, Callable[[PeerConnection, Any, Optional[int]], Awaitable[bool]]] = {
    Headers: PeerConnection._act_headers,
    Data: PeerConnection._act_data,
    Reset: PeerConnection._act_reset,
    GoAway: PeerConnection._act_goaway,
    Ping: PeerConnection._act_ping,
    Settings: PeerConnection._act_settings,
    WindowUpdate: PeerConnection._act_window_update,
    RawFrame: PeerConnection._act_frame,
    Raw: PeerConnection._act_raw,
    Flood: PeerConnection._act_flood,
    Sleep: PeerConnection._act_sleep,
    Signal: PeerConnection._act_signal,
    WaitUntil: PeerConnection._act_wait_until,
    Close: PeerConnection._act_close,
    Abort: PeerConnection._act_abort,
    Hang: PeerConnection._act_hang,
}


class _WindowReplay:
    """The peer's receive windows, recomputed from a connection's timeline: initial
    SETTINGS count at once, later ones from the client's ACK (RFC 9113 §6.9.2)."""

    def __init__(self, settings: Mapping[int, int]) -> None:
        self.initial = settings.get(Setting.INITIAL_WINDOW_SIZE, DEFAULT_WINDOW)
        self.windows = {0: DEFAULT_WINDOW}  # the peer's opening WINDOW_UPDATE is replayed
        self.lowest = dict(self.windows)
        self.pending: list[int] = []
        self.first_settings = True

    def run(self, timeline: Sequence[Frame]) -> dict[int, int]:
        for frame in timeline:
            if frame.type == FrameType.DATA and frame.inbound:
                self._data(frame)
            elif frame.type == FrameType.WINDOW_UPDATE and not frame.inbound:
                self._opened(frame)
            elif frame.type == FrameType.SETTINGS:
                self._settings(frame)
        return self.lowest

    def _data(self, frame: Frame) -> None:
        for key in (0, frame.stream_id):
            self.windows[key] = self.windows.get(key, self.initial) - frame.length
            self.lowest[key] = min(self.lowest.get(key, self.initial), self.windows[key])

    def _opened(self, frame: Frame) -> None:
        current = self.windows.get(frame.stream_id, self.initial)
        self.windows[frame.stream_id] = current + frame.increment

    def _settings(self, frame: Frame) -> None:
        if not frame.inbound and not frame.has(ACK):
            value = frame.settings.get(Setting.INITIAL_WINDOW_SIZE)
            if self.first_settings:
                self.first_settings = False
            elif value is not None:
                self.pending.append(value)
        elif frame.inbound and frame.has(ACK) and self.pending:
            value = self.pending.pop(0)
            for key in self.windows:
                if key:
                    self.windows[key] += value - self.initial
            self.initial = value


# ---------------------------------------------------------------------------------------
# The server


class H2Peer:
    """The scripted HTTP/2 server on 127.0.0.1 (TLS with ``tls``).

    ``settings`` is its first SETTINGS frame (``None``: it sends none at all, nor
    anything else before its ``on_connect`` actions, and ACKs the client's SETTINGS
    only after a SETTINGS of its own); ``connection_window`` the connection receive
    window it opens right after (65,535 means none is opened); ``refill`` how it
    opens its windows as DATA arrives; ``ack_settings`` / ``answer_pings`` whether it
    ACKs the client's SETTINGS and PINGs; ``on_connect`` actions played on every
    connection after the first frames; ``handler`` the answer to each request once
    its END_STREAM arrived; ``read_rate`` how fast each connection reads (bytes a
    second, None: as fast as the client writes, 0: not at all); ``rcvbuf`` its
    sockets' SO_RCVBUF (None: the kernel's, which grows to hundreds of KiB ahead of a
    slow reader).
    """

    def __init__(
        self,
        handler: Optional[Handler] = None,
        *,
        settings: Optional[Mapping[int, int]] = DEFAULT_SETTINGS,
        connection_window: int = MAX_WINDOW,
        refill: Refill = Refill(),
        ack_settings: bool = True,
        answer_pings: bool = True,
        on_connect: Sequence[Action] = (),
        tls: Optional[ssl.SSLContext] = None,
        read_rate: Optional[float] = None,
        rcvbuf: Optional[int] = None,
    ) -> None:
        self.handler: Handler = handler or valid_answer
        self.settings = settings
        self.connection_window = connection_window
        self.refill = refill
        self.ack_settings = ack_settings
        self.answer_pings = answer_pings
        self.on_connect = on_connect
        self.tls = tls
        self.read_rate = read_rate
        self.rcvbuf = rcvbuf
        self.port = 0
        self.conns: list[PeerConnection] = []
        self.errors: list[BaseException] = []
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiters: list[tuple[Callable[[], object], asyncio.Future[None]]] = []

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return len(self.conns)

    @property
    def requests(self) -> list[Request]:
        """Every request whose END_STREAM arrived, connection by connection."""
        return [r for conn in self.conns for r in conn.requests.values() if r.ended]

    @property
    def violations(self) -> list[str]:
        return [f"conn {c.index}: {v}" for c in self.conns for v in c.violations]

    async def __aenter__(self) -> H2Peer:
        loop = asyncio.get_running_loop()
        if self.rcvbuf is None:
            self._server = await loop.create_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        else:
            # Set before listen(): accepted sockets inherit it (and it bounds the
            # receive window they advertise from the start).
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            listener.bind(("127.0.0.1", 0))
            self._server = await loop.create_server(self._accept, sock=listener, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, future in self._waiters:
            future.cancel()
        await self._server.wait_closed()
        if self.errors and exc[0] is None:
            raise AssertionError(f"the peer's scripts failed: {self.errors!r}") from self.errors[0]

    def _accept(self) -> PeerConnection:
        conn = PeerConnection(self, len(self.conns))
        self.conns.append(conn)
        return conn

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run a script; its failure is reported when the peer closes."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # type: ignore[arg-type]

    def notify(self) -> None:
        """Something was read or written: wake the waiters whose condition holds."""
        still = []
        for predicate, future in self._waiters:
            if future.done():
                continue
            if predicate():
                future.set_result(None)
            else:
                still.append((predicate, future))
        self._waiters = still

    async def wait_until(self, predicate: Callable[[], object], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; it is checked each time a frame is read or
        written. AssertionError after ``timeout`` seconds."""
        if predicate():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"condition not reached within {timeout} s") from None


# ---------------------------------------------------------------------------------------
# Other peers for the connect cases


def silent_peer() -> SilentServer:
    """Accepts TCP connections and never says a word."""
    return SilentServer()


HTTP1_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def http1_peer() -> SilentServer:
    """Answers the first bytes with ``HTTP/1.1 400 Bad Request``, as an HTTP/1.1-only
    server does to the HTTP/2 preface."""
    return SilentServer(reply=HTTP1_400)


PEER_HOSTS = ("localhost", "127.0.0.1")


def tls_context() -> ssl.SSLContext:
    """A server context with a certificate (tests/pki.py) for localhost and ALPN h2."""
    return server_context("h2 peer", PEER_HOSTS)


def ca_pem() -> bytes:
    return pki_ca_pem("h2 peer", PEER_HOSTS)


# A fatal decode_error alert, which rustls (tonic) sends when the first bytes are not
# a TLS record; OpenSSL and BoringSSL close without a word.
TLS_ALERT = b"\x15\x03\x03\x00\x02\x02\x32"


def alerting_tls_peer() -> SilentServer:
    """A TLS server that answers non-TLS bytes with a TLS alert record."""
    return SilentServer(reply=TLS_ALERT)


# -- memory --------------------------------------------------------------------------


@dataclass
class Peak:
    bytes: int = 0
    traced: bool = True


@contextlib.asynccontextmanager
async def memory_peak() -> AsyncIterator[Peak]:
    """The peak memory growth inside the block: the traced Python allocations where
    tracemalloc exists (CPython), else the resident set, sampled every 20 ms just
    after a full collection (PyPy has no tracemalloc, and its GC would otherwise let
    garbage pile up to a multiple of the live heap before collecting it)."""
    peak = Peak()
    try:
        import tracemalloc
    except ImportError:
        peak.traced = False
        gc.collect()
        base = _rss()

        async def sample() -> None:
            while True:
                gc.collect()
                peak.bytes = max(peak.bytes, _rss() - base)
                await asyncio.sleep(0.02)

        sampler = asyncio.ensure_future(sample())
        try:
            yield peak
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        return
    tracemalloc.start()
    try:
        yield peak
        peak.bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")
