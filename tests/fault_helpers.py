"""Fault injection for the fault, soak, secrets and bad-input tests.

* :class:`RestartableServer`: the in-process server whose network side can crash and
  come back on the same port with the same :class:`~sepp_lite.testing.QueueState`
  (the real server keeps its state on disk, the test server in memory). A crash aborts
  every TCP connection with a reset, cancels the calls being handled and closes the
  listener; a restart listens again on the same port. It can also send a GOAWAY on
  every live connection.
* :class:`ServerProcess`: ``python -m sepp_lite.testing`` as a real subprocess, to
  SIGKILL (its state is lost), SIGSTOP and SIGCONT, and start again on the same port.
* :class:`RawH2Server`: a bare HTTP/2 server (h2, no grpclib) that answers every
  request with a scripted list of frames, valid or hostile.
* :class:`ServerThread`: runs servers on an event loop in another thread, so that the
  log records of the test's own thread come from the client only.
* :class:`LogCapture`: every log record of every logger, at DEBUG.

Every helper is an async context manager (or has a ``close``) that stops what it
started. All of them bind 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar, Union

import grpclib.server
import h2.config
import h2.connection
import h2.events
import h2.exceptions
from grpclib.protocol import H2Protocol

from sepp_lite.testing import SeppTestServer
from sepp_lite.testing._service import RawCodec

T = TypeVar("T")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.asynccontextmanager
async def running(coro: Awaitable[T]) -> AsyncIterator[asyncio.Future[T]]:
    """Run ``coro`` as a task for the block; cancel and reap it on the way out."""
    task = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------------------------
# The in-process server, crashable


class _TrackingServer(grpclib.server.Server):
    """grpclib's server, remembering the protocol of every connection it accepted."""

    def __init__(self, handlers: Sequence[Any], **kwargs: Any) -> None:
        super().__init__(handlers, **kwargs)
        self.protocols: list[H2Protocol] = []

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self.protocols.append(protocol)
        return protocol


def _live_transport(protocol: H2Protocol) -> Optional[asyncio.Transport]:
    connection = getattr(protocol, "connection", None)
    transport = getattr(connection, "_transport", None)  # deleted by grpclib on close
    if transport is None or transport.is_closing():
        return None
    return transport  # type: ignore[no-any-return]


