"""Exactly-once hand-off, end to end against the grpcio reference server (issue 40's
"done when"):

- 50 workflows whose first step outlives its 1 s lease on attempt 1 (no auto-extend,
  the handler takes 1.5 s then): each first step runs twice, and its second step
  exists as one job, which runs once;
- the same with a fan-out of 10 elements: each element's job exists once and runs once;
- a ``sepp-lite worker`` process SIGKILLed and restarted at random moments during 100
  three-step workflows: every root's last step ran, and each step of each root is one
  job id (a step may run more than once, never as two jobs).
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import random
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import sepp_lite as sepp
from sepp_lite import JobCtx
from sepp_lite.tasks import Chain, Tasks
from sepp_lite.tasks._workflow import where_of
from sepp_lite.testing import QueueState, ServerConfig
from tests.cli_helpers import started
from tests.client_helpers import NO_GRPCIO, unique_queue, until, worker_running

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

WORKFLOWS = 50
FAN_OUT = 10


@asynccontextmanager
async def reference_server() -> AsyncIterator[tuple[Any, QueueState]]:
    pytest.importorskip("grpc", reason=NO_GRPCIO)
    from tests.grpcio_server import GrpcioServer

    state = QueueState(ServerConfig().with_overrides(dead_letter_retention_ms=3_600_000))
    async with GrpcioServer(state) as server:
        yield server, state


Ran = list[tuple[str, str, tuple[int, ...], str, int]]  # step, root, branch, job id, attempt


def record(ran: Ran, step: str, ctx: JobCtx) -> None:
    where = where_of(ctx.custom)
    assert where is not None
    ran.append((step, where.root, where.branch, ctx.id, ctx.attempt))


def lease_outliving(queue: str, ran: Ran, fan_out: bool) -> tuple[Tasks, Chain[int, None]]:
    """A first step that takes 1.5 s on its first attempt (its lease is 1 s), then
    a second step (one per element with ``fan_out``)."""
    tasks = Tasks(queue=queue, max_attempts=5)

    @tasks.task
    async def first(n: int, ctx: JobCtx) -> list[int]:
        if ctx.attempt == 1:
            await asyncio.sleep(1.5)
        record(ran, "first", ctx)
        return [n * FAN_OUT + i for i in range(FAN_OUT)] if fan_out else [n]

    @tasks.task
    async def second(value: Any, ctx: JobCtx) -> None:
        record(ran, "second", ctx)

    return tasks, first.map(second) if fan_out else first.then(second)


async def run_lease_outliving(fan_out: bool) -> tuple[Ran, QueueState, str]:
    queue, ran = unique_queue(), []
    tasks, chain = lease_outliving(queue, ran, fan_out)
    per_root = FAN_OUT if fan_out else 1
    async with reference_server() as (server, state):
        async with await sepp.SeppClient.connect(server.addr) as client:
            await chain.enqueue_many(client, range(WORKFLOWS))
            worker = tasks.worker(client, lease_duration=1, max_in_flight=256, wait_timeout=0.2)
            async with worker_running(worker, 30):
                await until(
                    lambda: (
                        sum(step == "second" for step, *_ in ran) >= WORKFLOWS * per_root
                        and sum(step == "first" for step, *_ in ran) >= 2 * WORKFLOWS
                    ),
                    timeout=60,
                )
                # Attempt 1's late acks fail; nothing is left in flight or waiting.
                await until(lambda: state.counts(queue)[:3] == (0, 0, 0), timeout=10)
    return ran, state, queue


def assert_each_step_once(ran: Ran, per_root: int) -> None:
    firsts = collections.Counter(root for step, root, *_ in ran if step == "first")
    assert len(firsts) == WORKFLOWS
    # Each first step's handler ran at least twice (attempt 1 outlived its lease); on a
    # loaded machine attempt 2 may outlive its lease too. The hand-off stays once.
    assert min(firsts.values()) >= 2
    seconds: dict[tuple[str, tuple[int, ...]], list[str]] = collections.defaultdict(list)
    for step, root, branch, job_id, _ in ran:
        if step == "second":
            seconds[root, branch].append(job_id)
    assert set(root for root, _ in seconds) == set(firsts)
    assert len(seconds) == WORKFLOWS * per_root
    # One job each: the hand-off's guarantee. On a loaded machine a second step's own
    # 1 s lease may lapse too, and the same job runs again (an element's second step ran
    # twice in a full run at load 7; the check then counted runs, not job ids).
    assert {len(set(ids)) for ids in seconds.values()} == {1}


async def test_a_step_that_outlives_its_lease_hands_off_once() -> None:
    ran, state, _ = await run_lease_outliving(fan_out=False)
    assert_each_step_once(ran, 1)
    assert state.totals()["enqueued"] == 2 * WORKFLOWS


async def test_a_fan_out_step_that_outlives_its_lease_hands_off_each_element_once() -> None:
    ran, state, _ = await run_lease_outliving(fan_out=True)
    assert_each_step_once(ran, FAN_OUT)
    assert state.totals()["enqueued"] == WORKFLOWS * (1 + FAN_OUT)


# -- a worker killed at random moments ----------------------------------------------

KILLED_WORKFLOWS = 100
KILLS = 5

WORKER_MODULE = """
import asyncio
import os
import random

