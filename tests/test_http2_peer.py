"""The client's HTTP/2 connection against a scripted, frame-level peer (issue 15).

Every test checks what the caller got and what the wire showed: ``tests/h2_peer.py``
records each frame both ways, and judges the client's side of the protocol
(``peer.violations``: frame sizes, stream limits, header blocks, stream ids). The
cases follow the issue's list: connect failures, flow control with tiny windows,
MAX_FRAME_SIZE and CONTINUATION, MAX_HEADER_LIST_SIZE, MAX_CONCURRENT_STREAMS,
HPACK, response framing (CONTINUATION, padding, PRIORITY, unknown frames),
RST_STREAM codes, GOAWAY (graceful and not), PING and keepalive, protocol
violations, an oversize response, deadlines and cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import statistics
import string
import struct
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, Callable, Optional

import hpack
import pytest

import sepp_lite as sepp
from sepp_lite import (
    ClientError,
    ConnectError,
    EnqueueAck,
    ResponseTooLargeError,
    SeppClient,
    TransportError,
)
from sepp_lite._codec.enqueue import decode_enqueue_batch_request
from sepp_lite._retry import is_retryable
from sepp_lite.types import Payload
from tests.client_helpers import (
    JOB_ID,
    connected,
    default_reply,
    elapsed,
    free_port,
    hand_ctx,
    job,
    job_record,
    opts,
    reserve_reply,
)
from tests.h2_peer import (
    ACK,
    DEFAULT_SETTINGS,
    DEFAULT_WINDOW,
    END_HEADERS,
    MAX_STREAM_ID,
    MAX_WINDOW,
    OK_HEADERS,
    Abort,
    Action,
    Close,
    Data,
    ErrorCode,
    Field,
    Flood,
    FrameType,
    GoAway,
    H2Peer,
    Hang,
    Headers,
    PeerConnection,
    Ping,
    Raw,
    RawFrame,
    Refill,
    Request,
    Reset,
    Setting,
    Settings,
    Signal,
    Sleep,
    WindowUpdate,
    alerting_tls_peer,
    answer,
    ca_pem,
    frame_header,
    grpc_message,
    http1_peer,
    memory_peak,
    silent_peer,
    tls_context,
    valid_answer,
)

pytestmark = pytest.mark.timeout(60)

FAST = 1.0  # seconds: "at once", with room for a loaded 2-core machine
NO_RETRY = sepp.RetryPolicy(max_attempts=1)


def only(peer: H2Peer) -> PeerConnection:
    assert peer.connections == 1, f"expected one connection, the peer saw {peer.connections}"
    return peer.conns[0]


def first_then_valid(*actions: Action) -> Callable[[Request], Sequence[Action]]:
    """A handler: the first request gets ``actions``, every later one a valid answer."""
    pending = [list(actions)]

    def handler(request: Request) -> Sequence[Action]:
        return pending.pop() if pending else valid_answer(request)

    return handler


def complaints(conn: PeerConnection) -> list[tuple[int, int]]:
    """The client's RST_STREAMs and error GOAWAYs, as ``(stream, code)`` (a GOAWAY
    with NO_ERROR is how a client closes cleanly)."""
    gone = [(last, code) for last, code, _ in conn.goaways() if code != ErrorCode.NO_ERROR]
    return conn.resets() + gone


def queue_of(request: Request) -> str:
    return decode_enqueue_batch_request(request.message)[0].queue


def sepp_records(caplog: pytest.LogCaptureFixture, above: int) -> list[str]:
    return [
        f"{r.levelname} {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith("sepp_lite") and r.levelno > above
    ]


# -- connect --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def nothing_listening() -> AsyncIterator[Any]:
    class Port:
        port = free_port()

    yield Port


def tls_client() -> dict[str, Any]:
    return {"tls_ca_cert": ca_pem(), "tls_domain": "localhost"}


# peer, client options, reason (a regex), the values server_uses_tls may have, and
# whether the failure waits for connect_timeout.
CONNECT_CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any], str, set[Any], bool]] = {
    "silent peer": (silent_peer, dict, "timed out", {None}, True),
    "HTTP/1.1 peer": (http1_peer, dict, "HTTP/1", {None}, False),
    "TLS server that sends an alert": (alerting_tls_peer, dict, "TLS", {True}, False),
    # OpenSSL and BoringSSL (grpcio) close without a byte: nothing says "TLS" for sure.
    "TLS server that closes": (
        lambda: H2Peer(tls=tls_context()),
        dict,
        "TLS|closed the connection",
        {None, True},
        False,
    ),
    "plaintext peer, TLS client": (H2Peer, tls_client, "TLS", {False}, False),
    "peer closes before SETTINGS": (
        lambda: H2Peer(settings=None, on_connect=[Close()]),
        dict,
        "closed the connection",
        {None},
        False,
    ),
    "first frame is not SETTINGS": (
        lambda: H2Peer(settings=None, on_connect=[Ping()]),
        dict,
        "HTTP/2",
        {None},
        False,
    ),
    "nothing listening": (nothing_listening, dict, "connection refused", {None}, False),
}


@pytest.mark.parametrize("case", sorted(CONNECT_CASES))
async def test_connect_fails_with_a_clear_reason(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, options, reason, uses_tls, waits = CONNECT_CASES[case]
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    timeout = 0.5 if waits else 5.0
    async with make() as peer:
        addr = f"127.0.0.1:{peer.port}"
        connecting = SeppClient.connect(addr, connect_timeout=timeout, **options())
        took, error = await elapsed(connecting)
    assert isinstance(error, ConnectError), error
    assert error.addr == addr
    assert re.search(reason, error.reason), error.reason
    assert error.server_uses_tls in uses_tls, error.server_uses_tls
    if waits:
        assert timeout - 0.05 <= took < timeout + FAST
    else:
        assert took < FAST
    assert sepp_records(caplog, logging.DEBUG) == []  # raised, not also logged


async def test_connect_returns_only_once_the_servers_settings_arrived() -> None:
    peer = H2Peer(settings=None, on_connect=[Sleep(0.4), Settings(dict(DEFAULT_SETTINGS))])
    async with peer:
        took, client = await elapsed(SeppClient.connect(peer.addr, connect_timeout=5))
        assert isinstance(client, SeppClient), client
        try:
            assert took >= 0.35
            await client.get_server_info()
        finally:
            await client.close()
    assert peer.violations == []


# -- flow control ----------------------------------------------------------------------


def payload_jobs(total: int, count: int) -> list[sepp.EnqueueRequest]:
    """``count`` jobs whose payloads add up to ``total`` bytes, each different."""
    size = total // count
    return [
        job(f"big{i}", payload=Payload(bytes([i]) * size, "application/octet-stream"))
        for i in range(count)
    ]


def assert_body_is(request: Request, jobs: list[sepp.EnqueueRequest]) -> None:
    received = decode_enqueue_batch_request(request.message)
    assert [j.payload for j in received] == [(j.payload.data, j.payload.encoding) for j in jobs]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "megabytes, stream_window, step",
    # 15 MiB: the largest batch under the 16 MiB message limit the client enforces.
    [(1, 1_000, 700), (15, 16_384, 8_192)],
    ids=["1MiB", "15MiB"],
)
async def test_a_large_batch_waits_for_tiny_windows(
    megabytes: int, stream_window: int, step: int
) -> None:
    # The stream window is tiny and the connection window stays at 65,535; both are
    # opened `step` bytes at a time, so the client must wait for each WINDOW_UPDATE.
    settings = {Setting.MAX_CONCURRENT_STREAMS: 10, Setting.INITIAL_WINDOW_SIZE: stream_window}
    jobs = payload_jobs(megabytes << 20, 16)
    peer = H2Peer(settings=settings, connection_window=DEFAULT_WINDOW, refill=Refill(step=step))
    async with peer, connected(peer.addr, rpc_timeout=40) as client:
        results = await client.enqueue_batch(jobs)
    assert len(results) == 16 and all(isinstance(r, EnqueueAck) for r in results), results
    conn = only(peer)
    (request,) = peer.requests
    assert_body_is(request, jobs)
    lowest = conn.lowest_windows()
    assert min(lowest.values()) >= 0, lowest  # never more DATA than the windows allowed
    assert lowest[request.stream_id] < step  # and it did use the window it had
    assert peer.violations == []


async def test_a_lowered_initial_window_applies_to_the_open_stream() -> None:
    # Mid-request the peer drops INITIAL_WINDOW_SIZE to 0, so the open stream's window
    # goes to zero or below by the delta: from the client's ACK of that change on, no
    # DATA may come until the peer restores the window.
    settings = {Setting.MAX_CONCURRENT_STREAMS: 10, Setting.INITIAL_WINDOW_SIZE: 65_535}
    jobs = payload_jobs(1 << 20, 4)
    async with H2Peer(settings=settings) as peer, connected(peer.addr, rpc_timeout=20) as client:
        sending = asyncio.ensure_future(client.enqueue_batch(jobs))
        await peer.wait_until(lambda: bool(peer.conns and peer.conns[0].requests))
        conn = only(peer)
        request = conn.requests[1]
        await peer.wait_until(lambda: len(request.body) > 20_000)
        await conn.act(Settings({Setting.INITIAL_WINDOW_SIZE: 0}))
        await peer.wait_until(lambda: conn.unacked_settings == 0)
        shut_at = len(request.body)
        # A PING answered after the window closed: DATA the client had ready to send
        # would have come before its ACK (the peer also flags DATA beyond a window).
        await conn.act(Ping(b"window-0", wait_ack=True))
        still = len(request.body)
        await conn.act(Settings({Setting.INITIAL_WINDOW_SIZE: 65_535}))
        results = await asyncio.wait_for(sending, 20)
    assert all(isinstance(r, EnqueueAck) for r in results)
    assert still == shut_at < len(request.body)
    assert_body_is(request, jobs)
    assert min(conn.lowest_windows().values()) >= 0, conn.lowest_windows()
    assert peer.violations == []


# -- frame sizes and header blocks -----------------------------------------------------


async def test_a_1_mib_request_never_exceeds_max_frame_size() -> None:
    settings = {Setting.MAX_FRAME_SIZE: 16_384, Setting.INITIAL_WINDOW_SIZE: 4 << 20}
    jobs = payload_jobs(1 << 20, 2)
    async with H2Peer(settings=settings) as peer, connected(peer.addr) as client:
        await client.enqueue_batch(jobs)
    conn = only(peer)
    assert_body_is(peer.requests[0], jobs)
    sizes = [f.length for f in conn.frames()]
    assert max(sizes) <= 16_384
    assert len(conn.frames(FrameType.DATA)) >= 64
    assert peer.violations == []


def long_key(size: int) -> str:
    rng = random.Random(size)  # printable ASCII that HPACK's Huffman code barely shrinks
    return "".join(rng.choice(string.ascii_letters + string.digits + "~|{}") for _ in range(size))


async def test_a_header_block_over_max_frame_size_goes_in_continuation_frames() -> None:
    key = long_key(40_000)
    async with H2Peer() as peer, connected(peer.addr, api_key=key) as client:
        await client.get_server_info()
        await client.enqueue(job("after"))
    conn = only(peer)
    first = conn.requests[1].headers
    assert first.frames >= 3
    assert first.field("authorization") == Field("authorization", f"Bearer {key}", True)
    # HEADERS without END_HEADERS, then only CONTINUATION frames of that stream up
    # to the one with END_HEADERS: nothing else in between, nothing over 16,384.
    inbound = conn.frames()
    start = next(i for i, f in enumerate(inbound) if f.type == FrameType.HEADERS)
    block = inbound[start : start + first.frames]
    assert not block[0].has(END_HEADERS)
    assert [f.type for f in block[1:]] == [FrameType.CONTINUATION] * (first.frames - 1)
    assert {f.stream_id for f in block} == {1}
    assert block[-1].has(END_HEADERS)
    assert max(f.length for f in inbound) <= 16_384
    assert len(peer.requests) == 2
    assert peer.violations == []


async def test_headers_over_max_header_list_size_fail_locally_and_nothing_is_sent() -> None:
    settings = {**DEFAULT_SETTINGS, Setting.MAX_HEADER_LIST_SIZE: 4_096}
    async with H2Peer(settings=settings) as peer:
        async with connected(peer.addr, api_key="k" * 5_000, rpc_timeout=5) as client:
            took, error = await elapsed(client.get_server_info())
        async with connected(peer.addr) as small:
            await small.get_server_info()
    assert isinstance(error, TransportError), error
    assert took < FAST
    assert error.ambiguous is False
    assert "k" * 100 not in str(error)
    big, ok = peer.conns
    assert big.frames(FrameType.HEADERS) == [] and big.frames(FrameType.CONTINUATION) == []
    assert len(ok.requests) == 1
    assert peer.violations == []


# -- MAX_CONCURRENT_STREAMS --------------------------------------------------------------


async def test_64_calls_through_one_stream_slot_go_one_at_a_time_in_order() -> None:
    settings = {Setting.MAX_CONCURRENT_STREAMS: 1, Setting.INITIAL_WINDOW_SIZE: 1 << 20}
    queues = [f"fifo-{i:02d}" for i in range(64)]
    # One RPC per enqueue() call: this test counts streams, which coalescing merges.
    async with (
        H2Peer(settings=settings) as peer,
        connected(peer.addr, coalesce_enqueues=False, rpc_timeout=20) as client,
    ):
        results = await asyncio.gather(*(client.enqueue(job(q)) for q in queues))
    assert all(isinstance(r, EnqueueAck) for r in results)
    conn = only(peer)
    assert conn.max_open == 1
    assert [queue_of(r) for r in conn.requests.values()] == queues  # FIFO
    assert peer.violations == []


async def test_a_lowered_stream_limit_applies_to_new_streams() -> None:
    async def slow(request: Request) -> Sequence[Action]:
        await asyncio.sleep(0.01)  # keeps several calls waiting for the one slot
        return valid_answer(request)

    # One RPC per enqueue() call: this test counts streams, which coalescing merges.
    async with (
        H2Peer(slow) as peer,
        connected(peer.addr, coalesce_enqueues=False, rpc_timeout=20) as client,
    ):
        await client.get_server_info()
        conn = only(peer)
        await conn.act(Settings({Setting.MAX_CONCURRENT_STREAMS: 1}))
        await peer.wait_until(lambda: conn.unacked_settings == 0)
        results = await asyncio.gather(*(client.enqueue(job(f"low{i}")) for i in range(8)))
    assert all(isinstance(r, EnqueueAck) for r in results)
    assert len(conn.requests) == 9
    assert conn.max_open == 1
    assert peer.violations == []  # the peer checks the new limit from the client's ACK on


async def test_a_call_waiting_for_a_stream_slot_fails_at_its_deadline_off_the_wire() -> None:
    release = asyncio.Event()

    async def handler(request: Request) -> Sequence[Action]:
        if request.method == "Reserve":
            await asyncio.wait_for(release.wait(), 20)
        return valid_answer(request)

    settings = {Setting.MAX_CONCURRENT_STREAMS: 1, Setting.INITIAL_WINDOW_SIZE: 1 << 20}
    async with H2Peer(handler, settings=settings) as peer:
        async with connected(peer.addr, rpc_timeout=0.5, retry_policy=NO_RETRY) as client:
            poll = asyncio.ensure_future(client.reserve(opts("q", wait=5)))
            await peer.wait_until(lambda: len(peer.requests) == 1)
            took, error = await elapsed(client.get_server_info())
            release.set()
            assert await asyncio.wait_for(poll, 5) is None
            await client.get_server_info()  # the slot was not leaked
    assert isinstance(error, TransportError), error
    assert error.code is not None and error.code.name in ("DEADLINE_EXCEEDED", "UNAVAILABLE")
    assert error.ambiguous is False  # it never left the client
    assert 0.45 <= took < 0.5 + FAST
    assert "GetServerInfo" in str(error) and peer.addr in str(error)
    conn = only(peer)
    assert [r.method for r in conn.requests.values()] == ["Reserve", "GetServerInfo"]
    assert conn.max_open == 1
    assert peer.violations == []


# -- deadline and cancellation -----------------------------------------------------------


async def test_a_call_past_its_deadline_resets_its_stream_and_frees_the_slot() -> None:
    settings = {Setting.MAX_CONCURRENT_STREAMS: 1, Setting.INITIAL_WINDOW_SIZE: 1 << 20}
    async with H2Peer(first_then_valid(Hang()), settings=settings) as peer:
        async with connected(peer.addr, rpc_timeout=0.5) as client:
            took, error = await elapsed(client.get_server_info())
            conn = only(peer)
            await peer.wait_until(lambda: conn.resets() != [], timeout=5)
            after, info = await elapsed(client.get_server_info())
    assert isinstance(error, TransportError), error
    assert error.code is not None and error.code.name == "DEADLINE_EXCEEDED"
    assert error.ambiguous is True
    assert 0.45 <= took < 0.5 + FAST
    assert "GetServerInfo" in str(error) and peer.addr in str(error)
    assert conn.resets() == [(1, ErrorCode.CANCEL)]
    assert isinstance(info, sepp.ServerInfo), info
    assert after < FAST
    assert list(conn.requests) == [1, 3]  # the next call got the slot, same connection
    assert peer.violations == []


async def test_a_call_cancelled_by_its_caller_resets_its_stream_and_frees_the_slot() -> None:
    settings = {Setting.MAX_CONCURRENT_STREAMS: 1, Setting.INITIAL_WINDOW_SIZE: 1 << 20}
    async with H2Peer(first_then_valid(Hang()), settings=settings) as peer:
        async with connected(peer.addr, rpc_timeout=10) as client:
            poll = asyncio.ensure_future(client.reserve(opts("q", wait=5)))
            await peer.wait_until(lambda: len(peer.requests) == 1)
            poll.cancel()
            with pytest.raises(asyncio.CancelledError):
                await poll
            conn = only(peer)
            await peer.wait_until(lambda: conn.resets() != [], timeout=5)
            took, info = await elapsed(client.get_server_info())
    assert conn.resets() == [(1, ErrorCode.CANCEL)]
    assert isinstance(info, sepp.ServerInfo), info
    assert took < FAST
    assert list(conn.requests) == [1, 3]
    assert peer.violations == []


# -- HPACK ---------------------------------------------------------------------------------


async def test_authorization_is_never_indexed_and_nothing_is_indexed_at_all() -> None:
    async with H2Peer() as peer, connected(peer.addr, api_key="s3cret-key") as client:
        await client.get_server_info()
        await client.enqueue(job("hpack"))
        await client.reserve(opts("hpack"))
        await client.get_server_info()
    conn = only(peer)
    assert len(conn.requests) == 4
    for request in conn.requests.values():
        block = request.headers
        kinds = [kind for kind, _ in block.representations]
        assert "incremental" not in kinds, block.representations
        # Only the static table (61 entries) is referred to: we never add to the
        # peer's dynamic table, so nothing there can be ours.
        assert all(i <= 61 for kind, i in block.representations if kind != "size_update")
        assert block.field("authorization") == Field("authorization", "Bearer s3cret-key", True)
        kind, _, offset = block.entry_of("authorization")
        assert kind == "never_indexed"
        assert block.raw[offset] & 0xF0 == 0x10  # RFC 7541 §6.2.3: 0001xxxx
    assert peer.violations == []


@pytest.mark.parametrize("when", ["in the first SETTINGS", "mid-connection"])
async def test_a_smaller_header_table_size_is_acknowledged_by_a_size_update(when: str) -> None:
    small = {Setting.HEADER_TABLE_SIZE: 0}
    first = {**DEFAULT_SETTINGS, **small} if when == "in the first SETTINGS" else DEFAULT_SETTINGS
    async with H2Peer(settings=first) as peer, connected(peer.addr) as client:
        await client.get_server_info()
        conn = only(peer)
        if when == "mid-connection":
            await conn.act(Settings(small))
            await peer.wait_until(lambda: len(conn.frames(FrameType.SETTINGS)) >= 3)
        await client.get_server_info()
        await client.get_server_info()
    blocks = [r.headers.representations for r in conn.requests.values()]
    changed = 0 if when == "in the first SETTINGS" else 1
    assert blocks[changed][0] == ("size_update", 0), blocks[changed]
    assert all(kind != "size_update" for block in blocks[changed + 1 :] for kind, _ in block)
    assert peer.violations == []


# -- what responses may look like ----------------------------------------------------------


def reply_with_job(request: Request) -> bytes:
    if request.method == "Reserve":
        return reserve_reply(job_record())
    return default_reply(request.method, request.message)


def framed_answer(message: bytes) -> list[Action]:
    """A correct answer in awkward frames: header blocks cut into 3-byte CONTINUATION
    frames, padding, the PRIORITY flag, PRIORITY and unknown frames between, the
    message in 1- to 7-byte DATA frames, padded trailers in CONTINUATION frames."""
    unknown = RawFrame(0xFA, 0xFF, b"ignore me")
    return [
        RawFrame(FrameType.PRIORITY, 0, struct.pack(">IB", 0, 7)),
        unknown,
        RawFrame(0xFB, 0, b"", stream=0),
        Headers(split=3, pad=9, priority=True),
        unknown,
        Data(grpc_message(message)[:1], pad=3),
        Data(grpc_message(message)[1:], split=7, pad=1),
        RawFrame(FrameType.PRIORITY, 0, struct.pack(">IB", 0x8000_0000, 200)),
        Data(b"", pad=20),
        Headers((("grpc-status", "0"), ("x-extra", "v" * 40)), end=True, split=5, pad=2),
    ]


async def test_continuation_padding_priority_and_unknown_frames_in_answers() -> None:
    def handler(request: Request) -> Sequence[Action]:
        return framed_answer(reply_with_job(request))

    async with H2Peer(handler) as peer, connected(peer.addr) as client:
        jobs = await client.reserve(opts("q"))
        ack = await client.enqueue(job("q"))
        info = await client.get_server_info()
    assert jobs is not None and [j.ctx.id for j in jobs] == [JOB_ID]
    assert isinstance(ack, EnqueueAck)
    assert info.version == "0.1.0"
    conn = only(peer)
    assert complaints(conn) == []
    assert peer.violations == []


async def test_a_trailers_only_answer_and_its_status() -> None:
    refusal = Headers((*OK_HEADERS, ("grpc-status", "5")), end=True)
    async with H2Peer(first_then_valid(refusal)) as peer, connected(peer.addr) as client:
        took, error = await elapsed(client.enqueue(job("q")))
        await client.get_server_info()
    assert isinstance(error, ClientError), error
    assert error.code is not None and error.code.name == "NOT_FOUND"
    assert took < FAST
    assert only(peer).resets() == []
    assert peer.violations == []


# -- RST_STREAM ------------------------------------------------------------------------------

RST_STATUS = {
    ErrorCode.NO_ERROR: "INTERNAL",
    ErrorCode.PROTOCOL_ERROR: "INTERNAL",
    ErrorCode.INTERNAL_ERROR: "INTERNAL",
    ErrorCode.FLOW_CONTROL_ERROR: "INTERNAL",
    ErrorCode.STREAM_CLOSED: "INTERNAL",
    ErrorCode.FRAME_SIZE_ERROR: "INTERNAL",
    ErrorCode.CANCEL: "CANCELLED",
    ErrorCode.COMPRESSION_ERROR: "INTERNAL",
    ErrorCode.CONNECT_ERROR: "INTERNAL",
    ErrorCode.ENHANCE_YOUR_CALM: "RESOURCE_EXHAUSTED",
    ErrorCode.INADEQUATE_SECURITY: "PERMISSION_DENIED",
    ErrorCode.HTTP_1_1_REQUIRED: "INTERNAL",
    0x99: "INTERNAL",  # a code RFC 9113 does not define
}


@pytest.mark.parametrize("code", sorted(RST_STATUS), ids=lambda c: getattr(c, "name", hex(c)))
@pytest.mark.parametrize("after_headers", [False, True], ids=["before", "after-headers"])
async def test_rst_stream_codes_map_to_grpc_statuses(code: int, after_headers: bool) -> None:
    actions = [Headers(), Reset(code)] if after_headers else [Reset(code)]
    async with H2Peer(first_then_valid(*actions)) as peer:
        async with connected(peer.addr, retry_policy=NO_RETRY) as client:
            took, error = await elapsed(client.ack(hand_ctx()))
            await client.get_server_info()
    assert isinstance(error, ClientError), error
    assert error.code is not None and error.code.name == RST_STATUS[code], error
    assert took < FAST
    conn = only(peer)  # a stream error leaves the connection up
    assert len(conn.requests) == 2
    assert complaints(conn) == []
    assert peer.violations == []


async def test_refused_stream_is_retried_transparently_on_a_new_stream() -> None:
    async with H2Peer(first_then_valid(Reset(ErrorCode.REFUSED_STREAM))) as peer:
        async with connected(peer.addr, retry_policy=NO_RETRY) as client:
            ack = await client.enqueue(job("refused"))  # no idempotency key
    assert isinstance(ack, EnqueueAck)
    first, second = peer.requests
    assert (first.conn.index, first.stream_id) != (second.conn.index, second.stream_id)
    assert first.message == second.message
    assert peer.violations == []


async def test_a_stream_refused_every_time_gives_up_retryably() -> None:
    peer = H2Peer(lambda request: [Reset(ErrorCode.REFUSED_STREAM)])
    async with peer, connected(peer.addr, retry_policy=NO_RETRY) as client:
        took, error = await elapsed(client.enqueue(job("refused")))
    assert isinstance(error, TransportError), error
    assert error.code is not None and error.code.name == "UNAVAILABLE"
    assert error.ambiguous is False
    assert is_retryable(error, all_keyed=False)  # even a keyless enqueue may be retried
    assert 2 <= len(peer.requests) <= 4  # the first try and at most 3 transparent retries
    assert took < FAST
    assert peer.violations == []


# -- GOAWAY ----------------------------------------------------------------------------------


def started(
    client: SeppClient, calls: Sequence[Callable[[SeppClient], Awaitable[Any]]]
) -> list[asyncio.Future[Any]]:
    return [asyncio.ensure_future(_result(call(client))) for call in calls]


async def _result(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except sepp.SeppError as error:
        return error


async def test_graceful_goaway_finishes_open_streams_and_retries_the_rest_elsewhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What grpc-core, hyper and nginx do on shutdown: GOAWAY(2^31-1), a PING round
    # trip, GOAWAY(last stream really taken), the answers of the streams taken, close.
    drained = asyncio.Event()

    async def handler(request: Request) -> Sequence[Action]:
        conn = request.conn
        if conn.index > 0:
            return answer(reply_with_job(request))
        await request.conn.peer.wait_until(
            lambda: len([r for r in conn.requests.values() if r.ended]) == 4
        )
        taken = sorted(conn.requests)[1]
        if request.stream_id == min(conn.requests):
            for action in (GoAway(MAX_STREAM_ID), Ping(b"drain-01", wait_ack=True), GoAway(taken)):
                await conn.act(action)
            drained.set()
        await asyncio.wait_for(drained.wait(), 10)
        if request.stream_id <= taken:
            return answer(reply_with_job(request))
        return []  # never processed: no answer ever comes

    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    calls: list[Callable[[SeppClient], Awaitable[Any]]] = [
        lambda c: c.reserve(opts("drain")),
        *(lambda c, i=i: c.enqueue(job(f"drain{i}")) for i in range(3)),
    ]
    # One RPC per enqueue() call: this test counts streams, which coalescing merges.
    async with H2Peer(handler) as peer:
        async with connected(
            peer.addr, coalesce_enqueues=False, retry_policy=NO_RETRY, rpc_timeout=10
        ) as client:
            caplog.clear()
            results = await asyncio.gather(*started(client, calls))
            old = peer.conns[0]
            await asyncio.wait_for(old.closed.wait(), 5)
            info = await client.get_server_info()
    jobs, *acks = results
    assert isinstance(jobs, list) and [j.ctx.id for j in jobs] == [JOB_ID], jobs
    assert all(isinstance(a, EnqueueAck) for a in acks), acks
    assert isinstance(info, sepp.ServerInfo)
    old, new = peer.conns
    assert len(old.requests) == 4 and old.streams_after_goaway == []
    taken = sorted(old.requests)[1]
    not_processed = {old.requests[s].message for s in old.requests if s > taken}
    assert {r.message for r in new.requests.values()} >= not_processed
    assert [r.method for r in new.requests.values()][
        -1
    ] == "GetServerInfo"  # next call: new connection
    assert old.client_eof  # the client closed the drained connection itself
    assert sepp_records(caplog, logging.DEBUG) == []
    assert peer.violations == []


async def test_goaway_with_an_error_fails_taken_streams_and_retries_the_others() -> None:
    async def handler(request: Request) -> Sequence[Action]:
        conn = request.conn
        if conn.index > 0:
            return valid_answer(request)
        await conn.peer.wait_until(lambda: len([r for r in conn.requests.values() if r.ended]) == 3)
        if request.stream_id == min(conn.requests):
            return [GoAway(min(conn.requests), ErrorCode.INTERNAL_ERROR, b"shutting down")]
        return []

    queues = ["err0", "err1", "err2"]
    # One RPC per enqueue() call: this test counts streams, which coalescing merges.
    async with H2Peer(handler) as peer:
        async with connected(
            peer.addr, coalesce_enqueues=False, retry_policy=NO_RETRY, rpc_timeout=10
        ) as client:
            took, results = await elapsed(
                asyncio.gather(*started(client, [lambda c, q=q: c.enqueue(job(q)) for q in queues]))
            )
            old = peer.conns[0]
            await asyncio.wait_for(old.closed.wait(), 5)
    by_queue = dict(zip(queues, results))
    taken = queue_of(old.requests[min(old.requests)])
    failed = by_queue.pop(taken)
    assert isinstance(failed, TransportError), failed
    assert failed.code is not None and failed.code.name == "UNAVAILABLE"
    assert failed.ambiguous is True
    assert all(isinstance(r, EnqueueAck) for r in by_queue.values()), by_queue
    assert took < FAST
    assert sorted(queue_of(r) for r in peer.conns[1].requests.values()) == sorted(by_queue)
    assert old.client_eof
    assert peer.violations == []


async def test_too_many_pings_doubles_the_keepalive_interval_of_later_connections(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    async with H2Peer() as peer:
        async with connected(peer.addr, keepalive_time=0.2, keepalive_timeout=5) as client:
            await client.get_server_info()
            first = peer.conns[0]
            await peer.wait_until(lambda: len(pings(first)) >= 2, timeout=5)
            await first.act(GoAway(1, ErrorCode.ENHANCE_YOUR_CALM, b"too_many_pings"))
            await first.act(Close())
            await peer.wait_until(first.closed.is_set, timeout=5)
            await client.get_server_info()
            second = peer.conns[1]
            await peer.wait_until(lambda: len(pings(second)) >= 4, timeout=10)
    assert statistics.median(intervals(pings(first))) >= 0.15
    assert statistics.median(intervals(pings(second))) >= 0.35  # 0.4 s now
    warnings = sepp_records(caplog, logging.INFO)
    assert any("too_many_pings" in w or "keepalive" in w for w in warnings), warnings
    assert peer.violations == []


def pings(conn: PeerConnection) -> list[float]:
    """When the client's own PINGs (not ACKs) arrived."""
    return [f.at for f in conn.frames(FrameType.PING) if not f.has(ACK)]


