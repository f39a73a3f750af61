"""Periodic jobs (sepp_lite/_scheduler.py): schedules, slots and keys, the checks that keep
one job per slot, and one scheduler on the in-process server with its manual clock.
The multi-replica proofs are in test_periodic_replicas.py."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any, Union

import pytest

from sepp_lite import EnqueueAck, EnqueueRequest, JobCtx, Priority, SeppClient, ServerInfo
from sepp_lite._scheduler import (
    CLOCK_SKEW_ALLOWANCE,
    MAX_SLOTS_AHEAD,
    PeriodicJob,
    PeriodicScheduler,
    periodic_slot,
    slot_key,
)
from sepp_lite.errors import ConnectError, JobRejection
from sepp_lite.testing import ManualClock, SeppTestServer
from tests.client_helpers import unique_queue, until

needs_cron = pytest.mark.skipif(
    importlib.util.find_spec("cronsim") is None, reason="needs the cron extra (cronsim)"
)
UTC = timezone.utc
VIENNA = "Europe/Vienna"
# 2026's changes in Vienna: 02:00 CET -> 03:00 CEST on March 29 (01:00 UTC), and
# 03:00 CEST -> 02:00 CET on October 25 (01:00 UTC).
SPRING = datetime(2026, 3, 29, 1, tzinfo=UTC)
AUTUMN = datetime(2026, 10, 25, 1, tzinfo=UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def slots(job: PeriodicJob, start: str, count: int) -> list[str]:
    return [s.strftime("%Y-%m-%dT%H:%M") for s in job.next_slots(utc(start), count)]


# -- every= ------------------------------------------------------------------------------


def test_every_counts_slots_from_the_epoch_whatever_the_start() -> None:
    job = PeriodicJob("sweep", "q", every=timedelta(minutes=11))
    # Midnight is not a multiple of 11 min since the epoch; 00:05 is.
    assert slots(job, "2026-01-01T00:00:00", 2) == ["2026-01-01T00:05", "2026-01-01T00:16"]
    # Replicas starting at other moments compute the same instants.
    assert slots(job, "2026-01-01T00:04:59", 1) == ["2026-01-01T00:05"]
    assert all(ms(s) % 660_000 == 0 for s in job.next_slots(utc("2026-05-05T13:13:13"), 5))
    # A start exactly on a slot yields the next one: slots are strictly after it.
    assert slots(job, "2026-01-01T00:05:00", 1) == ["2026-01-01T00:16"]


def test_every_takes_seconds_too() -> None:
    assert PeriodicJob("t", "q", every=300).next_slots(utc("2026-01-01T00:01:00")) == [
        utc("2026-01-01T00:05:00")
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of every= and cron="),
        ({"every": 60, "cron": "* * * * *"}, "exactly one of every= and cron="),
        ({"every": 0.5}, "whole number of seconds"),
        ({"every": 90.5}, "whole number of seconds"),
        ({"every": -1}, "every must not be negative"),
        ({"every": 60, "tz": VIENNA}, "tz applies to cron= only"),
        ({"every": 60, "lookahead": -1}, "lookahead must not be negative"),
        ({"every": 60, "misfire_grace": 0}, "misfire_grace must be greater than zero"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PeriodicJob("t", "q", **options)


def test_names_are_checked_as_for_any_job() -> None:
    with pytest.raises(ValueError, match="job_type"):
        PeriodicJob("", "q", every=60)
    with pytest.raises(ValueError, match="queue"):
        PeriodicJob("t", "", every=60)


# -- keys and the slot a handler reads ---------------------------------------------------


def test_the_key_names_the_job_type_and_the_slot_in_utc() -> None:
    assert (
        slot_key("sweep", ms(utc("2026-03-29T01:00:00"))) == "periodic:sweep:2026-03-29T01:00:00Z"
    )


def test_each_slot_is_a_request_with_its_key_schedule_and_options() -> None:
    job = PeriodicJob(
        "report",
        "reports",
        every=3600,
        priority=7,
        max_attempts=5,
        custom={"team": "ops"},
    )
    request = job.request(ms(utc("2026-06-01T12:00:00")))
    assert request.queue == "reports" and request.job_type == "report"
    assert request.idempotency_key == "periodic:report:2026-06-01T12:00:00Z"
    assert request.scheduled_at == utc("2026-06-01T12:00:00")
    assert request.priority == Priority(7) and request.max_attempts == 5
    assert request.custom == {"team": "ops", "periodic_slot": "2026-06-01T12:00:00Z"}


def ctx_with(
    custom: dict[str, Any],
    job_type: str = "t",
    attempt: int = 1,
    lease_expires_at: Union[datetime, None] = None,
) -> JobCtx:
    now = datetime.now(UTC)
    return JobCtx(
        id="0",
        queue="q",
        job_type=job_type,
        priority=Priority(0),
        attempt=attempt,
        max_attempts=3,
        enqueued_at=now,
        custom=custom,
        trace_context=None,
        lease_expires_at=lease_expires_at or now,
    )


def test_periodic_slot_reads_the_slot_back() -> None:
    assert periodic_slot(ctx_with({"periodic_slot": "2026-06-01T12:00:00Z"})) == utc(
        "2026-06-01T12:00:00"
    )
    assert periodic_slot(ctx_with({})) is None
    assert periodic_slot(ctx_with({"periodic_slot": "soon"})) is None


# -- the checks that keep one job per slot -----------------------------------------------


class NoServer:
    """A producer for constructor checks: nothing is sent."""

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> list[Union[EnqueueAck, JobRejection]]:
        raise AssertionError("not reached")

    async def get_server_info(self) -> ServerInfo:
        raise AssertionError("not reached")


def test_lookahead_plus_grace_must_fit_in_the_dedup_window() -> None:
    fits = PeriodicJob("t", "q", every=60, lookahead=3600, misfire_grace=3600)
    PeriodicScheduler(NoServer(), [fits], dedup_window=7200 + CLOCK_SKEW_ALLOWANCE.seconds)
    with pytest.raises(ValueError, match="beyond the dedup window") as refused:
        PeriodicScheduler(NoServer(), [fits], dedup_window=7200)
    assert "lookahead (1:00:00) + misfire_grace (1:00:00)" in str(refused.value)
    # The default window is the server's default, 24 h.
    long = PeriodicJob("t", "q", every=60, lookahead=timedelta(hours=23, minutes=50))
    with pytest.raises(ValueError, match="beyond the dedup window"):
        PeriodicScheduler(NoServer(), [long])


def test_the_default_grace_is_the_gap_to_the_next_slot_at_most_ten_minutes() -> None:
    assert PeriodicJob("t", "q", every=60).grace_ms(0) == 60_000
    assert PeriodicJob("t", "q", every=3600).grace_ms(0) == 600_000
    assert PeriodicJob("t", "q", every=3600, misfire_grace=5).grace_ms(0) == 5_000


async def test_a_lookahead_beyond_the_schedule_horizon_is_refused_at_start() -> None:
    queue = unique_queue()
    async with SeppTestServer(max_schedule_horizon_ms=3_600_000) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("t", queue, every=60, lookahead=7200)
            scheduler = PeriodicScheduler(client, [job])
            with pytest.raises(ValueError, match="beyond the server's schedule horizon"):
                await asyncio.wait_for(scheduler.run(), 10)
            assert server.counts(queue).scheduled == 0


async def test_keys_longer_than_the_server_takes_are_refused_at_start() -> None:
    async with SeppTestServer(max_idempotency_key_bytes=40) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("a-rather-long-job-type", "q", every=60)
            with pytest.raises(ValueError, match="longer than the server accepts"):
                await asyncio.wait_for(PeriodicScheduler(client, [job]).run(), 10)


# -- cron= and DST -----------------------------------------------------------------------


@needs_cron
def test_cron_reads_five_fields_with_the_usual_extensions() -> None:
    job = PeriodicJob("t", "q", cron="0 9 * * MON-FRI")
    assert slots(job, "2026-12-04T10:00:00", 2) == ["2026-12-07T09:00", "2026-12-08T09:00"]
    last = PeriodicJob("t", "q", cron="0 0 L * *")
    assert slots(last, "2026-02-01T00:00:00", 1) == ["2026-02-28T00:00"]
    with pytest.raises(ValueError, match="5 fields"):
        PeriodicJob("t", "q", cron="0 0 * * * *")
    with pytest.raises(ValueError, match="invalid expression"):
        PeriodicJob("t", "q", cron="61 * * * *")
    with pytest.raises(ValueError, match="unknown time zone"):
        PeriodicJob("t", "q", cron="* * * * *", tz="Mars/Olympus")


@needs_cron
def test_cron_runs_in_its_time_zone() -> None:
    job = PeriodicJob("t", "q", cron="0 9 * * *", tz=VIENNA)
    assert slots(job, "2026-01-10T00:00:00", 1) == ["2026-01-10T08:00"]  # CET: UTC+1
    assert slots(job, "2026-07-10T00:00:00", 1) == ["2026-07-10T07:00"]  # CEST: UTC+2


@needs_cron
def test_spring_forward_a_job_in_the_skipped_hour_runs_once_right_after() -> None:
    daily = PeriodicJob("t", "q", cron="30 2 * * *", tz=VIENNA)
    # 02:30 local does not exist on March 29: it runs at 03:00 CEST, once.
    assert slots(daily, "2026-03-28T00:00:00", 3) == [
        "2026-03-28T01:30",
        "2026-03-29T01:00",
        "2026-03-30T00:30",
    ]
    hourly = PeriodicJob("t", "q", cron="0 * * * *", tz=VIENNA)
    around = [s for s in hourly.next_slots(SPRING - timedelta(hours=3), 6)]
    assert [s - around[0] for s in around] == [timedelta(hours=h) for h in range(6)]


@needs_cron
def test_fall_back_a_job_in_the_repeated_hour_runs_once() -> None:
    daily = PeriodicJob("t", "q", cron="30 2 * * *", tz=VIENNA)
    # 02:30 local happens twice on October 25: only the first (00:30 UTC) is a slot.
    assert slots(daily, "2026-10-24T00:00:00", 3) == [
        "2026-10-24T00:30",
        "2026-10-25T00:30",
        "2026-10-26T01:30",
    ]
    # A replica starting in the second 02:xx (after the first 02:30 ran) does not
    # compute that slot again, nor a second one for the repeated hour.
    assert slots(daily, "2026-10-25T01:10:00", 1) == ["2026-10-26T01:30"]
    # A wildcard-hour expression runs in real time, as cron does: every 30 min of the
    # 25-hour day, no instant twice.
    half = PeriodicJob("t", "q", cron="*/30 * * * *", tz=VIENNA)
    day = half.next_slots(utc("2026-10-24T22:00:00"), 50)
    assert len(set(day)) == 50
    assert {b - a for a, b in zip(day, day[1:])} == {timedelta(minutes=30)}


# -- one scheduler on the in-process server ----------------------------------------------

START = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


async def settled(scheduler: PeriodicScheduler, server: SeppTestServer) -> None:
    """Until the scheduler sleeps till a moment after the server's clock."""

    def asleep() -> bool:
        until_ = scheduler.sleeping_until
        return until_ is not None and ms(until_) > server.clock.now_ms()

    await until(asleep)


