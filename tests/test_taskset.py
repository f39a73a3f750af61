"""TaskSet (``sepp_lite/_taskset.py``, the owner of the worker's and the monitor's tasks;
the typed tasks of ``sepp_lite.tasks`` are tested in ``test_typed_tasks*.py``): tasks
clean up at the end of their own last step, exactly once, also when they are cancelled
before they ever ran."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import pytest

from sepp_lite._taskset import TaskSet


async def _quick() -> None:
    return None


async def test_a_finished_task_is_cleaned_up_in_its_own_loop_iteration() -> None:
    tasks = TaskSet("job")
    ends: list[asyncio.Task[None]] = []
    spawned = [tasks.spawn(_quick(), ends.append) for _ in range(5)]
    assert len(tasks) == 5
    # The tasks' first (and last) steps run in the next iteration, before this
    # coroutine resumes there: a done-callback would only run one iteration later.
    await asyncio.sleep(0)
    assert len(tasks) == 0
    assert ends == spawned
    assert all(task.done() for task in spawned)


async def test_a_crash_is_logged_and_still_cleaned_up(caplog: pytest.LogCaptureFixture) -> None:
    async def crash() -> None:
        raise ValueError("boom")

    tasks = TaskSet("job")
    ends: list[asyncio.Task[None]] = []
    task = tasks.spawn(crash(), ends.append)
    with caplog.at_level(logging.ERROR, logger="sepp_lite"):
        await asyncio.wait({task})
    assert task.result() is None
    assert ends == [task]
    assert len(tasks) == 0
    crashed = [record for record in caplog.records if "job task crashed" in record.getMessage()]
    assert len(crashed) == 1
    assert isinstance(crashed[0].exc_info[1], ValueError)  # type: ignore[index]


async def test_a_task_stopped_before_its_first_step_is_cleaned_up_once() -> None:
    tasks = TaskSet("job")
    ends: list[asyncio.Task[None]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = tasks.spawn(_quick(), ends.append)
        tasks.stop(task)
        await asyncio.wait({task})
        await asyncio.sleep(0)  # the done-callback runs one iteration later
        gc.collect()
    assert task.cancelled()
    assert ends == [task]
    assert len(tasks) == 0
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_task_stopped_while_running_is_cleaned_up_once() -> None:
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    tasks = TaskSet("job")
    ends: list[asyncio.Task[None]] = []
    task = tasks.spawn(slow(), ends.append)
    await started.wait()
    tasks.stop(task)
    await asyncio.wait({task})
    await asyncio.sleep(0)  # let the done-callback that stop() added run too
    assert task.cancelled()
    assert ends == [task]
    assert len(tasks) == 0


async def test_cancel_stops_everything_and_reports_a_task_that_will_not_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    running = asyncio.Event()

    async def stubborn() -> None:
        running.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass

    async def obedient() -> None:
        await asyncio.sleep(60)

    tasks = TaskSet("job")
    ends: list[asyncio.Task[None]] = []
    stuck = tasks.spawn(stubborn(), ends.append)
    normal = tasks.spawn(obedient(), ends.append)
    await running.wait()  # both have taken their first step
    unstarted = tasks.spawn(obedient(), ends.append)  # cancelled below before its first step
    with caplog.at_level(logging.ERROR, logger="sepp_lite"):
        assert await tasks.cancel(grace=0.05) is False
    assert "1 job task(s) ignored cancellation" in caplog.text
    assert unstarted.cancelled() and normal.cancelled()
    assert set(ends) == {unstarted, normal}
    assert len(tasks) == 1
    release.set()
    assert await tasks.wait(5)
    assert sorted(map(id, ends)) == sorted(map(id, [unstarted, normal, stuck]))
