"""The client's own HTTP/2 connection (RFC 9113, RFC 7541): a plain HTTP/2 client
that imports nothing else of sepp_lite.

- ``_frames``: frame layout, the numbers, the frames a client writes.
- ``_headers``: request header blocks (built once per method, never indexed, plus
  per-request literals) and response decoding with ``hpack`` (cached when the peer's
  table is empty).
- ``_stream``: one request's stream: request bytes waiting for window, the answer
  handed to its reader in order, and how a stream fails (``StreamFailure``).
- ``_connection``: the asyncio Protocol that owns the connection's state
  (``ConnectionState``) and the streams, and decides what each frame does to them.
- ``_reader``: bytes into frames, header blocks across CONTINUATION, the handshake.
- ``_writer``: what is written when: control frames first, request DATA in turns.
- ``_flow``: the window-update rule and the request DATA waiting for window.
- ``_settings``: our SETTINGS, and the record of the peer's.
- ``_slots``: calls waiting for the peer's MAX_CONCURRENT_STREAMS.
- ``_keepalive``, ``_timers``: PINGs that find a dead peer; typed timer handles.
- ``_config``: our side's knobs, in one place.

What a gRPC answer means (statuses, message framing, grpc-timeout) is
``sepp_lite._wire.grpc``'s; which connection a call uses, reconnecting and transparent
retries live in ``sepp_lite._wire.transport``.
"""

from __future__ import annotations

from sepp_lite._wire.http2._config import DEFAULT_CONFIG, Http2Config
from sepp_lite._wire.http2._connection import Connection, ConnectionState
from sepp_lite._wire.http2._frames import CANCEL, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY
from sepp_lite._wire.http2._headers import (
    RequestHead,
    ResponseHeaders,
    extra_fields,
    parse_fields,
    request_head,
)
from sepp_lite._wire.http2._keepalive import Keepalive
from sepp_lite._wire.http2._reader import HandshakeFailure
from sepp_lite._wire.http2._stream import BodyReader, Failed, Outcome, StreamFailure

__all__ = [
    "CANCEL",
    "DEFAULT_CONFIG",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "BodyReader",
    "Connection",
    "ConnectionState",
    "Failed",
    "HandshakeFailure",
    "Http2Config",
    "Keepalive",
    "Outcome",
    "RequestHead",
    "ResponseHeaders",
    "StreamFailure",
    "extra_fields",
    "parse_fields",
    "request_head",
]
