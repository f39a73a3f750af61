"""Concurrent ``enqueue()`` calls share EnqueueBatch calls (``sepp_lite/_coalesce.py``):
fewer calls than callers, each caller with its own result, rejection, cancellation,
deadline and retry decision; a lone call goes out at once; waiting calls are bounded;
the switch turns it off. Real sockets to the in-process server (the scripted one where
a test needs to see each request), over both client transports.

The module turns coalescing on through ``SEPP_LITE_COALESCE`` (CI also runs the client
suite with it off), except where a test is about the switch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable
from typing import Any, Callable, Optional

import pytest
from grpclib.exceptions import GRPCError

from sepp_lite import (
    EnqueueAck,
    EnqueueRequest,
    JobRejectedError,
    Payload,
    RetryPolicy,
    SeppClient,
    TransportError,
    errors,
)
from sepp_lite._codec.enqueue import decode_enqueue_batch_request
from sepp_lite.errors import Status
from sepp_lite.sync import SeppClient as BlockingClient
from sepp_lite.testing import (
    QueueConfig,
    QueueState,
    SeppServerThread,
    SeppTestServer,
    ServerConfig,
)
from tests.client_helpers import (
    NO_GRPCIO,
    ScriptedServer,
    connected,
    default_reply,
    opts,
    unique_queue,
    until,
    until_sync,
)

pytestmark = [pytest.mark.both_transports, pytest.mark.timeout(60)]

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)


@pytest.fixture(autouse=True)
def coalescing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEPP_LITE_COALESCE", "1")


class Gate:
    """A ``before_call`` hook for EnqueueBatch: counts the calls, holds those it is
    told to hold until :meth:`open`, and notes the most held at once."""

    def __init__(self, hold: Callable[[int], bool] = lambda number: False) -> None:
        self.calls = 0
        self.held = 0
        self.most_held = 0
        self.cancelled = 0
        self._hold = hold
        self._open = asyncio.Event()

    def open(self) -> None:
        self._open.set()

    async def __call__(self) -> None:
        self.calls += 1
        if not self._hold(self.calls):
            return
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        try:
            await self._open.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.held -= 1


def gated(server: SeppTestServer, hold: Callable[[int], bool] = lambda number: False) -> Gate:
    gate = Gate(hold)
    server.before_call("EnqueueBatch", gate)
    return gate


def spawn(calls: list[Awaitable[Any]]) -> list[asyncio.Future[Any]]:
    return [asyncio.ensure_future(call) for call in calls]


async def job_types_by_id(client: SeppClient, queue: str, count: int) -> dict[str, str]:
    jobs = await client.reserve(opts(queue, max_jobs=count + 10)) or []
    return {job.ctx.id: job.ctx.job_type for job in jobs}


# -- sharing --------------------------------------------------------------------------------


async def test_64_concurrent_callers_share_a_few_calls_each_with_its_own_job(
    server: SeppTestServer,
) -> None:
    gate = gated(server)
    queue = unique_queue()
    async with connected(server.addr) as client:
        acks = await asyncio.gather(
            *[client.enqueue(EnqueueRequest(queue, f"t{i}")) for i in range(64)]
        )
        # The first call went out alone; the 63 made meanwhile waited for it, together.
        assert gate.calls == 2
        assert all(isinstance(ack, EnqueueAck) for ack in acks)
        by_id = await job_types_by_id(client, queue, 64)
    assert [by_id[ack.job_id] for ack in acks] == [f"t{i}" for i in range(64)]


async def test_a_debug_line_tells_how_many_calls_share_each_batch(
    server: SeppTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    gated(server)
    queue = unique_queue()
    async with connected(server.addr) as client:
        with caplog.at_level(logging.DEBUG, "sepp_lite"):
            await asyncio.gather(*[client.enqueue(EnqueueRequest(queue, "t")) for _ in range(9)])
    lines = [r.getMessage() for r in caplog.records if "EnqueueBatch" in r.getMessage()]
    # The first call went out alone, as a plain call; the 8 made meanwhile shared one.
    assert lines == ["enqueue: 8 call(s) share one EnqueueBatch"]


@pytest.mark.connect_only
async def test_the_switch_and_the_environment_turn_it_off(
    server: SeppTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gated(server)
    queue = unique_queue()

    async def calls_for_64(**options: Any) -> int:
        before = gate.calls
        async with await SeppClient.connect(server.addr, **options) as client:
            await asyncio.gather(*[client.enqueue(EnqueueRequest(queue, "t")) for _ in range(64)])
        return gate.calls - before

    assert await calls_for_64(coalesce_enqueues=False) == 64
    monkeypatch.setenv("SEPP_LITE_COALESCE", "0")
    assert await calls_for_64() == 64
    assert await calls_for_64(coalesce_enqueues=True) == 2  # the option beats the environment
    monkeypatch.setenv("SEPP_LITE_COALESCE", "1")
    assert await calls_for_64() == 2


@pytest.mark.connect_only
@pytest.mark.parametrize(
    "options",
    [
        {"coalesce_enqueues": "yes"},
        {"max_enqueue_batches_in_flight": 0},
        {"max_enqueues_waiting": True},
    ],
)
async def test_bad_options_are_refused_before_connecting(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        await SeppClient.connect("127.0.0.1:1", **options)


async def test_a_lone_call_goes_out_at_once_and_later_ones_wait_for_it(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: number == 1)
    queue = unique_queue()
    async with connected(server.addr) as client:
        [first] = spawn([client.enqueue(EnqueueRequest(queue, "first"))])
        await until(lambda: gate.held == 1)  # no timer to wait for: it is at the server
        assert client.enqueues_waiting == 0
        later = spawn([client.enqueue(EnqueueRequest(queue, "later")) for _ in range(3)])
        await until(lambda: client.enqueues_waiting == 3)
        assert gate.calls == 1  # they wait for the call in flight
        gate.open()
        await asyncio.gather(first, *later)
        assert gate.calls == 2
        assert client.enqueues_waiting == 0
        # Alone again: each call goes out by itself, at once.
        for _ in range(3):
            await client.enqueue(EnqueueRequest(queue, "t"))
        assert gate.calls == 5


@pytest.mark.parametrize(
    "server_options", [{"queues": [QueueConfig("strict", allowed_job_types=["ok"])]}]
)
async def test_a_rejection_lands_on_its_own_caller_only(server: SeppTestServer) -> None:
    gate = gated(server)
    async with connected(server.addr) as client:
        types = ["bad" if i % 4 == 1 else "ok" for i in range(32)]
        results = await asyncio.gather(
            *[client.enqueue(EnqueueRequest("strict", job_type)) for job_type in types],
            return_exceptions=True,
        )
        assert gate.calls == 2
        for job_type, result in zip(types, results):
            if job_type == "ok":
                assert isinstance(result, EnqueueAck)
            else:
                assert isinstance(result, JobRejectedError)
                assert isinstance(result.rejection, errors.JobTypeNotAllowed)
        by_id = await job_types_by_id(client, "strict", 32)
    assert sorted(by_id.values()) == ["ok"] * 24


# -- cancellation -----------------------------------------------------------------------------


async def test_a_call_cancelled_before_its_batch_is_sent_is_never_sent(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: number == 1)
    queue = unique_queue()
    async with connected(server.addr) as client:
        first = spawn([client.enqueue(EnqueueRequest(queue, "first"))])
        await until(lambda: gate.held == 1)
        a, b, c = spawn([client.enqueue(EnqueueRequest(queue, name)) for name in "abc"])
        await until(lambda: client.enqueues_waiting == 3)
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert client.enqueues_waiting == 2
        gate.open()
        await asyncio.gather(*first, a, c)
        assert gate.calls == 2
        by_id = await job_types_by_id(client, queue, 4)
    assert sorted(by_id.values()) == ["a", "c", "first"]


async def test_a_call_cancelled_in_flight_leaves_the_batch_to_the_others(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: number <= 2)
    queue = unique_queue()
    async with connected(server.addr) as client:
        first = spawn([client.enqueue(EnqueueRequest(queue, "first"))])
        await until(lambda: gate.held == 1)
        a, b, c = spawn([client.enqueue(EnqueueRequest(queue, name)) for name in "abc"])
        await until(lambda: client.enqueues_waiting == 3)
        first[0].cancel()  # the lone call: its RPC is cancelled, the batch goes out
        await until(lambda: gate.calls == 2 and gate.held == 1)
        assert client.enqueues_waiting == 0
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert gate.cancelled == 1  # the lone call's; the batch is still in flight
        gate.open()
        ack_a, ack_c = await asyncio.gather(a, c)
        by_id = await job_types_by_id(client, queue, 4)
    # b's job may be enqueued (it was sent), as for a lone call cancelled in flight.
    assert by_id[ack_a.job_id] == "a" and by_id[ack_c.job_id] == "c"
    assert set(by_id.values()) <= {"first", "a", "b", "c"}


async def test_when_every_member_is_cancelled_the_call_is_cancelled(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: True)
    queue = unique_queue()
    async with connected(server.addr) as client:
        first = spawn([client.enqueue(EnqueueRequest(queue, "first"))])
        await until(lambda: gate.held == 1)
        members = spawn([client.enqueue(EnqueueRequest(queue, "m")) for _ in range(3)])
        await until(lambda: client.enqueues_waiting == 3)
        first[0].cancel()
        await until(lambda: gate.calls == 2 and gate.held == 1)
        for member in members:
            member.cancel()
        await asyncio.gather(*first, *members, return_exceptions=True)
        await until(lambda: gate.cancelled == 2)  # the server saw the batch's call end
        gate.open()


# -- deadlines and retries ----------------------------------------------------------------------


async def test_each_caller_keeps_its_own_deadline(server: SeppTestServer) -> None:
    gate = gated(server, hold=lambda number: True)
    queue = unique_queue()
    loop = asyncio.get_running_loop()
    ends: dict[str, tuple[float, float, BaseException]] = {}

    async def timed(client: SeppClient, name: str) -> None:
        start = loop.time()
        try:
            await client.enqueue(EnqueueRequest(queue, name))
        except TransportError as error:
            ends[name] = (start, loop.time(), error)

    try:
        async with connected(server.addr, rpc_timeout=1.0) as client:
            # A goes out alone and times out at 1.0; B and C wait for it, then share a
            # call, in which B fails at its own deadline (1.3) and C at its own (1.7).
            tasks = spawn([timed(client, "A")])
            await asyncio.sleep(0.3)
            tasks += spawn([timed(client, "B")])
            await asyncio.sleep(0.4)
            tasks += spawn([timed(client, "C")])
            await asyncio.gather(*tasks)
    finally:
        gate.open()
    assert gate.calls == 2
    for name, (start, end, error) in ends.items():
        assert end - start >= 0.99, name  # never cut short by another caller's deadline
        assert isinstance(error, TransportError) and error.code is Status.DEADLINE_EXCEEDED
        assert error.ambiguous
    assert ends["B"][1] < ends["C"][1] - 0.2  # nor kept waiting for one


async def test_keyed_and_keyless_jobs_never_share_a_call_nor_a_retry_decision() -> None:
    failed: set[bool] = set()

    def first_batch_of_each_kind_is_aborted(request: bytes) -> bytes:
        jobs = decode_enqueue_batch_request(request)
        keyed = {job.idempotency_key is not None for job in jobs}
        assert len(keyed) == 1, "keyed and keyless jobs in one call"
        kind = keyed.pop()
        if len(jobs) > 1 and kind not in failed:
            failed.add(kind)  # ABORTED: the server may have applied it
            raise GRPCError(Status.ABORTED, "aborted once")
        return default_reply("EnqueueBatch", request)

    async with ScriptedServer() as server:
        server.script("EnqueueBatch", *[first_batch_of_each_kind_is_aborted] * 10)
        async with connected(server.addr, retry_policy=FAST_RETRY) as client:
            jobs = [EnqueueRequest("q", "lone", idempotency_key="k-lone")] + [
                EnqueueRequest("q", "t", idempotency_key=f"k{i}" if i % 2 else None)
                for i in range(8)
            ]
            results = await asyncio.gather(
                *[client.enqueue(job) for job in jobs], return_exceptions=True
            )
        sizes = [len(decode_enqueue_batch_request(call.request)) for call in server.calls]
    # The lone call, the keyless batch (aborted, and not repeated: it may have been
    # applied), the keyed batch (aborted, then retried).
    assert sizes == [1, 4, 4, 4]
    for job, result in zip(jobs, results):
        if job.idempotency_key:
            assert isinstance(result, EnqueueAck)
        else:
            assert isinstance(result, TransportError) and result.code is Status.ABORTED


# -- deadlines, whatever goes ahead ---------------------------------------------------------------

# The callers' rpc_timeout, and how late past it a caller may end (event-loop scheduling).
DEADLINE = 0.6
LATE = 0.05
LARGE = Payload(b"x" * (1024 * 1024 + 1), "application/octet-stream")  # sent alone

Arrival = tuple[float, str, EnqueueRequest]


class Callers:
    """Calls made at set times (fractions of ``DEADLINE`` from the first), each of
    which the server holds, so each must fail: how long it took, and with what."""

    def __init__(self, client: SeppClient) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.ended: dict[str, Any] = {}
        self.tasks: list[asyncio.Future[Any]] = []

    async def at(self, fraction: float) -> None:
        await asyncio.sleep(max(0.0, self.start + fraction * DEADLINE - self.loop.time()))

    def call(self, name: str, request: EnqueueRequest) -> None:
        self.tasks += spawn([self._timed(name, request)])

    async def _timed(self, name: str, request: EnqueueRequest) -> None:
        began = self.loop.time()
        with pytest.raises(TransportError) as caught:
            await self.client.enqueue(request)
        self.ended[name] = (self.loop.time() - began, caught.value)

    async def all_ended(self) -> dict[str, Any]:
        await asyncio.gather(*self.tasks)
        return self.ended


async def deadline_errors(client: SeppClient, arrivals: list[Arrival]) -> dict[str, Any]:
    callers = Callers(client)
    for fraction, name, request in arrivals:
        await callers.at(fraction)
        callers.call(name, request)
    return await callers.all_ended()


def assert_each_ended_at_its_deadline(ended: dict[str, Any], unsent: set[str]) -> None:
    for name, (took, error) in ended.items():
        assert DEADLINE - 0.01 <= took <= DEADLINE + LATE, (name, took)
        assert error.code is Status.DEADLINE_EXCEEDED, name
        # Coalescing off says so too: a call on the wire may have been applied, one
        # whose deadline passed before it went out was not.
        assert error.ambiguous is (name not in unsent), name
        sent = "deadline exceeded before the call was sent" not in str(error)
        assert sent is (name not in unsent), (name, str(error))


def deadline_arrivals(ahead: str, queue: str) -> list[Arrival]:
    if ahead == "a keyed batch":
        # A goes out alone; when it ends, K1 and K2 share a call (K1 came first) that
        # may run until K2's deadline, 0.8 later; P waits behind it.
        return [
            (0.0, "A", EnqueueRequest(queue, "a")),
            (0.1, "K1", EnqueueRequest(queue, "k", idempotency_key="k1")),
            (0.2, "P", EnqueueRequest(queue, "p")),
            (0.8, "K2", EnqueueRequest(queue, "k", idempotency_key="k2")),
        ]
    # A goes out alone; P waits for it; then L, too large to share a call, goes out
    # alone too, and P waits behind L once A has ended.
    return [
        (0.0, "A", EnqueueRequest(queue, "a")),
        (0.1, "P", EnqueueRequest(queue, "p")),
        (0.5, "L", EnqueueRequest(queue, "l", payload=LARGE)),
    ]


@pytest.mark.parametrize("ahead", ["a keyed batch", "a large job alone"])
async def test_a_waiting_caller_ends_at_its_deadline_whatever_runs_ahead(
    server: SeppTestServer, ahead: str
) -> None:
    gate = gated(server, hold=lambda number: True)
    try:
        async with connected(server.addr, rpc_timeout=DEADLINE) as client:
            ended = await deadline_errors(client, deadline_arrivals(ahead, unique_queue()))
    finally:
        gate.open()
    assert_each_ended_at_its_deadline(ended, unsent={"P"})


async def test_a_waiting_caller_ends_at_its_deadline_on_the_grpcio_server() -> None:
    pytest.importorskip("grpc", reason=NO_GRPCIO)
    from tests.grpcio_server import GrpcioServer

    async with GrpcioServer() as server:
        server.hold()
        async with connected(server.addr, rpc_timeout=DEADLINE) as client:
            ended = await deadline_errors(
                client, deadline_arrivals("a keyed batch", unique_queue())
            )
    assert_each_ended_at_its_deadline(ended, unsent={"P"})


@pytest.mark.connect_only  # from_channel takes no coalescing options
async def test_a_caller_that_waited_for_room_ends_at_its_deadline_behind_a_later_one(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: True)
    queue = unique_queue()
    options = {"max_enqueues_waiting": 2, "max_enqueue_batches_in_flight": 1}
    try:
        async with await SeppClient.connect(server.addr, rpc_timeout=DEADLINE, **options) as client:
            callers = Callers(client)
            callers.call("A", EnqueueRequest(queue, "a"))  # alone
            await until(lambda: gate.held == 1)
            b, c = spawn([client.enqueue(EnqueueRequest(queue, t)) for t in "bc"])
            await until(lambda: client.enqueues_waiting == 2)
            await callers.at(0.1)
            callers.call("X", EnqueueRequest(queue, "x"))  # waits for room
            await callers.at(0.5)
            callers.call("L", EnqueueRequest(queue, "l", payload=LARGE))  # alone
            await callers.at(0.7)
            # Two slots free up, X is woken for one, and Y, made in the same step,
            # takes the other before X has come back: Y waits ahead of X, with a
            # later deadline, behind L (A has ended: one call in flight at most).
            b.cancel()
            c.cancel()
            callers.call("Y", EnqueueRequest(queue, "y"))
            ended = await callers.all_ended()
            await asyncio.gather(b, c, return_exceptions=True)
    finally:
        gate.open()
    assert_each_ended_at_its_deadline(ended, unsent={"X"})


# -- the server's limits, before the client knows them ------------------------------------------


def outcome(result: object) -> object:
    """What a caller saw, comparable across clients: the ack's kind, or the error."""
    if isinstance(result, EnqueueAck):
        return "ack"
    return (type(result).__name__, str(result))


