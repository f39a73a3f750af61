"""``@tasks.periodic`` on the typed-task registry: registering, the checks at start, a
worker that only consumes, and periodic jobs as ordinary jobs (middleware, retries,
dead letters); ``sepp-lite periodic`` and ``sepp-lite worker --no-periodic /
--processes 3`` as real processes."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

import pytest

import sepp_lite as sepp
from sepp_lite import DeadLetterCause, JobCtx, SeppClient, Tasks
from sepp_lite.cli import main
from sepp_lite.testing import ManualClock, SeppTestServer
from tests.client_helpers import unique_queue, until, worker_running
from tests.test_worker_processes import sepp_lite as sepp_lite_process

UTC = timezone.utc
START = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


# -- registering -------------------------------------------------------------------------


def test_a_periodic_task_is_a_task_with_a_schedule() -> None:
    tasks = Tasks(queue="jobs")

    @tasks.periodic(every=timedelta(minutes=15), max_attempts=2)
    async def sweep(ctx: JobCtx) -> None: ...

    @tasks.periodic(every=60, job_type="tick", queue="ticks")
    async def bare() -> None: ...

    assert tasks.job_types == ["sweep", "tick"]
    assert sweep.queue == "jobs" and sweep.max_attempts == 2
    assert [(j.job_type, j.queue, j.describe()) for j in tasks.periodic_jobs] == [
        ("sweep", "jobs", "every 900 s"),
        ("tick", "ticks", "every 60 s"),
    ]
    assert tasks.periodic_jobs[0].max_attempts == 2


def test_a_periodic_task_takes_the_ctx_or_nothing_and_a_valid_schedule() -> None:
    tasks = Tasks(queue="jobs")
    with pytest.raises(TypeError, match="takes the JobCtx or nothing"):

        @tasks.periodic(every=60)
        async def two(a: int, ctx: JobCtx) -> None: ...

    with pytest.raises(ValueError, match="whole number of seconds"):

        @tasks.periodic(every=0.5)
        async def fast(ctx: JobCtx) -> None: ...

    with pytest.raises(TypeError, match="no queue"):

        @Tasks().periodic(every=60)
        async def nowhere(ctx: JobCtx) -> None: ...

    assert len(tasks) == 0 and tasks.periodic_jobs == []


async def test_a_worker_refuses_a_schedule_the_dedup_window_cannot_keep(
    client: SeppClient,
) -> None:
    tasks = Tasks(queue="jobs")

    @tasks.periodic(every=60, lookahead=3600)
    async def sweep(ctx: JobCtx) -> None: ...

    with pytest.raises(ValueError, match="beyond the dedup window"):
        tasks.worker(client, dedup_window=3600)
    tasks.worker(client, dedup_window=3600 + 600 + 60)  # + the grace cap + the skew


async def test_a_worker_whose_schedule_the_server_cannot_take_does_not_start() -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.periodic(every=60, lookahead=7200)
    async def sweep(ctx: JobCtx) -> None: ...

    async with SeppTestServer(max_schedule_horizon_ms=3_600_000) as server:
        async with await SeppClient.connect(server.addr) as client:
            with pytest.raises(ValueError, match="schedule horizon"):
                await asyncio.wait_for(tasks.worker(client).run(), 10)


# -- running -----------------------------------------------------------------------------


async def quiet(server: SeppTestServer, queue: str, worker: Any) -> None:
    def idle() -> bool:
        wake = worker.scheduler.sleeping_until if worker.scheduler else None
        scheduling = worker.scheduler is None or (
            wake is not None and ms(wake) > server.clock.now_ms()
        )
        counts = server.counts(queue)
        return scheduling and counts.ready == 0 and counts.in_flight == 0

    await until(idle)


async def test_periodic_jobs_are_ordinary_jobs_middleware_retries_dead_letters() -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    seen: list[tuple[str, Optional[datetime], int]] = []

    @tasks.middleware
    async def note(call_next: Any, value: Any, ctx: JobCtx) -> Any:
        seen.append((ctx.job_type, sepp.periodic_slot(ctx), ctx.attempt))
        return await call_next(value, ctx)

    @tasks.periodic(every=60, lookahead=0, max_attempts=2)
    async def flaky(ctx: JobCtx) -> None:
        raise RuntimeError("the report server is down")

    clock = ManualClock(ms(START))
    async with SeppTestServer(clock=clock, dead_letter_retention_ms=3_600_000) as server:
        async with await SeppClient.connect(server.addr) as client:
            worker = tasks.worker(client, periodic_clock=clock)
            async with worker_running(worker, 10):
                await quiet(server, queue, worker)
                await server.advance(30)  # 12:01: the slot is due
                await quiet(server, queue, worker)
            slot = datetime(2026, 6, 1, 12, 1, tzinfo=UTC)
            # The 12:00 slot was 30 s late at start, within its grace (the 60 s to
            # the next slot): it ran too. Each ran twice (max_attempts=2), then died.
            assert sorted(seen) == [
                ("flaky", slot - timedelta(minutes=1), 1),
                ("flaky", slot - timedelta(minutes=1), 2),
                ("flaky", slot, 1),
                ("flaky", slot, 2),
            ]
            dead = await client.drain_dead_letters(queue, max_records=10)
            assert sorted(r.scheduled_at for r in dead) == [slot - timedelta(minutes=1), slot]  # type: ignore[type-var]
            assert {r.cause for r in dead} == {DeadLetterCause.ATTEMPTS_EXHAUSTED}


async def test_the_periodic_clock_is_the_lease_keepers_too() -> None:
    """A worker built with ``periodic_clock`` keeps its leases by that clock too, as the
    server expires them: a job handed back at shutdown is handed back, where the wall
    clock, months past the server's, took its lease for expired and left it."""
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    started = asyncio.Event()

    @tasks.task
    async def slow(text: str) -> None:
        started.set()
        await asyncio.Event().wait()  # until shutdown gives up on it

    clock = ManualClock(ms(START))
    async with SeppTestServer(clock=clock) as server:
        async with await SeppClient.connect(server.addr) as client:
            await slow.enqueue(client, "x")
            worker = tasks.worker(client, periodic_clock=clock, shutdown_timeout=0.1)
            async with worker_running(worker, 10):
                await asyncio.wait_for(started.wait(), 10)
            assert tuple(server.counts(queue)) == (1, 0, 0, 0)  # ready again, not in flight


