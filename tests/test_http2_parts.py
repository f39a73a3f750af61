"""The parts of the HTTP/2 connection, each on its own: the window-update rule, the
frame reader and its header-block limits, the peer's SETTINGS record, the stream slots,
the timers, and the write scheduler (ACK flood accounting, DATA in turns).

The connection's behaviour on the wire, with all of them together, is in
test_http2_peer.py, test_http2_sharing.py and test_http2_fuzz.py; these tests pin the
rules that can now be driven without a socket."""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sepp_lite._wire.grpc import Reader
from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._config import DEFAULT_CONFIG
from sepp_lite._wire.http2._connection import _READ_BUFFER
from sepp_lite._wire.http2._flow import DATA_CHUNK, window_increment
from sepp_lite._wire.http2._reader import (
    FrameReader,
    HandshakeFailure,
    HeaderBlock,
    ProtocolViolation,
)
from sepp_lite._wire.http2._settings import PeerSettings
from sepp_lite._wire.http2._slots import StreamSlots
from sepp_lite._wire.http2._stream import Stream
from sepp_lite._wire.http2._timers import Deadlines, Timer
from sepp_lite._wire.http2._writer import ACK_BATCH, Writer

# -- the window-update rule ----------------------------------------------------------------


def test_a_window_is_reopened_only_once_half_of_it_is_consumed() -> None:
    assert window_increment(100, 100) == 0
    assert window_increment(100, 51) == 0  # 49 consumed: not yet
    assert window_increment(100, 50) == 50  # half: everything consumed comes back
    assert window_increment(100, 0) == 100
    assert window_increment(65_535, 65_535 - 32_767) == 32_767  # half, rounded down


@settings(max_examples=200, deadline=None)
@given(
    initial=st.integers(min_value=2, max_value=1 << 20),
    fractions=st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=60),
)
def test_a_peer_that_respects_the_window_is_never_stalled_and_rarely_updated(
    initial: int, fractions: list[float]
) -> None:
    available = initial
    consumed = updates = 0
    for fraction in fractions:
        size = int(available * fraction)  # the peer sends no more than the window
        available -= size
        consumed += size
        increment = window_increment(initial, available)
        if increment:
            updates += 1
            available += increment
            assert available == initial  # all of it back, in one frame
        # Never less than half the window left: the peer keeps sending while ours
        # is under way (the update leaves once half is consumed).
        assert available > initial - initial // 2 or available == initial
    assert updates <= consumed // (initial // 2)  # one update per half window at most


# -- the frame reader ------------------------------------------------------------------------