def keys_of(
    server: SeppTestServer, queue: str, job: PeriodicJob, start: datetime, n: int
) -> list[object]:
    return [
        server.state.dedup_record(queue, slot_key(job.job_type, ms(s)))
        for s in job.next_slots(start, n)
    ]


async def test_the_next_slots_within_the_lookahead_are_kept_enqueued() -> None:
    queue = unique_queue()
    async with SeppTestServer(clock=ManualClock(ms(START))) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("tick", queue, every=60, lookahead=300, misfire_grace=30)
            scheduler = PeriodicScheduler(client, [job], clock=server.clock)
            task = asyncio.ensure_future(scheduler.run())
            try:
                await settled(scheduler, server)
                # 12:01 ... 12:05 are enqueued; 12:06 is beyond the look-ahead.
                assert server.counts(queue).scheduled == 5
                records = keys_of(server, queue, job, START, 6)
                assert all(records[:5]) and records[5] is None
                assert scheduler.sleeping_until == utc("2026-06-01T12:01:00")
                for _ in range(3):
                    await server.advance(60)
                    await settled(scheduler, server)
                # The slots that came due are ready; the window moved on by three.
                assert server.counts(queue) == (3, 5, 0, 0)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_at_most_max_slots_ahead_are_enqueued() -> None:
    queue = unique_queue()
    async with SeppTestServer(clock=ManualClock(ms(START))) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("tick", queue, every=1, lookahead=600, misfire_grace=1)
            scheduler = PeriodicScheduler(client, [job], clock=server.clock)
            task = asyncio.ensure_future(scheduler.run())
            try:
                await settled(scheduler, server)
                # 12:00:30 is now (within its grace: ready), then 16 of the next 600.
                assert server.counts(queue) == (1, MAX_SLOTS_AHEAD, 0, 0)
                # It looks again when the first slot passes, and adds one more.
                assert scheduler.sleeping_until == utc("2026-06-01T12:00:31")
                await server.advance(1)
                await settled(scheduler, server)
                assert server.counts(queue) == (2, MAX_SLOTS_AHEAD, 0, 0)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_a_slot_within_the_grace_is_caught_up_once_an_older_one_not() -> None:
    queue = unique_queue()
    start = datetime(2026, 6, 1, 12, 7, 0, tzinfo=UTC)
    async with SeppTestServer(clock=ManualClock(ms(start))) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("tick", queue, every=300, lookahead=0, misfire_grace=150)
            first = PeriodicScheduler(client, [job], clock=server.clock)
            again = PeriodicScheduler(client, [job], clock=server.clock)
            tasks = [asyncio.ensure_future(s.run()) for s in (first, again)]
            try:
                await settled(first, server)
                await settled(again, server)
                # 12:05 is 2 min late (< 150 s): enqueued, ready now, once for both.
                # 12:00 is 7 min late: skipped.
                assert server.counts(queue) == (1, 0, 0, 0)
                assert server.state.dedup_record(queue, "periodic:tick:2026-06-01T12:05:00Z")
                assert not server.state.dedup_record(queue, "periodic:tick:2026-06-01T12:00:00Z")
                assert server.state.totals()["deduplicated"] == 1
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


