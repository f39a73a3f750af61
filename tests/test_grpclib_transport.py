"""The grpclib adapter behind ``SeppClient.from_channel``: its grpclib-specific tuning."""

from __future__ import annotations

from grpclib.client import Channel

from sepp_lite._wire.grpclib_transport import GrpclibTransport
from tests.client_helpers import sepp_server


async def test_a_connection_keeps_a_bounded_record_of_closed_streams() -> None:
    # h2 remembers up to 65,536 closed streams per connection (about 8 MiB over a long
    # run); the adapter lowers that on every connection it opens.
    async with sepp_server() as server:
        transport = GrpclibTransport(Channel(server.host, server.port))
        try:
            await transport.unary("GetServerInfo", b"", _deadline())
            assert transport.connections_opened == 1
            # The limit lives in grpclib's and h2's internals, with no public accessor.
            protocol = transport.channel._protocol
            assert protocol is not None
            closed = protocol.processor.connection._connection._closed_streams
            assert closed._size_limit == 2048
        finally:
            await transport.close()


def _deadline() -> float:
    import asyncio

    return asyncio.get_running_loop().time() + 5
