"""Handlers as the Worker takes them, over real sockets against the in-process server:
checked when registered (a TypeError naming the function), a plain def run once per
delivery in the worker's bounded threads, the kinds of callables accepted, a thread
that outlives its job's cancellation, a str where a list of queues belongs (at run
time and under mypy), and the log lines of a failing job."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import unique_queue, until, worker_running

pytestmark = pytest.mark.timeout(60)

MYPY = Path(sys.executable).with_name("mypy")


async def enqueue(client: sepp.SeppClient, queue: str, job_type: str, n: int = 1) -> None:
    acks = await client.enqueue_batch([sepp.EnqueueRequest(queue, job_type) for _ in range(n)])
    assert all(isinstance(ack, sepp.EnqueueAck) for ack in acks), acks


async def run_idle(worker: sepp.Worker) -> None:
    await asyncio.wait_for(worker.run(until_idle=True), 30)


# -- a plain def -------------------------------------------------------------------


async def test_a_plain_def_runs_once_per_delivery_in_a_thread_and_is_acked(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "sync", 5)
    worker = sepp.Worker(client, [queue], 30, max_in_flight=4)
    runs: list[tuple[str, str]] = []
    lock = threading.Lock()

    @worker.handler("sync")
    def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        with lock:
            runs.append((ctx.id, threading.current_thread().name))

    with caplog.at_level(logging.INFO, "sepp_lite"):
        await run_idle(worker)
    assert len(runs) == 5 and len({job_id for job_id, _ in runs}) == 5  # once each
    assert all(name.startswith(f"sepp-worker-{worker.worker_id}") for _, name in runs)
    assert server.counts(queue) == (0, 0, 0, 0)  # every one acked
    [start] = [r.getMessage() for r in caplog.records if " started: " in r.getMessage()]
    assert "job types=sync " in start and "sync_threads=4 " in start  # min(32, 4)


async def test_a_plain_def_that_raises_is_nacked_and_retried_as_an_async_one(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    await client.enqueue(sepp.EnqueueRequest(queue, "fails", max_attempts=3))
    worker = sepp.Worker(client, [queue], 30)
    attempts: list[int] = []

    @worker.handler("fails")
    def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        attempts.append(ctx.attempt)
        raise ValueError("the disk is full")

    with caplog.at_level(logging.INFO, "sepp_lite"):
        await run_idle(worker)
    assert attempts == [1, 2, 3]
    assert server.counts(queue).dead == 1
    failures = [r for r in caplog.records if "handler raised ValueError" in r.getMessage()]
    assert [r.levelname for r in failures] == ["WARNING", "WARNING", "ERROR"]
    for n, record in enumerate(failures[:2], 1):  # retries: one line each, no traceback
        assert f"(type 'fails', attempt {n}/3): handler raised ValueError: the disk is full" in (
            record.getMessage()
        )
        assert record.exc_info is None
    # One ERROR for the dead letter, with what an operator needs to find it, and the
    # traceback of the last attempt.
    dead = failures[2]
    text = dead.getMessage()
    assert text.startswith("job ") and "dead-lettered" in text and "type 'fails'" in text
    assert f"queue {queue!r}" in text and "attempt 3/3" in text and "attempts are used up" in text
    assert "the disk is full" in text
    assert dead.exc_info is not None and isinstance(dead.exc_info[1], ValueError)


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST_ID", default="")


async def test_a_plain_def_sees_the_context_of_its_job_task(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    # What a tracing span or a request id set around the worker rides on.
    queue = unique_queue()
    await enqueue(client, queue, "sync")
    worker = sepp.Worker(client, [queue], 30)
    seen: list[str] = []

    @worker.handler("sync")
    def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        seen.append(REQUEST_ID.get())

    REQUEST_ID.set("set-before-run")
    await run_idle(worker)
    assert seen == ["set-before-run"]


async def test_sync_threads_bound_how_many_plain_defs_run_at_once(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "slow", 6)
    worker = sepp.Worker(client, [queue], 30, max_in_flight=6, sync_threads=2)
    running = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()

    @worker.handler("slow")
    def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1

    task = asyncio.ensure_future(run_idle(worker))
    try:
        await until(lambda: worker.in_flight == 6 and running == 2)
        await asyncio.sleep(0.2)  # the other four stay queued for a thread
        assert running == 2
    finally:
        release.set()
        await task
    assert most == 2
    assert server.counts(queue) == (0, 0, 0, 0)


async def test_sync_threads_is_validated(client: sepp.SeppClient) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="sync_threads"):
            sepp.Worker(client, ["q"], 30, sync_threads=bad)  # type: ignore[arg-type]


async def test_a_thread_is_waited_for_within_the_shutdown_grace(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "slow")
    worker = sepp.Worker(client, [queue], 30, shutdown_timeout=10)
    started = threading.Event()

    @worker.handler("slow")
    def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        started.set()
        threading.Event().wait(0.5)

    async with worker_running(worker, 20):
        await until(started.is_set)
    assert server.counts(queue) == (0, 0, 0, 0)  # finished within the grace: acked


async def test_a_thread_outliving_the_shutdown_grace_hands_its_job_back_when_it_ends(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    await enqueue(client, queue, "stuck")
    worker = sepp.Worker(client, [queue], 30, shutdown_timeout=0.2)
    started = threading.Event()
    release = threading.Event()
    runs = 0

    @worker.handler("stuck")
    def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        nonlocal runs
        runs += 1
        started.set()
        release.wait(20)

    try:
        async with worker_running(worker, 20) as task:
            await until(started.is_set)
            with caplog.at_level(logging.WARNING, "sepp_lite"):
                worker.shutdown_handle().shutdown()
                await asyncio.wait_for(task, 20)
            # A thread cannot be cancelled: the job keeps its slot while the worker waits
            # a moment for it, then leaves it behind, neither acked nor nacked while it runs.
            assert worker.in_flight == 1
            assert server.counts(queue).in_flight == 1
            assert any("cannot be cancelled" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
    await until(lambda: worker.in_flight == 0)  # the slot is freed when the thread ends
    assert runs == 1
    # Given up on, its outcome does not count: the job goes back (never an ack).
    assert server.counts(queue) == (1, 0, 0, 0)


# -- what registration takes -------------------------------------------------------


async def _async_three(payload: object, ctx: object, extra: int) -> None: ...


def _sync_one(payload: object) -> None: ...


class _AsyncCallable:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, payload: object, ctx: sepp.JobCtx) -> None:
        self.seen.append(ctx.id)


class _KeywordOnly:
    async def __call__(self, payload: object, ctx: object, *, flag: bool) -> None: ...


def _register(how: str, worker: sepp.Worker, handler: Any) -> None:
    if how == "handle":
        worker.handle("t", handler)
    elif how == "handler":
        worker.handler("t")(handler)
    elif how == "replace_handler":
        worker.replace_handler("t", handler)
    else:
        worker.catch_all(handler)


BAD = [
    ("_sync_one", lambda: _sync_one, "its signature is (payload)"),
    ("_async_three", lambda: _async_three, "missing a required argument: 'extra'"),
    # 3.13 says "missing a required keyword-only argument", older Pythons leave out "keyword-only".
    ("_KeywordOnly instance", _KeywordOnly, "argument: 'flag'"),
    ("_AsyncCallable", lambda: _AsyncCallable, "is a class"),
    ("42 (int)", lambda: 42, "is not callable"),
    ("None (NoneType)", lambda: None, "is not callable"),
]


@pytest.mark.parametrize("how", ["handle", "handler", "replace_handler", "catch_all"])
@pytest.mark.parametrize(("name", "make", "problem"), BAD, ids=[b[0] for b in BAD])
async def test_a_bad_handler_is_a_type_error_naming_it_at_registration(
    client: sepp.SeppClient, how: str, name: str, make: Callable[[], object], problem: str
) -> None:
    worker = sepp.Worker(client, ["q"], 30)
    with pytest.raises(TypeError) as info:
        _register(how, worker, make())
    text = str(info.value)
    assert name in text and problem in text, text
    assert f"Worker.{how}(" in text
    assert "expected an async def taking (payload, ctx)" in text
    assert worker._handlers == {} and worker._catch_all is None  # nothing registered


async def test_a_coroutine_object_is_refused_with_a_hint(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(client, ["q"], 30)
    called = _AsyncCallable()
    coroutine = called(None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"_AsyncCallable.__call__\(...\) is an awaitable.*"):
        worker.handle("t", coroutine)  # type: ignore[arg-type]


async def test_the_callables_a_handler_may_be_all_run_once(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    kinds = ["partial", "object", "varargs", "defaults", "method", "wrapper"]
    for kind in kinds:
        await enqueue(client, queue, kind)
    worker = sepp.Worker(client, [queue], 30)
    seen: list[str] = []
    obj = _AsyncCallable()

    async def tagged(tag: str, payload: object, ctx: sepp.JobCtx) -> None:
        seen.append(tag)

    def varargs(*args: Any) -> None:
        seen.append("varargs")

    def defaults(payload: object, ctx: object, extra: str = "defaults") -> None:
        seen.append(extra)

    class Service:
        async def method(self, payload: object, ctx: object) -> None:
            seen.append("method")

    def wrapper(payload: object, ctx: sepp.JobCtx) -> Awaitable[None]:
        # A plain def that returns a coroutine (an undecorated wrapper around an async
        # function): the coroutine is awaited once, on the loop.
        return tagged("wrapper", payload, ctx)

    worker.handle("partial", functools.partial(tagged, "partial"))
    worker.handle("object", obj)
    worker.handle("varargs", varargs)
    worker.handle("defaults", defaults)
    worker.handle("method", Service().method)
    worker.handle("wrapper", wrapper)
    await run_idle(worker)
    assert sorted(seen + ["object"] * len(obj.seen)) == sorted(kinds)
    assert server.counts(queue) == (0, 0, 0, 0)


# -- a str for a list of queues -----------------------------------------------------


async def test_a_str_for_the_queues_is_a_type_error(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    with pytest.raises(TypeError, match=r"not the str 'emails' \(write \['emails'\]"):
        sepp.Worker(client, "emails", 30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a str"):
        sepp.ReserveOptions("emails", 30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a str"):
        sepp.ReserveOptions(queues="emails", lease_duration=30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not the str 'emails'"):
        server.backlog("emails")  # type: ignore[arg-type]
    # What a str is not: a list, a tuple, a generator of names.
    assert sepp.Worker(client, ("a", "b"), 30).queues == ["a", "b"]
    assert sepp.Worker(client, (q for q in ["a"]), 30).queues == ["a"]


@pytest.mark.skipif(not MYPY.exists(), reason="mypy is not installed beside this Python")
def test_mypy_flags_a_str_for_the_queues(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from datetime import timedelta

            import sepp_lite as sepp

            async def main(client: sepp.SeppClient) -> None:
                lease = timedelta(seconds=30)
                sepp.Worker(client, ["emails"], 30)
                sepp.Worker(client, ("a", "b"), 30)
                sepp.Worker(client, {"a", "b"}, 30)
                sepp.Worker(client, (q for q in ["a"]), 30)
                sepp.ReserveOptions(["emails"], lease)
                sepp.ReserveOptions(("a", "b"), lease)
                sepp.Worker(client, "emails", 30)  # flagged
                sepp.ReserveOptions("emails", lease)  # flagged
                sepp.ReserveOptions(queues="emails", lease_duration=lease)  # flagged
            """
        )
    )
    expected = [
        number
        for number, line in enumerate(snippet.read_text().splitlines(), 1)
        if line.endswith("# flagged")
    ]
    result = subprocess.run(
        [
            str(MYPY),
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=300,
    )
    flagged = sorted(
        int(line.split(":")[1]) for line in result.stdout.splitlines() if ": error:" in line
    )
    assert len(expected) == 3 and flagged == expected, result.stdout + result.stderr


# -- log lines ---------------------------------------------------------------------


async def test_a_worker_without_handlers_warns_and_names_none(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    worker = sepp.Worker(client, [unique_queue()], 30)
    with caplog.at_level(logging.INFO, "sepp_lite"):
        await run_idle(worker)
    [start] = [r for r in caplog.records if " started: " in r.getMessage()]
    assert "job types=none " in start.getMessage() and "sync_threads" not in start.getMessage()
    [warning] = [r for r in caplog.records if "has no handlers" in r.getMessage()]
    assert warning.levelname == "WARNING"


async def test_the_start_line_names_the_job_types(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    worker = sepp.Worker(client, [unique_queue()], 30)
    worker.handle("email", _AsyncCallable()).handle("resize", _AsyncCallable())
    worker.catch_all(_AsyncCallable())
    with caplog.at_level(logging.INFO, "sepp_lite"):
        await run_idle(worker)
    [start] = [r.getMessage() for r in caplog.records if " started: " in r.getMessage()]
    assert "job types=email,resize (+ catch-all) " in start
    assert not any("has no handlers" in r.getMessage() for r in caplog.records)
