"""The client's HTTP/2 connection: one asyncio Protocol owning the whole state.

Every protocol event is a method of :class:`Connection`, and the connection's life
is one explicit :class:`ConnectionState`:

    CONNECTING --server SETTINGS--> OPEN --GOAWAY / ids used up--> DRAINING
        |                             |                               |
        +------ error, EOF -----------+------- error, EOF, drained ---+--> CLOSED

Only unary calls are made: a stream carries one request message and one response
message. What this side sends (frames, flow control, header blocks) is decided here;
which connection a call uses, reconnecting and retrying are the transport's business
(``sepp_lite._transport``).

Sending, when one large request shares the connection with small calls:

* Control frames (ACKs, WINDOW_UPDATE, RST_STREAM, GOAWAY, keepalive PINGs), header
  blocks and a request that fits in one chunk are written at once. Larger requests
  wait in their stream and go out in chunks, one stream after another
  (``_pump``), only while the transport's buffer is under ``write_buffer_high``: at
  most that much DATA is ever ahead of a control frame or of another call.
* A peer that sends PINGs or SETTINGS faster than it reads our ACKs is cut off by
  the number of ACKs still unsent (``_answer``), not by how full the send buffer is.
* Keepalive judges the peer by what it sends: while our PING waits for its ACK,
  every frame from the peer counts as a sign of life (``_keepalive_timeout``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import itertools
import logging
import socket
from typing import Any, Callable, Optional

from sepp_lite._http2 import _frames as f
from sepp_lite._http2._config import Http2Config
from sepp_lite._http2._headers import (
    TABLE_SIZE_ZERO,
    HeaderBlockError,
    RequestHead,
    ResponseDecoder,
)
from sepp_lite._http2._stream import (
    BodyReader,
    Outcome,
    Stream,
    StreamFailure,
    deadline,
    lost,
    not_processed,
    peer_error,
    reset,
    unsendable,
)

logger = logging.getLogger("sepp_lite.http2")

_PING_IDS = itertools.count(1)


class ConnectionState(enum.Enum):
    CONNECTING = "connecting"  # transport up, the server's first SETTINGS not seen yet
    OPEN = "open"  # new streams may be opened
    DRAINING = "draining"  # GOAWAY came (or ids ran out): open streams finish, no new ones
    CLOSED = "closed"


class HandshakeFailure(Exception):
    """The peer did not start an HTTP/2 connection; ``reason`` says what it did.
    ``closed_early``: it closed the connection without a byte (a TLS server met in
    plaintext may, and so may a server that is not gRPC at all)."""

    def __init__(
        self, reason: str, server_uses_tls: Optional[bool] = None, closed_early: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.server_uses_tls = server_uses_tls
        self.closed_early = closed_early


class ProtocolViolation(Exception):
    """A connection error (RFC 9113 §5.4.1) found in the peer's frames."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Keepalive:
    """Ping interval and ACK timeout in seconds. Shared by the connections of one
    transport, so a server's ``too_many_pings`` slows down the next connections too."""

    __slots__ = ("time", "timeout")

    def __init__(self, time: float, timeout: float) -> None:
        self.time = time
        self.timeout = timeout


def _handshake_problem(data: bytes) -> Optional[HandshakeFailure]:
    """What the peer's first bytes say when they are not an HTTP/2 SETTINGS frame."""
    if data[:5] == b"HTTP/"[: len(data)]:
        if len(data) < 5:
            return None  # maybe; wait for more
        line = data.split(b"\r\n", 1)[0][:40].decode("ascii", "replace")
        return HandshakeFailure(
            f"the server answered in HTTP/1 ({line!r}), not HTTP/2: is this the gRPC port?"
        )
    if len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03:
        return HandshakeFailure(
            "the server answered with TLS: is the server using TLS? "
            "connect with tls=True or an https:// address",
            server_uses_tls=True,
        )
    if len(data) >= 9 and (data[3] != f.SETTINGS or data[4] & f.ACK or data[5:9] != b"\0\0\0\0"):
        return HandshakeFailure(
            "the server's first frame was not SETTINGS: it does not speak HTTP/2"
        )
    return None


# Reads land in one buffer per connection (asyncio.BufferedProtocol): a plain
# Protocol's transport allocates a fresh 256 KiB bytes object for every read, which
# costs an mmap, an mremap and a munmap per answer.
_READ_BUFFER = 64 * 1024

