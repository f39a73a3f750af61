"""The client's HTTP/2 connection: the asyncio Protocol, and the rules of its life.

The connection's life is one explicit :class:`ConnectionState`:

    CONNECTING --server SETTINGS--> OPEN --GOAWAY / ids used up--> DRAINING
        |                             |                               |
        +------ error, EOF -----------+------- error, EOF, drained ---+--> CLOSED

Only unary calls are made: a stream carries one request message and one response
message. :class:`Connection` owns the streams and decides, for every event, what
happens to the calls on them; its parts each keep one kind of state:

* ``_reader.FrameReader``: bytes into frames, header blocks across CONTINUATION;
* ``_writer.Writer``: control frames first, request DATA in turns (``_flow.SendQueue``);
* ``_flow.window_increment``: when our receive windows are reopened;
* ``_settings.PeerSettings``: what the peer's SETTINGS allow us;
* ``_slots.StreamSlots``: calls waiting for the peer's concurrency limit;
* ``_keepalive.Pinger`` and ``_timers.Timer``: keepalive PINGs, the SETTINGS ACK wait.

Which connection a call uses, reconnecting and retrying are the transport's business
(``sepp_lite._wire.transport``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
from typing import Optional

from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._config import Http2Config
from sepp_lite._wire.http2._flow import window_increment
from sepp_lite._wire.http2._headers import HeaderBlockError, RequestHead, ResponseDecoder
from sepp_lite._wire.http2._keepalive import Keepalive, Pinger
from sepp_lite._wire.http2._reader import (
    FrameReader,
    HandshakeFailure,
    ProtocolViolation,
    handshake_problem,
    unpad,
)
from sepp_lite._wire.http2._settings import PeerSettings, local_settings
from sepp_lite._wire.http2._slots import StreamSlots
from sepp_lite._wire.http2._stream import (
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
from sepp_lite._wire.http2._timers import Deadlines, Timer
from sepp_lite._wire.http2._writer import Writer

logger = logging.getLogger("sepp_lite.http2")


class ConnectionState(enum.Enum):
    CONNECTING = "connecting"  # transport up, the server's first SETTINGS not seen yet
    OPEN = "open"  # new streams may be opened
    DRAINING = "draining"  # GOAWAY came (or ids ran out): open streams finish, no new ones
    CLOSED = "closed"


# Reads land in one buffer per connection (asyncio.BufferedProtocol): a plain
# Protocol's transport allocates a fresh 256 KiB bytes object for every read, which
# costs an mmap, an mremap and a munmap per answer.
_READ_BUFFER = 64 * 1024


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
        loop = self._loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.ready.add_done_callback(_retrieve)  # a failed connect is reported elsewhere
        self.closed: asyncio.Future[None] = loop.create_future()
        self._transport: Optional[asyncio.Transport] = None
        self._read_into: Optional[memoryview] = None
        self._reader = FrameReader(
            max_frame=config.max_frame_size,
            max_block=config.max_header_block,
            on_data=self._on_data,
            check_stream=self._known_stream,
            on_header_block=self._on_header_block,
            on_control=self._on_control,
        )
        self._writer = Writer(loop, config.max_outstanding_acks)
        self._out = self._writer.out  # the writer's control queue (the same list, ever)
        self._send = self._writer.data  # request DATA waiting for its turn or its window
        self._streams: dict[int, Stream] = {}
        self._next_id = config.first_stream_id
        self._goaway_last = f.MAX_STREAM_ID  # streams above it were not processed
        self._close_reason = "the connection closed"
        self._peer = PeerSettings()  # defaults until the peer's SETTINGS come
        # Our receive side: the response decoder and the connection's receive window.
        self._decoder = ResponseDecoder(config.max_header_list_size)
        self._recv_window = config.connection_window
        self._slots = StreamSlots(loop)
        self._pinger = Pinger(loop, keepalive, self._send_ping, self._ping_unanswered)
        # Our SETTINGS not yet acknowledged, and how long the peer has to.
        self._settings_unacked = 0
        self._settings_timer = Timer(loop, self._settings_timeout)
        self._deadlines = Deadlines(loop, self._is_open, self._expire)

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = self._writer.transport = transport  # type: ignore[assignment]
        config = self._config
        transport.set_write_buffer_limits(high=config.write_buffer_high)  # type: ignore[attr-defined]
        _limit_unsent(transport, config.send_lowat)
        self._out.append(f.PREFACE + local_settings(config))
        if config.connection_window > f.DEFAULT_WINDOW:
            # The connection window starts at 64 KiB whatever we advertise (SETTINGS
            # only sets the streams'): open it at once, or all responses together
            # would get at most 64 KiB per round trip.
            self._out.append(f.window_update(0, config.connection_window - f.DEFAULT_WINDOW))
        self._settings_unacked += 1
        # A peer that never acknowledges our SETTINGS may not apply them (our limits,
        # our windows): RFC 9113 §6.5.3 lets us end the connection for it.
        self._settings_timer.start(self._keepalive.timeout)
        self._writer.flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._read_into is None:
            self._read_into = memoryview(bytearray(_READ_BUFFER))
        return self._read_into

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._read_into[:nbytes].tobytes())  # type: ignore[index]

    def data_received(self, data: bytes) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        if self._pinger.awaited:
            self._pinger.heard()  # a sign of life: see Pinger
        try:
            self._reader.feed(data)
        except ProtocolViolation as error:
            self._fail_connection(error.code, str(error))
            return
        except HandshakeFailure as problem:
            self.ready.set_exception(problem)
            self._abort(problem.reason)
            return
        if self._out or self._send.ready:
            self._writer.flush()

    def pause_writing(self) -> None:
        # The transport holds more than write_buffer_high: the socket is backed up.
        # Request DATA stops here; control frames still go (see Writer.flush).
        self._writer.paused = True

    def resume_writing(self) -> None:
        self._writer.paused = False
        if self._send.ready and self.state is not ConnectionState.CLOSED:
            self._writer.flush()

    def eof_received(self) -> bool:
        if self._reader.buffer and self.state is not ConnectionState.CONNECTING:
            # The peer half-closed inside a frame: it can still read why we give up.
            self._fail_connection(
                f.PROTOCOL_ERROR, "the server closed the connection in the middle of a frame"
            )
        return False  # close our side too: a unary client has nothing more to say

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        buffered = self._reader.buffer
        if self.state is ConnectionState.CONNECTING and not self.ready.done():
            problem = handshake_problem(bytes(buffered)) if buffered else None
            if problem is None:
                detail = f": {exc}" if exc else ""
                problem = HandshakeFailure(
                    "the server closed the connection before sending its HTTP/2 settings"
                    f"{detail} (is the server using TLS? is this the gRPC port?)",
                    closed_early=not buffered,
                )
            self.ready.set_exception(problem)
        if buffered and self.state is not ConnectionState.CLOSED:
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
        slots = self._slots
        if slots.waiters or len(self._streams) + slots.reserved >= self._peer.max_streams:
            await self._wait_for_slot(deadline_at)
        if self.state is not ConnectionState.OPEN:
            raise not_processed(self._close_reason)
        limit = self._peer.max_header_list
        if limit is not None and head.size + extra_size > limit:
            # Checked here, not left to the peer: a server may answer an over-long
            # block with a reset, a 431 or a connection error that fails the other
            # calls too; refused here, the call surely never reached it.
            raise unsendable(
                f"the request's headers ({head.size + extra_size} bytes) are over the "
                f"server's limit ({limit} bytes)"
            )
        stream = self._open(head.block + extra, message, reader)
        self._deadlines.add(deadline_at, stream.id, stream, len(self._streams))
        try:
            return await stream.future
        except asyncio.CancelledError:
            self._abandon(stream)
            raise

    def _open(self, block: bytes, message: bytes, reader: BodyReader) -> Stream:
        stream_id = self._next_id
        self._next_id = stream_id + 2
        peer = self._peer
        if peer.table_update:
            block = peer.table_update + block
            peer.table_update = b""
        stream = Stream(
            stream_id,
            self._loop.create_future(),
            peer.initial_window,
            self._config.stream_window,
            reader,
        )
        self._streams[stream_id] = stream
        if self._next_id > f.MAX_STREAM_ID:
            # Stream ids are never reused: this connection can start no more calls,
            # but the ones in flight finish on it while the transport opens another.
            self._drain("the connection used up its stream ids")
        self._out.append(f.header_frames(stream_id, block, peer.max_frame, False))
        # The common case: the whole request is one chunk that the windows take, and
        # it goes with its HEADERS even while the socket is backed up: one chunk is
        # what its turn in the SendQueue would give it, and memory stays bounded (one
        # such frame per stream, a copy of a message its caller holds anyway).
        data = self._send.send(stream, message)
        if data:
            self._out.append(data)
        writer = self._writer
        if not writer.scheduled:
            if len(self._streams) == 1:
                writer.flush()  # a lone call: nothing to gather its frames with
            else:
                writer.flush_soon()  # with the other calls started in this loop iteration
        return stream

    async def _wait_for_slot(self, deadline_at: float) -> None:
        try:
            await self._slots.wait(deadline_at, self._slot_deadline)
        except BaseException:
            self._wake_waiters()  # a slot given to this call goes to the next one
            raise

    def _slot_deadline(self) -> StreamFailure:
        return deadline(
            "deadline exceeded while waiting for a free stream "
            f"(the server allows {self._peer.max_streams} at once)",
            sent=False,
        )

    def _wake_waiters(self) -> None:
        self._slots.wake(self._peer.max_streams - len(self._streams))

    def _is_open(self, stream: Stream) -> bool:
        return self._streams.get(stream.id) is stream

    def _expire(self, stream: Stream) -> None:
        if self._is_open(stream):
            # The peer may still be working on the call: the reset tells it to stop,
            # and the call may or may not have been applied (ambiguous).
            self._reset(stream, f.CANCEL)
            self._complete(stream, deadline("deadline exceeded", sent=True))

    def _abandon(self, stream: Stream) -> None:
        if self._is_open(stream):
            self._reset(stream, f.CANCEL)
            self._remove(stream)

    def _reset(self, stream: Stream, code: int) -> None:
        # Through the control queue, never behind the stream's own unsent DATA
        # (_remove drops that), and gathered with the loop iteration's other frames.
        self._out.append(f.rst_stream(stream.id, code))
        self._writer.flush_soon()

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
        if stream.pending is not None:  # still has request DATA queued: not any more
            self._send.discard(stream)
        if self._slots.waiters:
            self._wake_waiters()
        if self.state is ConnectionState.DRAINING and not self._streams:
            self.close()

    # -- frames from the peer (called by the FrameReader) ---------------------------------

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
        length = len(payload)  # padding included: it counts against the windows
        # The connection window is charged even for a stream we reset: the peer
        # charged its side when it sent, and the windows must agree.
        self._recv_window -= length
        if self._recv_window < 0:
            raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        increment = window_increment(self._config.connection_window, self._recv_window)
        if increment:
            self._out.append(f.window_update(0, increment))
            self._recv_window += increment
        if flags & f.PADDED:
            payload = unpad(payload)
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
            # No update on the last frame: the stream is done with its window.
            increment = window_increment(self._config.stream_window, stream.recv_window)
            if increment:
                self._out.append(f.window_update(stream.id, increment))
                stream.recv_window += increment

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
            # Streams held back by the connection window are still in the send queue:
            # data_received's flush gives them their turns.
            self._send.open_connection(increment)
            return
        stream = self._known_stream(stream_id, "WINDOW_UPDATE")
        if stream is None:
            return
        if increment == 0 or stream.send_window + increment > f.MAX_WINDOW:
            # A stream error (RFC 9113 §6.9, §6.9.1): this call fails, the others go on.
            problem = "a WINDOW_UPDATE of 0" if increment == 0 else "the stream window overflowed"
            self._reset(stream, f.PROTOCOL_ERROR if increment == 0 else f.FLOW_CONTROL_ERROR)
            self._complete(stream, peer_error(f"the server sent {problem}"))
            return
        self._send.open_stream(stream, increment)

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "PING of the wrong size")
        if not flags & f.ACK:
            self._writer.answer(f.ping(payload, ack=True))
        else:
            self._pinger.on_ack(payload)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            self._on_settings_ack(payload)
            return
        if len(payload) % 6:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        peer = self._peer
        for key, value in f.parse_settings(payload):
            delta = peer.apply(key, value)
            if delta:
                self._send.shift(self._streams.values(), delta)
        self._writer.answer(f.SETTINGS_ACK)
        if self.state is ConnectionState.CONNECTING:
            self.state = ConnectionState.OPEN
            self._pinger.start()
            if not self.ready.done():
                self.ready.set_result(None)
        # A larger window or a higher stream limit lets waiting requests and calls go.
        self._send.unblock()
        if self._slots.waiters:
            self._wake_waiters()

    def _on_settings_ack(self, payload: bytes) -> None:
        if payload:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
        if self._settings_unacked > 0:
            self._settings_unacked -= 1
            if not self._settings_unacked:
                self._settings_timer.cancel()

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        stream = self._known_stream(stream_id, "RST_STREAM")
        if stream is None:
            return
        self._complete(stream, _reset_failure(f.u32(payload)))

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        """The peer stops taking streams. Those above ``last_stream_id`` it promises
        never to have processed: they fail as not processed, which the transport
        sends again on another connection. Those at or below it may finish here.
        NO_ERROR is a graceful shutdown (a server restarting, a proxy rotating its
        connections): drain. Any other code ends the connection now."""
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "GOAWAY too short")
        last = f.u32(payload) & 0x7FFFFFFF
        code = f.u32(payload, 4)
        debug = payload[8:200].decode("utf-8", "replace")
        # A server may send two GOAWAYs (a first with 2^31-1, then the real last id):
        # the last id only ever goes down.
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
            # grpc servers count our PINGs against a policy of their own and close
            # the connection when we ping too often: back off, as grpc clients do.
            self._keepalive.time *= 2
            logger.warning(
                "%s: the server finds our keepalive pings too frequent; pinging every %.3g s "
                "on new connections",
                self.label,
                self._keepalive.time,
            )
        self._abort(self._close_reason)

    # -- keepalive and the SETTINGS timeout ------------------------------------------------

    def _send_ping(self, ping: bytes) -> None:
        self._out.append(ping)
        self._writer.flush()  # ahead of request DATA still waiting in its stream

    def _ping_unanswered(self, timeout: float) -> None:
        # hard: a dead peer reads nothing, and a transport that waits to write its
        # buffer first would keep the socket open for as long as that lasts.
        self._abort(f"the server did not answer a keepalive ping within {timeout:g} s", hard=True)

    def _settings_timeout(self) -> None:
        self._fail_connection(
            f.SETTINGS_TIMEOUT,
            f"the server did not acknowledge our settings within {self._keepalive.timeout:g} s",
        )

    # -- ending ---------------------------------------------------------------------------

    def _drain(self, reason: str) -> None:
        """No new streams from now on; close once the open ones are done. Calls
        waiting for a slot fail as not processed: no slot will come here, and the
        transport sends them on the next connection."""
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
        self._writer.last_words(f.goaway(0, f.NO_ERROR))
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
        self._writer.last_words(f.goaway(0, code, message.encode("utf-8")[:200]))
        self._abort(f"HTTP/2 protocol error: {message}", hard=code == f.ENHANCE_YOUR_CALM)

    def _abort(self, reason: str, hard: bool = False) -> None:
        """End the connection. ``hard``: the peer is not reading, so when the transport
        still holds bytes the socket is dropped (RST) instead of closed after them,
        which would keep it open for as long as the peer does not read."""
        self._close_reason = reason
        transport = self._transport
        if transport is not None:
            self._send.ready.clear()
            self._writer.flush()
            if hard and transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
        self._closed()

    def _closed(self) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        self.state = ConnectionState.CLOSED
        self._reader.stopped = True  # no frame after this one is read
        self._pinger.stop()
        self._settings_timer.cancel()
        self._send.clear()
        reason = self._close_reason
        if not self.ready.done():
            self.ready.set_exception(HandshakeFailure(reason))
        self._fail_waiters(reason)
        for stream in list(self._streams.values()):
            if stream.id > self._goaway_last:
                self._complete(stream, not_processed(reason))
            else:
                self._complete(stream, lost(f"connection lost during the call: {reason}"))
        self._deadlines.cancel()

    def _fail_waiters(self, reason: str) -> None:
        self._slots.fail_all(lambda: not_processed(reason))


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


def _reset_failure(code: int) -> StreamFailure:
    """A stream the server reset; REFUSED_STREAM says it was not processed (§8.7)."""
    text = f"the server reset the stream ({f.error_name(code)})"
    if code == f.REFUSED_STREAM:
        return not_processed(text)
    return reset(code, text)
