"""Keepalive: PINGs that find a dead peer on a connection that would otherwise wait
on it forever.

A connection can outlive its peer without a word: a server that froze, a NAT or a
load balancer that dropped the mapping. TCP says nothing for hours, and a call made
on such a connection hangs until its deadline. A PING every ``time`` seconds, with
``timeout`` seconds for a sign of life after it, notices instead.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Callable

from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._timers import Timer

_PING_IDS = itertools.count(1)


class Keepalive:
    """Ping interval and ACK timeout in seconds. Shared by the connections of one
    transport, so a server's ``too_many_pings`` slows down the next connections too."""

    __slots__ = ("time", "timeout")

    def __init__(self, time: float, timeout: float) -> None:
        self.time = time
        self.timeout = timeout


class Pinger:
    """One connection's keepalive PINGs. ``send`` writes a PING frame ahead of request
    DATA; ``dead`` is called with the timeout when the peer went silent after one.

    Why any frame counts as a sign of life, not only the ACK: our PING may sit behind
    request DATA in the socket buffers of a slow reader, which cannot ACK what it has
    not read yet; a peer that goes on sending (WINDOW_UPDATEs as it reads, its own
    PINGs) is alive. So the connection calls ``heard`` on every read while
    ``awaited`` is set. A peer that sends nothing for ``timeout`` after our PING is
    dead: a connection that only sends is dropped once it heard nothing for at most
    ``time`` + ``timeout`` (the PING leaves ``time`` after the last ACK)."""

    __slots__ = (
        "_ack_timer",
        "_dead",
        "_keepalive",
        "_loop",
        "_send",
        "_send_timer",
        "awaited",
        "last_heard",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        keepalive: Keepalive,
        send: Callable[[bytes], None],
        dead: Callable[[float], None],
    ) -> None:
        self._loop = loop
        self._keepalive = keepalive
        self._send = send
        self._dead = dead
        self._send_timer = Timer(loop, self._ping)
        self._ack_timer = Timer(loop, self._check)
        self.awaited = b""  # the payload of our PING whose ACK has not come, or b""
        self.last_heard = 0.0  # loop time of the last read while a PING is awaited

    def start(self) -> None:
        """The connection is open: the first PING leaves ``time`` from now."""
        self._send_timer.start(self._keepalive.time)

    def heard(self) -> None:
        self.last_heard = self._loop.time()

    def on_ack(self, payload: bytes) -> None:
        """A PING ACK: ours ends the wait, and the next PING leaves ``time`` later.
        An ACK of a PING we did not send (or no longer wait for) is ignored."""
        if payload == self.awaited:
            self.awaited = b""
            self._ack_timer.cancel()
            self._send_timer.start(self._keepalive.time)

    def stop(self) -> None:
        self._send_timer.cancel()
        self._ack_timer.cancel()

    def _ping(self) -> None:
        self.awaited = next(_PING_IDS).to_bytes(8, "big")
        self._send(f.ping(self.awaited))
        self.last_heard = self._loop.time()
        self._ack_timer.start(self._keepalive.timeout)

    def _check(self) -> None:
        timeout = self._keepalive.timeout
        wait = self.last_heard + timeout - self._loop.time()
        if wait > 0:
            self._ack_timer.start(wait)  # heard from since: a full timeout from then
        else:
            self._dead(timeout)