def abort_with_reset(transport: asyncio.BaseTransport) -> None:
    """Close a TCP connection the way a killed process's kernel may: at once, with a
    RST (SO_LINGER 0), dropping whatever was not sent."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


class RestartableServer:
    """The in-process sepp server with a network side that can crash and restart.

    One :class:`SeppTestServer` is built but never started: it supplies the config, the
    :class:`QueueState` (``self.state``) and the grpclib-facing ``QueueService``. Each
    "incarnation" is a grpclib server on 127.0.0.1 serving that one service, so every
    incarnation sees the same jobs, leases and idempotency records, as a restarted
    real server sees what it kept on disk. :meth:`crash` models ``kill -9`` of the
    process (every connection reset, the calls in progress cancelled, the port
    closed); :meth:`restart` crashes, waits, and listens again on the same port.
    Timers (lease expiries, schedules) keep running while it is down: the real
    server applies what fell due while it was down at its first sweep after start.
    """

    def __init__(self, *, port: int = 0, **config: Any) -> None:
        self.template = SeppTestServer(**config)
        self.state = self.template.state
        self.service = self.template.service
        self.port = port
        self.crashes = 0
        self.aborted = 0  # connections reset by crashes
        self.accepted = 0  # connections of all incarnations
        self._server: Optional[_TrackingServer] = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._server is not None

    async def start(self) -> RestartableServer:
        assert self._server is None, "already listening"
        server = _TrackingServer(
            [self.service], codec=RawCodec(self.template.config.limits.max_message_bytes)
        )
        await server.start("127.0.0.1", self.port, reuse_address=True)
        # grpclib's Server has no public way to tell the port it bound; its asyncio
        # Server (`_server`) has.
        sockets = server._server.sockets  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]
        self._server = server
        return self

    def _connections(self) -> list[asyncio.Transport]:
        if self._server is None:
            return []
        found = (_live_transport(p) for p in self._server.protocols)
        return [t for t in found if t is not None]

    def reset_connections(self) -> int:
        """Reset every live connection at once (the listener stays); returns how many.
        Safe to call from inside a call being handled: nothing more is written."""
        reset = 0
        for transport in self._connections():
            abort_with_reset(transport)
            reset += 1
        self.aborted += reset
        return reset

    async def crash(self) -> None:
        """Reset every connection, cancel the calls in progress, stop listening."""
        self.reset_connections()
        server, self._server = self._server, None
        if server is None:
            return
        self.crashes += 1
        self.accepted += len(server.protocols)
        server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5)

    async def restart(self, downtime: float = 0.2) -> None:
        await self.crash()
        await asyncio.sleep(downtime)
        await self.start()

    def goaway(self, last_stream_id: int = 2**31 - 1) -> int:
        """Send GOAWAY (NO_ERROR) on every live connection, keeping the TCP connection
        open, as a server that starts a graceful shutdown does; returns how many."""
        sent = 0
        if self._server is None:
            return 0
        for protocol in self._server.protocols:
            if _live_transport(protocol) is None:
                continue
            # grpclib sends no GOAWAY of its own: use its h2 connection (`_connection`).
            h2_connection = protocol.connection._connection
            h2_connection.close_connection(error_code=0, last_stream_id=last_stream_id)
            protocol.connection.flush()
            sent += 1
        return sent

    def counts(self, queue: str) -> Any:
        return self.state.counts(queue)

    @property
    def connections(self) -> int:
        """Connections accepted so far, by every incarnation."""
        current = 0 if self._server is None else len(self._server.protocols)
        return self.accepted + current

    async def stop(self) -> None:
        """Shut down for good: close every connection and the state's timers."""
        server, self._server = self._server, None
        if server is not None:
            self.accepted += len(server.protocols)
            server.close()
            for transport in (_live_transport(p) for p in server.protocols):
                if transport is not None:
                    transport.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        await self.template.stop()  # never started: closes the state only

    async def __aenter__(self) -> RestartableServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# ---------------------------------------------------------------------------------------
# The server as a real process

_LISTENING = re.compile(r"queue server listening addr=(\S+):(\d+)")


class ServerProcess:
    """``python -m sepp_lite.testing`` in a subprocess on 127.0.0.1.

    ``kill()`` is SIGKILL (the in-memory state is lost), ``freeze()``/``thaw()`` are
    SIGSTOP/SIGCONT, ``start()`` again listens on the same port. The process is always
    killed and reaped on exit.
    """

    def __init__(self, *args: str, port: int = 0) -> None:
        self.args = list(args)
        self.port = port
        self.starts = 0
        self._proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    async def start(self, timeout: float = 15.0) -> ServerProcess:
        assert self._proc is None, "already running"
        proc = self._proc = self._spawn()
        assert proc.stdout is not None
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), timeout)
        except BaseException:
            self.kill()
            raise
        match = _LISTENING.search(line.decode(errors="replace"))
        if match is None:
            self.kill()
            raise AssertionError(f"the server did not start: {line!r}")
        self.port = int(match.group(2))
        self.starts += 1
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "sepp_lite.testing", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), *self.args]
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT
        )

    def kill(self) -> None:
        """SIGKILL (after a SIGCONT, so a frozen process dies too) and reap."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

    def freeze(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    async def __aenter__(self) -> ServerProcess:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.kill()


# ---------------------------------------------------------------------------------------
# A bare HTTP/2 server that plays scripted frames


@dataclass
class Headers:
    """A HEADERS frame (``end`` sets END_STREAM): response headers or trailers."""

    headers: list[tuple[bytes, bytes]]
    end: bool = False


@dataclass
class Data:
    """A DATA frame with these bytes (``end`` sets END_STREAM)."""

    data: bytes
    end: bool = False


@dataclass
class Reset:
    """RST_STREAM on the request's stream."""

    code: int = 2  # INTERNAL_ERROR


