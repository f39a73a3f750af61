"""Connection lifecycle rules that need the transport's knobs: stream ids running out
(a new connection takes over) and a peer that never acknowledges our SETTINGS."""

from __future__ import annotations

import asyncio
import gc
import struct

from sepp_lite import SeppClient
from sepp_lite._wire.grpc import Reader
from sepp_lite._wire.http2 import ConnectionState, Http2Config, Keepalive
from sepp_lite._wire.http2 import _frames as f
from sepp_lite._wire.http2._headers import request_head
from sepp_lite._wire.transport import Http2Transport, parse_address
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import sepp_server


async def test_used_up_stream_ids_move_calls_to_a_new_connection() -> None:
    config = Http2Config(first_stream_id=2**31 - 5)  # three streams left: -5, -3, -1
    async with sepp_server() as server:
        transport = Http2Transport(parse_address(server.addr), label=server.addr, config=config)
        await transport.connect()
        client = SeppClient(transport)
        try:
            for _ in range(3):
                await client.get_server_info()
            assert client.connections_opened == 1
            await client.get_server_info()  # ids are used up: a new connection
            assert client.connections_opened == 2
            await asyncio.gather(*(client.get_server_info() for _ in range(5)))
            assert client.connections_opened == 3
        finally:
            await client.close()


async def test_unacknowledged_settings_end_the_connection_with_settings_timeout() -> None:
    received = bytearray()
    closed = asyncio.Event()

    class Peer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.write(f.settings({}))  # SETTINGS, but never an ACK of the client's

        def data_received(self, data: bytes) -> None:
            received.extend(data)

        def connection_lost(self, exc: object) -> None:
            closed.set()

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Peer, "127.0.0.1", 0)
    addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        transport = Http2Transport(parse_address(addr), label=addr, keepalive=Keepalive(30.0, 0.2))
        await transport.connect()  # the server's SETTINGS came: connected
        [conn] = transport.live_connections
        await asyncio.wait_for(closed.wait(), 5)
        assert conn.state is ConnectionState.CLOSED
        goaway = _last_goaway(bytes(received))
        assert goaway == (0, f.SETTINGS_TIMEOUT)
        await transport.close()
    finally:
        server.close()
        await server.wait_closed()


def _last_goaway(data: bytes) -> tuple[int, int]:
    data = data[len(f.PREFACE) :]
    found = None
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if data[3] == f.GOAWAY:
            found = struct.unpack(">LL", data[9:17])
        data = data[9 + length :]
    assert found is not None, "no GOAWAY"
    return found


async def test_a_call_whose_task_is_gone_leaves_no_unretrieved_failure() -> None:
    # Ctrl-C under Python 3.9's asyncio.run ends the task of a call in flight with
    # KeyboardInterrupt, without cancelling the call; closing the client then fails the
    # call's stream, which nobody reads any more: no "Future exception was never
    # retrieved" may follow. The call's coroutine is driven by hand here, and dropped.
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    server = SeppTestServer()
    held = asyncio.Event()

    async def hold() -> None:
        held.set()
        await asyncio.sleep(30)

    server.before_call("GetServerInfo", hold)
    try:
        async with server:
            transport = Http2Transport(parse_address(server.addr), label=server.addr)
            await transport.connect()
            [conn] = transport.live_connections
            fields = ((b"content-type", b"application/grpc"), (b"te", b"trailers"))
            path = b"/sepp.v1.QueueService/GetServerInfo"
            head = request_head(path, tls=False, authority=b"localhost", fields=fields)
            call = conn.call(head, b"", 0, b"\x00\x00\x00\x00\x00", loop.time() + 10, Reader(1024))
            call.send(None)  # sent; it now waits for the answer, as an interrupted task did
            await asyncio.wait_for(held.wait(), 5)
            conn.close("the client was closed")  # fails the call's stream
            call.close()
            del call
            await transport.close()
            gc.collect()
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c for c in unhandled if "never retrieved" in str(c.get("message"))] == []