@pytest.mark.parametrize("server_options", [{"max_enqueue_batch": 8}])
async def test_a_fresh_client_never_fails_callers_for_the_servers_batch_limit(
    server: SeppTestServer,
) -> None:
    queue = unique_queue()
    async with connected(server.addr) as client:
        assert client.server_info is None  # the limit is not known: 39 calls wait at first
        acks = await asyncio.gather(
            *[client.enqueue(EnqueueRequest(queue, f"t{i}")) for i in range(40)]
        )
        by_id = await job_types_by_id(client, queue, 40)
    assert [by_id[ack.job_id] for ack in acks] == [f"t{i}" for i in range(40)]
    assert len(by_id) == 40  # each job once


async def test_a_fresh_client_fits_the_grpcio_servers_batch_limit() -> None:
    pytest.importorskip("grpc", reason=NO_GRPCIO)
    from tests.grpcio_server import GrpcioServer

    state = QueueState(ServerConfig().with_overrides(max_enqueue_batch=8))
    queue = unique_queue()
    async with GrpcioServer(state) as server, connected(server.addr) as client:
        acks = await asyncio.gather(
            *[client.enqueue(EnqueueRequest(queue, f"t{i}")) for i in range(40)]
        )
        by_id = await job_types_by_id(client, queue, 40)
    assert [by_id[ack.job_id] for ack in acks] == [f"t{i}" for i in range(40)]