class Sink:
    """What the reader hands the connection, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self.stop_on_control = False  # as a connection that a control frame closed

    def reader(self, max_block: int = 1 << 20) -> FrameReader:
        reader = FrameReader(
            max_frame=f.DEFAULT_MAX_FRAME,
            max_block=max_block,
            on_data=lambda *a: self.events.append(("data", *a)),
            check_stream=lambda *a: self.events.append(("check", *a)),
            on_header_block=lambda *a: self.events.append(("block", *a)),
            on_control=lambda *a: self.on_control(reader, *a),
        )
        return reader

    def on_control(self, reader: FrameReader, *frame: object) -> None:
        self.events.append(("control", *frame))
        if self.stop_on_control:
            reader.stopped = True


_OPENING = f.settings({f.MAX_CONCURRENT_STREAMS: 10})
_ANSWER = (
    f.frame(f.HEADERS, 0, 1, b"\x88")  # a block cut in three
    + f.frame(f.CONTINUATION, 0, 1, b"ab")
    + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"cd")
    + f.frame(f.DATA, f.PADDED, 1, b"\x02xyz\0\0")
    + f.ping(b"12345678")
    + f.frame(
        f.HEADERS,
        f.END_HEADERS | f.END_STREAM | f.PADDED | f.PRIORITY_FLAG,
        1,
        b"\x01" + b"\0\0\0\0\x10" + b"\x89" + b"\0",
    )
)
_EXPECTED = [
    ("control", f.SETTINGS, 0, 0, _OPENING[9:]),
    ("check", 1, "HEADERS"),
    ("block", 1, b"\x88abcd", False),
    ("data", f.PADDED, 1, b"\x02xyz\0\0"),  # DATA padding counts against windows: kept
    ("control", f.PING, 0, 0, b"12345678"),
    ("check", 1, "HEADERS"),
    ("block", 1, b"\x89", True),
]


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(_OPENING + _ANSWER))))
def test_frames_cut_anywhere_by_reads_arrive_whole_and_in_order(cuts: list[int]) -> None:
    sink = Sink()
    reader = sink.reader()
    data = _OPENING + _ANSWER
    points = sorted({0, len(data), *cuts})
    for start, end in zip(points, points[1:]):
        reader.feed(data[start:end])
    assert sink.events == _EXPECTED
    assert not reader.buffer and reader.block is None


def test_the_first_bytes_tell_an_http1_or_tls_server_and_only_the_first() -> None:
    for answer, tls in ((b"HTTP/1.1 400 Bad Request\r\n\r\n", None), (b"\x15\x03\x01\0\x02", True)):
        reader = Sink().reader()
        with pytest.raises(HandshakeFailure) as caught:
            reader.feed(answer)
        assert caught.value.server_uses_tls is tls
    sink = Sink()
    reader = sink.reader()
    reader.feed(_OPENING[:5])  # inconclusive: kept until more comes
    assert reader.buffer == _OPENING[:5] and sink.events == []
    reader.feed(_OPENING[5:] + f.ping(b"HTTP/1.1"))  # after SETTINGS: frames, not a server
    assert [e[0] for e in sink.events] == ["control", "control"]
    with pytest.raises(HandshakeFailure, match="first frame was not SETTINGS"):
        Sink().reader().feed(f.ping(b"12345678"))


def test_a_header_block_is_bounded_from_its_first_fragment_to_its_last() -> None:
    HeaderBlock(1, False, b"x" * 100, limit=100).add(f.CONTINUATION, 1, b"")  # at the limit
    with pytest.raises(ProtocolViolation) as caught:
        HeaderBlock(1, False, b"x" * 101, limit=100)
    assert caught.value.code == f.ENHANCE_YOUR_CALM
    block = HeaderBlock(1, False, b"x" * 60, limit=100)
    block.add(f.CONTINUATION, 1, b"y" * 40)
    with pytest.raises(ProtocolViolation, match="over 100 bytes"):
        block.add(f.CONTINUATION, 1, b"z")
    # Through the reader: the limit holds across CONTINUATION frames.
    reader = Sink().reader(max_block=100)
    reader.feed(_OPENING + f.frame(f.HEADERS, 0, 1, b"x" * 60))
    with pytest.raises(ProtocolViolation) as caught:
        reader.feed(f.frame(f.CONTINUATION, 0, 1, b"y" * 41))
    assert caught.value.code == f.ENHANCE_YOUR_CALM


@pytest.mark.parametrize(
    "intruder",
    [f.frame(f.CONTINUATION, f.END_HEADERS, 3, b"x"), f.ping(b"12345678"), f.data(1, b"x", True)],
    ids=["another stream", "a ping", "data"],
)
def test_nothing_may_come_between_the_fragments_of_a_header_block(intruder: bytes) -> None:
    sink = Sink()
    reader = sink.reader()
    reader.feed(_OPENING + f.frame(f.HEADERS, 0, 1, b"\x88"))
    with pytest.raises(ProtocolViolation, match="interrupted") as caught:
        reader.feed(intruder)
    assert caught.value.code == f.PROTOCOL_ERROR
    assert [e[0] for e in sink.events] == ["control", "check"]  # no block, no intruder


def test_a_stopped_reader_delivers_no_later_frame_of_the_same_read() -> None:
    sink = Sink()
    reader = sink.reader()
    reader.feed(_OPENING)
    sink.events.clear()
    sink.stop_on_control = True
    reader.feed(f.ping(b"11111111") + f.ping(b"22222222"))
    assert sink.events == [("control", f.PING, 0, 0, b"11111111")]


# -- the peer's SETTINGS -------------------------------------------------------------------


def test_peer_settings_move_the_stream_windows_by_the_change_and_owe_one_table_update() -> None:
    peer = PeerSettings()
    assert peer.apply(f.INITIAL_WINDOW_SIZE, 1000) == 1000 - f.DEFAULT_WINDOW
    assert peer.apply(f.INITIAL_WINDOW_SIZE, 5000) == 4000
    assert peer.apply(f.MAX_CONCURRENT_STREAMS, 7) == 0 and peer.max_streams == 7
    assert peer.apply(f.HEADER_TABLE_SIZE, 8192) == 0 and peer.table_update == b""
    peer.apply(f.HEADER_TABLE_SIZE, 100)  # smaller than the 4096 assumed: say we fit
    assert peer.table_update == b"\x20"
    peer.table_update = b""  # the connection sent it with its next block
    peer.apply(f.HEADER_TABLE_SIZE, 50)  # our table is 0 already: nothing owed
    assert peer.table_update == b""
    for key, value, code in (
        (f.INITIAL_WINDOW_SIZE, 2**31, f.FLOW_CONTROL_ERROR),
        (f.MAX_FRAME_SIZE, f.DEFAULT_MAX_FRAME - 1, f.PROTOCOL_ERROR),
        (f.ENABLE_PUSH, 1, f.PROTOCOL_ERROR),
    ):
        with pytest.raises(ProtocolViolation) as caught:
            peer.apply(key, value)
        assert caught.value.code == code
    assert peer.apply(0xFF, 1) == 0  # unknown: ignored


# -- stream slots ----------------------------------------------------------------------------


async def test_slots_go_to_waiters_in_order_and_a_woken_cancelled_one_gives_its_back() -> None:
    loop = asyncio.get_running_loop()
    slots = StreamSlots(loop)
    never = loop.time() + 60
    order: list[int] = []

    async def call(n: int) -> None:
        await slots.wait(never, lambda: AssertionError("no deadline here"))
        order.append(n)

    tasks = [asyncio.create_task(call(n)) for n in range(3)]
    await asyncio.sleep(0)
    slots.wake(room=1)
    assert slots.reserved == 1  # promised to call 0, which has not run yet
    tasks[0].cancel()  # ... and never will: its slot must come back
    await asyncio.gather(tasks[0], return_exceptions=True)
    assert slots.reserved == 0 and len(slots.waiters) == 2
    slots.wake(room=2)
    await asyncio.gather(*tasks[1:])
    assert order == [1, 2] and slots.reserved == 0


async def test_a_slot_waiter_fails_with_what_the_connection_decides() -> None:
    loop = asyncio.get_running_loop()
    slots = StreamSlots(loop)
    with pytest.raises(TimeoutError, match="deadline"):
        await slots.wait(loop.time() + 0.01, lambda: TimeoutError("deadline"))
    assert not slots.waiters
    waiters = [asyncio.ensure_future(slots.wait(loop.time() + 60, RuntimeError)) for _ in range(2)]
    await asyncio.sleep(0)
    slots.fail_all(lambda: ConnectionError("draining"))
    failures = await asyncio.gather(*waiters, return_exceptions=True)
    assert [type(e) for e in failures] == [ConnectionError, ConnectionError]
    assert failures[0] is not failures[1]  # each its own traceback


# -- timers ----------------------------------------------------------------------------------


async def test_a_timer_runs_once_and_restarting_it_moves_it() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    done = asyncio.Event()

    def callback() -> None:
        fired.append(loop.time())
        done.set()

    timer = Timer(loop, callback)
    timer.start(30)
    timer.start(0.01)  # moved, not added
    assert timer.running
    await asyncio.wait_for(done.wait(), 5)
    assert len(fired) == 1 and not timer.running
    timer.start(0.01)
    timer.cancel()
    timer.cancel()
    await asyncio.sleep(0.05)
    assert len(fired) == 1 and not timer.running


class ManualHandle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoop:
    """What ``Deadlines`` uses of a loop (``time``, ``call_at``), on a clock the test
    moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[ManualHandle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> ManualHandle:
        handle = ManualHandle(when, callback)
        self.handles.append(handle)
        return handle

    def advance(self, to: float) -> None:
        """Run the due timers in order, each at its own time, then stand at ``to``."""
        while True:
            due = [h for h in self.handles if not h.cancelled and h.when <= to]
            if not due:
                break
            handle = min(due, key=lambda h: h.when)
            self.handles.remove(handle)
            self.now = max(self.now, handle.when)
            handle.callback()
        self.now = to


# An operation: add a call (its deadline), end the call added i-th (if not ended), or
# move the clock forward.
_deadline_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.floats(0, 20, allow_nan=False)),
        st.tuples(st.just("end"), st.integers(0, 200)),
        st.tuples(st.just("wait"), st.floats(0, 5, allow_nan=False)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(_deadline_ops)
def test_one_timer_expires_each_open_call_at_its_deadline_and_no_ended_one(
    ops: list[tuple[str, float]],
) -> None:
    loop = ManualLoop()
    open_calls: dict[int, float] = {}  # key: deadline
    added: list[int] = []
    expired: list[tuple[int, float]] = []  # key, when
    deadline_of: dict[int, float] = {}

    def expire(key: int) -> None:
        assert key in open_calls
        expired.append((key, loop.now))
        del open_calls[key]
        if key % 3 == 0:  # as a retry would: a new call, from inside the expiry
            add(1.0 + key % 7)

    def add(timeout: float) -> None:
        key = len(added)
        added.append(key)
        deadline = loop.now + timeout
        open_calls[key] = deadline_of[key] = deadline
        deadlines.add(deadline, key, key, len(open_calls))
        # Entries of ended calls are dropped once they outnumber the open ones.
        assert len(deadlines._entries) <= 2 * len(open_calls) + 65

    deadlines = Deadlines(
        loop,  # type: ignore[arg-type]
        lambda item: item in open_calls,
        expire,
    )
    for op, value in ops:
        if op == "add":
            add(value)
        elif op == "end":
            if value < len(added):
                open_calls.pop(added[int(value)], None)
        else:
            loop.advance(loop.now + value)
            # Every open call whose deadline came has expired, at its deadline.
            assert all(deadline > loop.now for deadline in open_calls.values())
    # Each expired once, at its own deadline (the clock stood still meanwhile).
    assert len({key for key, _ in expired}) == len(expired)
    assert all(when == deadline_of[key] for key, when in expired)
    deadlines.cancel()
    assert not [h for h in loop.handles if not h.cancelled]


def test_calls_ended_behind_a_long_one_leave_no_growing_backlog() -> None:
    loop = ManualLoop()
    live = {0}
    deadlines = Deadlines(loop, lambda item: item in live, lambda item: None)  # type: ignore[arg-type]
    deadlines.add(1000.0, 0, 0, 1)  # a long poll, at the front for all that follows
    for key in range(1, 5000):
        live.add(key)
        deadlines.add(30.0 + key / 1000, key, key, len(live))
        live.discard(key)  # answered at once
    assert len(deadlines._entries) <= 2 * len(live) + 65


def test_expired_calls_are_told_at_their_deadline_not_before() -> None:
    loop = ManualLoop()
    told: list[tuple[str, float]] = []
    live = {"a", "b", "c"}
    deadlines = Deadlines(
        loop,  # type: ignore[arg-type]
        lambda item: item in live,
        lambda item: told.append((item, loop.now)),
    )
    deadlines.add(5.0, 1, "a", 1)
    deadlines.add(2.0, 2, "b", 2)  # earlier: the timer moves to it
    deadlines.add(9.0, 3, "c", 3)
    live.discard("a")  # ended before its deadline: never told
    loop.advance(1.9)
    assert told == []
    loop.advance(10.0)
    assert told == [("b", 2.0), ("c", 9.0)]


# -- the write scheduler ---------------------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """Records writes; ``unsent`` is what the socket has not taken yet (``takes_all``:
    the socket of a peer that reads, which takes every write at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.unsent = 0
        self.takes_all = False
        self.writer: Optional[Writer] = None
        self.pause_after: Optional[int] = None  # bytes after which it is backed up

    def write(self, data: bytes | bytearray | memoryview) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))
        if not self.takes_all:
            self.unsent += len(data)
        if self.pause_after is not None and self.unsent > self.pause_after and self.writer:
            self.writer.paused = True

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.unsent


