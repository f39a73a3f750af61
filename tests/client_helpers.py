"""Shared fakes for the SeppClient tests: a scripted grpclib server that records every
call, a freezable TCP proxy, a silent socket, and small builders.

Every helper is an async context manager that stops what it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, TypeVar, Union

import grpclib.server
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.exceptions import GRPCError

from sepp_lite import SeppClient
from sepp_lite import errors as sepp_errors
from sepp_lite._codec.dead_letters import encode_drain_dead_letters_response
from sepp_lite._codec.enqueue import (
    decode_enqueue_batch_request,
    encode_enqueue_atomic_response,
    encode_enqueue_batch_response,
)
from sepp_lite._codec.job import JobRecord, encode_reserve_response
from sepp_lite._codec.lease import (
    decode_ack_request,
    decode_extend_request,
    decode_nack_request,
    encode_ack_response,
    encode_extend_response,
    encode_nack_response,
)
from sepp_lite._codec.server_info import encode_get_server_info_response
from sepp_lite._time import now_ms
from sepp_lite.errors import Status
from sepp_lite.testing import QueueState, SeppTestServer, ServerConfig
from sepp_lite.testing._service import RawCodec
from sepp_lite.types import EnqueueRequest, JobCtx, Payload, Priority, ReserveOptions

# Why a test that needs grpcio or sepp-py (which needs grpcio) skips: grpcio has wheels
# for CPython 3.10+ only, and none for PyPy or a free-threaded CPython.
NO_GRPCIO = "grpcio has no wheel for this interpreter (PyPy, free-threaded CPython)"
NO_SEPP_PY = "sepp-py needs grpcio and CPython 3.10+: no wheels for this interpreter"

SERVICE = "sepp.v1.QueueService"
METHODS = (
    "EnqueueBatch",
    "EnqueueAtomic",
    "Reserve",
    "Ack",
    "Nack",
    "Extend",
    "DrainDeadLetters",
    "GetServerInfo",
)
START_MS = 1_700_000_000_000  # a fixed ManualClock start: expected times are literals
JOB_ID = "6f1c1e0a-1111-4222-8333-444455556666"

T = TypeVar("T")
_names = itertools.count()


def unique_queue(prefix: str = "q") -> str:
    """A queue name no other test uses (short: some tests cap names at 16 bytes)."""
    return f"{prefix}{next(_names)}-{uuid.uuid4().hex[:6]}"


async def until(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.01) -> None:
    """Poll ``predicate()`` (state with no event to wait on) until it holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"condition not reached within {timeout} s")
        await asyncio.sleep(step)


@contextlib.asynccontextmanager
async def worker_running(worker: Any, timeout: float = 20.0) -> AsyncIterator[asyncio.Future[None]]:
    """Run ``worker`` (a ``sepp_lite.Worker``) for the block, and always stop it: its
    shutdown handle on the way out, then ``run()`` awaited for at most ``timeout``
    seconds. Its error is raised when the block ended well; when the block raised, that
    error goes on, and a worker that does not stop in time is cancelled."""
    task = asyncio.ensure_future(worker.run())
    try:
        yield task
    except BaseException:
        worker.shutdown_handle().shutdown()
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    worker.shutdown_handle().shutdown()
    await asyncio.wait_for(task, timeout)


def on_clock(worker: Any, clock: Any) -> None:
    """Keep ``worker``'s leases by ``clock`` (the in-process server's ``ManualClock``),
    before its ``run()``: its lease keeper then extends when the test moves the clock, as
    the server expires them. A Worker takes no clock in its signature: this is the test
    tools' seam (``run_until_drained`` and ``Tasks.worker(periodic_clock=...)`` use it)."""
    from sepp_lite.worker import keep_leases_by

    keep_leases_by(worker, clock)


