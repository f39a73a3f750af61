"""The HTTP/2 layer's pure parts against independent references: our request header
blocks decode with hpack's decoder as we meant them (and index nothing), frames split
as RFC 9113 says, grpc-timeout values follow gRPC's grammar, response blocks decode and
cache only when that is safe, and the reconnect backoff follows grpc's numbers."""

from __future__ import annotations

import hpack
import hyperframe.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sepp_lite._status import Status
from sepp_lite._wire.grpc import grpc_message, grpc_status, timeout_value
from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._headers import (
    ResponseDecoder,
    literal,
    parse_fields,
    request_head,
)
from sepp_lite._wire.transport import ReconnectBackoff

_names = st.binary(min_size=1, max_size=300).map(lambda b: b.lower())
_values = st.binary(max_size=5000)


@settings(max_examples=200, deadline=None)
@given(name=_names, value=_values, secret=st.booleans())
def test_a_literal_decodes_to_itself_and_changes_no_table(
    name: bytes, value: bytes, secret: bool
) -> None:
    decoder = hpack.Decoder(max_header_list_size=1 << 20)
    block = literal(name, value, never_indexed=secret)
    assert decoder.decode(block, raw=True) == [(name, value)]
    assert len(decoder.header_table.dynamic_entries) == 0
    # The representation: 0000xxxx (without indexing) or 0001xxxx (never indexed).
    assert block[0] >> 4 == (1 if secret else 0)


def test_request_head_decodes_in_order_with_authorization_never_indexed() -> None:
    fields = ((b"te", b"trailers"), (b"authorization", b"Bearer k"), (b"x-a", b"b"))
    head = request_head(b"/sepp.v1.QueueService/Ack", tls=True, authority=b"h:1", fields=fields)
    decoder = hpack.Decoder()
    decoded = decoder.decode(head.block, raw=True)
    assert decoded == [
        (b":method", b"POST"),
        (b":scheme", b"https"),
        (b":path", b"/sepp.v1.QueueService/Ack"),
        (b":authority", b"h:1"),
        *fields,
    ]
    [authorization] = [h for h in decoded if h[0] == b"authorization"]
    assert isinstance(authorization, hpack.NeverIndexedHeaderTuple)
    assert head.size == sum(len(n) + len(v) + 32 for n, v in decoded)
    assert len(decoder.header_table.dynamic_entries) == 0


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.0, b"1m"),
        (0.0001, b"1m"),
        (0.0011, b"2m"),
        (1.0, b"1000m"),
        (30.0, b"30000m"),
        (99_999.999, b"99999999m"),
        (100_000.0, b"100000S"),
        (10**12, b"99999999S"),
    ],
)
def test_timeout_values_follow_grpc_grammar(seconds: float, expected: bytes) -> None:
    value = timeout_value(seconds)
    assert value == expected
    assert 2 <= len(value) <= 9 and value[:-1].isdigit() and value[-1:] in b"mS"


@settings(max_examples=100, deadline=None)
@given(size=st.integers(0, 100_000), max_frame=st.sampled_from([16_384, 20_000, 65_536]))
def test_header_blocks_split_into_continuation_frames(size: int, max_frame: int) -> None:
    block = bytes(i % 251 for i in range(size))
    data = f.header_frames(7, block, max_frame, end_stream=True)
    frames = []
    while data:
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
        frames.append(frame)
        data = data[9 + length :]
    assert isinstance(frames[0], hyperframe.frame.HeadersFrame)
    assert all(isinstance(x, hyperframe.frame.ContinuationFrame) for x in frames[1:])
    assert all(x.stream_id == 7 and len(x.data) <= max_frame for x in frames)
    assert b"".join(x.data for x in frames) == block
    assert "END_STREAM" in frames[0].flags
    assert ["END_HEADERS" in x.flags for x in frames] == [False] * (len(frames) - 1) + [True]


def test_control_frames_parse_with_an_independent_parser() -> None:
    for data, kind in (
        (f.settings({f.ENABLE_PUSH: 0, f.INITIAL_WINDOW_SIZE: 1 << 22}), "SettingsFrame"),
        (f.window_update(0, 12345), "WindowUpdateFrame"),
        (f.rst_stream(3, f.CANCEL), "RstStreamFrame"),
        (f.goaway(0, f.PROTOCOL_ERROR, b"why"), "GoAwayFrame"),
        (f.ping(b"12345678", ack=True), "PingFrame"),
    ):
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:]))
        assert type(frame).__name__ == kind and length == len(data) - 9
    settings_frame, _ = hyperframe.frame.Frame.parse_frame_header(memoryview(f.SETTINGS_ACK))
    assert "ACK" in settings_frame.flags


def _encoded(headers: list[tuple[bytes, bytes]], encoder: hpack.Encoder) -> bytes:
    return encoder.encode(headers)  # type: ignore[no-any-return]


def test_response_blocks_are_cached_only_once_the_peer_table_is_empty() -> None:
    encoder = hpack.Encoder()  # indexes by default, as real servers do
    decoder = ResponseDecoder(65_536)
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    first = _encoded(head, encoder)
    assert decoder.decode(first).content_type == b"application/grpc"
    second = _encoded(head, encoder)  # now an index into the dynamic table
    assert decoder.decode(second).http_status == b"200"
    assert not decoder.is_cached(second)  # the peer's table is in use
    # The peer honours SETTINGS_HEADER_TABLE_SIZE=0: its next block shrinks the table.
    encoder.header_table_size = 0
    shrink = _encoded(head, encoder)
    assert shrink[0] == 0x20
    assert decoder.decode(shrink).http_status == b"200"
    again = _encoded(head, encoder)
    assert decoder.decode(again) == parse_fields(head)
    assert decoder.is_cached(again)
    assert decoder.decode(again) is decoder.decode(again)


def test_grpc_status_and_message_parse_like_grpc() -> None:
    parsed = parse_fields([(b"grpc-status", b"5"), (b"grpc-message", b"job%20%E2%82%AC gone%zz")])
    assert grpc_status(parsed) is Status.NOT_FOUND
    assert grpc_message(parsed) == "job \u20ac gone%zz"
    for bad in (b"99", b"-1", b"x", b"", b"1" * 20):
        assert grpc_status(parse_fields([(b"grpc-status", bad)])) is Status.UNKNOWN


def test_backoff_follows_grpc_connection_backoff() -> None:
    backoff = ReconnectBackoff()
    delays = [backoff.next() for _ in range(14)]
    bases = [min(1.0 * 1.6**n, 120.0) for n in range(14)]
    for delay, base in zip(delays, bases):
        assert base * 0.8 <= delay <= base * 1.2
    backoff.reset()
    assert 0.8 <= backoff.next() <= 1.2