def intervals(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


# -- PING, keepalive, SETTINGS ACK -------------------------------------------------------------


async def test_a_ping_from_the_peer_is_acked_with_the_same_bytes() -> None:
    payload = bytes([0, 1, 2, 0x7F, 0x80, 0xFE, 0xFF, 9])
    async with H2Peer() as peer, connected(peer.addr, keepalive_time=30) as client:
        await client.get_server_info()
        conn = only(peer)
        await conn.act(Ping(payload, wait_ack=True))
        await client.get_server_info()
    acks = [f.payload for f in conn.frames(FrameType.PING) if f.has(ACK)]
    assert acks == [payload]
    assert peer.violations == []


async def test_keepalive_pings_go_out_at_keepalive_time_while_idle() -> None:
    peer = H2Peer()
    async with peer, connected(peer.addr, keepalive_time=0.2, keepalive_timeout=2) as client:
        conn = only(peer)
        await peer.wait_until(lambda: len(pings(conn)) >= 4, timeout=5)
        assert not conn.closed.is_set() and conn.goaways() == []
        await client.get_server_info()
    assert 0.15 <= statistics.median(intervals(pings(conn))) < 0.2 + FAST
    assert len(conn.requests) == 1  # answered PINGs keep the connection
    assert peer.violations == []


async def test_an_unanswered_ping_drops_the_connection_after_keepalive_timeout() -> None:
    peer = H2Peer(first_then_valid(Hang()), answer_pings=False)
    async with (
        peer,
        connected(peer.addr, keepalive_time=0.2, keepalive_timeout=0.3, rpc_timeout=10) as client,
    ):
        took, error = await elapsed(client.reserve(opts("q", wait=5)))
        first = peer.conns[0]
        await asyncio.wait_for(first.closed.wait(), 5)
        info = await client.get_server_info()
    assert isinstance(error, TransportError), error
    assert error.code is not None and error.code.name == "UNAVAILABLE"
    assert error.ambiguous is True
    assert 0.2 <= took < 0.5 + FAST
    assert "Reserve" in str(error)
    assert first.client_eof
    assert isinstance(info, sepp.ServerInfo) and peer.connections == 2
    assert peer.violations == []


async def test_settings_never_acked_end_in_goaway_settings_timeout() -> None:
    peer = H2Peer(ack_settings=False)
    async with peer, connected(peer.addr, keepalive_time=30, keepalive_timeout=0.3):
        conn = only(peer)
        took, _ = await elapsed(asyncio.wait_for(conn.closed.wait(), 5))
    assert [code for _, code, _ in conn.goaways()] == [ErrorCode.SETTINGS_TIMEOUT]
    assert conn.client_eof
    assert took < 0.3 + FAST


# -- the connection lost, and peers that break the protocol -----------------------------------


@pytest.mark.parametrize("ending", [Close(), Abort()], ids=["EOF", "TCP reset"])
async def test_a_lost_connection_fails_the_call_ambiguously_and_the_next_call_reconnects(
    ending: Action,
) -> None:
    async with H2Peer(first_then_valid(Headers(), ending)) as peer:
        async with connected(peer.addr, retry_policy=NO_RETRY) as client:
            took, error = await elapsed(client.ack(hand_ctx()))
            info = await client.get_server_info()
    assert isinstance(error, TransportError), error
    assert error.code is not None and error.code.name == "UNAVAILABLE"
    assert error.ambiguous is True
    assert "Ack" in str(error) and peer.addr in str(error)
    assert took < FAST
    assert isinstance(info, sepp.ServerInfo) and peer.connections == 2
    assert peer.violations == []


def _block(*fields: tuple[str, str]) -> bytes:
    return bytes(hpack.Encoder().encode(list(fields)))


OK_BLOCK = _block((":status", "200"), ("content-type", "application/grpc"))

# What the peer sends on the call's stream (after the request arrived), and the GOAWAY
# code the client must answer with (None: the peer closed, so none is expected).
VIOLATIONS: dict[str, tuple[list[Action], Optional[int]]] = {
    "DATA on stream 0": (
        [Headers(), RawFrame(FrameType.DATA, 0, b"x", stream=0)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "a frame inside a header block": (
        [Headers(end_headers=False), RawFrame(FrameType.PING, 0, b"12345678", stream=0)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "CONTINUATION without HEADERS": (
        [RawFrame(FrameType.CONTINUATION, END_HEADERS, OK_BLOCK)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "PUSH_PROMISE": (
        [RawFrame(FrameType.PUSH_PROMISE, END_HEADERS, struct.pack(">I", 2) + OK_BLOCK)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "HEADERS on an even stream": (
        [RawFrame(FrameType.HEADERS, END_HEADERS, OK_BLOCK, stream=2)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "DATA on a stream never opened": (
        [Headers(), RawFrame(FrameType.DATA, 0, b"x", stream=101)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1": (
        [Settings({Setting.INITIAL_WINDOW_SIZE: 2**31})],
        ErrorCode.FLOW_CONTROL_ERROR,
    ),
    "SETTINGS_MAX_FRAME_SIZE under 16384": (
        [Settings({Setting.MAX_FRAME_SIZE: 16_383})],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "SETTINGS_ENABLE_PUSH of 2": ([Settings({Setting.ENABLE_PUSH: 2})], ErrorCode.PROTOCOL_ERROR),
    "SETTINGS of 7 bytes": (
        [RawFrame(FrameType.SETTINGS, 0, b"\0" * 7, stream=0)],
        ErrorCode.FRAME_SIZE_ERROR,
    ),
    "SETTINGS on a stream": (
        [RawFrame(FrameType.SETTINGS, 0, b"", stream=1)],
        ErrorCode.PROTOCOL_ERROR,
    ),
    "PING of 3 bytes": (
        [RawFrame(FrameType.PING, 0, b"abc", stream=0)],
        ErrorCode.FRAME_SIZE_ERROR,
    ),
    "connection window overflow": (
        [WindowUpdate(MAX_WINDOW), WindowUpdate(MAX_WINDOW)],
        ErrorCode.FLOW_CONTROL_ERROR,
    ),
    "connection WINDOW_UPDATE of 0": ([WindowUpdate(0)], ErrorCode.PROTOCOL_ERROR),
    "a header block that does not decode": (
        [Headers(block=b"\xff\xff\xff\xff\xff\x7f")],
        ErrorCode.COMPRESSION_ERROR,
    ),
    "DATA over our MAX_FRAME_SIZE": (
        [Headers(), RawFrame(FrameType.DATA, 0, b"\0" * 16_385)],
        ErrorCode.FRAME_SIZE_ERROR,
    ),
    "HEADERS over our MAX_FRAME_SIZE": (
        [Headers(block=_block((":status", "200"), ("x-big", long_key(30_000))))],
        ErrorCode.FRAME_SIZE_ERROR,
    ),
    "truncated frames then EOF": (
        [Headers(), Raw(frame_header(100, FrameType.DATA, 0, 1) + b"\0\0\0"), Close(half=True)],
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
async def test_a_protocol_violation_closes_the_connection_with_the_right_goaway(case: str) -> None:
    actions, code = VIOLATIONS[case]
    async with H2Peer(first_then_valid(*actions, Hang())) as peer:
        async with connected(peer.addr, retry_policy=NO_RETRY, rpc_timeout=5) as client:
            took, error = await elapsed(client.get_server_info())
            first = peer.conns[0]
            await asyncio.wait_for(first.closed.wait(), 5)
            info = await client.get_server_info()
    assert isinstance(error, TransportError), error
    assert error.code is not None and error.code.name == "UNAVAILABLE"
    assert error.ambiguous is True
    assert "HTTP/2 protocol error" in str(error)
    assert took < FAST
    if code is not None:
        assert [c for _, c, _ in first.goaways()] == [code]
    assert first.client_eof
    assert isinstance(info, sepp.ServerInfo) and peer.connections == 2  # a new connection
    assert peer.violations == []


async def test_a_response_over_max_receive_fails_at_once_and_is_never_buffered() -> None:
    # The answer declares 64 MiB against a limit of 1 MiB. The peer goes on sending as
    # much as the client's windows let it (ignoring the client's RST_STREAM): none of
    # it may be kept.
    declared = 64 << 20
    done = asyncio.Event()
    chunk = b"\0" * 16_384
    count = declared // len(chunk)
    flood = Flood(FrameType.DATA, chunk, count, flow=True, stall=0.5, ignore_reset=True)
    script = (Headers(), Data(grpc_message(b"", declared=declared)), flood, Signal(done))
    async with H2Peer(first_then_valid(*script)) as peer:
        async with connected(
            peer.addr, max_receive_message_bytes=1 << 20, rpc_timeout=10
        ) as client:
            async with memory_peak() as peak:
                took, error = await elapsed(client.get_server_info())
                await asyncio.wait_for(done.wait(), 20)
            info = await client.get_server_info()
    assert isinstance(error, ResponseTooLargeError), error
    assert error.size == declared and error.limit == 1 << 20
    assert took < FAST
    first = peer.conns[0]
    assert (1, ErrorCode.CANCEL) in first.resets()
    bound = 4 << 20 if peak.traced else 64 << 20  # traced bytes, or the resident set
    assert peak.bytes < bound, f"peak {peak.bytes} bytes while the peer sent {first.flooded}"
    assert isinstance(info, sepp.ServerInfo)
    assert peer.violations == []
