"""The grpclib face of the state machine: ``sepp.v1.QueueService`` over raw bytes.

Requests stay bytes through grpclib (a pass-through codec) and are decoded by the
hand-written codec only after the API-key check, as the real server's interceptor runs
before decoding. Transport-level errors reproduce tonic's statuses and messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Callable, Optional

from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from sepp_lite._codec._wire import guarded, read_len, read_tag, skip_field
from sepp_lite._codec.dead_letters import (
    decode_drain_dead_letters_request,
    encode_drain_dead_letters_response,
)
from sepp_lite._codec.enqueue import (
    decode_enqueue_batch_request,
    encode_enqueue_atomic_response,
    encode_enqueue_batch_response,
)
from sepp_lite._codec.job import decode_reserve_request, encode_reserve_response
from sepp_lite._codec.lease import (
    decode_ack_request,
    decode_extend_request,
    decode_nack_request,
    encode_ack_response,
    encode_extend_response,
    encode_nack_response,
)
from sepp_lite._codec.server_info import (
    decode_get_server_info_request,
    encode_get_server_info_response,
)
from sepp_lite._cork import cork
from sepp_lite.errors import DecodeError
from sepp_lite.testing._state import QueueState, RpcError

__all__ = ["HEALTH_CHECK", "HEALTH_WATCH", "QueueService", "RawCodec", "Routes"]

log = logging.getLogger(__name__)

SERVICE = "sepp.v1.QueueService"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
MISSING_KEY = "missing API key; expected an `authorization: Bearer <key>` header"
INVALID_KEY = "invalid API key"
_SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}
_SERVICE_UNKNOWN = b"\x08\x03"  # HealthCheckResponse{status: SERVICE_UNKNOWN}

Call = Callable[[bytes], Awaitable[bytes]]


class RawCodec(CodecBase):
    """Hands message bytes through unchanged, enforcing the decode size limit the way
    tonic does (OUT_OF_RANGE, before any decoding)."""

    __content_subtype__ = "proto"

    def __init__(self, max_message_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_message_bytes = max_message_bytes

    def encode(self, message: Any, message_type: Any) -> bytes:
        """The reply, already encoded."""
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> bytes:
        """The request bytes; raises ``GRPCError(OUT_OF_RANGE)`` above the limit."""
        if len(data) > self.max_message_bytes:
            raise GRPCError(
                Status.OUT_OF_RANGE,
                f"Error, decoded message length too large: found {len(data)} bytes, "
                f"the limit is: {self.max_message_bytes} bytes",
            )
        return data


def _visible_ascii(value: str) -> bool:
    # What http's HeaderValue::to_str accepts: visible ASCII, space and tab.
    return all(" " <= c <= "~" or c == "\t" for c in value)


def _health_service(data: bytes) -> str:
    def read(raw: bytes) -> str:
        pos, end, service = 0, len(raw), ""
        while pos < end:
            tag, pos = read_tag(raw, pos)
            if tag == 0x0A:
                start, pos = read_len(raw, pos, end)
                service = raw[start:pos].decode()
            else:
                pos = skip_field(raw, pos, end, tag)
        return service

    return guarded("HealthCheckRequest", read, data)


_OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc+proto")]
_OK_TRAILERS = [("grpc-status", "0")]


async def _reply(stream: Stream[bytes, bytes], message: bytes) -> None:
    """Send a unary OK answer: headers, the message and trailers.

    A reply is always the same two header blocks around one message, so they are
    written straight to grpclib's HTTP/2 stream, skipping the per-call metadata
    objects and event dispatch of ``send_message``/``send_trailing_metadata`` (a
    fifth of a small call's server CPU). The trailers go out now rather than from
    grpclib's exit handler, while the socket is still corked.
    """
    h2_stream = getattr(stream, "_stream", None)
    if h2_stream is None or stream._send_initial_metadata_done:  # not grpclib 0.4's layout
        await stream.send_message(message)
        await stream.send_trailing_metadata()
        return
    await h2_stream.send_headers(_OK_HEADERS)
    stream._send_initial_metadata_done = True
    await h2_stream.send_data(b"\x00%s%s" % (len(message).to_bytes(4, "big"), message))
    stream._send_message_done = True
    await h2_stream.send_headers(_OK_TRAILERS, end_stream=True)
    stream._send_trailing_metadata_done = True


class Routes(dict[str, Handler]):
    """A handler table that answers every unknown path with ``fallback`` (grpclib's own
    answer lacks a content-type, which clients then misreport as UNKNOWN)."""

    def __init__(self, table: Mapping[str, Handler], fallback: Handler) -> None:
        super().__init__(table)
        self.fallback = fallback

    def get(self, key: str, default: Any = None) -> Any:
        """The path's handler, else the fallback."""
        found = super().get(key)
        return self.fallback if found is None else found


class QueueService:
    """The eight ``sepp.v1.QueueService`` RPCs (plus ``grpc.health.v1.Health``'s Check
    and Watch, which are not behind auth) for a grpclib ``Server``."""

    def __init__(self, state: QueueState, api_keys: Optional[frozenset[str]] = None) -> None:
        self.state = state
        self._api_keys = api_keys
        self._active = 0
        self._idle: Optional[asyncio.Event] = None
        self._watchers: set[asyncio.Future[None]] = set()

    def __mapping__(self) -> dict[str, Handler]:
        """grpclib's handler table: path -> Handler."""
        calls: Mapping[str, Call] = {
            "EnqueueBatch": self._enqueue_batch,
            "EnqueueAtomic": self._enqueue_atomic,
            "Reserve": self._reserve,
            "Ack": self._ack,
            "Nack": self._nack,
            "Extend": self._extend,
            "DrainDeadLetters": self._drain,
            "GetServerInfo": self._server_info,
        }
        table = {
            f"/{SERVICE}/{name}": Handler(self._unary(call), Cardinality.UNARY_UNARY, bytes, bytes)
            for name, call in calls.items()
        }
        table[HEALTH_CHECK] = Handler(
            self._unary(self._health, auth=False), Cardinality.UNARY_UNARY, bytes, bytes
        )
        table[HEALTH_WATCH] = Handler(self._health_watch, Cardinality.UNARY_STREAM, bytes, bytes)
        return table

    def fallback_handler(self) -> Handler:
        """UNIMPLEMENTED for unknown paths, after the API-key check for paths of this
        service (tonic's interceptor wraps the whole service, unknown methods too)."""

        async def unimplemented(stream: Stream[bytes, bytes]) -> None:
            path = getattr(stream, "_method_name", "")
            if isinstance(path, str) and path.startswith(f"/{SERVICE}/"):
                self._authorize(stream.metadata)
            raise GRPCError(Status.UNIMPLEMENTED)

        return Handler(unimplemented, Cardinality.UNARY_UNARY, bytes, bytes)

    # -- plumbing ----------------------------------------------------------------------

    @property
    def active_calls(self) -> int:
        """Calls being handled right now."""
        return self._active

    def close(self) -> None:
        """Shut down: the state's long polls answer empty, open health watches end (with
        OK), and new ones end at once."""
        self.state.close()
        for watcher in self._watchers:
            if not watcher.done():
                watcher.set_result(None)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is being handled; ``False`` if ``timeout`` ran out."""
        if self._active == 0:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _authorize(self, metadata: Optional[Mapping[str, Any]]) -> None:
        keys = self._api_keys
        if keys is None:
            return
        value = None if metadata is None else metadata.get("authorization")
        if (
            not isinstance(value, str)
            or not _visible_ascii(value)
            or not value.startswith("Bearer ")
        ):
            log.warning("rejected request: missing API key")
            raise GRPCError(Status.UNAUTHENTICATED, MISSING_KEY)
        if value[7:] not in keys:
            log.warning("rejected request: invalid API key")
            raise GRPCError(Status.UNAUTHENTICATED, INVALID_KEY)

    @staticmethod
    async def _receive(stream: Stream[bytes, bytes]) -> bytes:
        try:
            data = await stream.recv_message()
        except NotImplementedError:  # grpclib's answer to the compressed flag
            raise GRPCError(
                Status.INTERNAL,
                "protocol error: received message with compressed-flag but no "
                "grpc-encoding was specified",
            ) from None
        if data is None:
            raise GRPCError(Status.INTERNAL, "Missing request message.")
        return data

    @staticmethod
    async def _answer(call: Call, data: bytes) -> bytes:
        try:
            return await call(data)
        except RpcError as exc:
            raise GRPCError(Status(exc.code.value), exc.message) from None
        except DecodeError as exc:
            raise GRPCError(Status.INTERNAL, f"failed to decode Protobuf message: {exc}") from None
        except (GRPCError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # A bug here must cost one call, never the server.
            log.exception("internal error while handling a call")
            raise GRPCError(Status.INTERNAL, f"internal error: {exc.__class__.__name__}") from None

    def _unary(self, call: Call, auth: bool = True) -> Callable[[Stream[bytes, bytes]], Any]:
        async def handle(stream: Stream[bytes, bytes]) -> None:
            self._active += 1
            try:
                if auth:
                    self._authorize(stream.metadata)
                data = await self._receive(stream)
                answer = await self._answer(call, data)
                # grpclib's Peer keeps the connection's asyncio transport in `_transport`.
                cork(getattr(getattr(stream, "peer", None), "_transport", None))
                await _reply(stream, answer)
            finally:
                self._call_ended()

        return handle

    def _call_ended(self) -> None:
        """One call counted in ``_active`` (for :meth:`wait_idle`) has finished."""
        self._active -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    # -- the RPCs ----------------------------------------------------------------------

    async def _enqueue_batch(self, data: bytes) -> bytes:
        jobs = decode_enqueue_batch_request(data)
        return encode_enqueue_batch_response(self.state.enqueue_batch(jobs))

    async def _enqueue_atomic(self, data: bytes) -> bytes:
        result = self.state.enqueue_atomic(decode_enqueue_batch_request(data))
        if result.acks is not None:
            return encode_enqueue_atomic_response(success=result.acks)
        return encode_enqueue_atomic_response(rejection=result.errors or [])

    async def _reserve(self, data: bytes) -> bytes:
        return encode_reserve_response(await self.state.reserve(decode_reserve_request(data)))

    async def _ack(self, data: bytes) -> bytes:
        return encode_ack_response(self.state.ack(decode_ack_request(data)))

    async def _nack(self, data: bytes) -> bytes:
        return encode_nack_response(*self.state.nack(decode_nack_request(data)))

    async def _extend(self, data: bytes) -> bytes:
        return encode_extend_response(*self.state.extend(decode_extend_request(data)))

    async def _drain(self, data: bytes) -> bytes:
        return encode_drain_dead_letters_response(
            self.state.drain(*decode_drain_dead_letters_request(data))
        )

    async def _server_info(self, data: bytes) -> bytes:
        decode_get_server_info_request(data)
        return encode_get_server_info_response(self.state.server_info())

    async def _health(self, data: bytes) -> bytes:
        if _health_service(data) in ("", SERVICE):
            return _SERVING
        raise GRPCError(Status.NOT_FOUND, "service not registered")

    async def _health_watch(self, stream: Stream[bytes, bytes]) -> None:
        """Health/Watch: the service's status now (SERVING, or SERVICE_UNKNOWN for a
        service this server does not have), then nothing more, since statuses never
        change here, until the server shuts down and the stream ends with OK."""
        data = await self._receive(stream)
        try:
            service = _health_service(data)
        except DecodeError as exc:
            raise GRPCError(Status.INTERNAL, f"failed to decode Protobuf message: {exc}") from None
        self._active += 1  # counted, so that a shutdown waits for the trailers
        try:
            await stream.send_message(_SERVING if service in ("", SERVICE) else _SERVICE_UNKNOWN)
            if not self.state.closing:
                watcher: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._watchers.add(watcher)
                try:
                    await watcher
                finally:
                    self._watchers.discard(watcher)
            await stream.send_trailing_metadata()
        finally:
            self._call_ended()