async def test_a_worker_without_periodic_only_consumes() -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    ran: list[Optional[datetime]] = []

    @tasks.periodic(every=60, lookahead=120, misfire_grace=10)
    async def tick(ctx: JobCtx) -> None:
        ran.append(sepp.periodic_slot(ctx))

    clock = ManualClock(ms(START))
    async with SeppTestServer(clock=clock) as server:
        async with (
            await SeppClient.connect(server.addr) as one,
            await SeppClient.connect(server.addr) as two,
        ):
            consumer = tasks.worker(one, periodic=False, periodic_clock=clock)
            assert consumer.scheduler is None
            async with worker_running(consumer, 10):
                await server.advance(120)
                await quiet(server, queue, consumer)
                assert server.counts(queue) == (0, 0, 0, 0) and ran == []
                scheduling = tasks.worker(two, periodic_clock=clock)
                async with worker_running(scheduling, 10):
                    await quiet(server, queue, scheduling)
                    assert server.counts(queue).scheduled == 2
                await server.advance(30)  # 12:03, to the ms
                await quiet(server, queue, consumer)
            # The consumer ran the slot the other worker had enqueued.
            assert ran == [datetime(2026, 6, 1, 12, 3, tzinfo=UTC)]


# -- the command line --------------------------------------------------------------------

MODULE = """
import os
from datetime import timedelta

import sepp_lite as sepp

tasks = sepp.Tasks(queue={queue!r})


@tasks.periodic(every=1, misfire_grace=5)
async def tick(ctx: sepp.JobCtx) -> None:
    slot = sepp.periodic_slot(ctx).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open({runs!r}, "a") as out:
        out.write(f"{{slot}} {{os.getpid()}}\\n")


@tasks.periodic(cron="30 2 * * *", tz="Europe/Vienna", job_type="nightly")
async def nightly() -> None: ...


@tasks.task
async def plain(text: str) -> None: ...


nothing = sepp.Tasks(queue={queue!r})
"""


