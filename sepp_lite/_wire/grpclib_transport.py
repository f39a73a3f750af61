"""The transport behind ``SeppClient.from_channel``: calls on a grpclib ``Channel``.

Imported only when a client wraps a grpclib channel, so ``import sepp_lite`` and
``SeppClient.connect`` never load grpclib or h2. Every grpclib and h2 failure is turned
into a :class:`~sepp_lite._status.CallFailure` here (the client maps it with
``errors.map_failure``); what an answer means is ``grpc``'s, as for the client's own
HTTP/2 transport.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import h2.exceptions
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.utils import Wrapper

from sepp_lite._sending import MAX_MESSAGE_BYTES
from sepp_lite._status import CallFailure, Status, status_of
from sepp_lite._wire import grpc
from sepp_lite._wire.cork import cork
from sepp_lite._wire.http2 import ResponseHeaders, parse_fields
from sepp_lite._wire.transport import (
    SERVICE_PREFIX,
    encode_metadata,
    user_agent,
)


def channel_label(channel: Channel) -> str:
    path = getattr(channel, "_path", None)
    if path:
        return f"unix:{path}"
    return f"{getattr(channel, '_host', '?')}:{getattr(channel, '_port', '?')}"


class GrpclibTransport:
    """One grpclib channel plus what every call needs: the method paths, the request
    headers (pre-encoded once), the receive limit.

    Calls run on grpclib's protocol layer (``Channel.__connect__``, the connection's
    streams and ``grpclib.utils.Wrapper``) rather than ``grpclib.client.Stream``: that
    skips per-call event dispatch, metadata re-validation and header re-encoding.
    grpclib owns the connection: connecting, flow control, pings, GOAWAY, stream limits.
    """

    def __init__(
        self,
        channel: Channel,
        *,
        metadata: tuple[tuple[str, str], ...] = (),
        max_receive: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.channel = channel
        self.max_receive = max_receive
        self.label = channel_label(channel)
        self.closed = False
        self.tls = channel._ssl is not None  # grpclib keeps the SSL context it was given
        self._base_headers = (
            (b":method", b"POST"),
            (b":scheme", b"https" if self.tls else b"http"),
        )
        self._tail_headers = (
            (b":authority", channel._authority.encode("ascii")),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", user_agent().encode("ascii")),
            *_never_indexed(encode_metadata(metadata)),
        )
        self._paths: dict[str, bytes] = {}
        self._tuned: object = None  # the connection _bound_closed_streams last saw
        self._opened = 0

    @property
    def connections_opened(self) -> int:
        """How many connections this client has seen grpclib open."""
        return self._opened

    def _headers(
        self, method: str, timeout: float, extra: tuple[tuple[str, str], ...]
    ) -> list[tuple[bytes, bytes]]:
        path = self._paths.get(method)
        if path is None:
            path = self._paths[method] = (SERVICE_PREFIX + method).encode("ascii")
        headers = [*self._base_headers, (b":path", path), *self._tail_headers]
        # Whole seconds, rounded up: the same value from call to call, so h2's HPACK
        # sends it as a one-byte index; the precise deadline is enforced here.
        headers.append((b"grpc-timeout", grpc.timeout_value(max(1, -int(-timeout // 1)))))
        if extra:
            headers.extend((name.encode("ascii"), value.encode("ascii")) for name, value in extra)
        return headers

    async def unary(
        self,
        method: str,
        request: bytes,
        deadline_at: float,
        extra_metadata: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """One unary call that must finish by ``deadline_at`` (``loop.time()``); every
        failure of the call comes out as a CallFailure."""
        if self.closed:
            raise RuntimeError("this SeppClient is closed")
        try:
            return await self._call(method, request, deadline_at, extra_metadata)
        except Exception as exc:
            failure = _as_failure(exc)
            if failure is None or failure is exc:
                raise
            raise failure from exc

    async def _call(
        self,
        method: str,
        request: bytes,
        deadline_at: float,
        extra: tuple[tuple[str, str], ...],
    ) -> bytes:
        loop = asyncio.get_running_loop()
        timeout = deadline_at - loop.time()
        if timeout <= 0:
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
                    self._opened += 1
                    _bound_closed_streams(processor.connection)
                stream = processor.connection.create_stream(wrapper=wrapper)
                headers: Any = self._headers(method, timeout, extra)  # h2 takes bytes too
                frame = grpc.length_prefixed(request)
                release = None
                try:
                    # grpclib's Connection keeps its asyncio transport in `_transport`.
                    cork(getattr(processor.connection, "_transport", None))
                    release = await stream.send_request(headers, _processor=processor)
                    await stream.send_data(frame, end_stream=True)
                    return await _receive(stream, grpc.Reader(self.max_receive))
                finally:
                    if release is not None:
                        if stream.closable:
                            stream.reset_nowait()
                        release()
        finally:
            timer.cancel()

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


async def _receive(stream: Any, reader: grpc.Reader) -> bytes:
    """The answer, read with grpclib's stream and judged by ``reader``: the head,
    the message prefix, then exactly as many bytes as it declares."""
    head = _response(await stream.recv_headers())
    # grpclib does not say whether the head ended the stream: one with grpc-status is
    # a trailers-only answer.
    _check(reader.on_head(head, grpc.grpc_status(head) is not None))
    prefix = await _read(stream, 5)
    if prefix:
        _check(reader.on_data(prefix))
        size = reader.expected - len(prefix)
        if size:
            _check(reader.on_data(await _read(stream, size)))
    # Reading on to the end of the stream, rather than waiting for trailers, fails a
    # response that ends without them at once instead of at the deadline. The
    # trailers, when sent, came before the end.
    extra = await _read(stream, 1)
    if extra:
        _check(reader.on_data(extra))
    result = reader.finish(_response(stream.trailers or []))
    if isinstance(result, bytes):
        return result
    raise result


def _check(outcome: object) -> None:
    """Raise the reader's failure; anything else (None) goes on."""
    if isinstance(outcome, BaseException):
        raise outcome


