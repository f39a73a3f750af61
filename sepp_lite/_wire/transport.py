"""Connecting the client: addresses, TLS, auth metadata, the user-agent, and the one
transport interface every call goes through.

Two transports implement :class:`Transport`: :class:`Http2Transport`, the client's own
HTTP/2 connections (``SeppClient.connect``), and ``grpclib_transport``'s adapter for a
grpclib ``Channel`` (``SeppClient.from_channel``), imported only when one is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import socket
import ssl
import sys
from typing import NamedTuple, Optional, Protocol

from sepp_lite import _log
from sepp_lite._sending import MAX_MESSAGE_BYTES
from sepp_lite._status import CallFailure, Status
from sepp_lite._version import __version__
from sepp_lite._wire import grpc
from sepp_lite._wire.http2 import (
    DEFAULT_CONFIG,
    Connection,
    HandshakeFailure,
    Http2Config,
    Keepalive,
    RequestHead,
    StreamFailure,
    extra_fields,
    request_head,
)
from sepp_lite.errors import ConnectError, InvalidApiKeyError

logger = _log.logger()

SERVICE_PREFIX = "/sepp.v1.QueueService/"
USER_AGENT = f"sepp-lite/{__version__}"


class Target(NamedTuple):
    """Where to connect: ``host:port``, or a unix socket ``path``; ``tls`` when the
    address said ``https://``."""

    host: Optional[str]
    port: Optional[int]
    path: Optional[str] = None
    tls: bool = False

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}"


_ADDRESS_FORMS = "host:port, http://host:port, https://host[:port] or unix:/path"


def _bad_address(addr: str, problem: str) -> ValueError:
    """The error for a malformed address: the whole address, then what is wrong."""
    return ValueError(f"cannot parse the address {addr!r}: {problem} (expected {_ADDRESS_FORMS})")


def parse_address(addr: str) -> Target:
    """Parse ``host:port``, ``http://host:port``, ``https://host[:port]``,
    ``dns:///host:port``, ``[v6]:port`` or ``unix:/path``; raise ``ValueError`` naming
    the whole address and what is wrong with it. A missing port means 443, as in grpc."""
    rest, tls = addr, False
    for prefix, is_tls in (("http://", False), ("https://", True), ("dns:///", False)):
        if rest.startswith(prefix):
            rest, tls = rest[len(prefix) :], is_tls
            break
    else:
        scheme, sep, _ = rest.partition("://")
        if sep:
            raise _bad_address(addr, f"unknown scheme {scheme + '://'!r}")
    if rest.startswith("unix:"):
        path = rest[len("unix:") :]
        if not path.strip("/"):
            raise _bad_address(addr, "no socket path after unix:")
        return Target(None, None, path, tls)
    rest = _without_path(rest, addr)
    host, port_text = _split_host_port(rest, addr)
    host = _ascii_host(host, addr)
    if port_text is None:
        return Target(host, 443, tls=tls)
    return Target(host, _port(port_text, addr), tls=tls)


def _without_path(rest: str, addr: str) -> str:
    """``host:port`` without a trailing ``/``; a path after it is an error."""
    host_port, slash, path = rest.partition("/")
    if slash and path.strip("/"):
        raise _bad_address(addr, f"it has a path ({'/' + path!r}), which a gRPC address cannot")
    return host_port


def _port(text: str, addr: str) -> int:
    if not text:
        raise _bad_address(addr, "the port is empty")
    if not text.isdigit():
        raise _bad_address(addr, f"the port {text!r} is not a number")
    if not 0 < int(text) < 65536:
        raise _bad_address(addr, f"the port {text} is out of range (1 to 65535)")
    return int(text)


