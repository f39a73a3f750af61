"""Jobs of a type no running worker knows outlive those workers, end to end: against the
grpcio reference server, a ``sepp-lite worker`` process without their handler runs for
30 s (it hands them back again and again, each time to wait longer), is stopped by its
PID, and a worker process that has the handler then runs every job exactly once; none
is dead-lettered. With the old fixed backoff (2, 4, 8 s) their four attempts would
have been used up, and the jobs dead-lettered, 14 s in."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import sepp_lite as sepp
from sepp_lite.testing import QueueState, ServerConfig
from tests.cli_helpers import started
from tests.client_helpers import NO_GRPCIO, unique_queue, until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

JOBS = 5
MAX_ATTEMPTS = 4
# Waits of 4.4, 8.8 and 17.6 s: handed back at 0, 4.4 and 13.2 s, ready again at 30.8 s,
# just after the worker without the handler has gone.
DELAY_S = 4.4
LACKING_FOR_S = 30.0

WORKERS = """
import pathlib

import sepp_lite as sepp

RAN = pathlib.Path({ran!r})


def lacking(client):
    worker = sepp.Worker(client, [{queue!r}], lease_duration=30, wait_timeout=1)
    worker.handle("invoice", lambda payload, ctx: None)
    worker.handle("receipt", lambda payload, ctx: None)
    return worker


def knowing(client):
    worker = sepp.Worker(client, [{queue!r}], lease_duration=30, wait_timeout=1)

    @worker.handler("report")
    async def report(payload, ctx):
        with RAN.open("a") as ran:
            ran.write(f"{{ctx.id}} {{ctx.attempt}}\\n")

    return worker
"""


@asynccontextmanager
async def worker_process(
    addr: str, tmp_path: Path, factory: str, *options: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``sepp-lite worker workers:FACTORY`` once it polls; its log in ``FACTORY.log``."""
    log = tmp_path / f"{factory}.log"
    argv = ["worker", f"workers:{factory}", "--app-dir", str(tmp_path), "--addr", addr]
    with log.open("wb") as stderr:
        async with started(*argv, *options, stdout=stderr.fileno(), stderr=stderr.fileno()) as proc:
            await until(lambda: "started: queues=" in log.read_text(), timeout=30)
            yield proc


async def stop(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_jobs_of_an_unknown_type_outlive_30_s_of_workers_without_it(
    tmp_path: Path,
) -> None:
    pytest.importorskip("grpc", reason=NO_GRPCIO)
    from tests.grpcio_server import GrpcioServer

    queue = unique_queue()
    ran = tmp_path / "ran.txt"
    (tmp_path / "workers.py").write_text(WORKERS.format(ran=str(ran), queue=queue))
    state = QueueState(ServerConfig().with_overrides(dead_letter_retention_ms=3_600_000))
    async with GrpcioServer(state) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            jobs = [sepp.EnqueueRequest(queue, "report", max_attempts=MAX_ATTEMPTS)] * JOBS
            ids = [ack.job_id for ack in await client.enqueue_batch(jobs)]  # type: ignore[union-attr]

        def attempts() -> list[int]:
            views = [state.job(job_id) for job_id in ids]
            return [view.attempt if view else 0 for view in views]

        begun = time.monotonic()
        delay = ("--unknown-type-delay", str(DELAY_S))
        async with worker_process(server.addr, tmp_path, "lacking", *delay) as lacking:
            # Handed back three times, each to wait longer: after 13.2 s, its third.
            await until(lambda: attempts() == [MAX_ATTEMPTS] * JOBS, timeout=LACKING_FOR_S)
            await asyncio.sleep(LACKING_FOR_S - (time.monotonic() - begun))
            assert state.counts(queue) == (0, JOBS, 0, 0)  # all of them waiting
            await stop(lacking)
        async with worker_process(server.addr, tmp_path, "knowing") as knowing:
            await until(lambda: state.counts(queue) == (0, 0, 0, 0), timeout=30)
            await stop(knowing)
    runs = ran.read_text().splitlines()
    assert sorted(runs) == sorted(f"{job_id} {MAX_ATTEMPTS}" for job_id in ids)  # once each
    assert state.dead_letters() == [] and state.totals()["dead_lettered"] == 0
    log = (tmp_path / "lacking.log").read_text()
    [first] = [line for line in log.splitlines() if "no handler for job type 'report'" in line]
    assert f"on queue {queue!r} (this worker handles: invoice, receipt)" in first
    assert "job types=invoice,receipt" in log