@pytest.mark.connect_only  # compares with the switch off, which only connect() takes
@pytest.mark.parametrize(
    "server_options", [{"max_message_bytes": 64 * 1024, "max_payload_bytes": 64 * 1024}]
)
async def test_callers_see_what_they_would_alone_when_the_server_refuses_a_size(
    server: SeppTestServer,
) -> None:
    # Each job fits the server's (unadvertised) message limit alone, the lot together
    # does not; one is too large even alone.
    sizes = [10] + [20 * 1024] * 10 + [70 * 1024] + [20 * 1024] * 4

    async def outcomes(coalesce: bool) -> list[object]:
        queue = unique_queue()
        jobs = [EnqueueRequest(queue, "t", payload=Payload(b"x" * n, "text/plain")) for n in sizes]
        async with await SeppClient.connect(server.addr, coalesce_enqueues=coalesce) as client:
            results = await asyncio.gather(
                *[client.enqueue(job) for job in jobs], return_exceptions=True
            )
            enqueued = await job_types_by_id(client, queue, len(jobs))
        assert len(enqueued) == len(jobs) - 1
        return [outcome(result) for result in results]

    alone = await outcomes(coalesce=False)
    assert alone.count("ack") == len(sizes) - 1
    assert await outcomes(coalesce=True) == alone