async def test_slots_a_running_scheduler_could_not_enqueue_in_time_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = unique_queue()
    async with SeppTestServer(clock=ManualClock(ms(START))) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("tick", queue, every=60, lookahead=0, misfire_grace=30)
            scheduler = PeriodicScheduler(client, [job], clock=server.clock)
            task = asyncio.ensure_future(scheduler.run())
            try:
                await settled(scheduler, server)
                # One step of 5 min: the scheduler's timer fires at 12:01, but it runs
                # only once the clock stands at 12:05:30, as after a frozen process.
                with caplog.at_level(logging.WARNING, "sepp_lite"):
                    await server.advance(300)
                    await settled(scheduler, server)
                lines = [r.getMessage() for r in caplog.records if "not run" in r.getMessage()]
                assert lines == [
                    "periodic tick: 5 slot(s) from 2026-06-01T12:01:00Z to "
                    "2026-06-01T12:05:00Z not run: more than misfire_grace late"
                ]
                assert server.counts(queue).ready == 0
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


class FailingFirst:
    """A producer whose first ``failures`` enqueues fail as an unreachable server's do."""

    def __init__(self, client: SeppClient, failures: int) -> None:
        self.client = client
        self.failures = failures
        self.calls = 0

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> list[Union[EnqueueAck, JobRejection]]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectError("127.0.0.1:1", "connection refused")
        return await self.client.enqueue_batch(jobs)

    async def get_server_info(self) -> ServerInfo:
        return await self.client.get_server_info()


