"""The client's own HTTP/2 connection, for gRPC unary calls (RFC 9113, RFC 7541).

- ``_frames``: frame layout, the numbers, the frames a client writes.
- ``_headers``: request header blocks (built once per method, never indexed) and
  response decoding with ``hpack`` (cached when the peer's table is empty).
- ``_stream``: one call's stream: request bytes waiting for window, the answer.
- ``_connection``: the asyncio Protocol that owns the connection's state
  (``ConnectionState``) and the streams, and decides what each frame does to them.
- ``_reader``: bytes into frames, header blocks across CONTINUATION, the handshake.
- ``_writer``: what is written when: control frames first, request DATA in turns.
- ``_flow``: the window-update rule and the request DATA waiting for window.
- ``_settings``: our SETTINGS, and the record of the peer's.
- ``_slots``: calls waiting for the peer's MAX_CONCURRENT_STREAMS.
- ``_keepalive``, ``_timers``: PINGs that find a dead peer; typed timer handles.
- ``_config``: our side's knobs, in one place.

Which connection a call uses, reconnecting and transparent retries live in
``sepp_lite._transport``.
"""

from __future__ import annotations

from sepp_lite._http2._config import DEFAULT_CONFIG, Http2Config
from sepp_lite._http2._connection import Connection, ConnectionState
from sepp_lite._http2._headers import RequestHead, literal, request_head, timeout_value
from sepp_lite._http2._keepalive import Keepalive
from sepp_lite._http2._reader import HandshakeFailure

__all__ = [
    "DEFAULT_CONFIG",
    "Connection",
    "ConnectionState",
    "HandshakeFailure",
    "Http2Config",
    "Keepalive",
    "RequestHead",
    "literal",
    "request_head",
    "timeout_value",
]
