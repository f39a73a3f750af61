"""Exactly one run per slot with several worker replicas, each a client, a Worker and a
PeriodicScheduler of its own: days of a 5-minute, an hourly and a daily schedule on
the in-process server's manual clock (replicas stopped and started at random, all of
them down for longer than the grace once, a DST change), then real time on the grpcio
reference server."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import random
import re
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest

from sepp_lite import JobCtx, Payload, SeppClient, Tasks, Worker
from sepp_lite._clock import Clock
from sepp_lite._scheduler import (
    PeriodicJob,
    PeriodicScheduler,
    periodic_slot,
)
from sepp_lite.testing import ManualClock, SeppTestServer
from tests.client_helpers import NO_GRPCIO, unique_queue, until, worker_running

UTC = timezone.utc
STEP_S = 150  # the manual clock moves in steps shorter than the grace
GRACE = timedelta(minutes=10)
LOOKAHEAD = timedelta(minutes=10)
# Long polls that outlast the simulation: a reserve answered empty in an instant of
# real time makes a Worker pause a quarter second, which would add up over the steps.
WAIT = timedelta(days=4)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def iso(slot_ms: int) -> str:
    return datetime.fromtimestamp(slot_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Runs:
    """What the handlers saw: (job_type, slot) of each run, and each run's job id."""

    slots: list[tuple[str, str]] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)

    async def handler(self, payload: Optional[Payload], ctx: JobCtx) -> None:
        slot = periodic_slot(ctx)
        assert slot is not None and ctx.scheduled_at == slot
        self.slots.append((ctx.job_type, slot.strftime("%Y-%m-%dT%H:%M:%SZ")))
        self.job_ids.append(ctx.id)


class Replica:
    """One worker process's worth: its own client, Worker and scheduler; with
    ``tasks``, the worker a ``Tasks`` registry builds (its scheduler inside)."""

    def __init__(
        self,
        addr: str,
        queue: str,
        jobs: list[PeriodicJob],
        runs: Runs,
        clock: Optional[Clock],
        tasks: Optional[Tasks] = None,
    ):
        self.addr, self.queue, self.jobs, self.runs, self.clock = addr, queue, jobs, runs, clock
        self.tasks = tasks
        self.scheduler: Optional[PeriodicScheduler] = None
        self._worker: Optional[Worker] = None
        self._tasks: list[asyncio.Future[None]] = []  # the worker's run(), the scheduler's
        self._stack = AsyncExitStack()  # the worker (worker_running) and its client
        self.starts = 0

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    async def start(self) -> None:
        self.starts += 1
        self._stack = AsyncExitStack()
        client = await self._stack.enter_async_context(await SeppClient.connect(self.addr))
        if self.tasks is not None:
            worker = self.tasks.worker(
                client, lease_duration=600, wait_timeout=WAIT, periodic_clock=self.clock
            )
            self._worker, self.scheduler = worker, worker.scheduler
            self._tasks = [await self._stack.enter_async_context(worker_running(worker, 10))]
            return
        self._worker = Worker(client, [self.queue], lease_duration=600, wait_timeout=WAIT)
        self.scheduler = PeriodicScheduler(client, self.jobs, clock=self.clock)
        for job in self.jobs:
            guarded = self.scheduler.guard(self.runs.handler, lease_duration=600)
            self._worker.handle(job.job_type, guarded)
        self._tasks = [
            await self._stack.enter_async_context(worker_running(self._worker, 10)),
            asyncio.ensure_future(self.scheduler.run()),
        ]

    async def stop(self) -> None:
        """The scheduler cancelled, then the worker stopped and its client closed."""
        _, *scheduler_task = self._tasks
        for task in scheduler_task:
            task.cancel()
        await asyncio.gather(*scheduler_task, return_exceptions=True)
        await self._stack.aclose()
        self._tasks = []
        self.scheduler = None


async def settle(server: SeppTestServer, queue: str, replicas: list[Replica]) -> None:
    """Until every running scheduler sleeps past the clock and, while some worker
    runs, the queue has nothing ready or in flight."""
    now = server.clock.now_ms

    def quiet() -> bool:
        for replica in replicas:
            if replica.running:
                for task in replica._tasks:
                    if task.done():
                        task.result()  # a crashed worker or scheduler fails the test
                scheduler = replica.scheduler
                assert scheduler is not None
                wake = scheduler.sleeping_until
                if wake is None or ms(wake) <= now():
                    return False
        counts = server.counts(queue)
        serving = any(r.running for r in replicas)
        return not serving or (counts.ready == 0 and counts.in_flight == 0)

    await until(quiet, timeout=30, step=0.002)


