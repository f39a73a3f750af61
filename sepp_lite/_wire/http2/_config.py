"""The client connection's knobs, in one place."""

from __future__ import annotations

from typing import NamedTuple


class Http2Config(NamedTuple):
    """What our side of the connection advertises and tolerates."""

    # Our SETTINGS_INITIAL_WINDOW_SIZE: how much a response may send before we open
    # the stream's window again (we do as soon as half of it has arrived). Each DATA
    # frame goes to its call's reader as it arrives, and what a reader keeps is bounded
    # by the receive limit, not by this window: the window only has to let a large
    # answer (a reserve of many jobs) arrive without a pause per round trip, which
    # HTTP/2's default of 64 KiB would not.
    stream_window: int = 4 * 1024 * 1024
    # The connection receive window we open right after the preface, and keep open:
    # sixteen streams' windows, so that many large answers at once do not share one
    # stream's worth per round trip.
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
    # ACKs (of the peer's PINGs and SETTINGS) written that the socket has not taken
    # yet: from this many on, the peer sends control frames faster than it reads our
    # answers, a flood (what grpc core allows pending, and what Envoy sets nghttp2's
    # max_outbound_ack to). Above the 7,282 ACKs one read can ask for at most (64 KiB
    # of empty SETTINGS), so one read is never a flood on its own: only ACKs that
    # earlier reads left and the socket still has not taken make one. Counted in
    # frames, not in the size of our send buffer: a large upload to a slow reader
    # fills that buffer legitimately, and one PING then is no flood. What a peer that
    # never reads makes us hold is bounded by it: about 170 KB of PING ACKs.
    max_outstanding_acks: int = 10_000
    # Request DATA goes to the transport only while its buffer is under this many bytes
    # (asyncio's pause_writing / resume_writing); the rest of a large request waits in
    # the stream, so control frames and other calls' chunks are never queued behind it.
    write_buffer_high: int = 64 * 1024
    # TCP_NOTSENT_LOWAT: the kernel keeps at most about this much of what we wrote and
    # it has not sent yet (on TCP sockets where the option exists). Without it a slow
    # reader lets the kernel take megabytes ahead of a small call's frames.
    send_lowat: int = 16 * 1024
    # The first stream id (odd); tests start near 2**31 to reach exhaustion quickly.
    first_stream_id: int = 1


DEFAULT_CONFIG = Http2Config()