async def test_a_refused_shared_call_teaches_the_client_the_servers_batch_limit() -> None:
    def refuse_over_8(request: bytes) -> bytes:
        if len(decode_enqueue_batch_request(request)) > 8:
            raise GRPCError(Status.INVALID_ARGUMENT, "batch exceeds max_enqueue_batch (8)")
        return default_reply("EnqueueBatch", request)

    async with ScriptedServer() as server:
        server.script("EnqueueBatch", *[refuse_over_8] * 200)
        bursts = []
        async with connected(server.addr) as client:
            for _ in range(2):
                before = len(server.calls)
                acks = await asyncio.gather(
                    *[client.enqueue(EnqueueRequest("q", "t")) for _ in range(40)]
                )
                assert all(isinstance(ack, EnqueueAck) for ack in acks)
                calls = server.calls[before:]
                bursts.append([len(decode_enqueue_batch_request(c.request)) for c in calls])
    first, second = bursts
    # A lone call, then the 39 that waited for it: refused, and sent again in smaller
    # calls until they fit. The next burst fits at once.
    assert first[:2] == [1, 39] and sum(size for size in first if size <= 8) == 40
    assert max(second) <= 8 and sum(second) == 40


# -- backpressure ---------------------------------------------------------------------------------


@pytest.mark.connect_only  # from_channel takes no coalescing options
async def test_waiting_calls_are_bounded_and_so_are_the_batches_in_flight(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: True)
    queue = unique_queue()
    most_waiting = 0
    done = False

    options = {"max_enqueues_waiting": 8, "max_enqueue_batches_in_flight": 2}
    async with await SeppClient.connect(server.addr, **options) as client:

        async def watch() -> None:
            nonlocal most_waiting
            while not done:
                most_waiting = max(most_waiting, client.enqueues_waiting)
                await asyncio.sleep(0)

        watcher = spawn([watch()])
        calls = spawn([client.enqueue(EnqueueRequest(queue, f"t{i}")) for i in range(41)])
        # The lone call and a full batch of 8 are held; 8 more wait; 24 wait for room.
        await until(lambda: gate.held == 2 and client.enqueues_waiting == 8)
        for _ in range(20):
            await asyncio.sleep(0)
        assert gate.calls == 2 and client.enqueues_waiting == 8
        gate.open()
        acks = await asyncio.gather(*calls)
        done = True
        await asyncio.gather(*watcher)
        by_id = await job_types_by_id(client, queue, 41)
    assert most_waiting == 8
    assert gate.most_held <= 2
    assert [by_id[ack.job_id] for ack in acks] == [f"t{i}" for i in range(41)]
    assert gate.calls >= 1 + 40 // 8


