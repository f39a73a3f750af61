"""The state machine's RPCs as bytes in, bytes out, for any gRPC server stack.

A front-end (grpclib in :mod:`._service`, grpcio in the tests) routes a path to a
:class:`Route`, checks the API key when the route asks for it, and turns the one
exception that comes out, :class:`RpcError`, into its stack's status answer. Everything
else (decoding, the codec's errors, a bug in a handler) is mapped here, once, to the
statuses and messages tonic sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Callable, Optional

from sepp_lite._codec._fields import guarded, read_len, read_tag, skip_field
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
from sepp_lite.errors import DecodeError
from sepp_lite.testing._state import Code, QueueState, RpcError

__all__ = [
    "HEALTH_CHECK",
    "HEALTH_WATCH",
    "SERVICE",
    "Call",
    "Dispatch",
    "Route",
]

log = logging.getLogger(__name__)

SERVICE = "sepp.v1.QueueService"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
MISSING_KEY = "missing API key; expected an `authorization: Bearer <key>` header"
INVALID_KEY = "invalid API key"
_SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}
_SERVICE_UNKNOWN = b"\x08\x03"  # HealthCheckResponse{status: SERVICE_UNKNOWN}

Call = Callable[[bytes], Awaitable[bytes]]


@dataclass(frozen=True)
class Route:
    """One unary method: its handler and whether the API-key check guards it."""

    call: Call
    auth: bool = True


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


def decode_failure(exc: DecodeError) -> RpcError:
    """tonic's answer to a request that does not decode."""
    return RpcError(Code.INTERNAL, f"failed to decode Protobuf message: {exc}")


class Dispatch:
    """``sepp.v1.QueueService``'s eight RPCs and ``grpc.health.v1.Health/Check`` (not
    behind auth) over ``state``, with tonic's API-key check when ``api_keys`` is set."""

    def __init__(
        self,
        state: QueueState,
        api_keys: Optional[frozenset[str]] = None,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.state = state
        self._api_keys = api_keys
        # The front-end's own status errors, let through as they are (tests make the
        # state raise them to script a failure).
        self._passthrough: tuple[type[BaseException], ...] = (
            RpcError,
            asyncio.CancelledError,
            *passthrough,
        )

    def routes(self) -> dict[str, Route]:
        """Every unary method by its path (``/sepp.v1.QueueService/Ack``...)."""
        calls: dict[str, Call] = {
            "EnqueueBatch": self._enqueue_batch,
            "EnqueueAtomic": self._enqueue_atomic,
            "Reserve": self._reserve,
            "Ack": self._ack,
            "Nack": self._nack,
            "Extend": self._extend,
            "DrainDeadLetters": self._drain,
            "GetServerInfo": self._server_info,
        }
        table = {f"/{SERVICE}/{name}": Route(call) for name, call in calls.items()}
        table[HEALTH_CHECK] = Route(self._health, auth=False)
        return table

    @staticmethod
    def guarded_path(path: str) -> bool:
        """Whether an unknown ``path`` is still behind the API-key check (tonic's
        interceptor wraps the whole service, unknown methods too)."""
        return path.startswith(f"/{SERVICE}/")

    def authorize(self, authorization: object) -> None:
        """Check the ``authorization`` header's value (``None`` when absent); raises
        :class:`RpcError` (UNAUTHENTICATED) with the real server's messages."""
        keys = self._api_keys
        if keys is None:
            return
        value = authorization
        if (
            not isinstance(value, str)
            or not _visible_ascii(value)
            or not value.startswith("Bearer ")
        ):
            log.warning("rejected request: missing API key")
            raise RpcError(Code.UNAUTHENTICATED, MISSING_KEY)
        if value[7:] not in keys:
            log.warning("rejected request: invalid API key")
            raise RpcError(Code.UNAUTHENTICATED, INVALID_KEY)

    async def answer(self, call: Call, data: bytes) -> bytes:
        """The reply to ``data``; every failure comes out as :class:`RpcError` (or as
        one of the ``passthrough`` errors)."""
        try:
            return await call(data)
        except self._passthrough:
            raise
        except DecodeError as exc:
            raise decode_failure(exc) from None
        except Exception as exc:
            # A bug here must cost one call, never the server.
            log.exception("internal error while handling a call")
            raise RpcError(Code.INTERNAL, f"internal error: {exc.__class__.__name__}") from None

    @staticmethod
    def health_status(data: bytes) -> bytes:
        """The ``HealthCheckResponse`` for the service a Check or Watch names: SERVING
        for this server's, SERVICE_UNKNOWN otherwise. Raises DecodeError."""
        return _SERVING if _health_service(data) in ("", SERVICE) else _SERVICE_UNKNOWN

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
        raise RpcError(Code.NOT_FOUND, "service not registered")