def _as_failure(exc: BaseException) -> CallFailure | None:
    """grpclib's and h2's exceptions as CallFailures; None for anything else (a bug, a
    closed client), which propagates as it is."""
    if isinstance(exc, CallFailure):
        return exc
    if isinstance(exc, GRPCError):
        return CallFailure(status_of(exc.status.value), exc.message or "")
    if isinstance(exc, asyncio.TimeoutError):
        return CallFailure(
            Status.DEADLINE_EXCEEDED, "deadline exceeded", local=True, ambiguous=True
        )
    if isinstance(exc, StreamTerminatedError):
        # The request may have reached the server before the connection went away.
        return grpc.lost_call(f"connection lost during the call: {exc}")
    if isinstance(exc, (ProtocolError, h2.exceptions.ProtocolError)):
        return grpc.lost_call(f"HTTP/2 protocol error: {exc}")
    if isinstance(exc, ssl.SSLError):
        # Certificate or handshake trouble does not heal by retrying: no status.
        return CallFailure(None, f"TLS failure: {exc}", local=True, ambiguous=False)
    if isinstance(exc, OSError):
        return CallFailure(
            Status.UNAVAILABLE, f"connection failed: {exc}", local=True, ambiguous=False
        )
    return None


def _response(headers: Any) -> ResponseHeaders:
    """grpclib's decoded headers (str pairs) as the HTTP/2 layer's ResponseHeaders."""
    fields = [
        (name.encode("latin-1"), value.encode("latin-1"))
        if isinstance(name, str)
        else (name, value)
        for name, value in headers
    ]
    return parse_fields(fields)


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
        raise CallFailure(Status.INTERNAL, "the response ended inside a message") from None
    return data


def _never_indexed(fields: tuple[tuple[bytes, bytes], ...]) -> tuple[Any, ...]:
    """``authorization`` as hpack's never-indexed tuple: HPACK then neither keeps the key
    in its connection-wide table nor shows it in its debug log."""
    from hpack import NeverIndexedHeaderTuple

    return tuple(
        NeverIndexedHeaderTuple(name, value) if name == b"authorization" else (name, value)
        for name, value in fields
    )