from sepp_lite import JobCtx
from sepp_lite.tasks import Tasks
from sepp_lite.tasks._workflow import where_of

tasks = Tasks(queue={queue!r}, max_attempts=50)
RAN = os.open({ran!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


async def note(step: str, ctx: JobCtx) -> None:
    await asyncio.sleep(random.uniform(0.05, 0.3))
    where = where_of(ctx.custom)
    os.write(RAN, f"{{step}} {{where.root}} {{ctx.id}}\\n".encode())


@tasks.task
async def one(n: int, ctx: JobCtx) -> int:
    await note("one", ctx)
    return n + 1


@tasks.task
async def two(n: int, ctx: JobCtx) -> int:
    await note("two", ctx)
    return n + 1


@tasks.task
async def three(n: int, ctx: JobCtx) -> None:
    await note("three", ctx)


chain = one.then(two).then(three)


def worker(client):
    return tasks.worker(client, lease_duration=1, max_in_flight=8, wait_timeout=0.2)
"""


async def test_workflows_survive_a_worker_killed_at_random_moments(tmp_path: Path) -> None:
    queue = unique_queue()
    ran = tmp_path / "ran.txt"
    (tmp_path / "killed_workers.py").write_text(WORKER_MODULE.format(queue=queue, ran=str(ran)))
    spec = importlib.util.spec_from_file_location(f"killed_{queue}", tmp_path / "killed_workers.py")
    assert spec is not None and spec.loader is not None
    killed_workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(killed_workers)  # the producer's side of the same tasks
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    kills = 0

    def lines() -> list[list[str]]:
        return [line.split() for line in ran.read_text().splitlines()] if ran.exists() else []

    def finished() -> set[str]:
        return {root for step, root, _ in lines() if step == "three"}

    async with reference_server() as (server, state):
        async with await sepp.SeppClient.connect(server.addr) as client:
            acks = await killed_workers.chain.enqueue_many(client, range(KILLED_WORKFLOWS))
            assert all(isinstance(ack, sepp.EnqueueAck) for ack in acks)
        argv = ["worker", "killed_workers:worker", "--app-dir", str(tmp_path)]
        argv += ["--addr", server.addr]
        log = (tmp_path / "worker.log").open("ab")
        left_at_last_kill = KILLED_WORKFLOWS
        while len(finished()) < KILLED_WORKFLOWS:
            async with started(*argv, stdout=log.fileno(), stderr=log.fileno()) as proc:
                if kills < KILLS:
                    await asyncio.sleep(rng.uniform(0.3, 1.5))  # start-up included
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                    kills += 1
                    left_at_last_kill = KILLED_WORKFLOWS - len(finished())
                    continue
                try:
                    await until(lambda: len(finished()) == KILLED_WORKFLOWS, timeout=60)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(proc.wait(), 30)
        log.close()
        assert state.dead_letters() == [], f"seed {seed}"
    ids: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for step, root, job_id in lines():
        ids[step, root].add(job_id)
    assert len(finished()) == KILLED_WORKFLOWS, f"seed {seed}"
    assert len(ids) == 3 * KILLED_WORKFLOWS, f"seed {seed}"
    doubled = {key: found for key, found in ids.items() if len(found) != 1}
    assert doubled == {}, f"seed {seed}: a step of one root as more than one job"
    assert left_at_last_kill > 0, f"seed {seed}: the kills came after the work"
