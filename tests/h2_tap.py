"""A TCP proxy that reads the HTTP/2 frames it forwards: what a real peer sent the
client (GOAWAY, PING...) without trusting the client's own account of it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Optional

from tests.client_helpers import FreezableProxy

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_TYPES = {
    0: "DATA",
    1: "HEADERS",
    2: "PRIORITY",
    3: "RST_STREAM",
    4: "SETTINGS",
    5: "PUSH_PROMISE",
    6: "PING",
    7: "GOAWAY",
    8: "WINDOW_UPDATE",
    9: "CONTINUATION",
}
# Payloads kept for control frames only: DATA and header blocks may be megabytes.
_KEEP_PAYLOAD = {"RST_STREAM", "SETTINGS", "PING", "GOAWAY", "WINDOW_UPDATE"}


@dataclass(frozen=True)
class Frame:
    connection: int
    to_server: bool
    kind: str
    flags: int
    stream: int
    length: int
    payload: bytes
    at: float  # the event loop's time when the proxy forwarded it


@dataclass(frozen=True)
class GoAway:
    connection: int
    last_stream_id: int
    error_code: int
    debug: bytes


class _FrameReader:
    """Cuts one direction of one connection into frames."""

    def __init__(self, emit: Callable[[str, int, int, int, bytes], None], skip: int) -> None:
        self._emit = emit
        self._skip = skip  # the client's connection preface
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if self._skip:
            taken = min(self._skip, len(self._buffer))
            del self._buffer[:taken]
            self._skip -= taken
        while len(self._buffer) >= 9:
            length = int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < 9 + length:
                return
            kind = FRAME_TYPES.get(self._buffer[3], f"0x{self._buffer[3]:02x}")
            flags = self._buffer[4]
            stream = int.from_bytes(self._buffer[5:9], "big") & 0x7FFF_FFFF
            payload = bytes(self._buffer[9 : 9 + length]) if kind in _KEEP_PAYLOAD else b""
            del self._buffer[: 9 + length]
            self._emit(kind, flags, stream, length, payload)


class FrameTap(FreezableProxy):
    """``FrameTap(port)``: a proxy on 127.0.0.1 to 127.0.0.1:``port`` that records every
    frame in both directions (:attr:`frames`)."""

    def __init__(self, port: int) -> None:
        super().__init__("127.0.0.1", port)
        self.frames: list[Frame] = []
        self._goaway = asyncio.Event()

    def observer(self, connection: int, to_server: bool) -> Optional[Callable[[bytes], None]]:
        def emit(kind: str, flags: int, stream: int, length: int, payload: bytes) -> None:
            at = asyncio.get_running_loop().time()
            frame = Frame(connection, to_server, kind, flags, stream, length, payload, at)
            self.frames.append(frame)
            if kind == "GOAWAY" and not to_server:
                self._goaway.set()

        return _FrameReader(emit, len(PREFACE) if to_server else 0).feed

    def count(self, kind: str, *, to_server: bool) -> int:
        return sum(1 for f in self.frames if f.kind == kind and f.to_server == to_server)

    def pings_sent(self, connection: int) -> list[float]:
        """When the client's PINGs (not its ACKs) on ``connection`` went through."""
        return [
            frame.at
            for frame in self.frames
            if frame.kind == "PING"
            and frame.to_server
            and frame.connection == connection
            and not frame.flags & 0x1
        ]

    def goaways(self, *, to_server: bool = False) -> list[GoAway]:
        """The GOAWAY frames sent to the client (or by it), in order."""
        return [
            GoAway(
                frame.connection,
                int.from_bytes(frame.payload[:4], "big") & 0x7FFF_FFFF,
                int.from_bytes(frame.payload[4:8], "big"),
                frame.payload[8:],
            )
            for frame in self.frames
            if frame.kind == "GOAWAY" and frame.to_server == to_server
        ]

    async def wait_goaway(self, timeout: float) -> GoAway:
        """The first GOAWAY sent to the client, waiting up to ``timeout`` for it."""
        await asyncio.wait_for(self._goaway.wait(), timeout)
        return self.goaways()[0]
