"""sepp_lite.sync.SeppClient: the blocking client, from plain threads, after fork(),
from inside a running event loop, and interrupted by Ctrl-C, against real servers.

The servers run on threads of their own (``SeppServerThread``, or a test helper on a
``LoopThread``): the tests themselves are synchronous, as the client's users are.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import os
import queue as queues
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

import sepp_lite
from sepp_lite import (
    BatchValidationError,
    ConnectError,
    DeadLetterCause,
    EmptyBatchError,
    EnqueueAck,
    JobNotFoundError,
    JobRejectedError,
    Payload,
    RetryDirective,
    RetryPolicy,
    SeppError,
    TransportError,
    UnauthenticatedError,
    UnknownQueuesError,
    _connect_defaults,
)
from sepp_lite._loop_thread import LoopThread
from sepp_lite.sync import SeppClient
from sepp_lite.testing import QueueConfig, SeppServerThread
from tests.client_helpers import (
    FreezableProxy,
    ScriptedServer,
    free_port,
    job,
    opts,
    run_on_own_loop,
    unique_queue,
    until_sync,
)

pytestmark = pytest.mark.timeout(90)

T = TypeVar("T")
RPCS = [
    "enqueue",
    "enqueue_batch",
    "enqueue_atomic",
    "reserve",
    "ack",
    "nack",
    "extend",
    "drain_dead_letters",
    "get_server_info",
]


@contextlib.contextmanager
def hosted(
    make: Callable[[], contextlib.AbstractAsyncContextManager[T]],
) -> Iterator[tuple[T, LoopThread]]:
    """Make and enter an async test helper (a proxy, a scripted server) on a loop
    thread of its own, for the duration of the block; yields it and that thread.
    Made there, as Python 3.9 binds its asyncio.Events to the constructing thread's
    loop."""
    portal = LoopThread("test-helper")

    async def enter() -> tuple[contextlib.AbstractAsyncContextManager[T], T]:
        manager = make()
        return manager, await manager.__aenter__()

    try:
        manager, value = portal.run(enter())
        try:
            yield value, portal
        finally:
            portal.run(manager.__aexit__(None, None, None))
    finally:
        portal.stop()


def on_loop(portal: LoopThread, fn: Callable[[], T]) -> T:
    """``fn()`` run on ``portal``'s thread (where the helper's state lives)."""

    async def call() -> T:
        return fn()

    return portal.run(call())


def sync_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "sepp-lite-sync")


# Not conftest.py's server: the blocking client needs one on a thread of its own.
@pytest.fixture
def server() -> Iterator[SeppServerThread]:
    with SeppServerThread(dead_letter_retention_ms=60_000) as srv:
        yield srv


# -- the API is the async client's --------------------------------------------------------


def test_connect_takes_exactly_the_async_connects_arguments_and_defaults() -> None:
    blocking = inspect.signature(SeppClient.connect)
    native = inspect.signature(sepp_lite.SeppClient.connect)
    described = [(p.name, p.kind, p.default, p.annotation) for p in blocking.parameters.values()]
    assert described == [
        (p.name, p.kind, p.default, p.annotation) for p in native.parameters.values()
    ]
    assert blocking.return_annotation == native.return_annotation == "SeppClient"
    # Not only equal: both take them from the one place, so neither can drift alone.
    shared = {id(value) for value in vars(_connect_defaults).values()}
    for signature in (blocking, native):
        for p in signature.parameters.values():
            if p.default not in (inspect.Parameter.empty, None, False, True):
                assert id(p.default) in shared, p.name


@pytest.mark.parametrize("name", RPCS)
def test_every_rpc_has_the_async_methods_arguments(name: str) -> None:
    blocking = inspect.signature(getattr(SeppClient, name))
    native = inspect.signature(getattr(sepp_lite.SeppClient, name))
    assert list(blocking.parameters.values()) == list(native.parameters.values())
    assert blocking.return_annotation == native.return_annotation
    assert not inspect.iscoroutinefunction(getattr(SeppClient, name))


def test_every_rpc_blocks_and_returns_the_async_clients_values(server: SeppServerThread) -> None:
    queue = unique_queue("rpcs")
    with SeppClient.connect(server.addr) as client:
        assert client.server_info is None
        info = client.get_server_info()
        assert isinstance(info, sepp_lite.ServerInfo) and client.server_info == info
        ack = client.enqueue(job(queue, payload=Payload(b"one", "text/plain"), priority=9))
        assert isinstance(ack, EnqueueAck)
        batch = client.enqueue_batch([job(queue), job(queue)])
        atomic = client.enqueue_atomic([job(queue)])
        assert all(isinstance(result, EnqueueAck) for result in [*batch, *atomic])
        assert server.counts(queue).ready == 4

        jobs = client.reserve(opts(queue, max_jobs=4))
        assert jobs is not None and len(jobs) == 4
        first, second, third, fourth = jobs
        assert first.ctx.id == ack.job_id and first.payload == Payload(b"one", "text/plain")
        expiry = client.extend(first.ctx, 120)
        assert expiry > second.ctx.lease_expires_at
        client.ack(first.ctx)
        assert client.nack(second.ctx, RetryDirective.after(60), "later") is False
        assert client.nack(third.ctx, RetryDirective.dead_letter(), "broken") is True
        client.ack(fourth.ctx)
        assert server.counts(queue) == (0, 1, 0, 1)

        [record] = client.drain_dead_letters(queue, 5)
        assert record.job_id == third.ctx.id and record.cause is DeadLetterCause.REJECTED
        assert client.reserve(opts(queue, wait=0.2)) is None


def test_errors_are_the_async_clients_classes() -> None:
    declared = QueueConfig("declared")
    with SeppServerThread(strict_queues=True, queues=[declared], api_keys=["k"]) as strict:
        with SeppClient.connect(strict.addr, api_key="k") as client:
            with pytest.raises(EmptyBatchError):
                client.enqueue_batch([])
            with pytest.raises(JobRejectedError):
                client.enqueue(job("undeclared"))
            with pytest.raises(BatchValidationError) as refused:
                client.enqueue_atomic([job("declared"), job("undeclared")])
            assert [error.index for error in refused.value.errors] == [1]
            with pytest.raises(UnknownQueuesError):
                client.reserve(opts("undeclared"))
            client.enqueue(job("declared"))
            [leased] = client.reserve(opts("declared")) or []
            client.ack(leased.ctx)
            with pytest.raises(JobNotFoundError):
                client.ack(leased.ctx)
        with SeppClient.connect(strict.addr, api_key="wrong") as client:
            with pytest.raises(UnauthenticatedError):
                client.get_server_info()
    with pytest.raises(ConnectError):
        SeppClient.connect(f"127.0.0.1:{free_port()}", connect_timeout=1)
    assert sync_threads() == 0  # a failed connect leaves no thread behind


def test_a_stalled_call_ends_at_the_async_clients_deadline(server: SeppServerThread) -> None:
    with hosted(lambda: FreezableProxy(server.server.host, server.server.port)) as (proxy, helper):
        with SeppClient.connect(proxy.addr, rpc_timeout=0.5) as client:
            client.get_server_info()
            helper.loop.call_soon_threadsafe(proxy.freeze)
            started = time.monotonic()
            with pytest.raises(TransportError) as stalled:
                client.enqueue(job(unique_queue("stalled")))
            assert time.monotonic() - started < 3.0
            assert stalled.value.code is not None
            assert stalled.value.code.name == "DEADLINE_EXCEEDED"
            helper.loop.call_soon_threadsafe(proxy.resume)


def test_retries_follow_the_policy_and_failures_match_the_async_client() -> None:
    queue = unique_queue("retry")
    busy = [GRPCError(Status.UNAVAILABLE, "busy"), GRPCError(Status.UNAVAILABLE, "busy")]
    patient = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)
    with hosted(ScriptedServer) as (scripted, helper):
        native = helper.run(sepp_lite.SeppClient.connect(scripted.addr))
        try:
            on_loop(helper, lambda: scripted.script("EnqueueBatch", *busy))
            with SeppClient.connect(scripted.addr) as client, pytest.raises(SeppError) as failed:
                client.enqueue(job(queue, idempotency_key="a"))
            with pytest.raises(SeppError) as failed_too:
                helper.run(native.enqueue(job(queue, idempotency_key="a")))
            assert type(failed.value) is type(failed_too.value)
            assert str(failed.value) == str(failed_too.value)

            on_loop(helper, lambda: scripted.script("EnqueueBatch", *busy))
            with SeppClient.connect(scripted.addr, retry_policy=patient) as client:
                assert isinstance(client.enqueue(job(queue, idempotency_key="b")), EnqueueAck)
            assert len(on_loop(helper, lambda: scripted.calls_to("EnqueueBatch"))) == 2 + 3
        finally:
            helper.run(native.close())


def test_between_calls_the_loop_keeps_the_connection_alive(server: SeppServerThread) -> None:
    # The loop thread runs while the caller does something else: a frozen peer is
    # found by the keepalive pings (so the next call reconnects at once) rather
    # than by the next call's deadline.
    with hosted(lambda: FreezableProxy(server.server.host, server.server.port)) as (proxy, helper):
        options: dict[str, Any] = {"keepalive_time": 0.2, "keepalive_timeout": 0.2}
        with SeppClient.connect(proxy.addr, rpc_timeout=30, **options) as client:
            client.get_server_info()
            helper.loop.call_soon_threadsafe(proxy.freeze)
            time.sleep(0.9)  # idle: a ping goes unanswered meanwhile
            helper.loop.call_soon_threadsafe(proxy.resume)
            client.get_server_info()
            assert proxy.connections == 2


# -- threads ------------------------------------------------------------------------------


def test_eight_threads_share_one_client_over_one_connection(server: SeppServerThread) -> None:
    queue = unique_queue("threads")
    with SeppClient.connect(server.addr) as client:

        def work(thread: int) -> int:
            for n in range(20):
                client.enqueue(job(queue, custom={"thread": thread, "n": n}))
            acked = 0
            while acked < 20:
                for leased in client.reserve(opts(queue, wait=1, max_jobs=20 - acked)) or []:
                    client.ack(leased.ctx)
                    acked += 1
            return acked

        with ThreadPoolExecutor(8) as pool:
            done = list(pool.map(work, range(8), timeout=60))
    assert done == [20] * 8
    assert server.totals()["acked"] == 160
    assert server.counts(queue) == (0, 0, 0, 0)
    assert server.connections_accepted == 1


def test_calls_from_eight_threads_wait_at_once(server: SeppServerThread) -> None:
    # Eight long polls are open together on the one connection (not one after the
    # other): one enqueue of eight jobs answers all of them.
    queue = unique_queue("polls")
    with SeppClient.connect(server.addr) as client, ThreadPoolExecutor(8) as pool:
        polls = [pool.submit(client.reserve, opts(queue, wait=20)) for _ in range(8)]
        until_sync(lambda: server.call(lambda: server.server.state.waiter_count) == 8)
        client.enqueue_batch([job(queue) for _ in range(8)])
        answers = [poll.result(timeout=10) for poll in polls]
    assert all(answer is not None and len(answer) == 1 for answer in answers)
    assert len({answer[0].ctx.id for answer in answers if answer}) == 8
    assert server.connections_accepted == 1


# -- fork ---------------------------------------------------------------------------------


def wait_for_child(pid: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the child did not finish within {timeout} s")
        time.sleep(0.01)


def in_child(client: SeppClient, queue: str, out: int) -> None:
    """What the forked child does with the client it inherited."""
    ack = client.enqueue(job(queue, "from-child"))
    with ThreadPoolExecutor(4) as pool:  # threads of the child share its new connection
        infos = list(pool.map(lambda _: client.get_server_info(), range(4)))
    assert len(infos) == 4
    os.write(out, ack.job_id.encode())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is not available here")
@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
def test_a_forked_child_connects_again_and_leaves_the_parents_connection_alone(
    server: SeppServerThread,
) -> None:
    queue = unique_queue("fork")
    with SeppClient.connect(server.addr) as client:
        client.enqueue(job(queue, "before-fork"))
        assert server.connections_accepted == 1
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read_end)
                in_child(client, queue, write_end)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            assert wait_for_child(pid) == 0
            child_job = os.read(read_end, 100).decode()
        finally:
            os.close(read_end)
        assert server.connections_accepted == 2  # the child's own connection
        # The parent's connection is untouched: it goes on without reconnecting.
        client.enqueue(job(queue, "after-fork"))
        leased = client.reserve(opts(queue, max_jobs=10)) or []
        assert server.connections_accepted == 2
    assert [j.ctx.job_type for j in leased] == ["before-fork", "from-child", "after-fork"]
    assert leased[1].ctx.id == child_job


# -- event loops and Ctrl-C ---------------------------------------------------------------


def test_a_call_from_a_running_event_loop_raises_naming_the_async_client(
    server: SeppServerThread,
) -> None:
    with SeppClient.connect(server.addr) as client:

        async def call_in_loop() -> None:
            client.get_server_info()

        async def connect_in_loop() -> None:
            SeppClient.connect(server.addr)

        for attempt in (call_in_loop, connect_in_loop):
            with pytest.raises(RuntimeError, match=r"use the async client, sepp_lite\.SeppClient"):
                run_on_own_loop(attempt())
        assert client.get_server_info()  # outside a loop it still works
    assert sync_threads() == 0


async def test_a_worker_thread_of_an_async_program_may_call_it(server: SeppServerThread) -> None:
    client = await asyncio.to_thread(SeppClient.connect, server.addr)
    try:
        info = await asyncio.to_thread(client.get_server_info)
    finally:
        client.close()  # closing blocks for a moment only, and is allowed anywhere
    assert info.version


CTRL_C = textwrap.dedent(
    """
    import signal, sys, time
    import sepp_lite
    from sepp_lite.sync import SeppClient

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    client = SeppClient.connect(sys.argv[1])
    options = sepp_lite.ReserveOptions([sys.argv[2]], 30, wait_timeout=60)
    print("blocking", flush=True)
    started = time.monotonic()
    try:
        client.reserve(options)
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - started:.2f} s", flush=True)
    sys.stdin.read()  # stay alive, and connected, until the test closes stdin
    client.get_server_info()
    client.close()
    print("done", flush=True)
    """
)


class Lines:
    """A subprocess's stdout lines, read on a thread so that every wait is bounded."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queues.Queue[str] = queues.Queue()
        assert proc.stdout is not None
        self._stdout = proc.stdout
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stdout:
            self._lines.put(line)

    def next(self, timeout: float = 15.0) -> str:
        return self._lines.get(timeout=timeout)

    def close(self) -> None:
        """After the process ended: the reader has met the end of the pipe."""
        self._reader.join(10)
        self._stdout.close()