def _writer(max_acks: int = 3) -> tuple[Writer, FakeTransport]:
    writer = Writer(asyncio.get_running_loop(), max_acks)
    transport = FakeTransport()
    writer.transport = transport
    transport.writer = writer
    return writer, transport


async def test_only_acks_the_socket_has_not_taken_count_towards_a_flood() -> None:
    writer, transport = _writer(max_acks=3)
    transport.unsent = 10**6  # a large upload the peer reads slowly: not a flood by itself
    for _ in range(3):
        writer.answer(f.SETTINGS_ACK)
        writer.flush()
    with pytest.raises(ProtocolViolation) as caught:
        writer.answer(f.SETTINGS_ACK)  # three ACKs still in the socket: a flood
    assert caught.value.code == f.ENHANCE_YOUR_CALM
    transport.unsent = 0  # the peer read everything: its next PING is answered
    writer.answer(f.ping(b"12345678", ack=True))
    assert writer.out == [f.ping(b"12345678", ack=True)]


async def test_the_acks_one_read_asks_for_reach_the_socket_as_they_are_made() -> None:
    # 20,000 PINGs in one read (no flush between the ACKs) from a peer that reads:
    # every one is answered, in writes of ACK_BATCH, and none waits for the read's end.
    writer, transport = _writer(max_acks=1000)
    transport.takes_all = True
    ack = f.ping(b"12345678", ack=True)
    for _ in range(20_000):
        writer.answer(ack)
        assert len(writer.out) <= ACK_BATCH
    writer.flush()
    assert b"".join(transport.writes) == ack * 20_000
    assert {len(w) for w in transport.writes[:-1]} == {ACK_BATCH * len(ack)}


