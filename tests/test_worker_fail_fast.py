"""A worker that can never work fails fast: a wrong API key, a key without the right,
a queue name the server refuses, or an undeclared queue on a strict server make
``Worker.run()`` raise (after finishing the jobs in flight), also with
``until_idle=True``; transient errors keep the backoff loop. And the log levels of the
handler's intended outcomes."""

from __future__ import annotations

import asyncio
import logging

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

import sepp_lite as sepp
from sepp_lite.testing import QueueConfig, SeppTestServer
from tests.client_helpers import (
    JOB_ID,
    ScriptedServer,
    job_record,
    reserve_reply,
    status_errors,
    unique_queue,
    until,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("until_idle", [False, True])
async def test_a_wrong_api_key_raises_at_once(until_idle: bool) -> None:
    async with SeppTestServer(api_keys=["right"]) as server:
        async with await sepp.SeppClient.connect(server.addr, api_key="wrong") as client:
            worker = sepp.Worker(client, ["q"], 30, reserve_error_backoff=0.01)
            with pytest.raises(sepp.UnauthenticatedError) as info:
                await asyncio.wait_for(worker.run(until_idle=until_idle), 10)
    assert info.value.code is not None and info.value.code.name == "UNAUTHENTICATED"


@pytest.mark.parametrize("until_idle", [False, True])
async def test_an_undeclared_queue_on_a_strict_server_raises(until_idle: bool) -> None:
    declared = unique_queue("d")
    async with SeppTestServer(strict_queues=True, queues=[QueueConfig(declared)]) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            worker = sepp.Worker(client, [declared, "undeclared"], 30)
            with pytest.raises(sepp.UnknownQueuesError) as info:
                await asyncio.wait_for(worker.run(until_idle=until_idle), 10)
    assert str(info.value) == 'queues not declared on the server (strict mode): ["undeclared"]'


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (Status.UNAUTHENTICATED, sepp.UnauthenticatedError),
        (Status.PERMISSION_DENIED, sepp.UnauthenticatedError),
        (Status.INVALID_ARGUMENT, sepp.InvalidRequestError),
        (Status.FAILED_PRECONDITION, sepp.UnknownQueuesError),
    ],
)
async def test_permanent_reserve_refusals_stop_the_worker_after_one_call(
    status: Status, error: type[Exception]
) -> None:
    async with ScriptedServer() as scripted:
        scripted.script("Reserve", GRPCError(status, "refused"))
        async with await sepp.SeppClient.connect(scripted.addr) as client:
            worker = sepp.Worker(client, ["q"], 30, reserve_error_backoff=0.01)
            with pytest.raises(error):
                await asyncio.wait_for(worker.run(), 10)
    assert len(scripted.calls_to("Reserve")) == 1


async def test_the_jobs_in_flight_finish_and_are_acked_before_it_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()
    async with ScriptedServer() as scripted:
        # One job, then the key is revoked while its handler runs.
        scripted.script(
            "Reserve",
            reserve_reply(job_record(JOB_ID)),
            GRPCError(Status.PERMISSION_DENIED, "key revoked"),
        )
        async with await sepp.SeppClient.connect(scripted.addr) as client:
            worker = sepp.Worker(client, ["q"], 30)

            @worker.handler("t")
            async def handler(payload: object, ctx: sepp.JobCtx) -> None:
                started.set()
                await release.wait()

            caplog.set_level(logging.INFO, "sepp_lite")
            run = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(started.wait(), 10)
            await until(lambda: len(scripted.calls_to("Reserve")) == 2)  # refused
            # Past the reserve loop, it drains: still waiting for the handler.
            await until(lambda: "draining 1 in-flight job(s)" in caplog.text)
            assert not run.done() and worker.in_flight == 1
            release.set()
            with pytest.raises(sepp.UnauthenticatedError):
                await asyncio.wait_for(run, 10)
    assert len(scripted.calls_to("Ack")) == 1


