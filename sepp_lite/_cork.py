"""Corked: send the frames one call writes as one TCP segment (client and test server).

grpclib writes every HTTP/2 frame on its own; on loopback each write is a full
transmission that wakes the peer, a tenth or more of a small call's CPU time. Setting
TCP_CORK while a call writes its frames, then clearing it, sends them together. Should
the call suspend while corked (the stream limit, backpressure, a long poll), the uncork
scheduled with ``call_soon`` runs first, so no other call's frames are held back.
Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Optional

_TCP_CORK: Optional[int] = getattr(socket, "TCP_CORK", None)


class Corked:
    """``with Corked(transport): ...`` around a burst of writes on ``transport`` (an
    asyncio transport, TLS or not; anything else, or ``None``, is left alone)."""

    __slots__ = ("_handle", "_sock")

    def __init__(self, transport: Any) -> None:
        self._sock: Any = None
        self._handle: Optional[asyncio.Handle] = None
        if _TCP_CORK is None or transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._sock = sock

    def __enter__(self) -> None:
        if self._sock is not None:
            self._set(1)
            self._handle = asyncio.get_running_loop().call_soon(self._set, 0)

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._set(0)

    def _set(self, value: int) -> None:
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, value)
        except OSError:  # the connection is closing; grpclib reports that on its own
            pass