def until_sync(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.01) -> None:
    """:func:`until` for a thread with no event loop: poll ``predicate()`` (state on
    another thread, with no event to wait on) with ``time.sleep``."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"condition not reached within {timeout} s")
        time.sleep(step)


def run_on_own_loop(coro: Awaitable[T]) -> T:
    """``asyncio.run`` for a synchronous test, on a loop of its own that leaves the
    thread's current loop alone: pytest-asyncio leaves one set between tests, and on
    Python 3.9 ``asyncio.run`` would unset it, leaving it unclosed for the GC to find."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def free_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def job(queue: str, job_type: str = "t", **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(queue=queue, job_type=job_type, **fields)


def text_job(queue: str, data: bytes = b"hello", **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(queue=queue, job_type="t", payload=Payload(data, "text/plain"), **fields)


def opts(
    *queues: str,
    lease: float = 30.0,
    wait: float = 0.0,
    worker_id: Optional[str] = None,
    max_jobs: Optional[int] = None,
) -> ReserveOptions:
    return ReserveOptions(
        queues=list(queues),
        lease_duration=timedelta(seconds=lease),
        wait_timeout=timedelta(seconds=wait),
        worker_id=worker_id,
        max_jobs=max_jobs,
    )


@contextlib.asynccontextmanager
async def sepp_server(**config: Any) -> AsyncIterator[SeppTestServer]:
    """``SeppTestServer(**config)``, started and always stopped."""
    server = SeppTestServer(**config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# How `connected()` makes its client: "connect" (SeppClient.connect, the default
# transport) or "from_channel" (SeppClient.from_channel over a grpclib Channel). The
# `client_transport` fixture (conftest.py) switches it for one test.
TRANSPORTS = ("connect", "from_channel")
transport = "connect"
_FROM_CHANNEL_OPTIONS = frozenset({"retry_policy", "rpc_timeout"})


@contextlib.asynccontextmanager
async def connected(addr: str, **kwargs: Any) -> AsyncIterator[SeppClient]:
    """``SeppClient.connect(addr, **kwargs)``, or the same over a grpclib ``Channel``
    while a test runs on the "from_channel" transport; always closed."""
    if transport == "connect":
        client = await SeppClient.connect(addr, **kwargs)
        try:
            yield client
        finally:
            await client.close()
        return
    unsupported = sorted(set(kwargs) - _FROM_CHANNEL_OPTIONS)
    if unsupported:
        raise TypeError(f"from_channel takes no {unsupported}: mark the test connect_only")
    host, port = addr.rsplit(":", 1)
    channel = Channel(host.strip("[]"), int(port))
    try:
        async with SeppClient.from_channel(channel, **kwargs) as client:
            yield client
    finally:
        channel.close()


async def once_reconnected(call: Callable[[], Awaitable[T]], timeout: float = 5.0) -> T:
    """``call()``, repeated while the client waits out its reconnect backoff. After a
    failed connect attempt a client backs off as grpc's channel does (about 1 s, then
    growing); calls in between fail at once, saying when the next attempt is."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        try:
            return await call()
        except sepp_errors.TransportError as error:
            if "next attempt in" not in str(error) or loop.time() > end:
                raise
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------------------
# The scripted server


class Hang:
    """A step that never answers (until the call is cancelled or the server stops)."""


class Drop:
    """A step that reads the request, then aborts the TCP connection without an answer."""


class NoReply:
    """A step that ends the call with status OK but no response message."""


@dataclass
class Late:
    """A step that gives the default answer ``seconds`` after the request came."""

    seconds: float


HANG = Hang()
DROP = Drop()
NO_REPLY = NoReply()

Step = Union[bytes, GRPCError, Hang, Drop, NoReply, Late, Callable[[bytes], bytes]]


@dataclass
class Call:
    """One call as the scripted server received it."""

    method: str
    request: bytes
    metadata: list[tuple[str, str]]
    user_agent: Optional[str]
    timeout: Optional[float]

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.metadata if key == name]


def server_info_bytes(**overrides: Any) -> bytes:
    info = QueueState(ServerConfig()).server_info()
    if overrides:
        info = type(info)(**{**info.__dict__, **overrides})
    return encode_get_server_info_response(info)


def job_record(
    job_id: str = JOB_ID,
    *,
    queue: str = "q",
    job_type: str = "t",
    payload: Optional[tuple[bytes, str]] = None,
    priority: int = 0,
    max_attempts: int = 3,
) -> JobRecord:
    return JobRecord(
        job_id,
        queue,
        job_type,
        payload=payload,
        priority=priority,
        trace=None,
        enqueued_ms=START_MS,
        max_attempts=max_attempts,
        custom={},
        scheduled_at=None,
    )


def hand_ctx(queue: str = "q") -> JobCtx:
    """A JobCtx built by hand (no lease, so no worker id), for lease RPCs."""
    now = datetime.now(timezone.utc)
    return JobCtx(
        id=JOB_ID,
        queue=queue,
        job_type="t",
        priority=Priority(0),
        attempt=1,
        max_attempts=3,
        enqueued_at=now,
        custom={},
        trace_context=None,
        lease_expires_at=now,
    )


def reserve_reply(*records: JobRecord, attempt: int = 1, lease_s: float = 30) -> bytes:
    expiry = now_ms() + int(lease_s * 1000)
    return encode_reserve_response([(record, attempt, expiry) for record in records])


def default_reply(method: str, request: bytes) -> bytes:
    if method == "GetServerInfo":
        return server_info_bytes()
    if method == "EnqueueBatch":
        jobs = decode_enqueue_batch_request(request)
        return encode_enqueue_batch_response([(str(uuid.uuid4()), False) for _ in jobs])
    if method == "EnqueueAtomic":
        jobs = decode_enqueue_batch_request(request)
        return encode_enqueue_atomic_response(success=[(str(uuid.uuid4()), False) for _ in jobs])
    if method == "Reserve":
        return encode_reserve_response([])
    if method == "Ack":
        return encode_ack_response(decode_ack_request(request).job_id)
    if method == "Nack":
        return encode_nack_response(decode_nack_request(request).job_id, False)
    if method == "Extend":
        req = decode_extend_request(request)
        return encode_extend_response(req.job_id, now_ms() + 30_000)
    if method == "DrainDeadLetters":
        return encode_drain_dead_letters_response([])
    raise AssertionError(method)


class ScriptedService:
    """``sepp.v1.QueueService`` with scripted answers: each method plays its steps in
    order, then answers validly by default. Every call is recorded."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._scripts: dict[str, list[Step]] = {}
        self._release = asyncio.Event()

    def script(self, method: str, *steps: Step) -> None:
        assert method in METHODS, method
        self._scripts[method] = list(steps)

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def release(self) -> None:
        self._release.set()

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{SERVICE}/{name}": Handler(
                self._handler(name), Cardinality.UNARY_UNARY, bytes, bytes
            )
            for name in METHODS
        }

    def _handler(self, method: str) -> Callable[[Any], Awaitable[None]]:
        async def handle(stream: grpclib.server.Stream[bytes, bytes]) -> None:
            request = await stream.recv_message()
            assert request is not None
            timeout = None if stream.deadline is None else stream.deadline.time_remaining()
            self.calls.append(
                Call(
                    method,
                    request,
                    list((stream.metadata or {}).items()),
                    stream.user_agent,
                    timeout,
                )
            )
            steps = self._scripts.get(method)
            step: Step = steps.pop(0) if steps else (lambda data: default_reply(method, data))
            if isinstance(step, GRPCError):
                raise step
            if isinstance(step, Hang):
                await self._release.wait()
                raise GRPCError(Status.UNAVAILABLE, "released")
            if isinstance(step, Drop):
                stream._stream._transport.abort()  # type: ignore[attr-defined]
                await self._release.wait()
                return
            if isinstance(step, NoReply):
                await stream.send_trailing_metadata()
                return
            if isinstance(step, Late):
                await asyncio.sleep(step.seconds)
                step = default_reply(method, request)
            reply = step if isinstance(step, bytes) else step(request)
            await stream.send_message(reply)

        return handle


