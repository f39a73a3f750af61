"""The loop the blocking client runs in its callers' threads (``_caller_loop``): who
drives it, how a waiting thread takes it over, the keeper's ticks between calls,
Ctrl-C, and closing from anywhere."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest

from sepp_lite._caller_loop import CallerLoop
from tests.client_helpers import until_sync

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def portal() -> Iterator[CallerLoop]:
    loop = CallerLoop("test-caller-loop", tick_s=0.05)
    yield loop
    loop.close()


async def where() -> int:
    await asyncio.sleep(0)
    return threading.get_ident()


def test_a_call_runs_in_the_calling_thread(portal: CallerLoop) -> None:
    assert portal.run(where()) == threading.get_ident()
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(lambda: (portal.run(where()), threading.get_ident())).result(10)
    assert other[0] == other[1]


def test_a_waiting_thread_hands_its_call_over_and_takes_the_loop_when_the_driver_leaves(
    portal: CallerLoop,
) -> None:
    first_started = threading.Event()
    release_first = threading.Event()
    second_started = threading.Event()
    release_second = threading.Event()

    async def first() -> int:
        first_started.set()
        while not release_first.is_set():  # noqa: ASYNC110 (set by another thread)
            await asyncio.sleep(0.01)
        return threading.get_ident()

    async def second() -> tuple[int, int]:
        started_on = threading.get_ident()
        second_started.set()
        while not release_second.is_set():  # noqa: ASYNC110 (set by another thread)
            await asyncio.sleep(0.01)
        return started_on, threading.get_ident()

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(lambda: (portal.run(first()), threading.get_ident()))
        assert first_started.wait(10)
        b = pool.submit(lambda: (portal.run(second()), threading.get_ident()))
        assert second_started.wait(10)  # the driver (a) runs b's coroutine meanwhile
        release_first.set()
        (a_ran_on, a_thread) = a.result(10)
        release_second.set()
        ((b_started_on, b_ended_on), b_thread) = b.result(10)
    assert a_ran_on == a_thread
    assert b_started_on == a_thread  # handed over to the driver
    assert b_ended_on == b_thread  # then b drove the loop itself


def test_many_threads_at_once_all_finish(portal: CallerLoop) -> None:
    async def hop(n: int) -> int:
        for _ in range(5):
            await asyncio.sleep(0.001)
        return n

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda n: portal.run(hop(n)), range(200), timeout=30))
    assert results == list(range(200))


def test_calls_ending_in_any_order_each_wake_their_own_thread(portal: CallerLoop) -> None:
    # Durations differ, so calls end out of order and the driving role moves often:
    # every thread must get its own result, and none may wait for a wake-up lost in a
    # hand-over.
    async def after(n: int) -> tuple[int, int]:
        await asyncio.sleep((n * 7 % 5) / 2000)
        return n, threading.get_ident()

    def call(n: int) -> tuple[int, int, int]:
        got, ran_in = portal.run(after(n))
        return got, ran_in, threading.get_ident()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(800), timeout=60))
    assert [got for got, _, _ in results] == list(range(800))
    assert len({ran_in for _, ran_in, _ in results}) > 1  # more than one thread drove


def test_threads_that_hand_calls_over_meanwhile_share_one_wake_up_of_the_loop(
    portal: CallerLoop,
) -> None:
    # Each hand-over by its own call_soon_threadsafe wrote to the loop's self-pipe once
    # per call (a system call that also gives up the GIL); calls handed over while the
    # loop is busy are started by the one wake-up already on its way.
    loop = portal.loop
    wake_ups: list[object] = []
    real = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        wake_ups.append(callback)
        return real(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    busy, all_waiting = threading.Event(), threading.Event()

    async def hold_the_loop() -> str:
        busy.set()
        assert all_waiting.wait(10)  # blocks the loop itself while the others hand over
        await asyncio.sleep(0)
        return "driver"

    async def follower(n: int) -> int:
        await asyncio.sleep(0)
        return n

    with ThreadPoolExecutor(6) as pool:
        driver = pool.submit(portal.run, hold_the_loop())
        assert busy.wait(10)
        followers = [pool.submit(portal.run, follower(n)) for n in range(5)]
        until_sync(lambda: len(portal._followers) == 5)
        all_waiting.set()
        assert driver.result(10) == "driver"
        assert [f.result(10) for f in followers] == list(range(5))
    assert len(wake_ups) == 1


def test_a_thread_whose_call_ended_is_woken_when_the_loop_would_wait_not_before(
    portal: CallerLoop,
) -> None:
    # Woken at once, a thread only woke to wait again for the GIL, held by the thread
    # running the rest of the loop's iteration: here a callback that holds the loop
    # for 50 ms (time.sleep gives the GIL up, so a thread woken early would return).
    loop = portal.loop
    done_at: dict[str, float] = {}
    answer: asyncio.Future[int] = loop.create_future()
    follower_waits = threading.Event()

    def busy() -> None:
        time.sleep(0.05)
        done_at["busy"] = time.monotonic()

    async def drive() -> str:
        while not follower_waits.is_set():  # noqa: ASYNC110 (set by another thread)
            await asyncio.sleep(0.001)
        answer.set_result(7)  # the follower's call ends in the next iteration...
        loop.call_soon(lambda: loop.call_soon(busy))  # ...and busy runs after it
        await asyncio.sleep(0.2)
        return "driver"

    async def follow() -> int:
        follower_waits.set()
        return await answer

    def follower() -> int:
        result = portal.run(follow())
        done_at["follower"] = time.monotonic()
        return result

    assert driving_then_following(portal, drive(), follower) == ("driver", 7)
    assert done_at["follower"] >= done_at["busy"]


def test_a_loop_that_never_waits_still_wakes_the_threads_of_ended_calls(
    portal: CallerLoop,
) -> None:
    # The driver's call spins (sleep(0): the loop only polls) until the follower's
    # thread has its result back: without the bound on iterations unwoken, neither
    # would ever end.
    follower_back = threading.Event()

    async def spin() -> str:
        while not follower_back.is_set():  # noqa: ASYNC110 (set by another thread)
            await asyncio.sleep(0)
        return "driver"

    async def quick() -> int:
        await asyncio.sleep(0)
        return 3

    def follower() -> int:
        result = portal.run(quick())
        follower_back.set()
        return result

    assert driving_then_following(portal, spin(), follower) == ("driver", 3)


def driving_then_following(
    portal: CallerLoop, driven: Coroutine[Any, Any, str], follower: Callable[[], int]
) -> tuple[str, int]:
    """Run ``driven`` in one thread; once it drives the loop, ``follower`` in another;
    both results."""
    with ThreadPoolExecutor(2) as pool:
        driver = pool.submit(portal.run, driven)
        until_sync(lambda: portal._driving)
        other = pool.submit(follower)
        return driver.result(10), other.result(10)


def test_a_hand_over_to_a_closed_loop_raises(portal: CallerLoop) -> None:
    def closed(*args: Any) -> None:
        raise RuntimeError("Event loop is closed")  # as asyncio's own check says it

    real = portal.loop.call_soon_threadsafe
    portal.loop.call_soon_threadsafe = closed  # type: ignore[method-assign]
    with portal._cond:
        portal._driving = True  # as if another thread drove the loop
    try:
        with pytest.raises(RuntimeError, match="the event loop is closed"):
            portal.run(where())
        assert not portal._followers and not portal._incoming
    finally:
        with portal._cond:
            portal._driving = False
        portal.loop.call_soon_threadsafe = real  # type: ignore[method-assign]


def test_errors_reach_the_caller(portal: CallerLoop) -> None:
    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        portal.run(fail())
    assert portal.run(where())  # the loop goes on


def test_between_calls_the_keeper_runs_due_timers(portal: CallerLoop) -> None:
    fired = threading.Event()

    async def arm() -> None:
        asyncio.get_running_loop().call_later(0.1, fired.set)

    portal.run(arm())
    assert fired.wait(5)  # nobody called meanwhile: the keeper ran the loop
    keeper = [t for t in threading.enumerate() if t.name == "test-caller-loop"]
    assert len(keeper) == 1 and keeper[0].daemon


def test_a_call_from_inside_the_loop_raises_instead_of_hanging(portal: CallerLoop) -> None:
    async def nested() -> None:
        portal.run(where())

    with pytest.raises(RuntimeError, match="inside the event loop"):
        portal.run(nested())


def test_the_main_threads_sigint_handler_is_restored_after_each_call(portal: CallerLoop) -> None:
    seen: list[Any] = []

    async def look() -> None:
        seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    portal.run(look())
    assert signal.getsignal(signal.SIGINT) is before
    if before is signal.default_int_handler:
        assert seen[0] is not before  # Ctrl-C cancels the call meanwhile
    else:  # someone else's handler (pytest's, a framework's) is left alone
        assert seen[0] is before


def test_ctrl_c_cancels_the_call_and_raises_keyboard_interrupt(portal: CallerLoop) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    cancelled = threading.Event()

    async def long_wait() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    # kill(), not raise(): a process-directed signal, which Linux gives the main thread
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            portal.run(long_wait())
        assert time.monotonic() - started < 5
        assert cancelled.is_set()  # unwound before the interruption reached us
        assert portal.run(where())  # and the loop goes on
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


def test_closing_cuts_short_calls_in_flight_and_later_calls_raise() -> None:
    portal = CallerLoop("test-caller-loop", tick_s=0.05)
    stop = asyncio.Event  # made on the loop, where 3.9 binds it
    holder: dict[str, Any] = {}

    async def wait_forever() -> None:
        holder["event"] = stop()
        await holder["event"].wait()

    async def final() -> None:
        holder["event"].set()

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(portal.run, wait_forever())
        until_sync(lambda: "event" in holder)
        portal.close(final())
        assert waiting.result(10) is None
    with pytest.raises(RuntimeError, match="closed"):
        portal.run(where())
    assert not any(t.name == "test-caller-loop" for t in threading.enumerate())
    assert portal.loop.is_closed()


def test_closing_from_inside_the_loop_only_starts_it() -> None:
    portal = CallerLoop("test-caller-loop", tick_s=0.05)
    closed = threading.Event()

    async def final() -> None:
        closed.set()

    async def close_here() -> None:
        portal.close(final())  # as a garbage collection of the client may

    portal.run(close_here())
    assert closed.wait(10)
    until_sync(lambda: portal.loop.is_closed())