def test_ctrl_c_interrupts_a_blocked_call_at_once_and_cancels_it(server: SeppServerThread) -> None:
    queue = unique_queue("ctrl-c")

    def waiting() -> int:
        count: int = server.call(lambda: server.server.state.waiter_count)
        return count

    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C, server.addr, queue],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = Lines(proc)
    try:
        assert lines.next() == "blocking\n"
        until_sync(lambda: waiting() == 1)  # the long poll is open on the server
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert lines.next().startswith("interrupted after")
        assert time.monotonic() - sent < 3.0
        # The call was cancelled on the client's loop: the server's long poll ends
        # while the process, and its connection, live on.
        until_sync(lambda: waiting() == 0)
        assert proc.poll() is None
        assert server.connections_accepted == 1
        assert proc.stdin is not None
        proc.stdin.close()
        assert lines.next() == "done\n"
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.close()
        assert proc.stdin is not None
        proc.stdin.close()


# -- lifetime -----------------------------------------------------------------------------


def test_close_is_idempotent_and_later_calls_raise(server: SeppServerThread) -> None:
    client = SeppClient.connect(server.addr, api_key="secret-key-1234")
    assert "secret-key-1234" not in repr(client) and server.addr in repr(client)
    client.close()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.get_server_info()
    assert sync_threads() == 0


def test_a_client_collected_unclosed_closes_its_connection(server: SeppServerThread) -> None:
    client = SeppClient.connect(server.addr)
    client.get_server_info()
    assert sync_threads() == 1
    del client
    gc.collect()
    until_sync(lambda: sync_threads() == 0)