@pytest.fixture
def app(tmp_path: Path) -> tuple[Path, str]:
    pytest.importorskip("cronsim", reason="the app has a cron schedule")
    queue = unique_queue()
    (tmp_path / "app.py").write_text(MODULE.format(queue=queue, runs=str(tmp_path / "runs")))
    return tmp_path, queue


async def sepp_lite_in_thread(*argv: str) -> int:
    """``sepp-lite argv`` in a thread, as ``tests/test_cli.py`` runs it: its
    ``asyncio.run`` must not replace, and then unset, the test thread's event loop
    (on Python 3.9 pytest-asyncio's, which would be left for the GC unclosed)."""
    return await asyncio.to_thread(main, list(argv))


async def test_sepp_lite_periodic_lists_the_schedules_and_next_slots(
    app: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, queue = app
    where = ["--app-dir", str(directory)]
    assert await sepp_lite_in_thread("periodic", "app:tasks", *where, "--count", "2", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [item["job_type"] for item in listed] == ["tick", "nightly"]
    tick, nightly = listed
    assert tick["schedule"] == "every 1 s" and tick["misfire_grace_s"] == 5
    assert len(tick["next_slots"]) == 2
    assert nightly["queue"] == queue and nightly["schedule"] == "cron '30 2 * * *' in Europe/Vienna"
    assert nightly["lookahead_s"] == 600 and nightly["misfire_grace_s"] is None
    first = datetime.strptime(nightly["next_slots"][0], "%Y-%m-%dT%H:%M:%SZ")
    assert first.minute == 30 and first.hour in (0, 1)  # 02:30 in Vienna, CET or CEST

    assert await sepp_lite_in_thread("periodic", "app:tasks", *where) == 0
    text = capsys.readouterr().out
    assert f"nightly on {queue}: cron '30 2 * * *' in Europe/Vienna" in text
    assert "02:30 CET" in text or "02:30 CEST" in text
    assert await sepp_lite_in_thread("periodic", "app:nothing", *where) == 0
    assert "app:nothing has no periodic tasks" in capsys.readouterr().out
    assert await sepp_lite_in_thread("periodic", "app:plain", *where) == 2
    assert "not a sepp_lite.Tasks" in capsys.readouterr().err


async def test_worker_no_periodic_enqueues_nothing(
    server: SeppTestServer, app: tuple[Path, str]
) -> None:
    directory, queue = app
    argv = ["worker", "app:tasks", "--addr", server.addr, "--app-dir", str(directory)]
    async with sepp_lite_process(*argv, "--no-periodic", "--until-idle") as command:
        assert await command.exit_code() == 0, command.text
    assert server.state.totals()["enqueued"] == 0
    assert "keeping the next slots" not in command.text
    async with sepp_lite_process(*argv, "--until-idle") as command:
        assert await command.exit_code() == 0, command.text
    assert (
        "periodic: keeping the next slots enqueued of tick (every 1 s); nightly "
        "(cron '30 2 * * *' in Europe/Vienna)" in command.text
    )
    assert server.counts(queue).scheduled > 0  # the slots ahead (the scheduler's look-ahead)


@pytest.mark.slow
async def test_worker_processes_3_run_each_slot_once(
    server: SeppTestServer, app: tuple[Path, str]
) -> None:
    directory, queue = app
    argv = ["worker", "app:tasks", "--addr", server.addr, "--app-dir", str(directory)]
    async with sepp_lite_process(*argv, "--processes", "3") as command:
        await until(lambda: command.text.count(" started: queues=") == 3, timeout=30)
        first = datetime.now(UTC)
        await asyncio.sleep(6)
        last = datetime.now(UTC)
        command.proc.send_signal(signal.SIGTERM)
        assert await command.exit_code() == 0, command.text
    lines = (directory / "runs").read_text().split()
    slots, pids = lines[::2], lines[1::2]
    counted = Counter(slots)
    assert [slot for slot, n in counted.items() if n > 1] == []
    window = {
        datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for second in range(int(first.timestamp()) + 1, int(last.timestamp()))
    }
    assert len(window) >= 4 and window <= set(counted)
    assert len(set(pids)) > 1  # the slots were shared among the processes
    assert server.state.totals()["deduplicated"] > 0  # all three scheduled them
