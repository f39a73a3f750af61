"""``_reach``: one loop, one backoff and one log line for waiting on a server."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest

from sepp_lite._reach import StartOptions, Stopped, clamped, start_info, until_reachable
from sepp_lite.errors import ConnectError, UnauthenticatedError
from sepp_lite.types import checked_reserve_options
from tests.test_sending import info

pytestmark = pytest.mark.timeout(30)


class Failing:
    """A call that fails ``times`` times with ``error``, then answers ``"ok"``."""

    def __init__(self, error: Exception, times: int) -> None:
        self.error, self.times, self.calls = error, times, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return "ok"


pauses: list[float] = []


async def no_pause(delay: float) -> None:
    """A pause that only notes its delay."""
    pauses.append(delay)


async def test_an_unreachable_server_is_waited_for_with_one_line_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pauses.clear()
    call = Failing(ConnectError("127.0.0.1:1", "connection refused"), 3)
    with caplog.at_level(logging.WARNING, "sepp_lite"):
        assert await until_reachable(call, 60, pause=no_pause) == "ok"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and call.calls == 4
    for number, line in enumerate(lines, 1):
        assert line.startswith(f"waiting for the sepp server (attempt {number}, 0 s of 60 s): ")
        assert "connection refused" in line and line.count("next attempt in") == 1
    # One backoff, growing: grpc's 1 s, then 1.6 times as long, each +-20 %.
    assert 0.8 <= pauses[0] <= 1.2 and pauses[0] < pauses[2] <= 2.56 * 1.2


async def test_the_wait_ends_with_the_callers_error_naming_its_setting() -> None:
    call = Failing(ConnectError("127.0.0.1:1", "connection refused"), 100)
    started = asyncio.get_running_loop().time()
    with pytest.raises(LookupError) as raised:
        await until_reachable(call, 0.2, setting="--wait 0.2", gave_up=LookupError)
    assert asyncio.get_running_loop().time() - started < 5
    text = str(raised.value)
    assert text.startswith("gave up waiting for the sepp server after 2 attempt(s) in 0 s")
    assert "(--wait 0.2): " in text and isinstance(raised.value.__cause__, ConnectError)


async def test_no_wait_and_a_refusal_raise_the_error_as_it_came() -> None:
    unreachable = ConnectError("127.0.0.1:1", "connection refused")
    with pytest.raises(ConnectError):
        await until_reachable(Failing(unreachable, 1), 0)
    refused = Failing(UnauthenticatedError("no"), 1)
    with pytest.raises(UnauthenticatedError):
        await until_reachable(refused, 60, pause=no_pause)
    assert refused.calls == 1


async def test_a_pause_that_stops_ends_a_workers_wait_without_an_answer() -> None:
    async def stopped(delay: float) -> None:
        raise Stopped

    call = Failing(ConnectError("127.0.0.1:1", "connection refused"), 1)
    assert await start_info(call, 60, LookupError, stopped) is None  # type: ignore[arg-type]
    assert call.calls == 1


def test_a_workers_options_are_clamped_into_new_ones(caplog: pytest.LogCaptureFixture) -> None:
    opts = checked_reserve_options(["q"], timedelta(seconds=600), None, "w", 500)
    start = StartOptions(opts, 7200.0, 86400.0)
    server = info(
        max_reserve_batch=100,
        max_lease_duration=timedelta(seconds=300),
        max_schedule_horizon=timedelta(hours=1),
    )
    with caplog.at_level(logging.WARNING, "sepp_lite"):
        reserve, delay, cap = clamped(start, server)
    assert (opts.max_jobs, opts.lease_duration) == (500, timedelta(seconds=600))  # as given
    assert (reserve.max_jobs, reserve.lease_duration, reserve.queues) == (
        100,
        timedelta(seconds=300),
        ["q"],
    )
    assert (delay, cap) == (3600.0, 3600.0)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("clamped to the server's limits: max_jobs 500 -> 100, lease ")
    unchanged = clamped(StartOptions(reserve, 60.0, 3600.0), server)
    assert unchanged.reserve is reserve
