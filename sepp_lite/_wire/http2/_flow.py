"""Flow control (RFC 9113 §5.2, §6.9): when we reopen our receive windows, and how
request DATA shares the peer's windows and the socket.

Receiving: each stream and the connection have a window the peer may fill; we give
room back with WINDOW_UPDATE. :func:`window_increment` is the one rule for both.

Sending: :class:`SendQueue` holds the request bytes that did not leave with their
HEADERS, spends the connection's send window on them, one chunk of one stream at a
time, and knows which streams wait for their own window.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Callable

from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._reader import ProtocolViolation
from sepp_lite._wire.http2._stream import Stream

# The largest DATA frame we write, whatever larger frames the peer allows: a request
# is sent in chunks of this size, one stream after another, so no call waits behind
# more than one chunk of each other call (nghttp2 uses the same 16 KiB). A request up
# to this size is one frame, written with its HEADERS.
DATA_CHUNK = f.DEFAULT_MAX_FRAME
# DATA is gathered into writes of about this size while the transport takes it.
WRITE_BATCH = 64 * 1024


def window_increment(initial: int, available: int) -> int:
    """The WINDOW_UPDATE increment owed for a receive window that opened at
    ``initial`` and has ``available`` left, or 0 when none is due yet.

    Why at half: an update per DATA frame would double the frames on the wire, and
    one only when the window is empty would stall the peer for a round trip each
    time. Giving back everything consumed once half the window is gone keeps the
    peer sending without pause as long as a round trip moves less than half a
    window, with one small frame per half window (grpc-go and h2o use the same rule;
    h2's WindowManager waits for half too, or for a large frame's worth)."""
    consumed = initial - available
    return consumed if consumed >= initial // 2 else 0


# How SendQueue.pump hands DATA to the socket: the frames of one write; returns
# whether the transport takes more now (not backed up, not closing).
Write = Callable[[list[bytes]], bool]


class SendQueue:
    """Request DATA waiting for its turn, and the connection's send window.

    Streams with stream window left take turns in ``ready`` (the connection window
    may still hold them all back); those whose own window is used up wait in
    ``blocked`` for a WINDOW_UPDATE or a SETTINGS change."""

    __slots__ = ("blocked", "ready", "window")

    def __init__(self) -> None:
        self.window = f.DEFAULT_WINDOW  # the connection's send window
        self.ready: collections.deque[Stream] = collections.deque()
        self.blocked: dict[int, Stream] = {}

    def send(self, stream: Stream, body: bytes) -> bytes:
        """A new stream's request: its one DATA frame when the whole body is one chunk
        the windows take now, else b"" and the body waits here for ``pump``."""
        size = len(body)
        if size <= DATA_CHUNK and size <= stream.send_window and size <= self.window:
            stream.send_window -= size
            self.window -= size
            stream.sent_end = True
            return f.frame(f.DATA, f.END_STREAM, stream.id, body)
        stream.pending = memoryview(body)
        if stream.send_window > 0:
            self.ready.append(stream)
        else:
            self.blocked[stream.id] = stream
        return b""

    def pump(self, write: Write) -> None:
        """Write request DATA: one chunk of each ready stream in turn, until ``write``
        says the transport is backed up, the connection window is used up or nothing
        is left.

        Why in turns: streams served in arrival order let one large upload take every
        reopening of the window and every write, and a small call behind it waits for
        all of it. Why ``write`` may stop us: what sits in the transport's buffer is
        ahead of everything written later, control frames included, so it is kept to
        about write_buffer_high (plus one batch) instead of whole messages."""
        ready = self.ready
        batch: list[bytes] = []
        gathered = 0
        while ready and self.window > 0:
            stream = ready.popleft()
            pending = stream.pending
            if pending is None:
                continue  # the stream ended or was reset while it waited its turn
            size = min(len(pending), DATA_CHUNK, stream.send_window, self.window)
            if size <= 0:  # a SETTINGS change left its window at or below zero
                self.blocked[stream.id] = stream
                continue
            stream.send_window -= size
            self.window -= size
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
                    self.blocked[stream.id] = stream
            gathered += size
            if gathered >= WRITE_BATCH:
                more = write(batch)
                batch = []
                gathered = 0
                if not more:
                    return
        if batch:
            write(batch)

    def open_connection(self, increment: int) -> None:
        """A WINDOW_UPDATE for the connection. The streams it held back are still in
        ``ready``: the next pump gives them their turns."""
        if increment == 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        self.window += increment
        if self.window > f.MAX_WINDOW:
            raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "the connection window overflowed")

    def open_stream(self, stream: Stream, increment: int) -> None:
        """A valid WINDOW_UPDATE for ``stream`` (the connection checked it)."""
        stream.send_window += increment
        if stream.send_window > 0 and self.blocked.pop(stream.id, None) is not None:
            self.ready.append(stream)

    def shift(self, streams: Iterable[Stream], delta: int) -> None:
        """A new INITIAL_WINDOW_SIZE moves every open stream's window by the change
        (RFC 9113 §6.9.2), which may leave it negative: such a stream waits until
        WINDOW_UPDATEs bring it above zero."""
        for stream in streams:
            stream.send_window += delta
            if stream.send_window > f.MAX_WINDOW:
                raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "a stream window overflowed")

    def unblock(self) -> None:
        """Streams whose window a SETTINGS change reopened take their turns again."""
        blocked = self.blocked
        for stream in [s for s in blocked.values() if s.send_window > 0]:
            del blocked[stream.id]
            self.ready.append(stream)

    def discard(self, stream: Stream) -> None:
        """``stream`` ended: nothing more of it is sent (``pump`` skips it in ``ready``)."""
        self.blocked.pop(stream.id, None)
        stream.pending = None

    def clear(self) -> None:
        """Send no more request DATA (the connection is going away)."""
        self.ready.clear()
        self.blocked.clear()
