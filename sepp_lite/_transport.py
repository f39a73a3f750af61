"""The grpclib side of the client: addresses, TLS, keepalive, user-agent, auth metadata,
the receive limit, connecting, and one unary call of raw bytes.

Every non-public grpclib knob the client depends on is touched in this module only,
each with a comment saying why.
"""

from __future__ import annotations

import asyncio
import platform
import ssl
import sys
from dataclasses import dataclass
from typing import Any, Optional

import grpclib
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import decode_grpc_message
from grpclib.utils import Wrapper
from hpack import NeverIndexedHeaderTuple

from sepp_lite import _otel
from sepp_lite._cork import cork
from sepp_lite._version import __version__
from sepp_lite.errors import (
    ConnectError,
    InvalidApiKeyError,
    ResponseTooLargeError,
    map_failure,
)

logger = _otel.logger()

DEFAULT_MAX_RECEIVE = 16 * 1024 * 1024
SERVICE_PREFIX = "/sepp.v1.QueueService/"
USER_AGENT = f"sepp-lite/{__version__}"


@dataclass(frozen=True)
class Target:
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


def parse_address(addr: str) -> Target:
    """Parse ``host:port``, ``http://host:port``, ``https://host[:port]``,
    ``dns:///host:port``, ``[v6]:port`` or ``unix:/path``; raise ``ValueError``. A
    missing port means 443, as in grpc."""
    rest, tls = addr, False
    for prefix, is_tls in (("http://", False), ("https://", True), ("dns:///", False)):
        if rest.startswith(prefix):
            rest, tls = rest[len(prefix) :], is_tls
            break
    if rest.startswith("unix:"):
        path = rest[len("unix:") :]
        if not path.strip("/"):
            raise ValueError(f"cannot parse the address {addr!r}: expected unix:/path")
        return Target(None, None, path, tls)
    host, port_text = _split_host_port(rest.rstrip("/"), addr)
    host = _ascii_host(host, addr)
    if port_text is None:
        return Target(host, 443, tls=tls)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"cannot parse the address {addr!r}: bad port {port_text!r}")
    return Target(host, int(port_text), tls=tls)


def _ascii_host(host: str, addr: str) -> str:
    """The host as sent on the wire: an internationalised name in its IDNA (punycode)
    form; a name that cannot be one (an empty label, one over 63 bytes) is refused."""
    if ":" in host:  # an IPv6 literal
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"cannot parse the address {addr!r}: invalid host name") from None


def _split_host_port(rest: str, addr: str) -> tuple[str, str | None]:
    """``host`` and the port text (``None`` when there is no ``:port`` at all)."""
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError(f"cannot parse the address {addr!r}: expected [v6-address]:port")
        port_text = tail[1:] if tail else None
    else:
        host, sep, port_text_or_host = rest.rpartition(":")
        port_text = port_text_or_host if sep else None
        host = host if sep else rest
    if not host or "/" in host:
        raise ValueError(f"cannot parse the address {addr!r}: expected host:port")
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


@dataclass(frozen=True)
class Keepalive:
    """HTTP/2 keepalive, sepp-py's values by default: a PING every ``time`` seconds,
    idle or not, and the connection is dropped when no ACK comes within ``timeout``."""

    time: float = 30.0
    timeout: float = 10.0


def channel_config(keepalive: Keepalive, tls_domain: str | None) -> Configuration:
    """grpclib's Configuration. The underscore fields are grpclib's non-public keepalive
    knobs (stack-evaluation §5.1): without all five, grpclib pings at most once per
    300 s and never on an idle connection, so a dead peer would go unnoticed."""
    return Configuration(
        _keepalive_time=keepalive.time,  # first PING after this much silence
        _keepalive_timeout=keepalive.timeout,  # close when the ACK does not come
        _keepalive_permit_without_calls=True,  # ping an idle connection too
        _http2_max_pings_without_data=0,  # 0 = no cap on pings between data frames
        _http2_min_sent_ping_interval_without_data=keepalive.time,  # not 300 s
        ssl_target_name_override=tls_domain,  # the name the certificate must carry
    )


def describe_connect_failure(exc: BaseException) -> str:
    """A one-line reason for a failed connect (never containing credentials)."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.__class__.__name__ == "gaierror":
        return f"cannot resolve the host name: {exc.strerror or exc}"
    return f"{exc.__class__.__name__}: {exc}"


_H2_STATUS = {
    "400": Status.INTERNAL,
    "401": Status.UNAUTHENTICATED,
    "403": Status.PERMISSION_DENIED,
    "404": Status.UNIMPLEMENTED,
    "429": Status.UNAVAILABLE,
    "502": Status.UNAVAILABLE,
    "503": Status.UNAVAILABLE,
    "504": Status.UNAVAILABLE,
}


def _grpc_status(headers: list[tuple[str, str]]) -> tuple[Status, str] | None:
    """The call's status from trailers (or trailers-only headers); ``None`` if absent."""
    code = message = None
    for name, value in headers:
        if name == "grpc-status":
            code = value
        elif name == "grpc-message":
            message = value
    if code is None:
        return None
    try:
        status = Status(int(code))
    except ValueError:
        return Status.UNKNOWN, f"invalid grpc-status {code!r}"
    return status, decode_grpc_message(message) if message else ""


