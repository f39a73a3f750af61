"""A Worker started before its server, over real sockets: ``Worker.run()`` and
``sepp-lite worker`` (one process and ``--processes``) keep trying for
``wait_for_server`` with one log line per attempt, then fail loudly; a refusal no
retry can fix fails at once; an outage after start-up logs one true delay per retry."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from pathlib import Path

import pytest

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import free_port, unique_queue, until, worker_running
from tests.fault_helpers import RestartableServer
from tests.test_worker_processes import sepp_lite

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

DELAY = re.compile(r"\bin ([0-9.]+) s\b")


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def one_delay(record: logging.LogRecord) -> float:
    """The one delay a retry line states (it must state exactly one)."""
    found = DELAY.findall(record.getMessage())
    assert len(found) == 1, record.getMessage()
    return float(found[0])


async def test_run_waits_for_a_server_that_comes_up_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await RestartableServer().start()
    try:
        async with await sepp.SeppClient.connect(server.addr) as client:
            queue = unique_queue()
            await client.enqueue_batch([sepp.EnqueueRequest(queue, "t") for _ in range(3)])
            await server.crash()  # down before the worker starts
            worker = sepp.Worker(client, [queue], 30, wait_for_server=60)
            done: list[str] = []

            @worker.handler("t")
            async def handle(payload: object, ctx: sepp.JobCtx) -> None:
                done.append(ctx.id)

            with caplog.at_level(logging.INFO, "sepp_lite"):
                async with worker_running(worker, 30) as running:
                    await until(lambda: messages(caplog, "waiting for the sepp server"), 30)
                    await asyncio.sleep(2)  # a few attempts go unanswered
                    assert not running.done()
                    await server.start()
                    await until(lambda: len(done) == 3, 30)
    finally:
        await server.crash()
    waits = messages(caplog, "waiting for the sepp server")
    assert len(waits) >= 2
    for number, record in enumerate(waits, 1):
        assert record.levelname == "WARNING"
        assert f"(attempt {number}, " in record.getMessage() and "of 60 s)" in record.getMessage()
        assert "next attempt in" in record.getMessage()
        one_delay(record)
    assert server.counts(queue) == (0, 0, 0, 0)


async def test_run_gives_up_after_wait_for_server() -> None:
    async with SeppTestServer() as gone:
        client = await sepp.SeppClient.connect(gone.addr)
    try:
        worker = sepp.Worker(client, ["q"], 30, wait_for_server=2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(sepp.TransportError) as info:
            await asyncio.wait_for(worker.run(), 30)
        took = loop.time() - started
        assert 2 <= took < 10
        text = str(info.value)
        assert text.startswith("gave up waiting for the sepp server after ")
        assert "(wait_for_server=2 s)" in text and "next attempt" not in text
        # 0: no waiting at all, the error as the client gave it.
        worker.wait_for_server = 0
        started = loop.time()
        with pytest.raises(sepp.TransportError) as info:
            await asyncio.wait_for(worker.run(), 30)
        assert loop.time() - started < 1.9  # under the 2 s of the first run
        assert "gave up" not in str(info.value)
    finally:
        await client.close()


async def test_a_refused_key_fails_at_once_despite_the_wait() -> None:
    async with SeppTestServer(api_keys={"w": "right-key"}) as server:
        async with await sepp.SeppClient.connect(server.addr, api_key="wrong-key") as client:
            worker = sepp.Worker(client, ["q"], 30, wait_for_server=60)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(sepp.UnauthenticatedError):
                await asyncio.wait_for(worker.run(), 30)
            assert loop.time() - started < 10  # not the 60 s of waiting


async def test_an_outage_after_start_logs_one_true_delay_per_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await RestartableServer().start()
    try:
        async with await sepp.SeppClient.connect(server.addr) as client:
            queue = unique_queue()
            worker = sepp.Worker(client, [queue], 30, wait_timeout=1)
            done: list[str] = []

            @worker.handler("t")
            async def handle(payload: object, ctx: sepp.JobCtx) -> None:
                done.append(ctx.id)

            with caplog.at_level(logging.INFO, "sepp_lite"):
                async with worker_running(worker, 30):
                    await until(lambda: messages(caplog, " started: "), 30)
                    await server.crash()
                    await until(lambda: len(messages(caplog, "reserve failed")) >= 4, 60)
                    await server.start()
                    async with await sepp.SeppClient.connect(server.addr) as producer:
                        await producer.enqueue(sepp.EnqueueRequest(queue, "t"))
                    await until(lambda: done, 60)
    finally:
        await server.crash()
    failures = messages(caplog, "reserve failed")
    delays = [one_delay(record) for record in failures]  # one delay each, no second one
    assert all("next attempt" not in r.getMessage() for r in failures)
    # The delay said is the delay waited: the next line comes no sooner (the client's
    # reconnect backoff, 1 s growing by 1.6, is longer than reserve_error_backoff).
    for record, said, after in zip(failures, delays, failures[1:]):
        assert after.created - record.created >= said - 0.05, (said, after.getMessage())
    assert max(delays) > 1.0  # the client's backoff grew, and the log followed it


# -- the command -------------------------------------------------------------------

WORKER_MODULE = """
import pathlib

