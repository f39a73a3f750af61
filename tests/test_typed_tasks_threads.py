"""Typed tasks written as a plain ``def``: each call runs in one of the worker's threads
(``sync_threads``), through the registry's middleware and the task's backoff, on the
in-process server over real sockets; periodic ones too."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest

import sepp_lite as sepp
from sepp_lite import JobCtx
from sepp_lite.tasks import Backoff, Tasks
from sepp_lite.testing import ManualClock, SeppTestServer, run_until_drained
from tests.client_helpers import unique_queue, until, worker_running

pytestmark = pytest.mark.timeout(60)


@dataclass
class Resize:
    image: str
    width: int


@pytest.fixture
async def clocked() -> AsyncIterator[SeppTestServer]:
    async with SeppTestServer(clock=ManualClock(), dead_letter_retention_ms=600_000) as srv:
        yield srv


async def test_a_plain_def_task_runs_in_a_worker_thread_inside_the_middleware(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    tasks = Tasks(queue=unique_queue())
    seen: list[tuple[str, str, int, int]] = []
    order: list[str] = []

    @tasks.middleware
    async def around(call_next: Any, value: Any, ctx: JobCtx) -> Any:
        order.append(f"before {value.image}")
        result = await call_next(value, ctx)
        order.append(f"after {value.image}")
        return result

    @tasks.task
    def resize(job: Resize, ctx: JobCtx) -> None:
        time.sleep(0.01)  # blocking, as plain-def tasks are
        seen.append((threading.current_thread().name, job.image, job.width, ctx.attempt))

    for name in ("a.png", "b.png"):
        await resize.enqueue(client, Resize(name, 64))
    await run_until_drained(tasks.worker(client, sync_threads=2), server)
    assert sorted(item[1:] for item in seen) == [("a.png", 64, 1), ("b.png", 64, 1)]
    assert all(name.startswith("sepp-worker-") for name, *_ in seen), seen
    assert threading.main_thread().name not in {name for name, *_ in seen}
    assert sorted(order) == ["after a.png", "after b.png", "before a.png", "before b.png"]


async def test_a_plain_def_tasks_failure_follows_its_backoff_then_dead_letters(
    clocked: SeppTestServer,
) -> None:
    tasks = Tasks(queue=unique_queue(), retry=Backoff(initial=7, jitter=0.0))
    attempts: list[int] = []

    @tasks.task(max_attempts=2)
    def flaky(job: Resize, ctx: JobCtx) -> None:
        attempts.append(ctx.attempt)
        raise OSError(f"disk full writing {job.image}")

    async with await sepp.SeppClient.connect(clocked.addr) as client:
        await flaky.enqueue(client, Resize("c.png", 8))
        await run_until_drained(tasks.worker(client), clocked)
        [record] = await client.drain_dead_letters(tasks.queues[0], 10)
    assert attempts == [1, 2]
    assert record.last_reason == "handler raised OSError: disk full writing c.png"


async def test_a_plain_def_task_without_ctx_and_its_unit_call(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    tasks = Tasks(queue=unique_queue())
    widths: list[int] = []

    @tasks.task
    def measure(job: Resize) -> int:
        widths.append(job.width)
        return job.width * 2

    assert measure(Resize("x", 3)) == 6  # calling the task calls the function itself
    await measure.enqueue(client, Resize("y", 5))
    await run_until_drained(tasks.worker(client), server)
    assert widths == [3, 5]


async def test_shutdown_waits_for_a_plain_def_task_that_is_running(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = Tasks(queue=unique_queue())
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    @tasks.task
    def slow(job: Resize) -> None:
        started.set()
        release.wait(10)
        finished.append(job.image)

    await slow.enqueue(client, Resize("z.png", 1))
    worker = tasks.worker(client)
    caplog.set_level(logging.INFO, "sepp_lite")
    async with worker_running(worker, 10) as running:
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        worker.shutdown_handle().shutdown()
        # Past the reserve loop, draining: the thread cannot be stopped, so the worker
        # waits for it, its job still in flight.
        await until(lambda: "draining 1 in-flight job(s)" in caplog.text)
        assert not running.done() and worker.in_flight == 1
        release.set()
    assert finished == ["z.png"]
    counts = server.counts(tasks.queues[0])
    assert (counts.ready, counts.in_flight, counts.dead) == (0, 0, 0)  # acked


async def test_a_plain_def_periodic_task_runs_in_a_worker_thread() -> None:
    tasks = Tasks(queue=unique_queue())
    runs: list[tuple[str, Optional[datetime]]] = []

    @tasks.periodic(every=60, lookahead=0)
    def report(ctx: JobCtx) -> None:
        runs.append((threading.current_thread().name, sepp.periodic_slot(ctx)))

    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=timezone.utc)
    clock = ManualClock(int(start.timestamp() * 1000))
    async with SeppTestServer(clock=clock) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            worker = tasks.worker(client, periodic_clock=clock)
            async with worker_running(worker, 10):
                queue = tasks.queues[0]

                def settled(count: int) -> bool:
                    counts = server.counts(queue)
                    return len(runs) >= count and counts.ready == counts.in_flight == 0

                await until(lambda: settled(1))  # acked before the clock moves past its lease
                await server.advance(30)  # 12:01: the next slot is due
                await until(lambda: settled(2))
    slot = datetime(2026, 6, 1, 12, 1, tzinfo=timezone.utc)
    assert sorted(s for _, s in runs) == [slot - timedelta(minutes=1), slot]  # type: ignore[type-var]
    assert all(name.startswith("sepp-worker-") for name, _ in runs), runs