async def test_a_failed_enqueue_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    queue = unique_queue()
    async with SeppTestServer(clock=ManualClock(ms(START))) as server:
        async with await SeppClient.connect(server.addr) as client:
            producer = FailingFirst(client, failures=1)
            job = PeriodicJob("tick", queue, every=60, lookahead=120)
            scheduler = PeriodicScheduler(producer, [job], clock=server.clock)
            with caplog.at_level(logging.WARNING, "sepp_lite"):
                task = asyncio.ensure_future(scheduler.run())
                try:
                    await settled(scheduler, server)
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            assert producer.calls == 2
            assert server.counts(queue).scheduled == 2
            [line] = [r for r in caplog.records if "enqueue failed" in r.getMessage()]
            assert line.levelno == logging.WARNING and "connection refused" in line.getMessage()


def test_misfired_judges_lateness_by_the_servers_time_of_the_delivery() -> None:
    # The worker's clock is ten minutes ahead of the server's: given the lease the
    # worker reserves with, the server's time of the delivery is read off the job.
    clock = ManualClock(ms(utc("2026-06-01T12:10:00")))
    job = PeriodicJob("t", "q", every=60, misfire_grace=30)
    scheduler = PeriodicScheduler(NoServer(), [job], clock=clock)
    slot = {"periodic_slot": "2026-06-01T12:00:00Z"}
    lease = timedelta(seconds=30)

    def delivered(late_ms: int, **fields: Any) -> JobCtx:
        at = utc("2026-06-01T12:00:00") + timedelta(milliseconds=late_ms)
        return ctx_with(slot, lease_expires_at=at + lease, **fields)

    assert not scheduler.misfired(delivered(29_999), lease_duration=lease)
    assert scheduler.misfired(delivered(30_000), lease_duration=30)  # 30 s late
    assert not scheduler.misfired(delivered(30_000, attempt=2), lease_duration=lease)  # a retry
    assert not scheduler.misfired(ctx_with({}), lease_duration=lease)  # not from a schedule
    assert not scheduler.misfired(delivered(30_000, job_type="other"), lease_duration=lease)

    async def handler(payload: Any, ctx: JobCtx) -> None: ...

    with pytest.raises(ValueError, match="lease_duration"):
        scheduler.guard(handler, lease_duration=0)


