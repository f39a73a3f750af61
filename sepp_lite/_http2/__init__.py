"""The client's own HTTP/2 connection, for gRPC unary calls (RFC 9113, RFC 7541).

- ``_frames``: frame layout, the numbers, the frames a client writes.
- ``_headers``: request header blocks (built once per method, never indexed) and
  response decoding with ``hpack`` (cached when the peer's table is empty).
- ``_stream``: one call's stream: request bytes waiting for window, the answer.
- ``_connection``: the asyncio Protocol that owns the connection's state
  (``ConnectionState``), flow control, SETTINGS, PING, GOAWAY and the streams.
- ``_config``: our side's knobs, in one place.

Which connection a call uses, reconnecting and transparent retries live in
``sepp_lite._transport``.
"""

from __future__ import annotations

from sepp_lite._http2._config import DEFAULT_CONFIG, Http2Config
from sepp_lite._http2._connection import (
    Connection,
    ConnectionState,
    HandshakeFailure,
    Keepalive,
)
from sepp_lite._http2._headers import RequestHead, literal, request_head, timeout_value

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