@pytest.mark.connect_only  # from_channel takes no coalescing options
async def test_a_caller_cancelled_while_it_waits_for_room_is_never_sent(
    server: SeppTestServer,
) -> None:
    gate = gated(server, hold=lambda number: number == 1)
    queue = unique_queue()
    options = {"max_enqueues_waiting": 1, "max_enqueue_batches_in_flight": 1}
    async with await SeppClient.connect(server.addr, **options) as client:
        first, second = spawn([client.enqueue(EnqueueRequest(queue, t)) for t in "ab"])
        await until(lambda: gate.held == 1 and client.enqueues_waiting == 1)
        third, fourth = spawn([client.enqueue(EnqueueRequest(queue, t)) for t in "cd"])
        for _ in range(10):
            await asyncio.sleep(0)
        assert client.enqueues_waiting == 1  # "c" and "d" wait for room
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        gate.open()
        await asyncio.gather(first, second, fourth)
        by_id = await job_types_by_id(client, queue, 4)
    assert sorted(by_id.values()) == ["a", "b", "d"]
    assert gate.calls == 3  # "a" alone, then "b", then "d": one waiting call at a time


# -- the blocking client --------------------------------------------------------------------


def test_the_blocking_client_coalesces_calls_from_8_threads() -> None:
    release = threading.Event()
    calls = 0

    async def hold_the_first() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)

    queue = unique_queue()
    with SeppServerThread() as server:
        server.call(server.server.before_call, "EnqueueBatch", hold_the_first)
        with BlockingClient.connect(server.addr) as client:
            acks: list[Optional[EnqueueAck]] = [None] * 8

            def produce(index: int) -> None:
                acks[index] = client.enqueue(EnqueueRequest(queue, f"t{index}"))

            threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
            threads[0].start()
            until_sync(lambda: calls == 1)
            for thread in threads[1:]:
                thread.start()
            until_sync(lambda: client.enqueues_waiting == 7)
            release.set()
            for thread in threads:
                thread.join(30)
            assert calls == 2
            jobs = client.reserve(opts(queue, max_jobs=20)) or []
    by_id = {job.ctx.id: job.ctx.job_type for job in jobs}
    assert [by_id[ack.job_id] for ack in acks if ack is not None] == [f"t{i}" for i in range(8)]
