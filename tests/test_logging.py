"""What a worker logs, and how: one record per event (a retry is one WARNING line
without a traceback, the end of a job one line with its traceback), and the formats
(sepp_lite._log): the JSON lines of ``JsonLogFormatter`` and the command line's text,
both naming the job a record is emitted for, the handler's own records included."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from grpclib.exceptions import GRPCError

import sepp_lite as sepp
from sepp_lite import JobCtx, JsonLogFormatter, _otel
from sepp_lite._log import TextLogFormatter
from sepp_lite.errors import Status
from sepp_lite.tasks import Backoff, Tasks
from sepp_lite.testing import ManualClock, SeppTestServer, run_until_drained
from tests.cli_helpers import sepp_lite as sepp_lite_command
from tests.client_helpers import (
    ScriptedServer,
    connected,
    job_record,
    reserve_reply,
    unique_queue,
)

pytestmark = pytest.mark.timeout(60)

APP = logging.getLogger("tests.app")  # the application's own logger, as a handler's
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TRACEBACK = "Traceback (most recent call last):"


@dataclass
class Note:
    n: int


@pytest.fixture
async def clocked() -> AsyncIterator[SeppTestServer]:
    """A server on a manual clock: retry delays pass as run_until_drained jumps."""
    async with SeppTestServer(clock=ManualClock(), dead_letter_retention_ms=600_000) as srv:
        yield srv


@contextlib.contextmanager
def emitted(formatter: logging.Formatter, level: int = logging.INFO) -> Iterator[io.StringIO]:
    """What a stream handler with ``formatter`` on the root logger writes in the block
    (sepp_lite's logger and the application's at ``level``)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    loggers = [logging.getLogger("sepp_lite"), APP]
    saved = [(logger, logger.level) for logger in loggers]
    root.addHandler(handler)
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        for logger, old in saved:
            logger.setLevel(old)


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


# -- one record per event ------------------------------------------------------------------