class ScriptedServer:
    """A grpclib server for :class:`ScriptedService` on 127.0.0.1."""

    def __init__(self, service: Optional[ScriptedService] = None, port: int = 0) -> None:
        self.service = service or ScriptedService()
        self.port = port
        self._server: Optional[grpclib.server.Server] = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def calls(self) -> list[Call]:
        return self.service.calls

    def script(self, method: str, *steps: Step) -> None:
        self.service.script(method, *steps)

    def calls_to(self, method: str) -> list[Call]:
        return self.service.calls_to(method)

    async def start(self) -> ScriptedServer:
        server = grpclib.server.Server([self.service], codec=RawCodec())
        await server.start("127.0.0.1", self.port)
        # grpclib's Server has no public way to tell the port it bound; its asyncio
        # Server (`_server`) has.
        sockets = server._server.sockets  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]
        self._server = server
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        self.service.release()
        if server is not None:
            server.close()
            await asyncio.wait_for(server.wait_closed(), 5)

    async def __aenter__(self) -> ScriptedServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# ---------------------------------------------------------------------------------------
# Sockets that misbehave


class SilentServer:
    """Accepts TCP connections and reads everything; never writes a byte, or writes
    ``reply`` once after the first bytes arrive."""

    def __init__(self, reply: bytes = b"") -> None:
        self.reply = reply
        self.port = 0
        self.connections = 0
        self._server: Optional[asyncio.AbstractServer] = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[Any]] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                if self.reply:
                    writer.write(self.reply)
                    self.reply = b""
        writer.close()

    async def __aenter__(self) -> SilentServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await _finish(self._tasks)
        await self._server.wait_closed()