async def simulate(
    start: datetime,
    days: float,
    jobs: list[PeriodicJob],
    queue: str,
    gap: tuple[datetime, datetime],
    seed: int,
    through_tasks: bool = False,
) -> tuple[Runs, SeppTestServer]:
    """Three replicas over ``days`` from ``start``; all of them down during ``gap``,
    otherwise stopped and started at random with at least one running."""
    rng = random.Random(seed)
    runs = Runs()
    registry = tasks_of(queue, runs) if through_tasks else None
    end = ms(start + timedelta(days=days))
    gap_start, gap_end = ms(gap[0]), ms(gap[1])
    wait_ms = int(WAIT.total_seconds() * 1000)
    async with SeppTestServer(clock=ManualClock(ms(start)), max_wait_timeout_ms=wait_ms) as server:
        replicas = [
            Replica(server.addr, queue, jobs, runs, server.clock, registry) for _ in range(3)
        ]
        try:
            for replica in replicas:
                await replica.start()
            await settle(server, queue, replicas)
            while server.clock.now_ms() < end:
                await step(server.clock.now_ms(), (gap_start, gap_end), rng, replicas)
                await settle(server, queue, replicas)
                await server.advance(STEP_S)
                await settle(server, queue, replicas)
        finally:
            for replica in replicas:
                if replica.running:
                    await replica.stop()
    assert sum(r.starts for r in replicas) > 50  # restarts at random points happened
    return runs, server


async def step(now: int, gap: tuple[int, int], rng: random.Random, replicas: list[Replica]) -> None:
    """All replicas stop when the gap starts and start when it ends; between, one is
    stopped or started now and then."""
    if now == gap[0]:
        for replica in replicas:
            if replica.running:
                await replica.stop()
    elif now == gap[1]:
        for replica in rng.sample(replicas, len(replicas)):
            await replica.start()
    elif not gap[0] < now < gap[1]:
        await toggle_one(rng, replicas)


async def toggle_one(rng: random.Random, replicas: list[Replica]) -> None:
    """Now and then stop a running replica (keeping one) or start a stopped one."""
    if rng.random() > 0.15:
        return
    replica = rng.choice(replicas)
    if not replica.running:
        await replica.start()
    elif sum(r.running for r in replicas) > 1:
        await replica.stop()