@dataclass
class GoAway:
    """GOAWAY on the connection (the TCP connection stays open)."""

    code: int = 0
    last_stream_id: Optional[int] = None


@dataclass
class Abort:
    """Close the TCP connection at once with a RST."""


@dataclass
class Close:
    """Close the TCP connection after flushing (a FIN)."""


@dataclass
class Raw:
    """Write these bytes to the socket as they are (not framed by h2)."""

    data: bytes


@dataclass
class Sleep:
    seconds: float


@dataclass
class Hang:
    """Never go on (until the server closes)."""


Action = Union[Headers, Data, Reset, GoAway, Abort, Close, Raw, Sleep, Hang]


@dataclass
class RawRequest:
    path: str
    headers: list[tuple[str, str]]
    body: bytes = b""


Responder = Callable[[RawRequest], Sequence[Action]]


def grpc_ok(message: bytes) -> list[Action]:
    """A well-formed unary gRPC answer carrying ``message``."""
    return [
        Headers([(b":status", b"200"), (b"content-type", b"application/grpc")]),
        Data(b"\x00" + len(message).to_bytes(4, "big") + message),
        Headers([(b"grpc-status", b"0")], end=True),
    ]


@dataclass
class _Conn:
    transport: asyncio.Transport
    h2: h2.connection.H2Connection
    requests: dict[int, RawRequest] = field(default_factory=dict)


class RawH2Server:
    """An HTTP/2 server that answers every request with ``responder(request)``'s
    frames. Outbound header checks are off, so hostile headers go out as given."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.port = 0
        self.requests: list[RawRequest] = []
        self.connections = 0
        self._conns: list[_Conn] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: Optional[asyncio.AbstractServer] = None
        self._closing = asyncio.Event()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> RawH2Server:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _RawProtocol(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        assert self._server is not None
        self._server.close()
        for conn in self._conns:
            conn.transport.abort()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._server.wait_closed()

    def _flush(self, conn: _Conn) -> None:
        data = conn.h2.data_to_send()
        if data and not conn.transport.is_closing():
            conn.transport.write(data)

    async def _play(self, conn: _Conn, stream_id: int, request: RawRequest) -> None:
        for action in self.responder(request):
            if conn.transport.is_closing():
                return
            try:
                if not await self._act(conn, stream_id, action):
                    return
            except h2.exceptions.H2Error:
                return  # the stream or connection is gone: nothing more to send
            self._flush(conn)

    async def _act(self, conn: _Conn, stream_id: int, action: Action) -> bool:
        if isinstance(action, Headers):
            conn.h2.send_headers(stream_id, action.headers, end_stream=action.end)
        elif isinstance(action, Data):
            conn.h2.send_data(stream_id, action.data, end_stream=action.end)
        elif isinstance(action, Reset):
            conn.h2.reset_stream(stream_id, error_code=action.code)
        elif isinstance(action, GoAway):
            conn.h2.close_connection(action.code, last_stream_id=action.last_stream_id)
        elif isinstance(action, Abort):
            abort_with_reset(conn.transport)
            return False
        elif isinstance(action, Close):
            self._flush(conn)
            conn.transport.close()
            return False
        elif isinstance(action, Raw):
            self._flush(conn)
            conn.transport.write(action.data)
        elif isinstance(action, Sleep):
            await asyncio.sleep(action.seconds)
        else:
            await self._closing.wait()
            return False
        return True

    def _received(self, conn: _Conn, data: bytes) -> None:
        try:
            events = conn.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush(conn)
            conn.transport.close()
            return
        for event in events:
            self._event(conn, event)
        self._flush(conn)

    def _event(self, conn: _Conn, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = [(as_text(k), as_text(v)) for k, v in event.headers or ()]
            path = dict(headers).get(":path", "")
            conn.requests[event.stream_id] = RawRequest(path, headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            request = conn.requests.get(event.stream_id)  # type: ignore[arg-type]
            if request is not None:
                request.body += event.data or b""
            conn.h2.acknowledge_received_data(
                event.flow_controlled_length or 0,
                event.stream_id,  # type: ignore[arg-type]
            )
        elif isinstance(event, h2.events.StreamEnded):
            request = conn.requests.pop(event.stream_id, None)  # type: ignore[arg-type]
            if request is not None:
                self.requests.append(request)
                task = asyncio.ensure_future(self._play(conn, event.stream_id, request))  # type: ignore[arg-type]
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)


def as_text(value: Union[bytes, str]) -> str:
    """A header name or value as text (h2 hands them over as bytes or str)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class _RawProtocol(asyncio.Protocol):
    def __init__(self, server: RawH2Server) -> None:
        self.server = server
        self.conn: Optional[_Conn] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        conn = _Conn(transport, h2.connection.H2Connection(config=config))  # type: ignore[arg-type]
        conn.h2.initiate_connection()
        self.conn = conn
        self.server.connections += 1
        self.server._conns.append(conn)
        self.server._flush(conn)

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.server._received(self.conn, data)