async def test_the_acks_a_peer_never_reads_stay_within_the_bound() -> None:
    writer, transport = _writer(max_acks=1000)
    ack = f.ping(b"12345678", ack=True)
    with pytest.raises(ProtocolViolation):
        for _ in range(20_000):
            writer.answer(ack)
    held = transport.unsent + sum(map(len, writer.out))
    assert 1000 * len(ack) - ACK_BATCH * len(ack) <= held <= 1000 * len(ack)


def test_one_read_cannot_ask_for_as_many_acks_as_make_a_flood() -> None:
    # The smallest frame that asks for an ACK is an empty SETTINGS, 9 bytes; a read
    # also carries the start of a frame an earlier read cut off.
    most_in_one_read = (_READ_BUFFER + f.FRAME_HEADER - 1) // f.FRAME_HEADER
    assert DEFAULT_CONFIG.max_outstanding_acks > most_in_one_read


def _stream(stream_id: int, send_window: int) -> Stream:
    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    return Stream(stream_id, future, send_window, 65_535, Reader(1 << 20))


def _data_frames(writes: list[bytes]) -> list[tuple[int, int, bool]]:
    """(stream id, size, END_STREAM) of each DATA frame written."""
    data = b"".join(writes)
    frames = []
    while data:
        length = int.from_bytes(data[:3], "big")
        if data[3] == f.DATA:
            frames.append((f.u32(data, 5), length, bool(data[4] & f.END_STREAM)))
        data = data[9 + length :]
    return frames