async def test_planned_retries_are_one_warning_line_each_and_a_dead_letter_one_error(
    clocked: SeppTestServer,
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, max_attempts=3)

    @tasks.task(retry=Backoff(initial=1, max=5))
    async def flaky(note: Note, ctx: JobCtx) -> None:
        if note.n < 50 and ctx.attempt == 3:
            return  # the plan works: two retries, then done
        raise RuntimeError(f"provider down ({note.n})")

    async with await sepp.SeppClient.connect(clocked.addr) as client:
        await flaky.enqueue_many(client, [Note(n) for n in range(54)])
        with emitted(TextLogFormatter()) as out:
            await run_until_drained(tasks.worker(client), clocked)
    text = out.getvalue()
    lines = text.splitlines()
    retries = [line for line in lines if " WARNING sepp_lite: job " in line]
    dead = [line for line in lines if " ERROR sepp_lite: job " in line]
    # 50 jobs retried twice and done, 4 retried twice and dead-lettered: 108 retries,
    # one line each; 4 dead letters, one line and one traceback each; nothing else
    # about the jobs (the worker's start, draining and stopped lines are the rest).
    assert len(retries) == 108 and len(dead) == 4
    assert text.count(TRACEBACK) == 4
    assert text.count("raise RuntimeError") == 4  # the handler's line, in each traceback
    stamped = [line for line in lines if re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert len(stamped) == 108 + 4 + 3, stamped[:3] + stamped[-3:]
    for line in retries:
        assert re.search(
            r"WARNING sepp_lite: job \S+ \(type 'flaky', attempt [12]/3\): handler raised "
            r"RuntimeError: provider down \(\d+\); next attempt in [0-9.]+ s$",
            line,
        ), line
    for line in dead:
        assert re.search(
            r"ERROR sepp_lite: job \S+ dead-lettered: type 'flaky', queue '[^']+', attempt "
            r"3/3; its attempts are used up; cause: handler raised RuntimeError: provider "
            r"down \(5[0-3]\)$",
            line,
        ), line
    assert "asked for" not in text and "after:" not in text


async def test_a_timeout_is_a_retry_line_and_on_the_last_attempt_shows_where_it_waited(
    clocked: SeppTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, max_attempts=2)

    async def wait_for_the_provider() -> None:
        await asyncio.sleep(3600)

    @tasks.task(timeout=0.05)
    async def stuck(note: Note) -> None:
        await wait_for_the_provider()

    async with await sepp.SeppClient.connect(clocked.addr) as client:
        ack = await stuck.enqueue(client, Note(1))
        with caplog.at_level(logging.INFO, "sepp_lite"):
            await run_until_drained(tasks.worker(client), clocked)
    about = [r for r in caplog.records if ack.job_id in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in about] == [
        (
            "WARNING",
            f"job {ack.job_id} (type 'stuck', attempt 1/2): timed out after 0.05 s (attempt 1 "
            "of 2); next attempt after the queue's retry delay",
        ),
        (
            "ERROR",
            f"job {ack.job_id} dead-lettered: type 'stuck', queue {queue!r}, attempt 2/2; its "
            "attempts are used up; cause: timed out after 0.05 s on its last attempt (2)",
        ),
    ]
    assert about[0].exc_info is None
    # The traceback of the cancellation: where the handler was waiting when time ran out.
    # PyPy's asyncio (pure Python) throws the CancelledError into the coroutine with the
    # traceback of its own __wakeup only, so there the line shows no handler frame.
    assert caplog.text.count(TRACEBACK) == 1
    if sys.implementation.name != "pypy":
        assert "wait_for_the_provider" in caplog.text


async def test_a_retry_carries_its_traceback_only_at_debug(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    ack = await client.enqueue(sepp.EnqueueRequest(queue, "boom", max_attempts=2))
    worker = sepp.Worker(client, [queue], 30)
    failed = asyncio.Event()

    @worker.handler("boom")
    async def boom(payload: object, ctx: JobCtx) -> None:
        failed.set()
        raise KeyError("missing")

    with caplog.at_level(logging.DEBUG, "sepp_lite"):
        await asyncio.wait_for(worker.run(until_idle=True), 10)
    assert failed.is_set()
    retry = next(r for r in caplog.records if ack.job_id in r.getMessage())
    assert retry.levelname == "WARNING" and retry.getMessage().endswith(
        "(type 'boom', attempt 1/2): handler raised KeyError: 'missing'; next attempt after "
        "the queue's retry delay"
    )
    assert retry.exc_info is not None and isinstance(retry.exc_info[1], KeyError)


async def test_a_nack_that_fails_says_what_the_attempt_did() -> None:
    async with ScriptedServer() as server:
        server.script("Reserve", reserve_reply(job_record(job_type="charge")))
        server.script("Nack", GRPCError(Status.NOT_FOUND, "no such job"))
        async with connected(server.addr) as client:
            worker = sepp.Worker(client, ["q"], 30)

            @worker.handler("charge")
            async def charge(payload: object, ctx: JobCtx) -> None:
                raise ValueError("card declined")

            with emitted(TextLogFormatter()) as out:
                await asyncio.wait_for(worker.run(until_idle=True), 10)
    [line] = [line for line in out.getvalue().splitlines() if " ERROR " in line]
    assert line.endswith("the attempt had failed: handler raised ValueError: card declined"), line
    assert TRACEBACK not in out.getvalue()


# -- the job of a record -------------------------------------------------------------------


async def test_json_lines_name_the_job_of_every_record_a_job_emits(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    await client.enqueue_batch(
        [sepp.EnqueueRequest(queue, "in_loop"), sepp.EnqueueRequest(queue, "in_thread")]
    )
    worker = sepp.Worker(client, [queue], 30)
    threads: list[str] = []

    @worker.handler("in_loop")
    async def in_loop(payload: object, ctx: JobCtx) -> None:
        APP.info("handling %s", ctx.id)
        await asyncio.get_running_loop().create_task(asyncio.sleep(0))  # a task of its own
        raise sepp.HandlerError.permanent("no")

    @worker.handler("in_thread")
    def in_thread(payload: object, ctx: JobCtx) -> None:
        threads.append(threading.current_thread().name)
        APP.info("handling %s", ctx.id)

    with emitted(JsonLogFormatter()) as out:
        APP.info("before any job")
        await asyncio.wait_for(worker.run(until_idle=True), 10)
    records = json_lines(out)
    assert threads and threads[0].startswith("sepp-worker-")  # the worker's own thread
    outside = [r for r in records if "job_id" not in r]
    assert {r["message"] for r in outside} >= {"before any job"}
    assert all("job_type" not in r and "attempt" not in r for r in outside)
    mine = [r for r in records if r["logger"] == "tests.app" and "job_id" in r]
    assert len(mine) == 2
    for record in mine:
        assert record["message"] == f"handling {record['job_id']}"
        assert record["queue"] == queue and record["attempt"] == 1
        assert record["job_type"] in ("in_loop", "in_thread")
        assert record["level"] == "INFO" and TIME.fullmatch(record["time"])
    # sepp_lite's own record of the dead letter carries the same fields.
    [dead] = [r for r in records if "dead-lettered" in r["message"]]
    assert dead["job_type"] == "in_loop" and dead["logger"] == "sepp_lite"
    assert dead["job_id"] == next(r["job_id"] for r in mine if r["job_type"] == "in_loop")


async def test_typed_tasks_records_name_their_job_in_both_kinds_of_function(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def welcome(note: Note) -> None:
        APP.info("welcome %d", note.n)

    @tasks.task
    def report(note: Note) -> None:
        APP.info("report %d", note.n)

    acks = [await welcome.enqueue(client, Note(1)), await report.enqueue(client, Note(2))]
    with emitted(JsonLogFormatter()) as out:
        await run_until_drained(tasks.worker(client), server)
    mine = {r["message"]: r for r in json_lines(out) if r["logger"] == "tests.app"}
    assert mine["welcome 1"]["job_id"] == acks[0].job_id
    assert mine["report 2"]["job_id"] == acks[1].job_id
    assert mine["report 2"]["job_type"] == "report"


def test_a_json_record_has_its_time_in_utc_its_exception_and_is_one_line() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord(
            "orders", logging.ERROR, __file__, 1, "failed %s of %d", ("x", 2), sys.exc_info()
        )
    record.created = 1_900_000_000.1239
    line = JsonLogFormatter().format(record)
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["time"] == "2030-03-17T17:46:40.123Z"
    assert (fields["level"], fields["logger"], fields["message"]) == (
        "ERROR",
        "orders",
        "failed x of 2",
    )
    assert fields["exception"].startswith(TRACEBACK)
    assert fields["exception"].endswith("ValueError: bad\nvalue")
    assert set(fields) == {"time", "level", "logger", "message", "exception"}


async def test_without_a_span_the_trace_id_is_the_one_the_job_came_with(
    server: SeppTestServer, client: sepp.SeppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (With OpenTelemetry at work, it is the job's span's: tests/test_otel.py.)
    monkeypatch.setattr(_otel, "AVAILABLE", False)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    queue = unique_queue()
    context = sepp.TraceContext(f"00-{trace_id}-00f067aa0ba902b7-01")
    await client.enqueue_batch(
        [sepp.EnqueueRequest(queue, "t", trace_context=context), sepp.EnqueueRequest(queue, "u")]
    )
    worker = sepp.Worker(client, [queue], 30, max_in_flight=1)
    worker.catch_all(lambda payload, ctx: APP.info("in %s", ctx.job_type))
    with emitted(JsonLogFormatter()) as out:
        await asyncio.wait_for(worker.run(until_idle=True), 10)
    mine = {r["message"]: r for r in json_lines(out) if r["logger"] == "tests.app"}
    assert mine["in t"]["trace_id"] == trace_id
    assert "trace_id" not in mine["in u"]  # no trace: no field


async def test_the_text_format_names_the_job_on_the_application_s_records(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    ack = await client.enqueue(sepp.EnqueueRequest(queue, "resize"))
    worker = sepp.Worker(client, [queue], 30)

    @worker.handler("resize")
    async def resize(payload: object, ctx: JobCtx) -> None:
        APP.warning("resizing")
        raise sepp.HandlerError.permanent("too large")

    with emitted(TextLogFormatter()) as out:
        APP.info("idle")
        await asyncio.wait_for(worker.run(until_idle=True), 10)
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"\S+ \S+ INFO tests.app: idle", lines[0])
    [mine] = [line for line in lines if "resizing" in line]
    assert mine.endswith(f" WARNING tests.app resize[{ack.job_id}]: resizing")
    # sepp_lite's own line about the job names it in its words, once.
    [dead] = [line for line in lines if "dead-lettered" in line]
    assert f" WARNING sepp_lite: job {ack.job_id} dead-lettered: " in dead


# -- the command line ----------------------------------------------------------------------

WORKER_MODULE = """
import logging

import sepp_lite as sepp

def make_worker(client):
    worker = sepp.Worker(client, [{queue!r}], 30)

    @worker.handler("greet")
    async def greet(payload, ctx):
        logging.getLogger("app").info("hello from %s", ctx.id)
        if ctx.attempt == 1:
            raise sepp.HandlerError.retry_after("not yet", 0.001)

    return worker
"""


async def test_worker_log_format_json_writes_only_json_lines(
    server: SeppTestServer, client: sepp.SeppClient, tmp_path: Path
) -> None:
    queue = unique_queue()
    (tmp_path / "app.py").write_text(WORKER_MODULE.format(queue=queue))
    ack = await client.enqueue(sepp.EnqueueRequest(queue, "greet"))
    base = ["worker", "app:make_worker", "--app-dir", str(tmp_path), "--addr", server.addr]
    code, _, err = await sepp_lite_command(*base, "--log-format", "json", "--until-idle")
    assert code == 0, err
    records = [json.loads(line) for line in err.splitlines()]  # every line is JSON
    assert all(TIME.fullmatch(r["time"]) and r["level"] and r["logger"] for r in records)
    hello = [r for r in records if r["logger"] == "app"]
    assert [r["message"] for r in hello] == [f"hello from {ack.job_id}"] * 2
    assert [(r["job_id"], r["job_type"], r["queue"]) for r in hello] == [
        (ack.job_id, "greet", queue)
    ] * 2
    assert [r["attempt"] for r in hello] == [1, 2]
    [retry] = [r for r in records if r["level"] == "WARNING" and r["logger"] == "sepp_lite"]
    assert retry["job_id"] == ack.job_id and "exception" not in retry
    assert retry["message"] == (
        f"job {ack.job_id} (type 'greet', attempt 1/3): handler raised HandlerError: not yet; "
        "next attempt in 0.001 s"
    )
    assert any(r["message"].startswith("worker ") and " started: " in r["message"] for r in records)


def test_log_format_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from sepp_lite.cli import main

    assert main(["worker", "app:w", "--log-format", "xml"]) == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_the_formatter_is_public_and_takes_a_formatter_s_arguments() -> None:
    # A dictConfig builds a formatter given by "class" with (format, datefmt, style).
    formatter = JsonLogFormatter("%(message)s", "%H:%M", "%")
    assert isinstance(formatter, logging.Formatter) and "JsonLogFormatter" in sepp.__all__
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    assert json.loads(formatter.format(record))["message"] == "m"
