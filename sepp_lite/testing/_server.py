"""``SeppTestServer``: the state machine served over real sockets with grpclib."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import tempfile
import weakref
from collections.abc import Awaitable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional

import grpclib.server
from grpclib.config import Configuration
from grpclib.protocol import H2Protocol

from sepp_lite._wire.redact import protect_credentials_in_logs
from sepp_lite.testing._clock import Clock, ManualClock, RealClock
from sepp_lite.testing._config import ConfigError, PemSource, ServerConfig
from sepp_lite.testing._service import QueueService, RawCodec, Routes
from sepp_lite.testing._state import Backlog, QueueCounts, QueueState

if TYPE_CHECKING:
    from sepp_lite.types import QueueNames

__all__ = ["SeppTestServer"]

log = logging.getLogger(__name__)

# How long stop() lets running calls (long polls answering empty) finish before
# cancelling them.
_DRAIN_TIMEOUT = 2.0
_CLOSE_TIMEOUT = 5.0


class _GrpcServer(grpclib.server.Server):
    """grpclib's server, remembering its connections: it has no way to close them, and
    from Python 3.12 ``asyncio.Server.wait_closed`` waits for every one of them."""

    def __init__(
        self, service: QueueService, on_connection: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__([service], **kwargs)
        self._mapping = Routes(self._mapping, service.fallback_handler())
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        self._on_connection = on_connection

    # grpclib's private hook: the one place a new connection can be seen (a grpclib
    # internal the test server needs; tests/test_architecture.py lists it).
    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        self._on_connection()
        return protocol

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()


@contextlib.contextmanager
def _pem_path(source: PemSource) -> Iterator[str]:
    """A file path for PEM given as bytes, PEM text or a path (``ssl`` reads files)."""
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        source = source.encode()
    if not isinstance(source, bytes):
        yield os.fspath(source)
        return
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(source)
        yield path
    finally:
        os.unlink(path)


def server_ssl_context(cert: PemSource, key: PemSource) -> ssl.SSLContext:
    """A TLS 1.2+ server context offering ALPN ``h2`` (gRPC clients require it).
    Raises :class:`ConfigError` when the certificate or key cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        with _pem_path(cert) as cert_path, _pem_path(key) as key_path:
            context.load_cert_chain(cert_path, key_path)
    except OSError as exc:  # ssl.SSLError included
        raise ConfigError(f"cannot load the TLS certificate and key: {exc}") from None
    return context


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    if family in (socket.AF_INET, socket.AF_INET6):
        # grpclib sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; without
        # it every response waits out Nagle and a delayed ACK (40 ms on Linux).
        proto = socket.IPPROTO_TCP
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _server_configuration() -> Configuration:
    # The real server (hyper) pings every 30 s and drops a connection after 10 s
    # without an answer, and never refuses client pings.
    return Configuration(
        _keepalive_time=30,
        _keepalive_timeout=10,
        _keepalive_permit_without_calls=True,
        _http2_max_pings_without_data=0,
        _http2_min_sent_ping_interval_without_data=30,
    )


class SeppTestServer:
    """An in-process sepp server on real sockets (127.0.0.1 and a free port by default).

    ``SeppTestServer(config, clock=ManualClock(), **overrides)``: ``overrides`` replace
    :class:`ServerConfig` fields, or :class:`Limits` fields by name. Use it as an async
    context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        config: Optional[ServerConfig] = None,
        *,
        clock: Optional[Clock] = None,
        **config_overrides: Any,
    ) -> None:
        base = config if config is not None else ServerConfig()
        self.config = base.with_overrides(**config_overrides) if config_overrides else base
        self.clock: Clock = clock if clock is not None else RealClock()
        self.state = QueueState(self.config, clock=self.clock)
        self.service = QueueService(self.state, self.config.api_key_set)
        if self.config.api_key_set is not None:
            protect_credentials_in_logs()  # hpack would log the keys clients send
        self.host = self.config.host
        self.port = self.config.port
        self._grpc: Optional[_GrpcServer] = None
        self._stopped = False
        self._accepted = 0

    @property
    def addr(self) -> str:
        """``host:port`` of the listening socket (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def connections_accepted(self) -> int:
        """How many client connections this server has accepted (closed ones too)."""
        return self._accepted

    def _count_connection(self) -> None:
        self._accepted += 1

    @property
    def running(self) -> bool:
        """Whether the server is accepting connections."""
        return self._grpc is not None

    async def start(self) -> SeppTestServer:
        """Bind and start serving; returns ``self``. Raises ``OSError`` when the address
        cannot be bound and ``RuntimeError`` when started twice."""
        if self._grpc is not None or self._stopped:
            raise RuntimeError("a SeppTestServer can be started only once")
        context = None
        if self.config.tls_cert is not None and self.config.tls_key is not None:
            context = server_ssl_context(self.config.tls_cert, self.config.tls_key)
        server = _GrpcServer(
            self.service,
            self._count_connection,
            codec=RawCodec(self.config.limits.max_message_bytes),
            config=_server_configuration(),
        )
        sock = _bind(self.host, self.port)
        try:
            await server.start(sock=sock, ssl=context)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._grpc = server
        if self.config.api_key_set is not None and context is None:
            log.warning("API-key auth is enabled without TLS; keys are sent in plaintext")
        log.info("sepp test server listening on %s", self.addr)
        return self

    async def stop(self) -> None:
        """Shut down gracefully: pending long polls answer empty, running calls get
        up to 2 s to finish, then every call and connection is closed. Idempotent."""
        server, self._grpc = self._grpc, None
        self._stopped = True
        self.service.close()  # the state too: pending long polls answer empty
        if server is None:
            return
        if not await self.service.wait_idle(_DRAIN_TIMEOUT):
            log.warning(
                "%d call(s) still running at shutdown; cancelling them", self.service.active_calls
            )
        server.close()
        server.close_connections()
        try:
            await asyncio.wait_for(server.wait_closed(), _CLOSE_TIMEOUT)
        except asyncio.TimeoutError:
            log.warning("the server did not close within %s s", _CLOSE_TIMEOUT)

    async def __aenter__(self) -> SeppTestServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.stop()

    def before_call(self, method: str, hook: Optional[Callable[[], Awaitable[None]]]) -> None:
        """Await ``hook()`` at the start of every call to ``method`` (``"EnqueueBatch"``,
        ``"Reserve"``, ... any of the eight ``sepp.v1.QueueService`` RPCs by name), once
        its request has arrived and its API key is checked and before the server acts on
        it; ``None`` removes the hook. Raises ``ValueError`` for another name.

        For tests of what a client does while it waits for an answer: a hook that
        waits for an event holds the call open until the event is set, and one that
        counts the calls can hold only the n-th. It can be set or removed before or
        after :meth:`start`.
        """
        self.service.set_call_hook(method, hook)

    def counts(self, queue: str) -> QueueCounts:
        """``(ready, scheduled, in_flight, dead)`` of ``queue``."""
        return self.state.counts(queue)

    def backlog(self, queues: Optional[QueueNames] = None) -> Backlog:
        """What is left to do on ``queues`` (every queue when ``None``); see
        :meth:`QueueState.backlog`."""
        return self.state.backlog(queues)

    async def advance(self, seconds: float) -> None:
        """Move a :class:`ManualClock` forward, run the timers that fall due (lease
        expiries, schedules, long-poll deadlines...) and let woken calls proceed.
        Raises ``TypeError`` with any other clock."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs a SeppTestServer created with clock=ManualClock()")
        self.clock.advance(seconds)
        for _ in range(8):
            await asyncio.sleep(0)
