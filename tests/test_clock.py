"""``sepp_lite/_clock.py``: the one clock protocol, which the periodic scheduler and the
in-process server both take, and the wall clock behind the test server's RealClock."""

from __future__ import annotations

import ast
import asyncio
import inspect
import time
from pathlib import Path

import pytest

import sepp_lite
from sepp_lite import testing
from sepp_lite._clock import Clock, WallClock
from sepp_lite._scheduler import PeriodicScheduler
from sepp_lite.testing import ManualClock, RealClock, SeppTestServer

PACKAGE = Path(sepp_lite.__file__).parent


def protocol_members(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(protocol).items()
        if callable(member) and not name.startswith("_")
    }


def test_each_clock_has_the_protocols_methods_with_its_signatures() -> None:
    wanted = protocol_members(Clock)
    assert set(wanted) == {"now_ms", "call_at"}
    for clock in (WallClock, RealClock, ManualClock):
        found = {name: inspect.signature(getattr(clock, name)) for name in wanted}
        assert [str(s) for s in found.values()] == [str(s) for s in wanted.values()], clock


def test_the_scheduler_and_the_test_server_take_the_one_clock() -> None:
    assert testing.Clock is Clock
    scheduler = inspect.signature(PeriodicScheduler).parameters["clock"].annotation
    server = inspect.signature(SeppTestServer).parameters["clock"].annotation
    assert scheduler == server == "Optional[Clock]"


def clock_protocols() -> list[str]:
    """Every class of sepp_lite with the methods of a clock that is a Protocol."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                bases = {ast.unparse(base) for base in node.bases}
                if {"now_ms", "call_at"} <= methods and "Protocol" in bases:
                    found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.name}")
    return found


def test_sepp_lite_has_one_clock_protocol() -> None:
    """The scheduler's ``SchedulerClock`` and ``testing``'s ``Clock`` had one shape."""
    assert clock_protocols() == ["_clock.py:Clock"]


def test_the_wall_clock_shows_a_step_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unlike the test server's RealClock: the scheduler reads a step back as one."""
    clock = WallClock()
    now = clock.now_ms()
    assert abs(now - time.time_ns() // 1_000_000) < 1_000
    monkeypatch.setattr("time.time_ns", lambda: (now - 5_000) * 1_000_000)
    assert clock.now_ms() == now - 5_000
    assert RealClock().now_ms() == now - 5_000  # a fresh RealClock has no floor yet


async def test_a_wall_clock_timer_runs_on_the_loop_and_can_be_cancelled() -> None:
    clock = WallClock()
    fired: list[str] = []
    witness = asyncio.Event()
    start = clock.now_ms()
    clock.call_at(start, lambda: fired.append("cancelled")).cancel()
    clock.call_at(start + 20, lambda: (fired.append("witness"), witness.set()))
    await asyncio.wait_for(witness.wait(), 5)
    # Timers run in deadline order: the cancelled one, due first, had its turn.
    assert fired == ["witness"]
