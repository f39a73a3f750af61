"""The start-up hooks, lifespans and shutdown hooks of one ``Tasks`` registry around any
number of its workers, on the in-process server: entered once by the first worker to
start and closed once by the last to stop, whether the workers start together, one
after another or overlapping, when the start fails or is cancelled; and refused to a
worker on a second event loop while one runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

import sepp_lite as sepp
from sepp_lite.tasks import Tasks
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import run_on_own_loop, unique_queue, worker_running

pytestmark = pytest.mark.timeout(60)


@dataclass
class Note:
    text: str


class Recorded:
    """A registry whose hooks and lifespan note what they do, each after a call to the
    server (as opening a pool would), so that a second worker starting meanwhile gets
    its turn on the loop while the first is still starting. ``client`` is the one they
    call: a worker on another event loop swaps in a client of its own."""

    def __init__(self, client: sepp.SeppClient) -> None:
        self.client = client
        self.queue = unique_queue()
        self.tasks = Tasks(queue=self.queue)
        self.events: list[str] = []
        self.handled: list[str] = []
        self.entered = asyncio.Event()
        self.handled_one = asyncio.Event()
        self.fail_start = False
        tasks, events = self.tasks, self.events

        @tasks.on_startup
        async def open_pool(state: Any) -> None:
            await self.client.get_server_info()
            events.append("startup")
            if self.fail_start:
                raise ConnectionError("database unreachable")
            state.pool = len([e for e in events if e == "startup"])

        @tasks.on_shutdown
        async def close_pool(state: Any) -> None:
            await self.client.get_server_info()
            events.append("shutdown")

        @tasks.lifespan
        @asynccontextmanager
        async def lifespan(state: Any) -> AsyncIterator[None]:
            await self.client.get_server_info()
            events.append("enter")
            self.entered.set()
            yield
            await self.client.get_server_info()
            events.append("exit")

        @tasks.task
        async def note(msg: Note) -> None:
            self.handled.append(f"{msg.text} pool {tasks.state.pool}")
            self.handled_one.set()

        self.note = note


async def test_workers_started_together_enter_the_hooks_once_and_close_them_once(
    client: sepp.SeppClient,
) -> None:
    app = Recorded(client)
    await app.note.enqueue_many(client, [Note(str(n)) for n in range(6)])
    workers = [app.tasks.worker(client) for _ in range(3)]
    await asyncio.gather(*(worker.run(until_idle=True) for worker in workers))
    assert app.events == ["startup", "enter", "exit", "shutdown"]
    assert sorted(app.handled) == [f"{n} pool 1" for n in range(6)]


async def test_a_worker_joining_a_running_one_shares_its_hooks_and_the_last_closes(
    client: sepp.SeppClient,
) -> None:
    app = Recorded(client)
    first = app.tasks.worker(client)
    async with worker_running(first, 10) as first_run:
        await asyncio.wait_for(app.entered.wait(), 10)
        async with worker_running(app.tasks.worker(client), 10):
            await app.note.enqueue(client, Note("a"))
            await asyncio.wait_for(app.handled_one.wait(), 10)
            first.shutdown_handle().shutdown()
            await asyncio.wait_for(first_run, 10)
            # The first worker has stopped; the second still runs inside the same hooks.
            assert app.events == ["startup", "enter"]
        assert app.events == ["startup", "enter", "exit", "shutdown"]
    # A worker that starts after all have stopped enters them afresh.
    await app.tasks.worker(client).run(until_idle=True)
    assert app.events == ["startup", "enter", "exit", "shutdown"] * 2
    assert app.handled == ["a pool 1"]


async def test_a_failed_start_fails_every_worker_waiting_for_it_once(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    app = Recorded(client)
    app.fail_start = True
    await app.note.enqueue(client, Note("kept"))
    workers = [app.tasks.worker(client) for _ in range(3)]
    results = await asyncio.gather(
        *(worker.run(until_idle=True) for worker in workers), return_exceptions=True
    )
    assert [type(result) for result in results] == [ConnectionError] * 3
    assert app.events == ["startup", "shutdown"]  # one start, closed once
    assert server.counts(app.queue).ready == 1  # nobody reserved
    # The next worker to start tries again, on its own.
    app.fail_start = False
    await app.tasks.worker(client).run(until_idle=True)
    assert app.events == ["startup", "shutdown", "startup", "enter", "exit", "shutdown"]
    assert app.handled == ["kept pool 2"]


async def test_a_worker_cancelled_while_starting_leaves_the_start_to_the_next(
    client: sepp.SeppClient,
) -> None:
    app = Recorded(client)
    starting, release = asyncio.Event(), asyncio.Event()

    @app.tasks.on_startup
    async def slow(state: Any) -> None:
        if not release.is_set():
            starting.set()
            await release.wait()  # the first start hangs here until cancelled

    first = asyncio.ensure_future(app.tasks.worker(client).run())
    await asyncio.wait_for(starting.wait(), 10)
    second = app.tasks.worker(client)
    second_run = asyncio.ensure_future(second.run(until_idle=True))
    await asyncio.sleep(0)  # the second worker runs up to its wait for the first's start
    first.cancel()
    release.set()
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled()
    await asyncio.wait_for(second_run, 10)  # not cancelled with it: it started itself
    # The cancelled start is closed (its shutdown hooks run), then the second starts.
    assert app.events == ["startup", "shutdown", "startup", "enter", "exit", "shutdown"]


async def test_a_worker_on_a_second_event_loop_is_refused_while_one_runs(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    app = Recorded(client)

    async def in_a_thread() -> None:
        async with await sepp.SeppClient.connect(server.addr) as own:
            await app.tasks.worker(own).run(until_idle=True)  # the hooks are not called

    loop = asyncio.get_running_loop()
    worker = app.tasks.worker(client)
    async with worker_running(worker, 10):
        await asyncio.wait_for(app.entered.wait(), 10)
        with pytest.raises(RuntimeError, match="another event loop"):
            await loop.run_in_executor(None, run_on_own_loop, in_a_thread())
    assert app.events == ["startup", "enter", "exit", "shutdown"]
    # Once the last worker of the first loop has stopped, another loop may start them.
    await app.note.enqueue(client, Note("there"))

    async def with_own_client() -> None:
        async with await sepp.SeppClient.connect(server.addr) as own:
            app.client = own
            await app.tasks.worker(own).run(until_idle=True)

    await loop.run_in_executor(None, run_on_own_loop, with_own_client())
    assert app.events == ["startup", "enter", "exit", "shutdown"] * 2
    assert app.handled == ["there pool 2"]
