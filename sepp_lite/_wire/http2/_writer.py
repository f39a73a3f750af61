"""The write scheduler: what goes to the socket, in which order.

Two kinds of bytes share one socket:

* Control frames (ACKs, WINDOW_UPDATE, RST_STREAM, GOAWAY, keepalive PINGs), header
  blocks and requests that fit in one chunk: queued in ``out`` and written at the
  next flush, whether or not the socket is backed up. They are small, and each one
  unblocks something: the peer's PING waits for its ACK, the peer's sending for our
  WINDOW_UPDATE, a call for its HEADERS.
* The rest of larger requests: waiting in their streams (``_flow.SendQueue``) and
  written in chunks, in turns, only while the transport's buffer is under
  ``write_buffer_high``, so at most that much DATA is ever ahead of a control frame
  or of another call.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Optional

from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._flow import SendQueue
from sepp_lite._wire.http2._reader import ProtocolViolation

# While a read is parsed, queued ACKs go to the socket once this many have gathered
# (fewer when the flood bound is small): a burst of PINGs or SETTINGS is answered as
# it is read, in writes of about 1 KiB, so the socket takes them while the rest of
# the read is parsed and ``out`` stays short. One or two, the usual case, still leave
# with the read's other frames in one write.
ACK_BATCH = 64


class Writer:
    """Frames queued for one connection's transport."""

    __slots__ = (
        "_ack_batch",
        "_acks_owed",
        "_acks_queued",
        "_loop",
        "_max_acks",
        "_owed",
        "_written",
        "data",
        "out",
        "paused",
        "scheduled",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, max_outstanding_acks: int) -> None:
        self._loop = loop
        self.transport: Optional[asyncio.Transport] = None
        self.out: list[bytes] = []  # frames for the next flush; never rebound
        self.data = SendQueue()
        self.scheduled = False  # a flush is due in this loop iteration (flush_soon)
        self.paused = False  # the transport's buffer is over write_buffer_high
        self._written = 0  # bytes handed to the transport, ever
        # ACKs queued in ``out``; and those written that the socket may not have taken
        # yet, as (end offset in _written of their write, how many), with their sum:
        # see ``answer``.
        self._acks_queued = 0
        self._owed: collections.deque[tuple[int, int]] = collections.deque()
        self._acks_owed = 0
        self._max_acks = max_outstanding_acks
        self._ack_batch = max(1, min(ACK_BATCH, max_outstanding_acks // 4))

    def flush(self) -> None:
        """Write the queued frames (control frames, header blocks, one-chunk requests)
        whether or not the transport is backed up, then request DATA while it is not."""
        self.scheduled = False
        if self._write_out() and self.data.ready and not self.paused:
            self.data.pump(self._write)

    def flush_soon(self) -> None:
        """Flush once the loop has run what is ready: frames queued by the calls and
        resets of one loop iteration then leave in one write (one system call)."""
        if not self.scheduled:
            self.scheduled = True
            self._loop.call_soon(self.flush)

    def answer(self, ack: bytes) -> None:
        """Queue an ACK the peer asked for: written with the next flush, ahead of any
        request DATA still waiting in its stream, so a slow reader that pings during a
        large upload is answered, never refused. In a burst they go every
        ``ACK_BATCH`` ACKs, while the read that brought them is still being parsed.

        Why a count: each ACK answers a frame the peer sent, so a peer that sends PINGs
        or SETTINGS and does not read makes us buffer ACKs without end. As nghttp2 and
        grpc bound it, what counts is ACKs the socket has not taken yet (the peer has
        not read what is ahead of them): from ``max_outstanding_acks`` on it is a
        flood. ACKs written and taken, as a reading peer's are, never count, however
        many one read asks for. The size of our send buffer says nothing about the
        peer: a large upload to a slow reader fills it, and the peer's PING then is no
        flood."""
        if self._acks_queued >= self._ack_batch:
            self._write_out()
        if self._owed and self._unread() + self._acks_queued >= self._max_acks:
            raise ProtocolViolation(
                f.ENHANCE_YOUR_CALM, "the server floods control frames without reading"
            )
        self._acks_queued += 1
        self.out.append(ack)

    def last_words(self, goaway: bytes) -> None:
        """Write a GOAWAY after what is queued, and no request DATA after it: the
        streams still waiting to send fail as the connection closes."""
        self.data.clear()
        self.out.append(goaway)
        self.flush()

    def _write_out(self) -> bool:
        """Hand ``out`` to the transport; False when there is no transport to take it."""
        out = self.out
        transport = self.transport
        if transport is None or transport.is_closing():
            out.clear()
            self._acks_queued = 0
            return False
        if out:
            data = b"".join(out) if len(out) > 1 else out[0]
            out.clear()
            self._written += len(data)
            transport.write(data)
            acks = self._acks_queued
            if acks:
                # Owed until the socket has taken every byte up to here.
                self._owed.append((self._written, acks))
                self._acks_owed += acks
                self._acks_queued = 0
        return True

    def _unread(self) -> int:
        """The ACKs written that the socket has not taken: those whose write it has
        taken in full are no longer owed."""
        owed = self._owed
        transport = self.transport
        taken = self._written - (transport.get_write_buffer_size() if transport else 0)
        while owed and owed[0][0] <= taken:
            self._acks_owed -= owed.popleft()[1]
        return self._acks_owed

    def _write(self, frames: list[bytes]) -> bool:
        transport = self.transport
        assert transport is not None
        data = b"".join(frames) if len(frames) > 1 else frames[0]
        self._written += len(data)
        transport.write(data)
        # write() called pause_writing if the socket is backed up (or failed).
        return not (self.paused or transport.is_closing())
