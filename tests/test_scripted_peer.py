"""The scripted HTTP/2 peer's own checks (``tests/h2_peer.py``) can fail: a hand-written
client breaks each rule the peer judges (frame size, flow control, stream limit, header
blocks, stream ids) and the peer must say so. Without this, a peer that never complains
would make every ``peer.violations == []`` in ``test_http2_peer.py`` (the client against
the peer) pass for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import hpack
import pytest

from tests.h2_peer import (
    ACK,
    DEFAULT_SETTINGS,
    END_HEADERS,
    END_STREAM,
    PREFACE,
    FrameType,
    H2Peer,
    Hang,
    PeerConnection,
    Setting,
    Settings,
    frame_bytes,
    grpc_message,
    hpack_entries,
)

pytestmark = pytest.mark.timeout(30)

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/sepp.v1.QueueService/GetServerInfo"),
    (":authority", "peer"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def headers(stream_id: int, *, end_stream: bool = False, end_headers: bool = True) -> bytes:
    block = hpack.Encoder().encode(REQUEST)  # a fresh encoder: the block stands alone
    flags = (END_HEADERS if end_headers else 0) | (END_STREAM if end_stream else 0)
    return frame_bytes(FrameType.HEADERS, flags, stream_id, block)


async def played(
    frames: bytes, *, settings: Mapping[int, int] = DEFAULT_SETTINGS
) -> PeerConnection:
    """Send the preface, an empty SETTINGS and ``frames`` to a fresh peer (which never
    answers a request), and return what it made of them."""
    async with H2Peer(lambda request: [Hang()], settings=settings) as peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", peer.port)
        try:
            writer.write(PREFACE + frame_bytes(FrameType.SETTINGS, 0, 0) + frames)
            await writer.drain()
            expected = _count(frames) + 1
            await peer.wait_until(lambda: len(peer.conns[0].frames()) >= expected, 5)
        finally:
            writer.close()
            await writer.wait_closed()
    return peer.conns[0]


def _count(frames: bytes) -> int:
    count, at = 0, 0
    while at < len(frames):
        at += 9 + int.from_bytes(frames[at : at + 3], "big")
        count += 1
    return count


async def test_a_well_behaved_client_gives_no_violation() -> None:
    conn = await played(headers(1) + frame_bytes(FrameType.DATA, END_STREAM, 1, grpc_message(b"")))
    assert conn.violations == []
    assert min(conn.lowest_windows().values()) >= 0
    (request,) = conn.requests.values()
    assert request.ended and request.method == "GetServerInfo"


async def test_data_over_the_stream_window_shows_in_the_replay() -> None:
    settings = {Setting.INITIAL_WINDOW_SIZE: 100}
    conn = await played(
        headers(1) + frame_bytes(FrameType.DATA, 0, 1, b"x" * 150), settings=settings
    )
    assert conn.lowest_windows()[1] == -50


async def test_a_frame_over_max_frame_size() -> None:
    conn = await played(headers(1) + frame_bytes(FrameType.DATA, 0, 1, b"x" * 16_385))
    assert any("over 16384" in v for v in conn.violations), conn.violations


async def test_more_streams_than_allowed() -> None:
    settings = {Setting.MAX_CONCURRENT_STREAMS: 1}
    conn = await played(headers(1) + headers(3), settings=settings)
    assert conn.max_open == 2
    assert any("limit 1" in v for v in conn.violations), conn.violations


async def test_a_frame_inside_a_header_block() -> None:
    ping = frame_bytes(FrameType.PING, 0, 0, b"12345678")
    conn = await played(headers(1, end_headers=False) + ping)
    assert any("inside the header block" in v for v in conn.violations), conn.violations


async def test_even_and_decreasing_stream_ids() -> None:
    conn = await played(headers(5) + headers(2) + headers(3))
    assert len([v for v in conn.violations if v.startswith("stream ")]) == 2, conn.violations


async def test_incremental_indexing_and_never_indexed_fields_are_told_apart() -> None:
    block = hpack.Encoder().encode([*REQUEST, hpack.NeverIndexedHeaderTuple("authorization", "k")])
    conn = await played(frame_bytes(FrameType.HEADERS, END_HEADERS, 1, block))
    request = conn.requests[1].headers
    assert ("incremental", 1) in [(k, v) for k, v, _ in hpack_entries(block)]
    assert request.entry_of("authorization")[0] == "never_indexed"
    assert request.field("authorization").never_indexed
    assert not request.field(":authority").never_indexed


async def test_settings_count_as_acked_only_when_the_client_acks() -> None:
    async with H2Peer() as peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", peer.port)
        try:
            writer.write(PREFACE + frame_bytes(FrameType.SETTINGS, 0, 0))
            await peer.wait_until(lambda: bool(peer.conns))
            conn = peer.conns[0]
            await conn.act(Settings({Setting.MAX_CONCURRENT_STREAMS: 1}))
            assert conn.unacked_settings == 1
            writer.write(frame_bytes(FrameType.SETTINGS, ACK, 0))
            await peer.wait_until(lambda: conn.unacked_settings == 0, 5)
        finally:
            writer.close()
            await writer.wait_closed()
    sent = [f.settings for f in conn.frames(FrameType.SETTINGS, inbound=False) if not f.has(ACK)]
    assert sent[-1] == {Setting.MAX_CONCURRENT_STREAMS: 1}