async def _finish(tasks: list[asyncio.Task[Any]]) -> None:
    """Let ``tasks`` end on their own (their sockets are closed), then cancel leftovers."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=2)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class FreezableProxy:
    """A TCP proxy to ``host:port`` that can stop forwarding in both directions
    (:meth:`freeze`) and start again (:meth:`resume`); bytes are held, not lost."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.connections = 0
        self._running = asyncio.Event()
        self._running.set()
        self._closing = asyncio.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._server: Optional[asyncio.AbstractServer] = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def observer(self, connection: int, to_server: bool) -> Optional[Callable[[bytes], None]]:
        """A hook for subclasses: what sees each chunk forwarded on ``connection``
        (counted from 1) in one direction, before it is forwarded."""
        return None

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        observe: Optional[Callable[[bytes], None]],
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                await self._running.wait()
                if not data or self._closing.is_set():
                    break
                if observe is not None:
                    observe(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        number = self.connections
        await asyncio.gather(
            self._pump(reader, up_writer, self.observer(number, to_server=True)),
            self._pump(up_reader, writer, self.observer(number, to_server=False)),
        )

    async def __aenter__(self) -> FreezableProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._closing.set()
        self._running.set()
        for writer in self._writers:
            writer.close()
        await _finish(self._tasks)
        await self._server.wait_closed()


async def elapsed(awaitable: Awaitable[Any]) -> tuple[float, Any]:
    """``(seconds, result or exception)`` of awaiting ``awaitable``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        result: Any = await awaitable
    except Exception as exc:
        result = exc
    return loop.time() - start, result


def all_text(exc: BaseException) -> str:
    """str and repr of an exception and of everything chained to it."""
    parts: list[str] = []
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current), repr(getattr(current, "args", ()))]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def client_records(
    records: list[logging.LogRecord], above: int = logging.DEBUG
) -> list[logging.LogRecord]:
    """What sepp_lite's client side logged above ``above`` (the test server's records
    are not the client's)."""
    return [
        record
        for record in records
        if record.name.startswith("sepp_lite")
        and not record.name.startswith("sepp_lite.testing")
        and record.levelno > above
    ]


def status_errors(statuses: Iterable[Status], message: str = "scripted") -> list[GRPCError]:
    return [GRPCError(status, f"{message} {status.name}") for status in statuses]
