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

from sepp_lite._sending import MAX_MESSAGE_BYTES
from sepp_lite._wire.cork import cork
from sepp_lite.errors import DecodeError
from sepp_lite.testing._dispatch import (
    HEALTH_CHECK,
    HEALTH_WATCH,
    SERVICE,
    Dispatch,
    Route,
    decode_failure,
)
from sepp_lite.testing._state import QueueState, RpcError

__all__ = ["HEALTH_CHECK", "HEALTH_WATCH", "CallHook", "QueueService", "RawCodec", "Routes"]

log = logging.getLogger(__name__)

CallHook = Callable[[], Awaitable[None]]


class RawCodec(CodecBase):
    """Hands message bytes through unchanged, enforcing the decode size limit the way
    tonic does (OUT_OF_RANGE, before any decoding)."""

    __content_subtype__ = "proto"

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
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
    # grpclib internals (listed in tests/test_architecture.py): its Stream's HTTP/2
    # stream and the flags its own send_* methods set.
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
        self.dispatch = Dispatch(state, api_keys, passthrough=(GRPCError,))
        self._active = 0
        self._idle: Optional[asyncio.Event] = None
        self._watchers: set[asyncio.Future[None]] = set()
        self._hooks: dict[str, CallHook] = {}

    def __mapping__(self) -> dict[str, Handler]:
        """grpclib's handler table: path -> Handler."""
        table = {
            path: Handler(self._unary(path, route), Cardinality.UNARY_UNARY, bytes, bytes)
            for path, route in self.dispatch.routes().items()
        }
        table[HEALTH_WATCH] = Handler(self._health_watch, Cardinality.UNARY_STREAM, bytes, bytes)
        return table

    def fallback_handler(self) -> Handler:
        """UNIMPLEMENTED for unknown paths, after the API-key check for paths of this
        service (tonic's interceptor wraps the whole service, unknown methods too)."""

        async def unimplemented(stream: Stream[bytes, bytes]) -> None:
            # grpclib's Stream keeps the requested path only in `_method_name` (one of
            # the grpclib internals the test server reads; tests/test_architecture.py
            # lists each with its reason).
            path = getattr(stream, "_method_name", "")
            if isinstance(path, str) and self.dispatch.guarded_path(path):
                try:
                    self._authorize(stream)
                except RpcError as exc:
                    raise _grpc_error(exc) from None
            raise GRPCError(Status.UNIMPLEMENTED)

        return Handler(unimplemented, Cardinality.UNARY_UNARY, bytes, bytes)

    def set_call_hook(self, method: str, hook: Optional[CallHook]) -> None:
        """Await ``hook()`` before handling each call to ``method`` (one of the eight
        RPCs, by name); ``None`` removes it. Raises ``ValueError`` for another name."""
        if f"/{SERVICE}/{method}" not in self.dispatch.routes():
            raise ValueError(f"no {SERVICE} method named {method!r}")
        if hook is None:
            self._hooks.pop(method, None)
        else:
            self._hooks[method] = hook

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

    def _authorize(self, stream: Stream[bytes, bytes]) -> None:
        metadata = stream.metadata
        self.dispatch.authorize(None if metadata is None else metadata.get("authorization"))

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

    def _unary(self, path: str, route: Route) -> Callable[[Stream[bytes, bytes]], Any]:
        method = path.rsplit("/", 1)[-1]
        hooks = self._hooks

        async def handle(stream: Stream[bytes, bytes]) -> None:
            self._active += 1
            try:
                try:
                    if route.auth:
                        self._authorize(stream)
                    data = await self._receive(stream)
                    if hooks:
                        hook = hooks.get(method)
                        if hook is not None:
                            await hook()
                    answer = await self.dispatch.answer(route.call, data)
                except RpcError as exc:
                    raise _grpc_error(exc) from None
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

    async def _health_watch(self, stream: Stream[bytes, bytes]) -> None:
        """Health/Watch: the service's status now (SERVING, or SERVICE_UNKNOWN for a
        service this server does not have), then nothing more, since statuses never
        change here, until the server shuts down and the stream ends with OK."""
        data = await self._receive(stream)
        try:
            status = self.dispatch.health_status(data)
        except DecodeError as exc:
            raise _grpc_error(decode_failure(exc)) from None
        self._active += 1  # counted, so that a shutdown waits for the trailers
        try:
            await stream.send_message(status)
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


def _grpc_error(exc: RpcError) -> GRPCError:
    """The state's :class:`RpcError` as grpclib's ``GRPCError``."""
    return GRPCError(Status(exc.code.value), exc.message)