async def test_control_frames_go_first_and_large_requests_take_turns_by_chunks() -> None:
    writer, transport = _writer()
    queue = writer.data
    queue.window = 10 * DATA_CHUNK
    one, three = _stream(1, 10 * DATA_CHUNK), _stream(3, 10 * DATA_CHUNK)
    assert queue.send(one, b"a" * (2 * DATA_CHUNK + 5)) == b""  # waits for its turns
    assert queue.send(three, b"b" * (DATA_CHUNK + 1)) == b""
    small = _stream(5, 10 * DATA_CHUNK)
    assert queue.send(small, b"c" * 10) == f.frame(f.DATA, f.END_STREAM, 5, b"c" * 10)
    writer.out.append(f.ping(b"12345678"))
    writer.flush()
    assert transport.writes[0] == f.ping(b"12345678")  # ahead of every chunk
    assert _data_frames(transport.writes) == [
        (1, DATA_CHUNK, False),
        (3, DATA_CHUNK, False),
        (1, DATA_CHUNK, False),
        (3, 1, True),
        (1, 5, True),
    ]
    assert queue.window == 10 * DATA_CHUNK - (2 * DATA_CHUNK + 5) - (DATA_CHUNK + 1) - 10


async def test_request_data_stops_when_the_socket_backs_up_and_waits_for_its_window() -> None:
    writer, transport = _writer()
    transport.pause_after = 1  # backed up after the first write
    queue = writer.data
    queue.window = 1 << 24
    big = _stream(1, 1 << 24)
    queue.send(big, b"x" * (8 * DATA_CHUNK))
    writer.flush()
    assert sum(size for _, size, _ in _data_frames(transport.writes)) == 4 * DATA_CHUNK
    writer.paused = False  # resume_writing
    writer.flush()
    assert sum(size for _, size, _ in _data_frames(transport.writes)) == 8 * DATA_CHUNK
    # A stream whose own window is used up waits outside the turns until it reopens.
    transport.pause_after = None
    writer.paused = False
    small = _stream(3, 100)
    queue.send(small, b"y" * 300)
    writer.flush()
    assert queue.blocked == {3: small} and small.send_window == 0
    queue.open_stream(small, 1000)
    writer.flush()
    assert _data_frames(transport.writes)[-1] == (3, 200, True)