import sepp_lite as sepp

MARKS = pathlib.Path({marks!r})


def make_worker(client):
    worker = sepp.Worker(client, [{queue!r}], lease_duration=30, wait_timeout=1)

    @worker.handler("t")
    def handle(payload, ctx):  # a plain def: it runs in a thread
        (MARKS / ("done-" + ctx.id)).touch()

    return worker
"""


def app(tmp_path: Path, queue: str) -> list[str]:
    (tmp_path / "startup_tasks.py").write_text(
        WORKER_MODULE.format(marks=str(tmp_path), queue=queue)
    )
    return ["worker", "startup_tasks:make_worker", "--app-dir", str(tmp_path)]


def done_marks(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.glob("done-*")}


@pytest.mark.parametrize("processes", [1, 2])
async def test_the_command_waits_for_a_server_that_comes_up_later(
    tmp_path: Path, processes: int
) -> None:
    port = free_port()
    queue = unique_queue()
    argv = [*app(tmp_path, queue), "--addr", f"127.0.0.1:{port}", "--wait-for-server", "60"]
    async with sepp_lite(*argv, "--processes", str(processes)) as command:
        await command.line(r"waiting for the sepp server \(attempt 1, 0 s of 60 s\)")
        # Longer than the ~6 s in which a supervisor gives up on children that die at
        # start-up: waiting children do not die.
        await asyncio.sleep(8)
        assert command.proc.returncode is None
        async with SeppTestServer(port=port) as server:
            async with await sepp.SeppClient.connect(server.addr) as client:
                acks = await client.enqueue_batch(
                    [sepp.EnqueueRequest(queue, "t") for _ in range(4)]
                )
            await until(lambda: len(done_marks(tmp_path)) == 4, 60)
            await until(lambda: server.counts(queue) == (0, 0, 0, 0), 30)
            command.proc.send_signal(signal.SIGTERM)
            assert await command.exit_code(60) == 0, command.text
    assert {f"done-{ack.job_id}" for ack in acks} == done_marks(tmp_path)  # type: ignore[union-attr]
    assert "Traceback" not in command.text
    attempts = [line for line in command.lines if "waiting for the sepp server" in line]
    assert all(len(DELAY.findall(line)) == 1 for line in attempts), attempts


async def test_the_command_gives_up_loudly_after_its_wait(tmp_path: Path) -> None:
    argv = [*app(tmp_path, unique_queue()), "--addr", f"127.0.0.1:{free_port()}"]
    async with sepp_lite(*argv, "--wait-for-server", "2") as command:
        assert await command.exit_code(60) == 2
    assert re.fullmatch(
        r"error: gave up waiting for the sepp server after \d+ attempt\(s\) in 2 s "
        r"\(--wait-for-server 2\): cannot connect to the sepp server at 127\.0\.0\.1:\d+: "
        r"connection refused\n",
        command.lines[-1],
    ), command.text
    assert command.text.count("waiting for the sepp server (attempt ") >= 2
