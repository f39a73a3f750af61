"""``_loop_thread.LoopThread``, the one loop-in-a-thread helper (the test server's
thread and the health endpoints' HTTP server run on it): coroutines run on its thread,
blocking from a plain thread or awaited from another event loop; stopping it cancels
what is left and ends the thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from sepp_lite._loop_thread import LoopThread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def portal() -> Iterator[LoopThread]:
    portal = LoopThread("test-loop-thread")
    try:
        yield portal
    finally:
        portal.stop()


def test_run_blocks_until_the_coroutine_ends_on_the_loop_thread(portal: LoopThread) -> None:
    async def where() -> int:
        await asyncio.sleep(0.01)
        return threading.get_ident()

    assert portal.run(where()) not in (threading.get_ident(), None)

    async def fail() -> None:
        raise KeyError("from the loop")

    with pytest.raises(KeyError, match="from the loop"):
        portal.run(fail())


async def test_run_from_loop_leaves_the_callers_loop_running(portal: LoopThread) -> None:
    release: concurrent.futures.Future[None] = concurrent.futures.Future()
    ticks = 0

    async def blocked_until_released() -> int:
        await asyncio.wrap_future(release)
        return threading.get_ident()

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            if ticks == 3:
                release.set_result(None)  # only a caller's loop that keeps running gets here
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    try:
        ident = await asyncio.wait_for(portal.run_from_loop(blocked_until_released()), 30)
    finally:
        ticker.cancel()
    assert ident != threading.get_ident() and ticks >= 3

    async def fail() -> None:
        raise KeyError("from the loop")

    with pytest.raises(KeyError, match="from the loop"):
        await portal.run_from_loop(fail())


class Forever:
    """A coroutine that waits until it is cancelled, on a portal; and whether it has
    started and whether it was cancelled, for any thread to wait for."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def run(self) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    @classmethod
    async def on(cls, portal: LoopThread) -> tuple[Forever, asyncio.Future[None]]:
        """Started on ``portal``: itself, and the task awaiting it here."""
        forever = cls()
        waiting = asyncio.ensure_future(portal.run_from_loop(forever.run()))
        assert await asyncio.get_running_loop().run_in_executor(None, forever.started.wait, 30)
        return forever, waiting


async def test_cancelling_the_awaiting_task_cancels_the_coroutine(portal: LoopThread) -> None:
    forever, waiting = await Forever.on(portal)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await asyncio.get_running_loop().run_in_executor(None, forever.cancelled.wait, 30)


async def test_stopping_cancels_what_is_left_and_ends_the_thread() -> None:
    portal = LoopThread("test-loop-thread")
    forever, waiting = await Forever.on(portal)
    await portal.stop_from_loop()
    assert forever.cancelled.is_set()
    assert portal.loop.is_closed()
    assert not any(t.name == "test-loop-thread" for t in threading.enumerate())
    with pytest.raises(asyncio.CancelledError):
        await waiting

    async def never_run() -> None:
        raise AssertionError("ran on a stopped loop")

    # Refused, and closed: no "coroutine was never awaited" warning (an error here).
    with pytest.raises(RuntimeError, match="stopped"):
        await portal.run_from_loop(never_run())
    with pytest.raises(RuntimeError, match="stopped"):
        portal.run(never_run())
    await portal.stop_from_loop()  # idempotent