def _ascii_host(host: str, addr: str) -> str:
    """The host as sent on the wire: an internationalised name in its IDNA (punycode)
    form; a name that cannot be one (an empty label, one over 63 bytes) is refused."""
    if ":" in host:  # an IPv6 literal
        return host
    if host.isascii():
        # What the idna codec checks of an ASCII name, without loading it (and
        # stringprep and unicodedata, about 0.25 MiB) for the names nearly everyone uses.
        labels = host.split(".")
        if labels[-1] == "":
            labels.pop()  # a trailing dot: the root
        if not all(0 < len(label) < 64 for label in labels):
            raise _bad_address(addr, f"invalid host name {host!r}")
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        raise _bad_address(addr, f"invalid host name {host!r}") from None


def _split_host_port(rest: str, addr: str) -> tuple[str, str | None]:
    """``host`` and the port text (``None`` when there is no ``:port`` at all)."""
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket:
            raise _bad_address(addr, "an IPv6 address has no closing ']'")
        if tail and not tail.startswith(":"):
            raise _bad_address(addr, f"expected ':port' after ']', got {tail!r}")
        if not host:
            raise _bad_address(addr, "the IPv6 address in [] is empty")
        port_text = tail[1:] if tail else None
    else:
        host, sep, port_text_or_host = rest.rpartition(":")
        port_text = port_text_or_host if sep else None
        host = host if sep else rest
    if not host:
        raise _bad_address(addr, "it has no host")
    return host, port_text


def bearer_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The ``authorization`` entry for every call, rendered once. The key must be
    non-empty printable ASCII without CR/LF (it travels as an HTTP/2 header value)."""
    if api_key is None:
        return ()
    if not isinstance(api_key, str) or not api_key:
        raise InvalidApiKeyError()
    if not all(" " <= char <= "~" for char in api_key):
        raise InvalidApiKeyError()
    return (("authorization", f"Bearer {api_key}"),)


def tls_context(ca_cert: bytes | None) -> ssl.SSLContext:
    """A verifying client context (certificate and host name): the system's roots, or
    only ``ca_cert`` (PEM) when given, as grpc's ``root_certificates`` does; ALPN h2,
    which gRPC servers require."""
    if ca_cert is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies and checks host names
        context.load_verify_locations(cadata=ca_cert.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    return context


# The one sentence for each TLS mismatch, whichever way the transport found it out.
SERVER_USES_TLS = (
    "the server uses TLS (it answered a plaintext connection in TLS): connect with "
    "tls=True or an https:// address"
)
SERVER_IS_PLAINTEXT = (
    "the server does not use TLS (it answered the TLS handshake in plaintext): connect "
    "without TLS, to host:port or http://host:port"
)


def describe_connect_failure(exc: BaseException) -> tuple[str, Optional[bool]]:
    """A one-line reason for a failed connect (never containing credentials), and
    whether the failure says the server does (True) or does not (False) use TLS."""
    if isinstance(exc, HandshakeFailure):
        if exc.server_uses_tls is not None:
            return (SERVER_USES_TLS if exc.server_uses_tls else SERVER_IS_PLAINTEXT), (
                exc.server_uses_tls
            )
        return exc.reason, None
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message}", None
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if reason in _PLAINTEXT_PEER:
            return SERVER_IS_PLAINTEXT, False
        return f"TLS handshake failed: {reason}", None
    if isinstance(exc, OSError):
        return network_error_words(exc), None
    return f"{exc.__class__.__name__}: {exc}", None


# What a failed connect's errno means, in words (the C library's texts name the
# symptom, not what to check).
_NETWORK_ERRORS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ENETUNREACH: "the network is unreachable (this machine has no route to it)",
    errno.EHOSTUNREACH: "the host is unreachable (it is down, or no route leads to it)",
    errno.ETIMEDOUT: "the connection attempt timed out (the host did not answer)",
    errno.ECONNRESET: "the connection was reset by the other side",
    errno.ECONNABORTED: "the connection was aborted",
    errno.EACCES: "the connection was not permitted (a firewall rule?)",
    errno.EPERM: "the connection was not permitted (a firewall rule?)",
    errno.EADDRNOTAVAIL: "the address cannot be connected to from this machine",
}

_RESOLVER_ERRORS = {
    "EAI_NONAME": "no such host (the name is not known to DNS)",
    "EAI_NODATA": "no such host (the name has no address)",
    "EAI_AGAIN": "the name could not be resolved now (is DNS reachable?)",
    "EAI_FAIL": "the name could not be resolved (DNS failed)",
}

_ERRNO_IN_TEXT = re.compile(r"\[Errno (-?\d+)\]")


def network_error_words(exc: OSError) -> str:
    """A failed connect's ``OSError`` in words, not as errno text."""
    if exc.__class__.__name__ == "gaierror":
        for name, words in _RESOLVER_ERRORS.items():
            if exc.errno is not None and exc.errno == getattr(socket, name, None):
                return f"cannot resolve the host name: {words}"
        return f"cannot resolve the host name: {exc.strerror or exc}"
    code = exc.errno
    if code is None:
        # asyncio's "Multiple exceptions: ..." (one per address of the host): when
        # every address failed alike, that one reason is the answer.
        codes = {int(found) for found in _ERRNO_IN_TEXT.findall(str(exc))}
        code = codes.pop() if len(codes) == 1 else None
    if code in _NETWORK_ERRORS:
        return _NETWORK_ERRORS[code]
    if exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return f"{exc.__class__.__name__}: {exc}"


