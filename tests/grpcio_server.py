"""A grpcio (C core) server for tests: ``sepp.v1.QueueService`` and Health/Check over
the in-process state machine, through the same dispatch as the grpclib test server.

grpcio is a test extra on CPython only: import this module after
``pytest.importorskip("grpc")``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import grpc
import grpc.aio

from sepp_lite.testing import QueueState, RpcError, ServerConfig
from sepp_lite.testing._dispatch import Dispatch, Route

# The sepp server's transport (spec/server-semantics.md §8): 16 MiB requests, a PING
# every 30 s answered within 10 s, and no ping strikes (hyper has none), so clients
# pinging every 30 s without calls are never sent GOAWAY(too_many_pings).
SEPP_LIKE: Mapping[str, Any] = {
    "grpc.max_receive_message_length": 16 * 1024 * 1024,
    "grpc.keepalive_time_ms": 30_000,
    "grpc.keepalive_timeout_ms": 10_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_ping_strikes": 0,
}
# grpcio's own ping policy, for tests about it: only the message limit differs from
# grpc's defaults (at most one ping per 5 min with calls, none without; 2 strikes).
GRPC_DEFAULTS: Mapping[str, Any] = {"grpc.max_receive_message_length": 16 * 1024 * 1024}


class GrpcioServer:
    """``grpc.aio`` server on 127.0.0.1 (``port=0``: a free one) serving ``state``.

    Tests see what arrives (:attr:`peers`, one ``ipv4:host:port`` per call, so a new
    client connection shows as a new port; :meth:`wait_calls`) and can hold every
    answer back (:meth:`hold` / :meth:`release`) after the call has done its work.
    """

    def __init__(
        self,
        state: Optional[QueueState] = None,
        *,
        port: int = 0,
        api_keys: Optional[Sequence[str]] = None,
        options: Mapping[str, Any] = SEPP_LIKE,
    ) -> None:
        self.state = state if state is not None else QueueState(ServerConfig())
        self.dispatch = Dispatch(self.state, None if api_keys is None else frozenset(api_keys))
        self.port = port
        self.peers: list[str] = []
        self._options = {**options, "grpc.so_reuseport": 0}
        self._arrived = asyncio.Condition()
        self._open = asyncio.Event()
        self._open.set()
        self._server: Optional[grpc.aio.Server] = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> GrpcioServer:
        server = grpc.aio.server(options=list(self._options.items()))
        server.add_generic_rpc_handlers(self._handlers())
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server
        return self

    async def stop(self, grace: Optional[float] = 5.0) -> None:
        """Shut down as the sepp server does: pending long polls answer empty, then the
        C core's graceful stop (GOAWAY(2^31-1), PING, GOAWAY(last), open calls get
        ``grace`` seconds to finish). Idempotent."""
        server, self._server = self._server, None
        self.state.close()
        if server is not None:
            await server.stop(grace)

    def hold(self) -> None:
        """From now on, calls do their work and then wait for :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def wait_calls(self, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` calls in all have arrived."""
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.peers) >= count), timeout
            )

    async def __aenter__(self) -> GrpcioServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
        await self.stop(grace=None)

    def _handlers(self) -> list[grpc.GenericRpcHandler]:
        services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for path, route in self.dispatch.routes().items():
            service, method = path.lstrip("/").split("/")
            # No (de)serializers: requests and answers stay bytes, as in the dispatch.
            handler = grpc.unary_unary_rpc_method_handler(self._unary(route))
            services.setdefault(service, {})[method] = handler
        return [
            grpc.method_handlers_generic_handler(service, methods)
            for service, methods in services.items()
        ]

    def _unary(self, route: Route) -> Any:
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            async with self._arrived:
                self.peers.append(context.peer())
                self._arrived.notify_all()
            try:
                if route.auth:
                    self.dispatch.authorize(_header(context, "authorization"))
                answer = await self.dispatch.answer(route.call, request)
            except RpcError as exc:
                await context.abort(grpc.StatusCode[exc.code.name], exc.message)
            await self._open.wait()
            return answer

        return handle


def _header(context: grpc.aio.ServicerContext, name: str) -> Optional[str]:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return str(value)
    return None
