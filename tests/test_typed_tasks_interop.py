"""Typed tasks with other producers and workers, and on grpcio's server: the input is an
ordinary payload, so the official sepp-py client (installed as ``sepp`` on CPython
3.10+) enqueues what a typed task runs and runs what a typed producer enqueues; and the
whole flow (producer, worker, a payload that does not fit, a timeout, dead letters)
works over grpcio's C core as it does on the in-process server."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import pytest

import sepp_lite as sepp
from sepp_lite import DeadLetterCause, JobCtx, Payload
from sepp_lite.tasks import Tasks
from sepp_lite.testing import QueueState, SeppTestServer, ServerConfig, run_until_drained
from tests.client_helpers import NO_GRPCIO, NO_SEPP_PY, connected, unique_queue

pytestmark = pytest.mark.timeout(60)


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class Order:
    number: int
    items: list[Item]
    note: Optional[str] = None


# -- sepp-py ----------------------------------------------------------------------------


async def test_a_sepp_py_producers_json_runs_a_typed_task(server: SeppTestServer) -> None:
    seppy = pytest.importorskip("sepp", reason=NO_SEPP_PY)
    queue = unique_queue()
    official = await seppy.SeppClient.connect(server.addr)
    try:
        body = json.dumps({"number": 7, "items": [{"sku": "a", "qty": 2}]}).encode()
        await official.enqueue(
            seppy.EnqueueRequest(queue, "ship", payload=seppy.Payload(body, "application/json"))
        )
    finally:
        await official.close()
    tasks = Tasks(queue=queue)
    shipped: list[Order] = []

    @tasks.task
    async def ship(order: Order, ctx: JobCtx) -> None:
        shipped.append(order)

    async with connected(server.addr) as client:
        await run_until_drained(tasks.worker(client), server)
    assert shipped == [Order(7, [Item("a", 2)])]


async def test_a_typed_producers_job_runs_in_a_plain_sepp_py_worker(
    server: SeppTestServer,
) -> None:
    seppy = pytest.importorskip("sepp", reason=NO_SEPP_PY)
    queue = unique_queue()
    tasks = Tasks(queue=queue, priority=4)

    @tasks.task
    async def ship(order: Order) -> None: ...

    async with connected(server.addr) as client:
        await ship.enqueue(client, Order(7, [Item("a", 2)], note="fragile"))
    official = await seppy.SeppClient.connect(server.addr)
    seen: list[Any] = []
    try:
        worker = seppy.Worker(official, [queue], timedelta(seconds=30))

        @worker.handler("ship")
        async def handle(payload: Any, ctx: Any) -> None:
            seen.append((payload.encoding, json.loads(payload.data), ctx.priority.value))
            worker.shutdown_handle().shutdown()

        await asyncio.wait_for(worker.run(), 30)
    finally:
        await official.close()
    assert seen == [
        (
            "application/json",
            {"number": 7, "items": [{"sku": "a", "qty": 2}], "note": "fragile"},
            4,
        )
    ]
    assert server.counts(queue).ready == 0 and server.counts(queue).in_flight == 0


# -- grpcio's server -----------------------------------------------------------------------


async def test_the_whole_flow_against_grpcio() -> None:
    pytest.importorskip("grpc", reason=NO_GRPCIO)
    from tests.grpcio_server import GrpcioServer

    queue = unique_queue()
    tasks = Tasks(queue=queue, max_attempts=2)
    shipped: list[Order] = []
    events: list[str] = []

    @tasks.on_startup
    async def start(state: Any) -> None:
        events.append("startup")

    @tasks.middleware
    async def log(call_next: Any, value: Any, ctx: JobCtx) -> Any:
        events.append(ctx.job_type)
        return await call_next(value, ctx)

    @tasks.task
    async def ship(order: Order, ctx: JobCtx) -> None:
        shipped.append(order)

    @tasks.task(timeout=0.05)
    async def stuck(order: Order) -> None:
        await asyncio.sleep(3600)

    state = QueueState(ServerConfig().with_overrides(dead_letter_retention_ms=60_000))
    async with GrpcioServer(state) as grpcio, connected(grpcio.addr) as client:
        results = await ship.enqueue_many(client, [Order(1, []), Order(2, [Item("b", 1)])])
        assert all(isinstance(result, sepp.EnqueueAck) for result in results)
        await stuck.enqueue(client, Order(3, []))
        await client.enqueue(
            sepp.EnqueueRequest(queue, "ship", Payload(b'{"number": "x"}', "application/json"))
        )
        worker = tasks.worker(client)
        await asyncio.wait_for(worker.run(until_idle=True), 30)
        records = {r.job_type: r for r in await client.drain_dead_letters(queue, 10)}
    assert sorted(order.number for order in shipped) == [1, 2]
    assert events[0] == "startup" and events.count("ship") == 2 and events.count("stuck") == 2
    assert records["ship"].cause == DeadLetterCause.REJECTED
    assert records["ship"].last_reason == (
        "payload does not fit Order: order.number: expected int, got str"
    )
    assert records["stuck"].cause == DeadLetterCause.ATTEMPTS_EXHAUSTED
    assert records["stuck"].last_reason == "timed out after 0.05 s on its last attempt (2)"