# OpenSSL's words for a peer that answered a ClientHello with something other than TLS.
_PLAINTEXT_PEER = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)


def user_agent() -> str:
    """``sepp-lite/<version> (<platform>; <implementation>/<version>)``."""
    version = ".".join(map(str, sys.version_info[:3]))
    runtime = f"{sys.implementation.name}/{version}"
    return f"{USER_AGENT} ({sys.platform}; {runtime})"


def encode_metadata(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """Check metadata once (lower-case names, printable ASCII values), as bytes."""
    encoded: list[tuple[bytes, bytes]] = []
    for name, value in metadata:
        if (
            not name
            or name != name.lower()
            or name.startswith((":", "grpc-"))
            or not name.isascii()
        ):
            raise ValueError(f"invalid metadata name {name!r}")
        if not value.isascii() or not value.isprintable():
            raise ValueError(f"invalid value for metadata {name!r}")
        encoded.append((name.encode("ascii"), value.encode("ascii")))
    return tuple(encoded)


class Transport(Protocol):
    """What the client needs from a transport: one unary call of raw bytes, ending
    with the answer or a :class:`~sepp_lite._status.CallFailure` (which the client
    maps to a :class:`~sepp_lite.errors.SeppError` with ``errors.map_failure``)."""

    label: str  # the server's address, for messages
    tls: bool
    closed: bool

    @property
    def connections_opened(self) -> int: ...

    async def unary(
        self,
        method: str,
        request: bytes,
        deadline_at: float,
        extra_metadata: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """Call ``method`` (``Reserve``, ...) with ``extra_metadata`` beside the
        transport's own, and return the response message; the call must end by
        ``deadline_at`` (``loop.time()``). Raises :class:`CallFailure`;
        ``RuntimeError`` once the transport is closed."""
        ...

    async def close(self) -> None: ...


class ReconnectBackoff:
    """Delays between connection attempts, as grpc's channel makes them
    (connection-backoff.md): 1 s, then x1.6 up to 120 s, each jittered by +-20 %.

    Why back off at all: a server that is down or restarting would otherwise get a
    connection attempt per call, from every client at once, just as it comes back.
    Why jitter: clients that lost the same server at the same moment would retry in
    lockstep. Why grpc's numbers: a sepp deployment mixes this client with grpc-based
    ones, and one server should see one pattern."""

    INITIAL = 1.0
    MULTIPLIER = 1.6
    JITTER = 0.2
    MAXIMUM = 120.0

    def __init__(self) -> None:
        self._next = self.INITIAL

    def next(self) -> float:
        import random  # here, not at import: only a failed connect gets this far

        delay = self._next * (1 + random.uniform(-self.JITTER, self.JITTER))
        self._next = min(self._next * self.MULTIPLIER, self.MAXIMUM)
        return delay

    def reset(self) -> None:
        self._next = self.INITIAL


_TLS_PROBE_S = 2.0  # at most this long to learn whether a server that hung up speaks TLS


class Http2Transport:
    """The client's own HTTP/2 transport.

    Calls go to the current connection; when it stops taking streams (a GOAWAY, used-up
    stream ids) or fails, the next call opens a new one, while calls still running on
    the old one finish there. A call the server never processed is sent again, as
    grpc's transparent retries do; failed connection attempts back off as grpc's
    channel does, and calls during the backoff fail at once with UNAVAILABLE.

    Why a new connection beside a draining one rather than after it: a server sends
    GOAWAY to shed or rotate connections (a restart, a load balancer's connection
    age), and the calls it already took are worth finishing where they are, while
    new ones should not wait for the slowest of them (a long poll can take minutes).
    """

    def __init__(
        self,
        target: Target,
        *,
        label: str,
        ssl_context: Optional[ssl.SSLContext] = None,
        tls_domain: Optional[str] = None,
        metadata: tuple[tuple[str, str], ...] = (),
        max_receive: int = MAX_MESSAGE_BYTES,
        keepalive: Optional[Keepalive] = None,
        connect_timeout: float = 5.0,
        config: Http2Config = DEFAULT_CONFIG,
    ) -> None:
        self.label = label
        self.tls = ssl_context is not None
        self.authenticated = any(name == "authorization" for name, _ in metadata)
        self.closed = False
        self._target = target
        self._ssl = ssl_context
        self._server_hostname = (tls_domain or target.host or "localhost") if ssl_context else None
        self._max_receive = max_receive
        self._keepalive = keepalive or Keepalive(30.0, 10.0)
        self._connect_timeout = connect_timeout
        self._config = config
        self._authority = _authority(target)
        self._fields = (
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", user_agent().encode("ascii")),
            *encode_metadata(metadata),
        )
        self._heads: dict[str, RequestHead] = {}
        self._current: Optional[Connection] = None
        self._live: set[Connection] = set()  # the current connection and draining ones
        self._connecting: Optional[asyncio.Task[Connection]] = None
        self._backoff = ReconnectBackoff()
        self._retry_at = 0.0
        self._last_failure: Optional[CallFailure] = None  # while backing off
        self._opened = 0
        self._phase = "connecting"  # or "settings": what a connect timeout interrupted

    @property
    def connections_opened(self) -> int:
        """How many HTTP/2 connections this transport has opened (1 after connect)."""
        return self._opened

    @property
    def live_connections(self) -> list[Connection]:
        """The connections not closed yet: the current one and any still draining."""
        return list(self._live)

    async def connect(self) -> None:
        """Open the first connection: return once the server's SETTINGS came, or raise
        :class:`~sepp_lite.errors.ConnectError` (within the connect timeout)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self._open()
        except (HandshakeFailure, OSError, asyncio.TimeoutError) as exc:
            reason, uses_tls = self._describe(exc)
            if isinstance(exc, HandshakeFailure) and exc.closed_early and not self.tls:
                left = self._connect_timeout - (loop.time() - started)
                if await self._speaks_tls(min(left, _TLS_PROBE_S)):
                    # It closed the plaintext connection, and it completes a TLS handshake.
                    reason, uses_tls = SERVER_USES_TLS, True
            logger.debug("cannot connect to the sepp server at %s: %s", self.label, reason)
            raise ConnectError(self.label, reason, server_uses_tls=uses_tls) from exc

    async def _speaks_tls(self, timeout: float) -> bool:
        """Whether the server completes a TLS handshake (nothing verified, nothing sent):
        asked only to explain a failed plaintext connect."""
        if timeout <= 0:
            return False
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        probe.check_hostname = False
        probe.verify_mode = ssl.CERT_NONE
        probe.set_alpn_protocols(["h2"])
        target = self._target
        try:
            if target.path is not None:
                opening = asyncio.open_unix_connection(
                    target.path, ssl=probe, server_hostname="localhost"
                )
            else:
                opening = asyncio.open_connection(
                    target.host, target.port, ssl=probe, server_hostname=target.host
                )
            _, writer = await asyncio.wait_for(opening, timeout)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), timeout)
        return True

    async def unary(
        self,
        method: str,
        request: bytes,
        deadline_at: float,
        extra_metadata: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        if self.closed:
            raise RuntimeError("this SeppClient is closed")
        head = self._heads.get(method) or self._head(method)
        body = grpc.length_prefixed(request)
        loop = asyncio.get_running_loop()
        attempts = self._config.transparent_retries + 1
        for attempt in range(attempts):
            conn = self._current
            # A draining connection (GOAWAY, stream ids used up) finishes the calls it
            # has but takes no new one: a new call opens its successor beside it, so a
            # server's graceful restart or a proxy's rotation costs no call a failure.
            if conn is None or not conn.accepting:
                conn = await self._connection(deadline_at)
            remaining = deadline_at - loop.time()
            if remaining <= 0:
                raise CallFailure(
                    Status.DEADLINE_EXCEEDED,
                    "deadline exceeded before the call was sent",
                    local=True,
                    ambiguous=False,
                )
            # The server learns the deadline too, so it can stop working on a call
            # whose caller has given up (and a long poll ends before it).
            fields: tuple[tuple[bytes, bytes], ...] = (
                (b"grpc-timeout", grpc.timeout_value(remaining)),
            )
            if extra_metadata:
                fields += _encoded_metadata(extra_metadata)
            extra, size = extra_fields(fields)
            try:
                return await conn.call(
                    head, extra, size, body, deadline_at, grpc.Reader(self._max_receive)
                )
            except StreamFailure as exc:
                failure = grpc.failure_of(exc)
            # Transparent retry, as grpc does: a call the server never processed (a
            # GOAWAY past its stream, REFUSED_STREAM, a connection closed before its
            # stream opened) cannot have been applied, so sending it again is safe
            # whatever the RPC, and the caller never sees a server's routine restart
            # or connection rotation. Bounded, so a server that refuses everything
            # still fails the call.
            if not failure.not_processed or attempt + 1 == attempts:
                raise failure from None
            logger.debug(
                "%s to %s not processed (%s); sending it again", method, self.label, failure
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _head(self, method: str) -> RequestHead:
        path = (SERVICE_PREFIX + method).encode("ascii")
        head = request_head(path, tls=self.tls, authority=self._authority, fields=self._fields)
        self._heads[method] = head
        return head

    async def _connection(self, deadline_at: float) -> Connection:
        """The connection for a new call: the one being opened, or a new one.

        Reconnecting is lazy, on the first call that needs a connection, so an idle
        client holds none open after its server went away; the calls that arrive while
        one is being opened share that attempt (a shield: one caller's deadline or
        cancellation must not abort the others'). While a backoff runs, calls fail at
        once with the last connect failure, as grpc's TRANSIENT_FAILURE does, rather
        than wait: their caller's retry policy or deadline decides what waiting is
        worth."""
        loop = asyncio.get_running_loop()
        connecting = self._connecting
        if connecting is None:
            wait = self._retry_at - loop.time()
            if wait > 0:
                last = self._last_failure
                assert last is not None
                early = CallFailure(
                    last.status,
                    f"{last.message}; next attempt in {wait:.1f} s",
                    local=True,
                    ambiguous=False,
                )
                early.retry_after = wait
                raise early from last.__cause__
            connecting = self._connecting = asyncio.ensure_future(self._reconnect())
            connecting.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(connecting), deadline_at - loop.time())
        except asyncio.TimeoutError:
            raise CallFailure(
                Status.DEADLINE_EXCEEDED,
                "deadline exceeded while connecting",
                local=True,
                ambiguous=False,
            ) from None

    async def _reconnect(self) -> Connection:
        try:
            return await self._open()
        except (HandshakeFailure, OSError, asyncio.TimeoutError) as exc:
            reason, _ = self._describe(exc)
            # Certificate and handshake trouble does not heal by retrying: no status.
            status = None if isinstance(exc, ssl.SSLError) else Status.UNAVAILABLE
            failure = CallFailure(status, f"cannot connect: {reason}", local=True, ambiguous=False)
            failure.__cause__ = exc
            self._last_failure = failure
            failure.retry_after = self._backoff.next()
            self._retry_at = asyncio.get_running_loop().time() + failure.retry_after
            logger.debug("cannot connect to the sepp server at %s: %s", self.label, reason)
            raise failure from exc
        finally:
            self._connecting = None

    async def _open(self) -> Connection:
        """A new connection that the server has sent its SETTINGS on."""
        loop = asyncio.get_running_loop()
        self._phase = "connecting"
        transport, conn = await asyncio.wait_for(self._establish(loop), self._connect_timeout)
        self._opened += 1
        self._backoff.reset()
        self._current = conn
        self._live.add(conn)
        conn.closed.add_done_callback(lambda _: self._live.discard(conn))
        logger.debug("connection %d to %s is open", self._opened, self.label)
        return conn

    async def _establish(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.BaseTransport, Connection]:
        def factory() -> Connection:
            return Connection(config=self._config, keepalive=self._keepalive, label=self.label)

        target, hostname = self._target, self._server_hostname
        if target.path is not None:
            transport, conn = await loop.create_unix_connection(
                factory, target.path, ssl=self._ssl, server_hostname=hostname
            )
        else:
            assert target.host is not None and target.port is not None  # parse_address
            transport, conn = await loop.create_connection(
                factory, target.host, target.port, ssl=self._ssl, server_hostname=hostname
            )
        try:
            _check_alpn(transport)
            self._phase = "settings"
            await conn.ready
        except BaseException:
            transport.abort()
            raise
        return transport, conn

    def _describe(self, exc: BaseException) -> tuple[str, Optional[bool]]:
        if isinstance(exc, asyncio.TimeoutError):
            if self._phase == "settings":
                return "timed out waiting for the server's HTTP/2 settings", None
            return "timed out", None
        return describe_connect_failure(exc)

    async def close(self) -> None:
        """Close every connection and wait (at most a second) until their sockets are
        really closed: a TLS shutdown finishes asynchronously, and an event loop that
        ends first would leave a socket open (and warn about it)."""
        self.closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        live = list(self._live)
        for conn in live:
            conn.close("the client was closed")
        if live:
            await asyncio.wait([conn.closed for conn in live], timeout=1.0)
        for conn in live:
            if not conn.closed.done():
                conn.abort()


def _authority(target: Target) -> bytes:
    if target.path is not None:
        return b"localhost"
    return str(target).encode("ascii")


def _encoded_metadata(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((name.encode("ascii"), value.encode("ascii")) for name, value in metadata)


def _check_alpn(transport: asyncio.BaseTransport) -> None:
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return
    chosen = ssl_object.selected_alpn_protocol()
    # A server that chose another protocol (http/1.1) would read our preface as a bad
    # HTTP/1.1 request and answer or hang up in its own terms: name the cause here. A
    # server that chose nothing is let through; its SETTINGS, or their absence, decide.
    if chosen is not None and chosen != "h2":
        raise HandshakeFailure(
            f"the server chose {chosen!r} in the TLS handshake (ALPN), not HTTP/2 ('h2')"
        )


def _retrieve(task: asyncio.Future[Connection]) -> None:
    if not task.cancelled():
        task.exception()
