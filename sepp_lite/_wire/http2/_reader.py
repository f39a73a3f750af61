"""Reading the peer's bytes: the handshake, frames, and header blocks across CONTINUATION.

:class:`FrameReader` cuts what the socket delivers into frames and hands each one to
the connection through callbacks it was built with, so a frame costs one call into
the connection, as when the loop was a method of it. What a frame *means* (streams,
windows, SETTINGS) is the connection's business; what is wrong with a frame whatever
the connection's state (its size, its padding, an interrupted header block) is found
here and raised as :class:`ProtocolViolation`, which the connection answers with
GOAWAY.
"""

from __future__ import annotations

from typing import Callable, Optional

from sepp_lite._wire.http2 import _frames as f


class ProtocolViolation(Exception):
    """A connection error (RFC 9113 §5.4.1) found in the peer's frames."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


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


def handshake_problem(data: bytes) -> Optional[HandshakeFailure]:
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


def unpad(payload: bytes) -> bytes:
    """A PADDED frame's payload without its pad length and padding."""
    if not payload:
        raise ProtocolViolation(f.PROTOCOL_ERROR, "a PADDED frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolViolation(f.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


class HeaderBlock:
    """A header block that a HEADERS frame began without END_HEADERS, growing with
    each CONTINUATION until one ends it (RFC 9113 §6.10).

    Why a limit before decoding: a peer may send CONTINUATION frames without end,
    each within the frame size, and HPACK can only decode the block once it is
    whole, so everything waits in memory until then. ``limit`` (our
    ``max_header_block``) bounds it; past it the peer is abusing us, not failing one
    call, hence ENHANCE_YOUR_CALM for the whole connection."""

    __slots__ = ("end_stream", "limit", "parts", "size", "stream_id")

    def __init__(self, stream_id: int, end_stream: bool, first: bytes, limit: int) -> None:
        self.stream_id = stream_id
        self.end_stream = end_stream  # the HEADERS frame's flag: trailers or trailers-only
        self.limit = limit
        self.parts = [first]
        self.size = len(first)
        self._check()

    def add(self, kind: int, stream_id: int, payload: bytes) -> None:
        """Take the next frame, which must be a CONTINUATION of the same stream: HPACK
        state is shared by the whole connection, so nothing may come between the
        pieces of one block (RFC 9113 §4.3)."""
        if kind != f.CONTINUATION or stream_id != self.stream_id:
            raise ProtocolViolation(
                f.PROTOCOL_ERROR, "a header block was interrupted by another frame"
            )
        self.parts.append(payload)
        self.size += len(payload)
        self._check()

    def joined(self) -> bytes:
        return b"".join(self.parts)

    def _check(self) -> None:
        if self.size > self.limit:
            raise ProtocolViolation(f.ENHANCE_YOUR_CALM, f"a header block over {self.limit} bytes")


# The connection's side of reading: DATA (flags, stream id, payload); the check that
# a HEADERS frame names a stream we opened (stream id, frame name); a whole header
# block (stream id, block, END_STREAM); any other frame (type, flags, stream id, payload).
OnData = Callable[[int, int, bytes], None]
CheckStream = Callable[[int, str], object]
OnHeaderBlock = Callable[[int, bytes, bool], None]
OnControl = Callable[[int, int, int, bytes], None]


class FrameReader:
    """Frames out of a byte stream. ``buffer`` holds the start of a frame (or of the
    handshake) that a read cut off; ``stopped`` (set when the connection closes) ends
    reading in the middle of a read."""

    __slots__ = (
        "block",
        "buffer",
        "handshake",
        "max_block",
        "max_frame",
        "stopped",
        "_check_stream",
        "_on_control",
        "_on_data",
        "_on_header_block",
    )

    def __init__(
        self,
        *,
        max_frame: int,
        max_block: int,
        on_data: OnData,
        check_stream: CheckStream,
        on_header_block: OnHeaderBlock,
        on_control: OnControl,
    ) -> None:
        self.buffer = bytearray()
        self.block: Optional[HeaderBlock] = None  # a header block still open
        self.handshake = True  # the peer's first frame has not been seen to be SETTINGS
        self.stopped = False
        self.max_frame = max_frame  # our SETTINGS_MAX_FRAME_SIZE
        self.max_block = max_block
        self._on_data = on_data
        self._check_stream = check_stream
        self._on_header_block = on_header_block
        self._on_control = on_control

    def feed(self, data: bytes) -> None:
        """Handle every whole frame that ``data`` completes and keep the rest.
        Raises :class:`HandshakeFailure` when the peer does not speak HTTP/2, and
        :class:`ProtocolViolation` for a frame no connection state can accept."""
        buf = self.buffer
        if buf:  # the start of a frame came with an earlier read
            buf += data
            data = bytes(buf)
            buf.clear()
        if self.handshake:
            # The first bytes tell an HTTP/1 or TLS server from an HTTP/2 one, which
            # makes a far better error than a frame that does not parse.
            problem = handshake_problem(data[:64])
            if problem is not None or len(data) < f.FRAME_HEADER:
                buf += data
                if problem is not None:
                    raise problem
                return
            self.handshake = False
        used = self._read(data)
        if used < len(data):
            buf += data[used:]  # at most one frame's start: _read checked its size

    def _read(self, buf: bytes) -> int:
        """Handle every whole frame in ``buf``; return how many bytes were used."""
        pos = 0
        size = len(buf)
        limit = self.max_frame
        while size - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if length > limit:
                # Checked on the header, before the payload arrives: what we buffer
                # stays within one frame of our advertised size plus one read.
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
            if self.block is not None:
                self._continue_block(kind, flags, stream_id, payload)
            elif kind == f.DATA:
                self._on_data(flags, stream_id, payload)
            elif kind == f.HEADERS:
                self._headers(flags, stream_id, payload)
            elif kind == f.CONTINUATION:
                raise ProtocolViolation(f.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            elif kind == f.PUSH_PROMISE:
                raise ProtocolViolation(f.PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled")
            else:
                self._on_control(kind, flags, stream_id, payload)
            if self.stopped:
                break
        return pos

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._check_stream(stream_id, "HEADERS")
        if flags & f.PADDED:
            payload = unpad(payload)
        if flags & f.PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolViolation(f.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if flags & f.END_HEADERS:
            self._on_header_block(stream_id, payload, bool(flags & f.END_STREAM))
        else:
            self.block = HeaderBlock(stream_id, bool(flags & f.END_STREAM), payload, self.max_block)

    def _continue_block(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        block = self.block
        assert block is not None
        block.add(kind, stream_id, payload)
        if flags & f.END_HEADERS:
            self.block = None
            self._on_header_block(block.stream_id, block.joined(), block.end_stream)
