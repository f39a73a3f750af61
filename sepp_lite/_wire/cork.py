"""Corked: send the frames written during one event-loop iteration as one TCP segment.

grpclib writes every HTTP/2 frame on its own; on loopback each write is a full
transmission that wakes the peer, a tenth or more of a small call's CPU time. The
first call that writes on a connection in an iteration sets TCP_CORK and schedules
the uncork with ``call_soon``, which runs at the start of the next iteration: every
frame written until then, by this call or by any other (64 concurrent acks of a Worker,
many answers of a server), leaves in one transmission. Nothing waits longer than one
loop iteration. Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Optional

_TCP_CORK: Optional[int] = getattr(socket, "TCP_CORK", None)
_corked: set[Any] = set()  # sockets corked in this iteration, uncork pending


def cork(transport: Any) -> None:
    """Hold back what ``transport`` (an asyncio transport, TLS or not) writes until
    the next loop iteration; anything else, or ``None``, is left alone."""
    if _TCP_CORK is None or transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is None or sock in _corked or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1)
    except OSError:  # the connection is closing; grpclib reports that on its own
        return
    _corked.add(sock)
    asyncio.get_running_loop().call_soon(_uncork, sock)


def _uncork(sock: Any) -> None:
    _corked.discard(sock)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 0)
    except OSError:
        pass