# ---------------------------------------------------------------------------------------
# Servers on another thread


class ServerThread:
    """An event loop in a daemon thread for servers (or anything) the test does not
    want on its own thread; :meth:`run` runs a coroutine there and returns its result.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="fault-servers", daemon=True)
        self._stack: list[Any] = []

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def ident(self) -> Optional[int]:
        return self._thread.ident

    def __enter__(self) -> ServerThread:
        self._thread.start()
        return self

    async def run(self, coro: Awaitable[T], timeout: float = 20.0) -> T:
        future = asyncio.run_coroutine_threadsafe(_await(coro), self.loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    async def enter(self, factory: Callable[[], Any]) -> Any:
        """Build an async context manager on the thread (on Python 3.9 asyncio objects
        bind to the loop of the thread that creates them) and enter it there; it is
        exited by :meth:`aclose`."""

        async def build_and_enter() -> Any:
            manager = factory()
            value = await manager.__aenter__()
            self._stack.append(manager)
            return value

        return await self.run(build_and_enter())

    async def aclose(self) -> None:
        while self._stack:
            manager = self._stack.pop()
            await self.run(manager.__aexit__(None, None, None))

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _await(coro: Awaitable[T]) -> T:
    return await coro


# ---------------------------------------------------------------------------------------
# Logs


class LogCapture(logging.Handler):
    """Every record of every logger, at DEBUG: the root and each named logger in
    ``loggers`` are set to DEBUG (and to propagate) for the block; ``records`` keeps
    them with their exception text rendered."""

    def __init__(self, loggers: Sequence[str] = ()) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.loggers = ["", *loggers]
        self._saved: list[tuple[logging.Logger, int, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        self.records.append(record)

    def text(self, record: logging.LogRecord) -> str:
        """Everything a formatter could print for ``record``."""
        parts = [record.getMessage(), repr(record.args), record.exc_text or ""]
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(repr(record.exc_info[1]))
        parts.append(record.stack_info or "")
        return "\n".join(parts)

    @contextlib.contextmanager
    def installed(self) -> Iterator[LogCapture]:
        for name in self.loggers:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.level, logger.propagate))
            logger.setLevel(logging.DEBUG)
            if name:
                logger.propagate = True
        root = logging.getLogger()
        root.addHandler(self)
        try:
            yield self
        finally:
            root.removeHandler(self)
            for logger, level, propagate in reversed(self._saved):
                logger.setLevel(level)
                logger.propagate = propagate
            self._saved.clear()