def _check_response_headers(headers: list[tuple[str, str]]) -> tuple[Status, str] | None:
    """Raise for a non-gRPC answer; return the status of a trailers-only answer."""
    http_status = content_type = None
    for name, value in headers:
        if name == ":status":
            http_status = value
        elif name == "content-type":
            content_type = value
    if http_status != "200":
        status = _H2_STATUS.get(http_status or "", Status.UNKNOWN)
        raise GRPCError(status, f"HTTP status {http_status}")
    if content_type is None or not content_type.startswith("application/grpc"):
        raise GRPCError(Status.UNKNOWN, f"unexpected content-type {content_type!r}")
    return _grpc_status(headers)


def _timeout_value(seconds: float) -> bytes:
    """A ``grpc-timeout`` header value that stays the same from call to call (whole
    seconds, rounded up), so HPACK sends it as a one-byte index after the first call.
    The precise deadline is enforced here, on the client."""
    return b"%dS" % max(1, -int(-seconds // 1))


class Transport:
    """One grpclib channel plus what every call needs: the method paths, the request
    headers (pre-encoded once), the receive limit. ``unary`` is the one place a call
    crosses the wire.

    Calls run on grpclib's protocol layer (``Channel.__connect__``, the connection's
    streams and ``grpclib.utils.Wrapper``) rather than ``grpclib.client.Stream``: that
    skips per-call event dispatch, metadata re-validation and header re-encoding,
    which cost about a third of a small call's CPU time. grpclib still owns the
    connection: connecting, flow control, keepalive pings, GOAWAY and stream limits.
    """

    def __init__(
        self,
        channel: Channel,
        *,
        metadata: tuple[tuple[str, str], ...] = (),
        max_receive: int = DEFAULT_MAX_RECEIVE,
        label: str = "",
    ) -> None:
        self.channel = channel
        self.max_receive = max_receive
        self.label = label or repr(channel)
        self.closed = False
        scheme = b"https" if channel._ssl is not None else b"http"  # grpclib's own choice
        authority = channel._authority.encode("ascii")
        self._base_headers = (
            (b":method", b"POST"),
            (b":scheme", scheme),
        )
        self._tail_headers = (
            (b":authority", authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", _user_agent().encode("ascii")),
        ) + _encode_metadata(metadata)
        self._paths: dict[str, bytes] = {}
        self._tuned: object = None  # the connection _bound_closed_streams last saw

    async def connect(self, timeout: float) -> None:
        """Open the connection now (grpclib connects lazily), or raise ConnectError."""
        try:
            # Channel.__connect__ is grpclib's own connect step, which every call runs
            # first; calling it up front gives connect-time errors and a timeout.
            await asyncio.wait_for(self.channel.__connect__(), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            self.channel.close()
            reason = describe_connect_failure(exc)
            logger.error("cannot connect to the sepp server at %s: %s", self.label, reason)
            raise ConnectError(self.label, reason) from exc

    def _headers(
        self, method: str, timeout: float, extra: tuple[tuple[str, str], ...]
    ) -> list[tuple[bytes, bytes]]:
        path = self._paths.get(method)
        if path is None:
            path = self._paths[method] = (SERVICE_PREFIX + method).encode("ascii")
        headers = [*self._base_headers, (b":path", path), *self._tail_headers]
        headers.append((b"grpc-timeout", _timeout_value(timeout)))
        if extra:
            headers.extend((name.encode("ascii"), value.encode("ascii")) for name, value in extra)
        return headers

    async def unary(
        self,
        method: str,
        request: bytes,
        deadline_at: float,
        extra_metadata: tuple[tuple[str, str], ...] = (),
        kind: str = "generic",
        timeout_hint: float = 30.0,
    ) -> bytes:
        """One unary call that must finish by ``deadline_at`` (``loop.time()``); every
        failure comes out as a SeppError."""
        if self.closed:
            raise RuntimeError("this SeppClient is closed")
        try:
            return await self._call(method, request, deadline_at, extra_metadata, timeout_hint)
        except Exception as exc:
            error = map_failure(exc, kind)  # type: ignore[arg-type]
            if error is None or error is exc:
                raise
            raise error from exc

    async def _call(
        self,
        method: str,
        request: bytes,
        deadline_at: float,
        extra: tuple[tuple[str, str], ...],
        timeout_hint: float,
    ) -> bytes:
        loop = asyncio.get_running_loop()
        if deadline_at <= loop.time():
            raise asyncio.TimeoutError("deadline exceeded before the call started")
        wrapper = Wrapper()
        # The Wrapper cancels this task with the error it is given: our deadline, or
        # StreamTerminatedError when grpclib sees the connection or the stream die.
        timer = loop.call_at(deadline_at, wrapper.cancel, asyncio.TimeoutError("deadline exceeded"))
        try:
            with wrapper:
                protocol = await self.channel.__connect__()
                processor = protocol.processor
                if protocol is not self._tuned:
                    self._tuned = protocol
                    _bound_closed_streams(processor.connection)
                stream = processor.connection.create_stream(wrapper=wrapper)
                headers: Any = self._headers(method, timeout_hint, extra)  # h2 takes bytes too
                frame = b"\x00%s%s" % (len(request).to_bytes(4, "big"), request)
                release = None
                try:
                    # grpclib's Connection keeps its asyncio transport in `_transport`.
                    cork(getattr(processor.connection, "_transport", None))
                    release = await stream.send_request(headers, _processor=processor)
                    await stream.send_data(frame, end_stream=True)
                    return await self._receive(stream)
                finally:
                    if release is not None:
                        if stream.closable:
                            stream.reset_nowait()
                        release()
        finally:
            timer.cancel()

    async def _receive(self, stream: Any) -> bytes:
        status = _check_response_headers(await stream.recv_headers())
        if status is not None:  # trailers-only: an error, or OK without a message
            raise (
                GRPCError(*status)
                if status[0] is not Status.OK
                else GRPCError(Status.INTERNAL, "the server sent no response message")
            )
        message = await self._message(stream)
        # Reading on to the end of the stream, rather than waiting for trailers, fails a
        # response that ends without them at once instead of at the deadline. The
        # trailers, when sent, came before the end.
        if await _read(stream, 1):
            raise GRPCError(Status.INTERNAL, "the server sent more than one response message")
        status = _grpc_status(stream.trailers or [])
        if status is None:
            raise GRPCError(Status.INTERNAL, "the response ended without a grpc-status")
        if status[0] is not Status.OK:
            raise GRPCError(*status)
        if message is None:
            raise GRPCError(Status.INTERNAL, "the server sent no response message")
        return message

    async def _message(self, stream: Any) -> bytes | None:
        """The one response message, or ``None`` when the body is empty."""
        prefix = await _read(stream, 5)
        if not prefix:
            return None
        if prefix[0]:
            raise GRPCError(Status.INTERNAL, "compressed responses are not supported")
        size = int.from_bytes(prefix[1:5], "big")
        if size > self.max_receive:
            raise ResponseTooLargeError(size, self.max_receive)
        return await _read(stream, size) if size else b""

    async def close(self) -> None:
        """Close the connection and wait (at most a second) until its socket is really
        closed: a TLS shutdown finishes asynchronously, and an event loop that ends
        first would leave the socket open (and warn about it)."""
        self.closed = True
        protocol = self.channel._protocol  # grpclib's live connection, None when idle
        transport = getattr(getattr(protocol, "connection", None), "_transport", None)
        self.channel.close()
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        for _ in range(100):
            if sock is None or sock.fileno() == -1:
                return
            await asyncio.sleep(0.01)
        transport.abort()
        await asyncio.sleep(0)


# How many closed streams h2 remembers per connection (it answers late frames on them
# correctly); h2's own default is 65,536, about 8 MiB once reached.
_CLOSED_STREAMS_KEPT = 2048


def _bound_closed_streams(connection: Any) -> None:
    """Keep fewer closed-stream records on a new connection. h2 files every closed
    stream in a size-limited dict whose default limit lets a busy worker's memory grow
    by about 8 MiB over its first 65,536 calls. Both names are private (grpclib's
    Connection keeps the h2 connection in ``_connection``, h2 the dict in
    ``_closed_streams``), so anything unexpected is left alone."""
    h2_connection = getattr(connection, "_connection", None)
    closed = getattr(h2_connection, "_closed_streams", None)
    if closed is not None and isinstance(getattr(closed, "_size_limit", None), int):
        closed._size_limit = min(closed._size_limit, _CLOSED_STREAMS_KEPT)


async def _read(stream: Any, size: int) -> bytes:
    """``size`` bytes of the response body, or ``b""`` when it has ended. grpclib's
    buffer raises a bare AssertionError when the stream ends partway through the bytes
    asked for: a truncated message is the server's fault, and an INTERNAL status here,
    not an exception outside the error tree (it would stop a Worker)."""
    try:
        data: bytes = await stream.recv_data(size)
    except AssertionError:
        raise GRPCError(Status.INTERNAL, "the response ended inside a message") from None
    return data


def _user_agent() -> str:
    """``sepp-lite/<version>``, then grpclib's own product token."""
    runtime = f"{platform.python_implementation().lower()}/{platform.python_version()}"
    return f"{USER_AGENT} grpc-python-grpclib/{grpclib.__version__} ({sys.platform}; {runtime})"


def _encode_metadata(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """Check metadata once (lower-case names, printable ASCII values), as bytes. The
    ``authorization`` header is never indexed: HPACK then neither keeps the key in its
    connection-wide table nor shows it in its debug log."""
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
        pair = (name.encode("ascii"), value.encode("ascii"))
        encoded.append(NeverIndexedHeaderTuple(*pair) if name in _SECRET_HEADERS else pair)
    return tuple(encoded)


_SECRET_HEADERS = frozenset({"authorization"})