def test_misfired_without_the_lease_allows_the_worker_a_minute_ahead() -> None:
    clock = ManualClock(ms(utc("2026-06-01T12:01:29.999")))
    job = PeriodicJob("t", "q", every=60, misfire_grace=30)
    scheduler = PeriodicScheduler(NoServer(), [job], clock=clock)
    ctx = ctx_with({"periodic_slot": "2026-06-01T12:00:00Z"})
    assert not scheduler.misfired(ctx)  # by this clock 89.999 s late: 29.999 s, less a minute
    clock.advance(0.001)
    assert scheduler.misfired(ctx)


async def test_cancelling_leaves_no_timer_and_no_call_behind() -> None:
    queue = unique_queue()
    clock = ManualClock(ms(START))
    async with SeppTestServer(clock=clock) as server:
        async with await SeppClient.connect(server.addr) as client:
            job = PeriodicJob("tick", queue, every=60, lookahead=120)
            scheduler = PeriodicScheduler(client, [job], clock=clock)
            # Cancelled while it sleeps: its wake-up timer goes with it.
            task = asyncio.ensure_future(scheduler.run())
            await settled(scheduler, server)
            assert clock.pending_timers() >= 1
            before = clock.pending_timers()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled() and clock.pending_timers() == before - 1
            assert scheduler.sleeping_until is None
            # Cancelled while an enqueue is under way: the cancellation comes through.
            arrived, release = asyncio.Event(), asyncio.Event()

            async def hold() -> None:
                arrived.set()
                await release.wait()

            server.before_call("EnqueueBatch", hold)
            await server.advance(60)  # 12:01:30: the 12:03 slot comes within the look-ahead
            again = asyncio.ensure_future(scheduler.run())
            await asyncio.wait_for(arrived.wait(), 10)
            again.cancel()
            await asyncio.wait_for(asyncio.gather(again, return_exceptions=True), 10)
            assert again.cancelled()
            release.set()
