"""SETTINGS (RFC 9113 §6.5): the ones we send, and what the peer's allow us.

Ours come from :class:`~sepp_lite._wire.http2._config.Http2Config` and are sent once, with
the preface. The peer's are a :class:`PeerSettings` record, holding the defaults of
RFC 9113 §6.5.2 until its first SETTINGS frame, and changed by every later one.
"""

from __future__ import annotations

from typing import Optional

from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._config import Http2Config
from sepp_lite._wire.http2._headers import TABLE_SIZE_ZERO
from sepp_lite._wire.http2._reader import ProtocolViolation


def local_settings(config: Http2Config) -> bytes:
    """Our SETTINGS frame. Push is off: a unary client has no use for a pushed stream,
    and one would only hold the peer's resources and ours. MAX_FRAME_SIZE is sent only
    when it is not the default, which the peer assumes without it."""
    ours = {
        f.ENABLE_PUSH: 0,
        f.HEADER_TABLE_SIZE: config.header_table_size,
        f.INITIAL_WINDOW_SIZE: config.stream_window,
        f.MAX_HEADER_LIST_SIZE: config.max_header_list_size,
    }
    if config.max_frame_size != f.DEFAULT_MAX_FRAME:
        ours[f.MAX_FRAME_SIZE] = config.max_frame_size
    return f.settings(ours)


class PeerSettings:
    """What the peer's SETTINGS allow us."""

    __slots__ = (
        "encoder_table",
        "initial_window",
        "max_frame",
        "max_header_list",
        "max_streams",
        "table_update",
    )

    def __init__(self) -> None:
        self.max_streams = 2**31  # no limit until the peer sets one
        self.initial_window = f.DEFAULT_WINDOW  # each new stream's send window
        self.max_frame = f.DEFAULT_MAX_FRAME  # the largest frame we may send
        self.max_header_list: Optional[int] = None  # a request's headers, if limited
        # The size of the peer's HPACK decoder table that our blocks may assume, and
        # a size update owed at the start of our next header block.
        self.encoder_table = 4096
        self.table_update = b""

    def apply(self, key: int, value: int) -> int:
        """Take one setting; return how much it moved the initial stream window (the
        connection moves every open stream's window by as much: RFC 9113 §6.9.2).
        Unknown settings are ignored (§6.5.2)."""
        if key == f.MAX_CONCURRENT_STREAMS:
            self.max_streams = value
        elif key == f.INITIAL_WINDOW_SIZE:
            if value > f.MAX_WINDOW:
                raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE over 2^31-1")
            delta = value - self.initial_window
            self.initial_window = value
            return delta
        elif key == f.MAX_FRAME_SIZE:
            if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                raise ProtocolViolation(f.PROTOCOL_ERROR, f"MAX_FRAME_SIZE of {value}")
            self.max_frame = value
        elif key == f.HEADER_TABLE_SIZE:
            if value < self.encoder_table:
                # We never index, but must still tell the peer's decoder that our
                # table fits its new size (RFC 7541 §4.2): 0 fits every size.
                self.encoder_table = 0
                self.table_update = TABLE_SIZE_ZERO
        elif key == f.MAX_HEADER_LIST_SIZE:
            self.max_header_list = value
        elif key == f.ENABLE_PUSH and value != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, f"a server sent ENABLE_PUSH={value}")
        return 0
