"""Settle once: whoever releases a delivery's lease first (the handler through a
client, the worker, a lost lease), the Worker sends no second Ack or Nack for it, and
says nothing about it. Counted on the wire, on a scripted server and on the in-process
one; a user's own second ack still fails as the server answers it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Callable

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer
from sepp_lite.worker import Handler
from tests.client_helpers import (
    JOB_ID,
    Late,
    ScriptedServer,
    job_record,
    reserve_reply,
    unique_queue,
)

pytestmark = pytest.mark.timeout(60)

MakeHandler = Callable[[sepp.SeppClient], Handler]


def acks_itself(client: sepp.SeppClient) -> Handler:
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        await client.ack(ctx)

    return handler


def nacks_itself(client: sepp.SeppClient) -> Handler:
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        await client.nack(ctx, sepp.RetryDirective.after(60), "later")

    return handler


def dead_letters_itself(client: sepp.SeppClient) -> Handler:
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        await client.nack(ctx, sepp.RetryDirective.dead_letter(), "no")

    return handler


def acks_then_raises(client: sepp.SeppClient) -> Handler:
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        await client.ack(ctx)
        raise RuntimeError("after the ack")

    return handler


def acks_then_raises_handler_error(client: sepp.SeppClient) -> Handler:
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        await client.ack(ctx)
        raise sepp.HandlerError.retry("after the ack")

    return handler


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as server:
        yield server


async def run_one_job(
    server: ScriptedServer, make_handler: MakeHandler, **worker_options: object
) -> list[logging.LogRecord]:
    """Serve one reserved job to a Worker whose handler ``make_handler`` builds, run it
    until idle, and return what sepp_lite logged at INFO and above."""
    server.script("Reserve", reserve_reply(job_record(JOB_ID)))
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.INFO)
    library = logging.getLogger("sepp_lite")
    library.addHandler(keep)
    try:
        async with await sepp.SeppClient.connect(server.addr) as client:
            worker = sepp.Worker(client, ["q"], 30, **worker_options)  # type: ignore[arg-type]
            worker.handle("t", make_handler(client))
            await asyncio.wait_for(worker.run(until_idle=True), 20)
    finally:
        library.removeHandler(keep)
    return records


def settles(server: ScriptedServer) -> list[str]:
    return [call.method for call in server.calls if call.method in ("Ack", "Nack")]


@pytest.mark.parametrize(
    ("make_handler", "expected"),
    [
        (acks_itself, ["Ack"]),
        (nacks_itself, ["Nack"]),
        (dead_letters_itself, ["Nack"]),
        (acks_then_raises, ["Ack"]),
        (acks_then_raises_handler_error, ["Ack"]),
    ],
    ids=["ack", "nack", "dead-letter", "ack-then-raise", "ack-then-handler-error"],
)
async def test_a_job_the_handler_settled_is_not_settled_again(
    scripted: ScriptedServer, make_handler: MakeHandler, expected: list[str]
) -> None:
    records = await run_one_job(scripted, make_handler)
    assert settles(scripted) == expected
    # Silently: no warning or error about the job (the handler's own traceback of the
    # exception raised after its ack is not logged either: the job is settled).
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


async def test_with_a_lease_keeper_nothing_is_extended_after_the_handler_acked(
    scripted: ScriptedServer,
) -> None:
    def acks_then_works_on(client: sepp.SeppClient) -> Handler:
        async def handler(payload: object, ctx: sepp.JobCtx) -> None:
            await client.ack(ctx)
            await asyncio.sleep(0.3)  # several keeper intervals after the ack

        return handler

    records = await run_one_job(scripted, acks_then_works_on, auto_extend_interval=0.02)
    assert settles(scripted) == ["Ack"]
    assert [c.method for c in scripted.calls].count("Extend") == 0
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


async def test_a_handler_ack_the_server_refuses_is_not_followed_by_a_nack(
    scripted: ScriptedServer,
) -> None:
    # The handler's ack meets NOT_FOUND (the lease lapsed): the lease is gone, so the
    # worker must not nack the job for the JobNotFoundError the handler then raises.
    scripted.script("Ack", GRPCError(Status.NOT_FOUND, "job not found"))
    await run_one_job(scripted, acks_itself)
    assert settles(scripted) == ["Ack"]


async def test_a_transport_failure_of_the_handler_ack_leaves_the_settle_to_the_worker(
    scripted: ScriptedServer,
) -> None:
    # UNAVAILABLE says nothing about the lease: the worker still settles the job (a
    # nack, for the exception the handler raised), so it is not left to lapse.
    scripted.script("Ack", GRPCError(Status.UNAVAILABLE, "down"))
    await run_one_job(scripted, acks_itself)
    assert settles(scripted) == ["Ack", "Nack"]


async def test_tracking_is_per_delivery_a_redelivery_is_settled_again(
    scripted: ScriptedServer,
) -> None:
    # The same job id twice, attempts 1 and 2: the handler acks attempt 1 itself; the
    # worker acks attempt 2 (the handler returns without acking it).
    scripted.script(
        "Reserve",
        reserve_reply(job_record(JOB_ID), attempt=1),
        reserve_reply(job_record(JOB_ID), attempt=2),
    )
    async with await sepp.SeppClient.connect(scripted.addr) as client:
        worker = sepp.Worker(client, ["q"], 30)

        @worker.handler("t")
        async def handler(payload: object, ctx: sepp.JobCtx) -> None:
            if ctx.attempt == 1:
                await client.ack(ctx)

        await asyncio.wait_for(worker.run(until_idle=True), 20)
    acks = scripted.calls_to("Ack")
    assert len(acks) == 2 and settles(scripted) == ["Ack", "Ack"]


async def test_in_process_server_one_settle_and_a_second_user_ack_still_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The in-process server answers a second Ack of a job with NOT_FOUND, which the
    # worker would log at ERROR: no such line means no second Ack went out.
    queue = unique_queue()
    second: list[BaseException] = []
    async with SeppTestServer() as server, await sepp.SeppClient.connect(server.addr) as client:
        await client.enqueue_batch([sepp.EnqueueRequest(queue, "t") for _ in range(3)])
        worker = sepp.Worker(client, [queue], 30)

        @worker.handler("t")
        async def handler(payload: object, ctx: sepp.JobCtx) -> None:
            await client.ack(ctx)
            try:
                await client.ack(ctx)  # the user's own mistake: the server's answer
            except sepp.JobNotFoundError as error:
                second.append(error)

        with caplog.at_level(logging.DEBUG, "sepp_lite"):
            await asyncio.wait_for(worker.run(until_idle=True), 20)
        assert server.counts(queue) == (0, 0, 0, 0)
    assert len(second) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    skipped = [r for r in caplog.records if "already settled by its handler" in r.getMessage()]
    assert len(skipped) == 3 and all(r.levelno == logging.DEBUG for r in skipped)


async def test_with_a_lease_keeper_nothing_is_extended_while_the_handler_s_ack_is_on_its_way(
    scripted: ScriptedServer,
) -> None:
    # The server answers the handler's Ack 0.3 s late: a keeper extending every 20 ms
    # must wait for that answer (which decides the lease), not extend meanwhile.
    scripted.script("Ack", Late(0.3))
    records = await run_one_job(scripted, acks_itself, auto_extend_interval=0.02)
    assert settles(scripted) == ["Ack"]
    assert [c.method for c in scripted.calls].count("Extend") == 0
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
