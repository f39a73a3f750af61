"""Periodic slots with workers whose clocks disagree with the server's: on the
in-process server's manual clock, each worker's scheduler keeps a clock some seconds
ahead of it or behind it, as a replica on another machine would. Every slot runs once
when it is due by the server's clock, and a slot delivered an hour late is skipped,
whatever the workers' clocks say."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

import sepp_lite as sepp
from sepp_lite import JobCtx, SeppClient, Tasks
from sepp_lite.tasks import TaskWorker
from sepp_lite.testing import ManualClock, SeppTestServer
from tests.client_helpers import unique_queue, until, worker_running

pytestmark = pytest.mark.timeout(60)

UTC = timezone.utc
START = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
SKIPPED = re.compile(r"periodic tick: slot (\S+) skipped")


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def slots(first: datetime, count: int) -> list[str]:
    return [(first + timedelta(seconds=n)).strftime("%Y-%m-%dT%H:%M:%SZ") for n in range(count)]


class SkewedClock:
    """A worker's wall clock, ``offset_s`` ahead of the server's manual clock (behind
    it when negative); its timers are the server clock's, shifted."""

    def __init__(self, server_clock: ManualClock, offset_s: float) -> None:
        self._server_clock = server_clock
        self._offset_ms = round(offset_s * 1000)

    def step(self, seconds: float) -> None:
        """Step this clock (as NTP does when it corrects one)."""
        self._offset_ms += round(seconds * 1000)

    def now_ms(self) -> int:
        return self._server_clock.now_ms() + self._offset_ms

    def call_at(self, deadline_ms: int, callback: Callable[[], None]) -> Any:
        return self._server_clock.call_at(deadline_ms - self._offset_ms, callback)


class Fleet:
    """Workers of one registry with an ``every=1`` task (its misfire grace: the second
    to the next slot), each with a client of its own and a skewed clock."""

    def __init__(self, server: SeppTestServer, skews: list[float]) -> None:
        self.server, self.skews = server, skews
        self.queue = unique_queue()
        self.tasks = Tasks(queue=self.queue)
        self.ran: list[str] = []
        self.clocks: list[SkewedClock] = []
        self._running: list[tuple[TaskWorker, asyncio.Future[None]]] = []
        self._stack = AsyncExitStack()  # the workers (worker_running) and their clients

        @self.tasks.periodic(every=1)
        async def tick(ctx: JobCtx) -> None:
            slot = sepp.periodic_slot(ctx)
            assert slot is not None
            self.ran.append(slot.strftime("%Y-%m-%dT%H:%M:%SZ"))

    async def start(self) -> None:
        for skew in self.skews:
            client = await self._stack.enter_async_context(
                await SeppClient.connect(self.server.addr)
            )
            clock = SkewedClock(self.server.clock, skew)
            self.clocks.append(clock)
            worker = self.tasks.worker(client, periodic_clock=clock)
            running = await self._stack.enter_async_context(worker_running(worker, 10))
            self._running.append((worker, running))
        await self.settle()

    async def stop(self) -> None:
        """Each worker stopped (last started first), then its client closed."""
        await self._stack.aclose()
        self._running = []

    async def settle(self) -> None:
        """Until every scheduler sleeps past the server's clock and nothing is ready
        or in flight."""
        now = self.server.clock.now_ms

        def quiet() -> bool:
            for worker, running in self._running:
                if running.done():
                    running.result()  # a crashed worker fails the test
                assert worker.scheduler is not None
                wake = worker.scheduler.sleeping_until
                if wake is None or ms(wake) <= now():
                    return False
            counts = self.server.counts(self.queue)
            return counts.ready == 0 and counts.in_flight == 0

        await until(quiet, timeout=10, step=0.002)

    async def seconds(self, count: int) -> None:
        for _ in range(count):
            await self.server.advance(1)
            await self.settle()


@asynccontextmanager
async def started(skews: list[float]) -> AsyncIterator[Fleet]:
    """A server on a manual clock from ``START`` and a fleet on it, started, and
    stopped at the end."""
    async with SeppTestServer(clock=ManualClock(ms(START))) as server:
        fleet = Fleet(server, skews)
        try:
            await fleet.start()
            yield fleet
        finally:
            await fleet.stop()


def periodic_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("periodic")]


@pytest.mark.parametrize("skew", [2, -60, 600], ids=["2s-ahead", "60s-behind", "10min-ahead"])
async def test_every_slot_runs_when_the_server_says_it_is_due(
    skew: float, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "sepp_lite"):
        async with started([skew]) as fleet:
            assert fleet.ran == slots(START, 1)  # the slot of the start, at once
            await fleet.seconds(7)
    assert fleet.ran == slots(START, 8)
    assert periodic_lines(caplog) == []


async def test_two_workers_two_minutes_apart_run_each_slot_once() -> None:
    async with started([60, -60]) as fleet:
        await fleet.seconds(5)
    assert fleet.ran == slots(START, 6)


@pytest.mark.parametrize("skew", [2, -60], ids=["2s-ahead", "60s-behind"])
async def test_a_slot_delivered_an_hour_late_is_still_skipped(
    skew: float, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "sepp_lite"):
        async with started([skew]) as fleet:
            await fleet.seconds(2)
            await fleet.stop()
            # Down for an hour: the slots enqueued ahead wait for the next worker.
            ahead = fleet.server.counts(fleet.queue).scheduled
            await fleet.server.advance(3600)
            await fleet.start()
            await fleet.seconds(2)
    back = START + timedelta(seconds=2 + 3600)
    assert fleet.ran == slots(START, 3) + slots(back, 3)
    lines = [SKIPPED.search(line) for line in periodic_lines(caplog)]
    skipped = [line.group(1) for line in lines if line]
    # Each slot enqueued ahead before the worker stopped, skipped with one line.
    assert ahead > 0 and sorted(skipped) == slots(START + timedelta(seconds=3), ahead)


@pytest.mark.parametrize("step", [-30, 30], ids=["stepped-back", "stepped-forward"])
async def test_a_clock_stepped_half_a_minute_keeps_its_slots_on_time(
    step: float, caplog: pytest.LogCaptureFixture
) -> None:
    # every=1 keeps 16 s of slots ahead, too few to cover the step: the scheduler must
    # read the server's clock again, not wait for the next minute.
    with caplog.at_level(logging.WARNING, "sepp_lite"):
        async with started([0]) as fleet:
            await fleet.seconds(2)
            fleet.clocks[0].step(step)
            for second in range(3, 40):
                await fleet.seconds(1)
                assert fleet.ran[-1] == slots(START, second + 1)[-1]  # on time
    assert fleet.ran == slots(START, 40)
    assert periodic_lines(caplog) == []