# The largest DATA frame we write, whatever larger frames the peer allows: a request
# is sent in chunks of this size, one stream after another, so no call waits behind
# more than one chunk of each other call (nghttp2 uses the same 16 KiB). A request up
# to this size is one frame, written with its HEADERS.
_DATA_CHUNK = f.DEFAULT_MAX_FRAME
# DATA is gathered into writes of about this size while the transport takes it.
_WRITE_BATCH = 64 * 1024


class Connection(asyncio.BufferedProtocol):
    """One HTTP/2 connection to a gRPC server, for unary calls (client side)."""

    def __init__(
        self,
        *,
        config: Http2Config,
        keepalive: Keepalive,
        label: str,
    ) -> None:
        self.state = ConnectionState.CONNECTING
        self.label = label
        self._config = config
        self._keepalive = keepalive
        self._loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.ready.add_done_callback(_retrieve)  # a failed connect is reported elsewhere
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._transport: Optional[asyncio.Transport] = None
        self._buf = bytearray()
        self._read_into: Optional[memoryview] = None
        self._out: list[bytes] = []
        self._flush_pending = False
        self._paused = False  # the transport's buffer is over write_buffer_high
        self._written = 0  # bytes handed to the transport, ever
        # ACKs queued in _out, and the end offsets (in _written) of the ACKs written
        # that the socket may not have taken yet: see _answer.
        self._acks_queued = 0
        self._acks_owed: collections.deque[int] = collections.deque()
        self._streams: dict[int, Stream] = {}
        self._next_id = config.first_stream_id
        self._goaway_last = f.MAX_STREAM_ID  # streams above it were not processed
        self._close_reason = "the connection closed"
        # What the peer allows us (its SETTINGS), defaults until they come.
        self._peer_max_streams = 2**31
        self._peer_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        self._peer_max_headers: Optional[int] = None
        self._send_window = f.DEFAULT_WINDOW  # the connection's send window
        self._encoder_table = 4096  # the peer's decoder table size we may assume
        self._table_update = b""  # a size update owed at the start of the next block
        # Our receive side.
        self._decoder = ResponseDecoder(config.max_header_list_size)
        self._recv_window = config.connection_window
        self._recv_unacked = 0
        self._continuation: Optional[list[Any]] = None  # [stream id, end_stream, parts, size]
        # Calls waiting for a free stream, first come first served; ``_reserved``
        # counts slots promised to waiters that were woken but have not run yet.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._reserved = 0
        # Streams with request bytes to send: those with stream window take turns in
        # _ready (the connection window may still hold them all back); those whose
        # stream window is used up wait in _blocked for a WINDOW_UPDATE.
        self._ready: collections.deque[Stream] = collections.deque()
        self._blocked: dict[int, Stream] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ping_payload: Optional[bytes] = None
        self._last_heard = 0.0  # loop time of the last read while our PING is unanswered
        self._settings_unacked = 0

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        config = self._config
        transport.set_write_buffer_limits(high=config.write_buffer_high)  # type: ignore[attr-defined]
        _limit_unsent(transport, config.send_lowat)
        ours = {
            f.ENABLE_PUSH: 0,
            f.HEADER_TABLE_SIZE: config.header_table_size,
            f.INITIAL_WINDOW_SIZE: config.stream_window,
            f.MAX_HEADER_LIST_SIZE: config.max_header_list_size,
        }
        if config.max_frame_size != f.DEFAULT_MAX_FRAME:
            ours[f.MAX_FRAME_SIZE] = config.max_frame_size
        self._out.append(f.PREFACE + f.settings(ours))
        if config.connection_window > f.DEFAULT_WINDOW:
            self._out.append(f.window_update(0, config.connection_window - f.DEFAULT_WINDOW))
        self._settings_unacked += 1
        self._timer("settings", self._keepalive.timeout, self._settings_timeout)
        self._flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._read_into is None:
            self._read_into = memoryview(bytearray(_READ_BUFFER))
        return self._read_into

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._read_into[:nbytes].tobytes())  # type: ignore[index]

    def data_received(self, data: bytes) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        if self._ping_payload is not None:
            self._last_heard = self._loop.time()  # a sign of life: see _keepalive_timeout
        buf = self._buf
        if buf:  # the start of a frame came with an earlier read
            buf += data
            data = bytes(buf)
            buf.clear()
        try:
            if self.state is ConnectionState.CONNECTING and not self._check_handshake(data):
                buf += data
                return
            used = self._read_frames(data)
        except ProtocolViolation as error:
            self._fail_connection(error.code, str(error))
            return
        if used < len(data):
            buf += data[used:]  # at most one frame's start: _read_frames checked its size
        if self._out or self._ready:
            self._flush()

    def pause_writing(self) -> None:
        # The transport holds more than write_buffer_high: the socket is backed up.
        # Request DATA stops here; control frames still go (see _flush).
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._ready and self.state is not ConnectionState.CLOSED:
            self._flush()

    def eof_received(self) -> bool:
        if self._buf and self.state is not ConnectionState.CONNECTING:
            # The peer half-closed inside a frame: it can still read why we give up.
            self._fail_connection(
                f.PROTOCOL_ERROR, "the server closed the connection in the middle of a frame"
            )
        return False  # close our side too: a unary client has nothing more to say

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self.state is ConnectionState.CONNECTING and not self.ready.done():
            problem = _handshake_problem(bytes(self._buf)) if self._buf else None
            if problem is None:
                detail = f": {exc}" if exc else ""
                problem = HandshakeFailure(
                    "the server closed the connection before sending its HTTP/2 settings"
                    f"{detail} (is the server using TLS? is this the gRPC port?)",
                    closed_early=not self._buf,
                )
            self.ready.set_exception(problem)
        if self._buf and self.state is not ConnectionState.CLOSED:
            self._close_reason = "the connection closed in the middle of a frame"
        elif exc is not None and self.state is not ConnectionState.CLOSED:
            self._close_reason = f"the connection failed: {exc}"
        self._closed()
        if not self.closed.done():
            self.closed.set_result(None)

    # -- calls ----------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """Whether a new call may use this connection."""
        return self.state is ConnectionState.OPEN

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    async def call(
        self,
        head: RequestHead,
        extra: bytes,
        extra_size: int,
        message: bytes,
        deadline_at: float,
        reader: BodyReader,
    ) -> bytes:
        """One request: ``head`` plus ``extra`` (per-call fields) as its header block,
        ``message`` as its body; ``reader`` reads the answer. Raises
        :class:`StreamFailure` or the reader's failure; a CancelledError resets the
        stream."""
        if self._waiters or len(self._streams) + self._reserved >= self._peer_max_streams:
            await self._wait_for_slot(deadline_at)
        if self.state is not ConnectionState.OPEN:
            raise not_processed(self._close_reason)
        limit = self._peer_max_headers
        if limit is not None and head.size + extra_size > limit:
            raise unsendable(
                f"the request's headers ({head.size + extra_size} bytes) are over the "
                f"server's limit ({limit} bytes)"
            )
        stream = self._open(head.block + extra, message, reader)
        timer = self._loop.call_at(deadline_at, self._expire, stream)
        try:
            return await stream.future
        except asyncio.CancelledError:
            self._abandon(stream)
            raise
        finally:
            timer.cancel()

    def _open(self, block: bytes, message: bytes, reader: BodyReader) -> Stream:
        stream_id = self._next_id
        self._next_id = stream_id + 2
        if self._table_update:
            block = self._table_update + block
            self._table_update = b""
        stream = Stream(
            stream_id,
            self._loop.create_future(),
            self._peer_window,
            self._config.stream_window,
            reader,
        )
        self._streams[stream_id] = stream
        if self._next_id > f.MAX_STREAM_ID:
            self._drain("the connection used up its stream ids")
        self._out.append(f.header_frames(stream_id, block, self._peer_max_frame, False))
        body = message
        size = len(body)
        if size <= _DATA_CHUNK and size <= stream.send_window and size <= self._send_window:
            # The common case: the whole request is one chunk, and the windows take it.
            # It goes with its HEADERS even while the socket is backed up: one chunk is
            # what its turn in _pump would give it, and memory stays bounded (one such
            # frame per stream, a copy of a message its caller holds anyway).
            self._out.append(f.frame(f.DATA, f.END_STREAM, stream_id, body))
            stream.send_window -= size
            self._send_window -= size
            stream.sent_end = True
        else:
            stream.pending = memoryview(body)
            if stream.send_window > 0:
                self._ready.append(stream)
            else:
                self._blocked[stream_id] = stream
        if len(self._streams) == 1 and not self._flush_pending:
            self._flush()  # a lone call: nothing to gather its frames with
        elif not self._flush_pending:
            # Frames of calls started in this loop iteration leave in one write.
            self._flush_pending = True
            self._loop.call_soon(self._flush)
        return stream

    def _pump(self, transport: asyncio.Transport) -> None:
        """Write request DATA: one chunk of each ready stream in turn, until the
        transport is backed up, the connection window is used up or nothing is left.

        Why in turns: streams served in arrival order let one large upload take every
        reopening of the window and every write, and a small call behind it waits for
        all of it. Why stop at pause_writing: what sits in the transport's buffer is
        ahead of everything written later, control frames included, so it is kept to
        about write_buffer_high (plus one batch) instead of whole messages."""
        ready = self._ready
        batch: list[bytes] = []
        gathered = 0
        while ready and self._send_window > 0:
            stream = ready.popleft()
            pending = stream.pending
            if pending is None:
                continue  # the stream ended or was reset while it waited its turn
            size = min(len(pending), _DATA_CHUNK, stream.send_window, self._send_window)
            if size <= 0:  # a SETTINGS change left its window at or below zero
                self._blocked[stream.id] = stream
                continue
            stream.send_window -= size
            self._send_window -= size
            if size == len(pending):
                batch.append(f.data(stream.id, pending, True))
                stream.pending = None
                stream.sent_end = True
            else:
                batch.append(f.data(stream.id, pending[:size], False))
                stream.pending = pending[size:]
                if stream.send_window > 0:
                    ready.append(stream)  # its next chunk after the other streams' turns
                else:
                    self._blocked[stream.id] = stream
            gathered += size
            if gathered >= _WRITE_BATCH:
                self._write(transport, batch)
                batch = []
                gathered = 0
                # write() called pause_writing if the socket is backed up (or failed).
                if self._paused or transport.is_closing():
                    return
        if batch:
            self._write(transport, batch)

    def _unblock(self) -> None:
        """Streams whose window a SETTINGS change reopened take their turns again."""
        blocked = self._blocked
        for stream in [s for s in blocked.values() if s.send_window > 0]:
            del blocked[stream.id]
            self._ready.append(stream)

    async def _wait_for_slot(self, deadline_at: float) -> None:
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(waiter)
        timer = self._loop.call_at(deadline_at, self._waiter_expired, waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._reserved -= 1  # woken, then cancelled before taking the slot
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            self._wake_waiters()
            raise
        finally:
            timer.cancel()
        self._reserved -= 1

    def _waiter_expired(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(
                deadline(
                    "deadline exceeded while waiting for a free stream "
                    f"(the server allows {self._peer_max_streams} at once)",
                    sent=False,
                )
            )

    def _wake_waiters(self) -> None:
        waiters = self._waiters
        while waiters and len(self._streams) + self._reserved < self._peer_max_streams:
            waiter = waiters.popleft()
            if not waiter.done():
                self._reserved += 1
                waiter.set_result(None)

    def _expire(self, stream: Stream) -> None:
        if self._streams.get(stream.id) is stream:
            self._reset(stream, f.CANCEL)
            self._complete(stream, deadline("deadline exceeded", sent=True))

    def _abandon(self, stream: Stream) -> None:
        if self._streams.get(stream.id) is stream:
            self._reset(stream, f.CANCEL)
            self._remove(stream)

    def _reset(self, stream: Stream, code: int) -> None:
        # Through _out, never behind the stream's own unsent DATA (_remove drops it).
        self._out.append(f.rst_stream(stream.id, code))
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _complete(self, stream: Stream, outcome: Outcome) -> None:
        """End ``stream``'s call with ``outcome`` (bytes or a failure)."""
        self._remove(stream)
        future = stream.future
        if future.done():
            return
        if isinstance(outcome, bytes):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)  # type: ignore[arg-type]
            # Its caller may be gone: a task that Ctrl-C interrupted before it could be
            # cancelled (Python 3.9's asyncio.run) must not leave "Future exception was
            # never retrieved" behind. An awaiting caller still gets the exception.
            future.exception()

    def _remove(self, stream: Stream) -> None:
        if self._streams.pop(stream.id, None) is None:
            return
        self._blocked.pop(stream.id, None)
        stream.pending = None  # if it still waits in _ready, _pump skips it
        if self._waiters:
            self._wake_waiters()
        if self.state is ConnectionState.DRAINING and not self._streams:
            self.close()

    def _flush(self) -> None:
        """Write the queued frames (control frames, header blocks, one-chunk requests)
        whether or not the transport is backed up, then request DATA while it is not."""
        self._flush_pending = False
        out = self._out
        transport = self._transport
        if transport is None or transport.is_closing():
            out.clear()
            return
        if out:
            data = b"".join(out) if len(out) > 1 else out[0]
            out.clear()
            self._written += len(data)
            transport.write(data)
            if self._acks_queued:
                # Owed until the socket has taken every byte up to here.
                self._acks_owed.extend(itertools.repeat(self._written, self._acks_queued))
                self._acks_queued = 0
        if self._ready and not self._paused:
            self._pump(transport)

    def _write(self, transport: asyncio.Transport, frames: list[bytes]) -> None:
        data = b"".join(frames) if len(frames) > 1 else frames[0]
        self._written += len(data)
        transport.write(data)

    # -- reading frames -------------------------------------------------------------------

    def _check_handshake(self, data: bytes) -> bool:
        """In CONNECTING: False while the first bytes are still inconclusive; a
        HandshakeFailure ends the connection."""
        problem = _handshake_problem(data[:64])
        if problem is not None:
            self.ready.set_exception(problem)
            self._abort(problem.reason)
            return False
        return len(data) >= f.FRAME_HEADER

    def _read_frames(self, buf: bytes) -> int:
        """Handle every whole frame in ``buf``; return how many bytes were used."""
        pos = 0
        size = len(buf)
        limit = self._config.max_frame_size
        while size - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if length > limit:
                raise ProtocolViolation(
                    f.FRAME_SIZE_ERROR, f"a frame of {length} bytes is over our limit of {limit}"
                )
            end = pos + 9 + length
            if end > size:
                break
            kind = buf[pos + 3]
            flags = buf[pos + 4]
            stream_id = f.u32(buf, pos + 5) & 0x7FFFFFFF
            payload = buf[pos + 9 : end]
            pos = end
            if self._continuation is not None:
                self._on_continuation(kind, flags, stream_id, payload)
            elif kind == f.DATA:
                self._on_data(flags, stream_id, payload)
            elif kind == f.HEADERS:
                self._on_headers(flags, stream_id, payload)
            else:
                self._on_control(kind, flags, stream_id, payload)
            if self.state is ConnectionState.CLOSED:
                break
        return pos

    def _on_control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == f.PING:
            self._on_ping(flags, stream_id, payload)
        elif kind == f.SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == f.RST_STREAM:
            self._on_rst_stream(stream_id, payload)
        elif kind == f.GOAWAY:
            self._on_goaway(stream_id, payload)
        elif kind == f.CONTINUATION:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        elif kind == f.PUSH_PROMISE:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5, §5.3.2).

    def _known_stream(self, stream_id: int, what: str) -> Optional[Stream]:
        """The open stream ``stream_id``; None for one that is closed already; a
        connection error for stream 0, an even id or one we never opened."""
        stream = self._streams.get(stream_id)
        if stream is None and (stream_id == 0 or stream_id % 2 == 0 or stream_id >= self._next_id):
            raise ProtocolViolation(f.PROTOCOL_ERROR, f"{what} on stream {stream_id}")
        return stream

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self._known_stream(stream_id, "DATA")
        length = len(payload)
        self._recv_window -= length
        if self._recv_window < 0:
            raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_unacked += length
        if self._recv_unacked >= self._config.connection_window // 2:
            self._out.append(f.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        if flags & f.PADDED:
            payload = _unpad(payload)
        if stream is None:
            return  # a stream we reset: its window no longer matters
        stream.recv_window -= length
        if stream.recv_window < 0:
            self._reset(stream, f.FLOW_CONTROL_ERROR)
            self._complete(stream, peer_error("DATA beyond the stream window"))
            return
        outcome = stream.on_data(payload) if payload else None
        if outcome is not None:
            self._reset(stream, f.CANCEL)
            self._complete(stream, outcome)
        elif flags & f.END_STREAM:
            self._end_stream(stream, stream.finish(None))
        else:
            unacked = self._config.stream_window - stream.recv_window
            if unacked >= self._config.stream_window // 2:
                self._out.append(f.window_update(stream.id, unacked))
                stream.recv_window += unacked

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._known_stream(stream_id, "HEADERS")
        if flags & f.PADDED:
            payload = _unpad(payload)
        if flags & f.PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolViolation(f.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if flags & f.END_HEADERS:
            self._on_header_block(stream_id, payload, bool(flags & f.END_STREAM))
        else:
            self._continuation = [stream_id, bool(flags & f.END_STREAM), [payload], len(payload)]
            self._check_block_size(len(payload))

    def _on_continuation(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._continuation
        assert pending is not None
        if kind != f.CONTINUATION or stream_id != pending[0]:
            raise ProtocolViolation(
                f.PROTOCOL_ERROR, "a header block was interrupted by another frame"
            )
        pending[2].append(payload)
        pending[3] += len(payload)
        self._check_block_size(pending[3])
        if flags & f.END_HEADERS:
            self._continuation = None
            self._on_header_block(pending[0], b"".join(pending[2]), pending[1])

    def _check_block_size(self, size: int) -> None:
        if size > self._config.max_header_block:
            raise ProtocolViolation(
                f.ENHANCE_YOUR_CALM,
                f"a header block over {self._config.max_header_block} bytes",
            )

    def _on_header_block(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        # Decode even for a stream we reset: the peer's HPACK state moves on regardless.
        try:
            response = self._decoder.decode(block)
        except HeaderBlockError as exc:
            raise ProtocolViolation(
                f.COMPRESSION_ERROR, f"a header block did not decode: {exc}"
            ) from None
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        outcome = stream.on_headers(response, end_stream)
        if end_stream:
            self._end_stream(stream, outcome)
        elif outcome is not None:
            self._reset(stream, f.CANCEL)
            self._complete(stream, outcome)

    def _end_stream(self, stream: Stream, outcome: Outcome) -> None:
        """The peer ended its half; ours must end too before the stream is closed."""
        if not stream.sent_end:
            self._reset(stream, f.CANCEL)  # the answer came before the whole request left
        self._complete(stream, outcome)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = f.u32(payload) & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(f.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "the connection window overflowed")
            return  # streams held back by it are still in _ready: data_received pumps
        stream = self._known_stream(stream_id, "WINDOW_UPDATE")
        if stream is None:
            return
        if increment == 0 or stream.send_window + increment > f.MAX_WINDOW:
            problem = "a WINDOW_UPDATE of 0" if increment == 0 else "the stream window overflowed"
            self._reset(stream, f.PROTOCOL_ERROR if increment == 0 else f.FLOW_CONTROL_ERROR)
            self._complete(stream, peer_error(f"the server sent {problem}"))
            return
        stream.send_window += increment
        if stream.send_window > 0 and self._blocked.pop(stream_id, None) is not None:
            self._ready.append(stream)  # data_received's flush gives it its turn

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "PING of the wrong size")
        if not flags & f.ACK:
            self._answer(f.ping(payload, ack=True))
        elif payload == self._ping_payload:
            self._ping_payload = None
            self._cancel_timer("ping-ack")
            self._timer("ping", self._keepalive.time, self._send_keepalive)

    def _answer(self, ack: bytes) -> None:
        """Queue an ACK the peer asked for: written with the next flush, ahead of any
        request DATA still waiting in its stream (see _flush), so a slow reader that
        pings during a large upload is answered, never refused.

        Why a count: each ACK answers a frame the peer sent, so a peer that sends PINGs
        or SETTINGS and does not read makes us buffer ACKs without end. As nghttp2
        bounds it, what counts is ACKs the socket has not taken yet (the peer has not
        read what is ahead of them): past ``max_outstanding_acks`` it is a flood. The
        size of our send buffer says nothing about the peer: a large upload to a slow
        reader fills it, and the peer's PING then is no flood."""
        owed = self._acks_owed
        if owed:
            transport = self._transport
            taken = self._written - (transport.get_write_buffer_size() if transport else 0)
            while owed and owed[0] <= taken:
                owed.popleft()
        if len(owed) + self._acks_queued >= self._config.max_outstanding_acks:
            raise ProtocolViolation(
                f.ENHANCE_YOUR_CALM, "the server floods control frames without reading"
            )
        self._acks_queued += 1
        self._out.append(ack)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            self._on_settings_ack(payload)
            return
        if len(payload) % 6:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        for key, value in f.parse_settings(payload):
            self._apply_setting(key, value)
        self._answer(f.SETTINGS_ACK)
        if self.state is ConnectionState.CONNECTING:
            self.state = ConnectionState.OPEN
            self._timer("ping", self._keepalive.time, self._send_keepalive)
            if not self.ready.done():
                self.ready.set_result(None)
        self._unblock()
        if self._waiters:
            self._wake_waiters()

    def _on_settings_ack(self, payload: bytes) -> None:
        if payload:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
        if self._settings_unacked > 0:
            self._settings_unacked -= 1
            if not self._settings_unacked:
                self._cancel_timer("settings")

    def _apply_setting(self, key: int, value: int) -> None:
        if key == f.MAX_CONCURRENT_STREAMS:
            self._peer_max_streams = value
        elif key == f.INITIAL_WINDOW_SIZE:
            self._set_peer_window(value)
        elif key == f.MAX_FRAME_SIZE:
            if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                raise ProtocolViolation(f.PROTOCOL_ERROR, f"MAX_FRAME_SIZE of {value}")
            self._peer_max_frame = value
        elif key == f.HEADER_TABLE_SIZE:
            if value < self._encoder_table:
                # We never index, but must still tell the peer's decoder that our
                # table fits its new size (RFC 7541 §4.2): 0 fits every size.
                self._encoder_table = 0
                self._table_update = TABLE_SIZE_ZERO
        elif key == f.MAX_HEADER_LIST_SIZE:
            self._peer_max_headers = value
        elif key == f.ENABLE_PUSH and value != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, f"a server sent ENABLE_PUSH={value}")

    def _set_peer_window(self, value: int) -> None:
        """A new INITIAL_WINDOW_SIZE moves every open stream's window by the change
        (RFC 9113 §6.9.2), which may leave it negative."""
        if value > f.MAX_WINDOW:
            raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE over 2^31-1")
        delta = value - self._peer_window
        self._peer_window = value
        for stream in self._streams.values():
            stream.send_window += delta
            if stream.send_window > f.MAX_WINDOW:
                raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "a stream window overflowed")

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        stream = self._known_stream(stream_id, "RST_STREAM")
        if stream is None:
            return
        self._complete(stream, _reset_failure(f.u32(payload)))

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "GOAWAY too short")
        last = f.u32(payload) & 0x7FFFFFFF
        code = f.u32(payload, 4)
        debug = payload[8:200].decode("utf-8", "replace")
        self._goaway_last = min(self._goaway_last, last)
        name = f.error_name(code)
        detail = f" ({debug})" if debug else ""
        self._close_reason = f"the server sent GOAWAY {name}{detail}"
        for stream in [s for s in self._streams.values() if s.id > self._goaway_last]:
            self._complete(stream, not_processed(self._close_reason))
        if code == f.NO_ERROR:
            logger.debug("%s: GOAWAY last_stream_id=%d, draining", self.label, last)
            self._drain(self._close_reason)
            return
        if code == f.ENHANCE_YOUR_CALM and debug.startswith("too_many_pings"):
            self._keepalive.time *= 2
            logger.warning(
                "%s: the server finds our keepalive pings too frequent; pinging every %.3g s "
                "on new connections",
                self.label,
                self._keepalive.time,
            )
        self._abort(self._close_reason)

    # -- keepalive and timers -------------------------------------------------------------

    def _timer(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        self._cancel_timer(name)
        self._timers[name] = self._loop.call_later(delay, callback)

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _send_keepalive(self) -> None:
        self._timers.pop("ping", None)
        if self.state is ConnectionState.CLOSED:
            return
        self._ping_payload = next(_PING_IDS).to_bytes(8, "big")
        self._out.append(f.ping(self._ping_payload))
        self._flush()  # ahead of request DATA still waiting in its stream
        self._last_heard = self._loop.time()
        self._timer("ping-ack", self._keepalive.timeout, self._keepalive_timeout)

    def _keepalive_timeout(self) -> None:
        """keepalive_timeout after our PING (or after the last frame heard since).

        Why any frame counts: our PING may sit behind request DATA in the socket
        buffers of a slow reader, which cannot ACK what it has not read yet; a peer
        that goes on sending (WINDOW_UPDATEs as it reads, its own PINGs) is alive.
        A peer that sends nothing for keepalive_timeout after our PING is dead, so a
        connection that only sends is dropped once it heard nothing for at most
        keepalive_time + keepalive_timeout (the PING leaves keepalive_time after the
        last ACK)."""
        self._timers.pop("ping-ack", None)
        timeout = self._keepalive.timeout
        wait = self._last_heard + timeout - self._loop.time()
        if wait > 0:
            self._timer("ping-ack", wait, self._keepalive_timeout)
            return
        # hard: a dead peer reads nothing, and a transport that waits to write its
        # buffer first would keep the socket open for as long as that lasts.
        self._abort(f"the server did not answer a keepalive ping within {timeout:g} s", hard=True)

    def _settings_timeout(self) -> None:
        self._timers.pop("settings", None)
        self._fail_connection(
            f.SETTINGS_TIMEOUT,
            f"the server did not acknowledge our settings within {self._keepalive.timeout:g} s",
        )

    # -- ending ---------------------------------------------------------------------------

    def _drain(self, reason: str) -> None:
        """No new streams from now on; close once the open ones are done."""
        if self.state in (ConnectionState.OPEN, ConnectionState.CONNECTING):
            self.state = ConnectionState.DRAINING
            self._close_reason = reason
            self._fail_waiters(reason)
            if not self._streams:
                self.close()

    def close(self, reason: str = "") -> None:
        """Close gracefully: a GOAWAY, then the socket (calls in flight fail)."""
        if self.state is ConnectionState.CLOSED:
            return
        if reason:
            self._close_reason = reason
        self._last_words(f.goaway(0, f.NO_ERROR))
        if self._transport is not None:
            self._transport.close()
        self._closed()

    def abort(self) -> None:
        """Drop the connection at once (calls in flight fail)."""
        if self._transport is not None:
            self._transport.abort()
        self._closed()

    def _fail_connection(self, code: int, message: str) -> None:
        """A connection error: tell the peer why, then drop the connection. After a
        flood (ENHANCE_YOUR_CALM) the socket is not kept for the GOAWAY to be read:
        that peer does not read (see _abort)."""
        logger.debug("%s: HTTP/2 connection error %s: %s", self.label, f.error_name(code), message)
        self._last_words(f.goaway(0, code, message.encode("utf-8")[:200]))
        self._abort(f"HTTP/2 protocol error: {message}", hard=code == f.ENHANCE_YOUR_CALM)

    def _last_words(self, goaway: bytes) -> None:
        """Write a GOAWAY after what is queued, and no request DATA after it: the
        streams still waiting to send fail as the connection closes."""
        self._ready.clear()
        self._blocked.clear()
        self._out.append(goaway)
        self._flush()

    def _abort(self, reason: str, hard: bool = False) -> None:
        """End the connection. ``hard``: the peer is not reading, so when the transport
        still holds bytes the socket is dropped (RST) instead of closed after them,
        which would keep it open for as long as the peer does not read."""
        self._close_reason = reason
        transport = self._transport
        if transport is not None:
            self._ready.clear()
            self._flush()
            if hard and transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
        self._closed()

    def _closed(self) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        self.state = ConnectionState.CLOSED
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._ready.clear()
        self._blocked.clear()
        reason = self._close_reason
        if not self.ready.done():
            self.ready.set_exception(HandshakeFailure(reason))
        self._fail_waiters(reason)
        for stream in list(self._streams.values()):
            if stream.id > self._goaway_last:
                self._complete(stream, not_processed(reason))
            else:
                self._complete(stream, lost(f"connection lost during the call: {reason}"))

    def _fail_waiters(self, reason: str) -> None:
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(not_processed(reason))


def _limit_unsent(transport: asyncio.BaseTransport, lowat: int) -> None:
    """Set TCP_NOTSENT_LOWAT on a TCP socket: the kernel then takes little more than
    ``lowat`` bytes that it cannot send yet, and the rest of a large upload waits in
    its stream, where small calls and control frames can still go ahead of it."""
    option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    sock = transport.get_extra_info("socket")
    if not lowat or option is None or sock is None:
        return
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, lowat)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise ProtocolViolation(f.PROTOCOL_ERROR, "a PADDED frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolViolation(f.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


def _reset_failure(code: int) -> StreamFailure:
    """A stream the server reset; REFUSED_STREAM says it was not processed (§8.7)."""
    text = f"the server reset the stream ({f.error_name(code)})"
    if code == f.REFUSED_STREAM:
        return not_processed(text)
    return reset(code, text)
