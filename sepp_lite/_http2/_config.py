"""The client connection's knobs, in one place."""

from __future__ import annotations

from typing import NamedTuple


class Http2Config(NamedTuple):
    """What our side of the connection advertises and tolerates."""

    # Our SETTINGS_INITIAL_WINDOW_SIZE: how much a response may send before we open
    # the stream's window again (we do as soon as half of it has arrived).
    stream_window: int = 4 * 1024 * 1024
    # The connection receive window we open right after the preface, and keep open.
    connection_window: int = 64 * 1024 * 1024
    # Our SETTINGS_MAX_FRAME_SIZE: a larger frame from the peer is a connection error,
    # so the receive buffer never holds more than one frame of this size plus a read.
    max_frame_size: int = 16_384
    # Our SETTINGS_MAX_HEADER_LIST_SIZE, enforced by the HPACK decoder.
    max_header_list_size: int = 64 * 1024
    # A header block (HEADERS + CONTINUATION) larger than this, before decoding, is a
    # connection error: it bounds what a peer can make us buffer.
    max_header_block: int = 128 * 1024
    # Our SETTINGS_HEADER_TABLE_SIZE: 0, so decoded blocks can be cached (_headers).
    header_table_size: int = 0
    # A call the server never processed (GOAWAY, REFUSED_STREAM) is sent again, on a
    # new connection when needed, this many times at most, as grpc's transparent retry.
    transparent_retries: int = 3
    # Control frames (PING and SETTINGS ACKs) are not answered once this much is
    # waiting to be written: a peer that floods them without reading is cut off.
    max_pending_writes: int = 4 * 1024 * 1024
    # The first stream id (odd); tests start near 2**31 to reach exhaustion quickly.
    first_stream_id: int = 1


DEFAULT_CONFIG = Http2Config()