def expected_runs(
    jobs: list[PeriodicJob], start: datetime, end: datetime, gap: tuple[datetime, datetime]
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The slots that must run once, and the ones in the gap that must not run: a slot
    more than the grace late when the replicas came back is skipped."""
    run: set[tuple[str, str]] = set()
    skipped: set[tuple[str, str]] = set()
    for job in jobs:
        for slot_ms in job.schedule.slots_after(ms(start) - job.grace_ms(0)):
            if slot_ms > ms(end):
                break
            if slot_ms <= ms(start) and slot_ms + job.grace_ms(slot_ms) <= ms(start):
                continue
            late = ms(gap[1]) - slot_ms
            target = skipped if ms(gap[0]) < slot_ms and late >= job.grace_ms(slot_ms) else run
            target.add((job.job_type, iso(slot_ms)))
    return run, skipped


SCHEDULES: dict[str, dict[str, Any]] = {
    "five-min": {"every": timedelta(minutes=5)},
    "hourly": {"cron": "0 * * * *", "tz": "Europe/Vienna"},
    "daily": {"cron": "30 2 * * *", "tz": "Europe/Vienna"},
}


def schedules(queue: str) -> list[PeriodicJob]:
    return [
        PeriodicJob(name, queue, lookahead=LOOKAHEAD, misfire_grace=GRACE, **options)
        for name, options in SCHEDULES.items()
    ]


def tasks_of(queue: str, runs: Runs) -> Tasks:
    """The same schedules as periodic tasks of a registry."""
    tasks = Tasks(queue=queue)

    async def run(ctx: JobCtx) -> None:
        await runs.handler(None, ctx)

    for name, options in SCHEDULES.items():  # one function, three job types
        tasks.periodic(job_type=name, lookahead=LOOKAHEAD, misfire_grace=GRACE, **options)(run)
    return tasks


needs_cron = pytest.mark.skipif(
    importlib.util.find_spec("cronsim") is None, reason="needs the cron extra (cronsim)"
)

SCENARIOS = {
    # Vienna springs forward on 2026-03-29 at 01:00 UTC (02:00 -> 03:00 local): the
    # daily 02:30 runs at 03:00 CEST, once.
    "spring": (
        datetime(2026, 3, 27, 22, 2, 30, tzinfo=UTC),
        (datetime(2026, 3, 28, 9, 2, 30, tzinfo=UTC), datetime(2026, 3, 28, 10, 2, 30, tzinfo=UTC)),
        ("daily", "2026-03-29T01:00:00Z"),
    ),
    # Vienna falls back on 2026-10-25 at 01:00 UTC (03:00 -> 02:00 local): the daily
    # 02:30 runs on the first 02:30 (00:30 UTC), not again an hour later.
    "autumn": (
        datetime(2026, 10, 23, 22, 2, 30, tzinfo=UTC),
        (
            datetime(2026, 10, 24, 15, 30, 0, tzinfo=UTC),
            datetime(2026, 10, 24, 16, 17, 30, tzinfo=UTC),
        ),
        ("daily", "2026-10-25T00:30:00Z"),
    ),
}


@needs_cron
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("scenario", "through"),
    [("spring", "tasks"), ("autumn", "tasks"), ("autumn", "scheduler")],
)
async def test_three_replicas_run_every_slot_exactly_once_over_days(
    scenario: str, through: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``through``: workers of a ``Tasks`` registry with ``@tasks.periodic`` tasks, or
    plain Workers with a PeriodicScheduler beside each."""
    start, gap, dst_slot = SCENARIOS[scenario]
    days = 2.5
    queue = unique_queue()
    jobs = schedules(queue)
    with caplog.at_level(logging.WARNING, "sepp_lite"):
        runs, server = await simulate(
            start, days, jobs, queue, gap, seed=len(scenario), through_tasks=through == "tasks"
        )
    end = start + timedelta(days=days)
    must_run, must_skip = expected_runs(jobs, start, end, gap)

    counted = Counter(runs.slots)
    assert [slot for slot, n in counted.items() if n > 1] == []
    assert len(set(runs.job_ids)) == len(runs.job_ids)
    assert set(counted) == must_run
    assert must_skip and not must_skip & set(counted)
    assert dst_slot in counted
    daily = sorted(slot for job_type, slot in counted if job_type == "daily")
    assert len(daily) == len({slot[:10] for slot in daily})  # one a day, DST or not
    # 2.5 days of 5-minute slots, the two before the start within the grace, less the
    # ones skipped in the gap.
    assert sum(1 for t, _ in counted if t == "five-min") == 722 - sum(
        1 for t, _ in must_skip if t == "five-min"
    )
    totals = server.state.totals()
    # The replicas enqueued each slot many times; the server made one job of each.
    assert totals["deduplicated"] > totals["enqueued"]
    pending = server.counts(queue).scheduled  # the look-ahead past the end
    assert pending > 0
    assert totals["enqueued"] == len(must_run) + skipped_with_a_job(jobs, gap) + pending
    # A slot that was enqueued before the gap and delivered after it is skipped with
    # one log line, by the one worker that received it.
    skipped_lines = [
        re.search(r"periodic (\S+): slot (\S+) skipped", r.getMessage()) for r in caplog.records
    ]
    logged = Counter((m.group(1), m.group(2)) for m in skipped_lines if m)
    assert set(logged.values()) == {1}
    assert set(logged) <= must_skip and len(logged) == skipped_with_a_job(jobs, gap)


def skipped_with_a_job(jobs: list[PeriodicJob], gap: tuple[datetime, datetime]) -> int:
    """Slots in the gap that the replicas enqueued (look-ahead) before they stopped."""
    count = 0
    for job in jobs:
        for slot_ms in job.schedule.slots_after(ms(gap[0])):
            if slot_ms > ms(gap[0]) + job.lookahead_ms:
                break
            if ms(gap[1]) - slot_ms >= job.grace_ms(slot_ms):
                count += 1
    return count


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_every_second_with_three_replicas_in_real_time_on_grpcio() -> None:
    pytest.importorskip("grpc", reason=NO_GRPCIO)
    from tests.grpcio_server import GrpcioServer

    queue = unique_queue()
    runs = Runs()
    jobs = [PeriodicJob("tick", queue, every=1, misfire_grace=5)]
    async with GrpcioServer() as server:
        replicas = [Replica(server.addr, queue, jobs, runs, None) for _ in range(3)]
        try:
            for replica in replicas:
                await replica.start()
            first = datetime.now(UTC)
            await asyncio.sleep(4)
            await replicas[1].stop()  # a rolling restart of one replica
            await asyncio.sleep(2)
            await replicas[1].start()
            await asyncio.sleep(4)
            last = datetime.now(UTC)
            window = {iso(slot) for slot in range(ms(first) // 1000 * 1000 + 1000, ms(last), 1000)}
            await until(lambda: window <= {slot for _, slot in runs.slots}, timeout=20)
        finally:
            for replica in replicas:
                if replica.running:
                    await replica.stop()
    counted = Counter(slot for _, slot in runs.slots)
    assert len(window) >= 9
    assert [slot for slot, n in counted.items() if n > 1] == []
    assert window <= set(counted)
    assert len(set(runs.job_ids)) == len(runs.job_ids)
    totals = server.state.totals()
    assert totals["deduplicated"] > 0  # the replicas did enqueue the same slots
