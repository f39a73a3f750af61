"""``sepp_lite.proto``: the generated messages and grpclib's stub, for raw gRPC access."""

from __future__ import annotations

import inspect
from datetime import timedelta

import betterproto
import grpclib.client
import grpclib.events

import sepp_lite
from sepp_lite import proto
from sepp_lite._proto.sepp import v1 as generated
from tests.client_helpers import connected, sepp_server, unique_queue


def test_every_generated_class_is_public_there() -> None:
    classes = {
        name
        for name, value in vars(generated).items()
        if inspect.isclass(value) and value.__module__ == generated.__name__
    }
    assert set(proto.__all__) == classes
    assert proto.__all__ == sorted(proto.__all__)
    assert issubclass(proto.EnqueueRequest, betterproto.Message)


async def test_the_raw_stub_talks_to_the_server_as_the_client_does() -> None:
    queue = unique_queue("raw")
    seen: list[dict[str, str]] = []

    async def on_request(event: grpclib.events.SendRequest) -> None:
        seen.append(dict(event.metadata))  # what a grpclib "interceptor" gets to see

    async with sepp_server(api_keys=["k"]) as server:
        channel = grpclib.client.Channel(server.host, server.port)
        grpclib.events.listen(channel, grpclib.events.SendRequest, on_request)
        stub = proto.QueueServiceStub(channel, metadata={"authorization": "Bearer k"})
        try:
            info = await stub.get_server_info(proto.GetServerInfoRequest())
            assert info.server_version == "0.1.0"
            request = proto.EnqueueBatchRequest(
                jobs=[proto.EnqueueRequest(queue=queue, job_type="t", priority=3)]
            )
            [result] = (await stub.enqueue_batch(request)).results
            job_id = result.success.job_id
        finally:
            channel.close()
        async with connected(server.addr, api_key="k") as client:
            options = sepp_lite.ReserveOptions([queue], timedelta(seconds=30))
            [job] = await client.reserve(options) or []
            assert (job.ctx.id, job.ctx.priority.value) == (job_id, 3)
            await client.ack(job.ctx)
    assert seen and all(m.get("authorization") == "Bearer k" for m in seen)