async def test_a_refused_server_info_at_start_raises_before_any_reserve() -> None:
    async with ScriptedServer() as scripted:
        scripted.script("GetServerInfo", GRPCError(Status.UNAUTHENTICATED, "no key"))
        async with await sepp.SeppClient.connect(scripted.addr) as client:
            worker = sepp.Worker(client, ["q"], 30)
            with pytest.raises(sepp.UnauthenticatedError):
                await asyncio.wait_for(worker.run(until_idle=True), 10)
    assert scripted.calls_to("Reserve") == []


async def test_transient_errors_keep_the_backoff_loop(caplog: pytest.LogCaptureFixture) -> None:
    transient = [Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.INTERNAL, Status.UNKNOWN]
    async with ScriptedServer() as scripted:
        scripted.script("Reserve", *status_errors(transient * 3))
        async with await sepp.SeppClient.connect(scripted.addr) as client:
            worker = sepp.Worker(client, ["q"], 30, reserve_error_backoff=0.01)
            with caplog.at_level(logging.WARNING, "sepp_lite"):
                # until_idle returns at the first empty reserve, after the 12 failures.
                await asyncio.wait_for(worker.run(until_idle=True), 20)
    assert len(scripted.calls_to("Reserve")) == 13
    failures = [r for r in caplog.records if r.getMessage().startswith("reserve failed")]
    assert len(failures) == 12


async def test_the_worker_can_run_again_after_the_error_is_fixed() -> None:
    async with ScriptedServer() as scripted:
        scripted.script("Reserve", GRPCError(Status.UNAUTHENTICATED, "no"))
        async with await sepp.SeppClient.connect(scripted.addr) as client:
            worker = sepp.Worker(client, ["q"], 30)
            with pytest.raises(sepp.UnauthenticatedError):
                await worker.run(until_idle=True)
            await asyncio.wait_for(worker.run(until_idle=True), 10)  # no stale error


# -- log levels of the handler's intended outcomes ----------------------------------------


async def test_each_outcome_a_handler_asks_for_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = unique_queue()
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            acks = await client.enqueue_batch(
                [sepp.EnqueueRequest(queue, kind) for kind in ("later", "again", "never")]
            )
            ids = dict(zip(("later", "again", "never"), (a.job_id for a in acks)))  # type: ignore[union-attr]
            worker = sepp.Worker(client, [queue], 30)

            @worker.catch_all
            async def handler(payload: object, ctx: sepp.JobCtx) -> None:
                if ctx.job_type == "later":
                    raise sepp.HandlerError.retry_after("busy", 60)
                if ctx.job_type == "again" and ctx.attempt == 1:
                    raise sepp.HandlerError.retry("flaky")
                if ctx.job_type == "never":
                    raise sepp.HandlerError.permanent("bad input")

            with caplog.at_level(logging.DEBUG, "sepp_lite"):
                await asyncio.wait_for(worker.run(until_idle=True), 10)
    about = {
        kind: [(r.levelname, r.getMessage()) for r in caplog.records if job_id in r.getMessage()]
        for kind, job_id in ids.items()
    }
    # A retry the handler asked for: one WARNING, its delay when it chose one, no
    # traceback (not even at DEBUG: a HandlerError is not a crash).
    assert about["later"] == [
        (
            "WARNING",
            f"job {ids['later']} (type 'later', attempt 1/3): handler raised HandlerError: busy; "
            "next attempt in 60 s",
        )
    ]
    assert about["again"] == [
        (
            "WARNING",
            f"job {ids['again']} (type 'again', attempt 1/3): handler raised HandlerError: "
            "flaky; next attempt after the queue's retry delay",
        )
    ]
    # The dead letter: one WARNING, once the server confirmed it.
    assert about["never"] == [
        (
            "WARNING",
            f"job {ids['never']} dead-lettered: type 'never', queue {queue!r}, attempt 1/3; a "
            "permanent failure (HandlerError.permanent), not retried; cause: bad input",
        )
    ]
    assert not [r for r in caplog.records if r.exc_info]
    assert not [r for r in caplog.records if "asked for" in r.getMessage()]
