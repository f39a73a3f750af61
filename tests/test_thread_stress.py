"""Many threads at once through what the GIL used to serialise: one blocking client's
caller loop (its hand-overs and wake-ups), a Worker's thread pool for plain ``def``
tasks, and the two together. They run on every interpreter; on a free-threaded
CPython (3.13t, ``sys._is_gil_enabled()`` False) the threads truly run at once, which
is where a missing lock shows (docs/platforms.md, "Free-threaded CPython").

Every wait is bounded: the pools' results by ``timeout``, the worker by
``run_until_drained``, the whole test by its timeout mark.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import sepp_lite as sepp
from sepp_lite import EnqueueAck, JobCtx, Payload
from sepp_lite.sync import SeppClient
from sepp_lite.tasks import Tasks
from sepp_lite.testing import SeppServerThread, run_until_drained
from tests.client_helpers import job, unique_queue

pytestmark = pytest.mark.timeout(180)

THREADS = 16
CALLS = 1_000


# The blocking client needs a server on a thread of its own.
@pytest.fixture
def server() -> Iterator[SeppServerThread]:
    with SeppServerThread() as srv:
        yield srv


def sent_by(server: SeppServerThread, acks: list[EnqueueAck]) -> list[bytes]:
    """The payload of each acked job, as the server holds it (in one call)."""

    def payloads() -> list[bytes]:
        views = [server.server.state.job(ack.job_id) for ack in acks]
        return [view.record.payload[0] if view and view.record.payload else b"" for view in views]

    result: list[bytes] = server.call(payloads)
    return result


def test_sixteen_threads_enqueue_a_thousand_jobs_each_through_one_blocking_client(
    server: SeppServerThread,
) -> None:
    # Each call's ack comes back to the thread that made it, for the job it sent: a
    # hand-over that lost a wake-up would hang (bounded here), one that mixed calls up
    # would give a thread another thread's ack.
    queue = unique_queue("stress")
    acks: list[list[EnqueueAck]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []
    with SeppClient.connect(server.addr) as client:

        def enqueue_all(thread: int) -> None:
            try:
                for n in range(CALLS):
                    payload = Payload(b"%d:%d" % (thread, n), "text/plain")
                    acks[thread].append(client.enqueue(job(queue, payload=payload)))
            except BaseException as error:
                errors.append(error)

        # Daemon threads, not a pool: a thread left hanging must not hang the exit too.
        threads = [
            threading.Thread(target=enqueue_all, args=(n,), daemon=True) for n in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 150
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not [thread for thread in threads if thread.is_alive()], "calls hang"
    assert errors == []
    every = [ack for thread_acks in acks for ack in thread_acks]
    assert len({ack.job_id for ack in every}) == THREADS * CALLS
    expected = [b"%d:%d" % (thread, n) for thread in range(THREADS) for n in range(CALLS)]
    assert sent_by(server, every) == expected
    assert server.counts(queue) == (THREADS * CALLS, 0, 0, 0)
    assert server.connections_accepted == 1


@dataclass
class Item:
    n: int


async def test_def_tasks_mutate_shared_state_under_the_documented_rules(
    server: SeppServerThread,
) -> None:
    # docs/consuming.md: plain def tasks run at once in the worker's threads; a read-
    # modify-write of shared state takes a lock, one operation on a built-in container
    # (list.append) needs none, and per-thread state lives in a threading.local.
    tasks = Tasks(queue=unique_queue("shared"))
    lock = threading.Lock()
    totals: Counter[str] = Counter()
    done: list[int] = []
    mine = threading.local()
    per_thread: dict[str, int] = {}
    running = 0
    most_at_once = 0

    @tasks.task
    def count(item: Item, ctx: JobCtx) -> None:
        nonlocal running, most_at_once
        with lock:
            running += 1
            most_at_once = max(most_at_once, running)
        if not hasattr(mine, "count"):
            mine.count = 0
            with lock:
                per_thread[threading.current_thread().name] = 0
        sum(i * i for i in range(2_000))  # a little work of its own, outside the lock
        time.sleep(0.001)  # and a blocking call: the others run meanwhile, GIL or not
        mine.count += 1
        with lock:
            totals["jobs"] += 1
            totals["odd" if item.n % 2 else "even"] += 1
            per_thread[threading.current_thread().name] = mine.count
            running -= 1
        done.append(item.n)

    jobs = 2_000
    async with await sepp.SeppClient.connect(server.addr) as client:
        for start in range(0, jobs, 250):
            await count.enqueue_many(client, [Item(n) for n in range(start, start + 250)])
        worker = tasks.worker(client, max_in_flight=16, max_jobs=16, sync_threads=8)
        await run_until_drained(worker, server, timeout=120)
    assert totals == {"jobs": jobs, "odd": jobs // 2, "even": jobs // 2}
    assert sorted(done) == list(range(jobs))
    assert sum(per_thread.values()) == jobs and 1 < len(per_thread) <= 8
    assert 1 < most_at_once <= 8
    assert server.totals()["acked"] == jobs


async def test_def_tasks_share_one_blocking_client(server: SeppServerThread) -> None:
    # The usual producer inside a worker: plain def tasks enqueue follow-up jobs through
    # one blocking client, from the worker's eight threads at once (its caller loop
    # driven by them in turn while the worker's own loop runs here).
    tasks = Tasks(queue=unique_queue("first"))
    follow_ups = unique_queue("next")
    acks: list[tuple[int, EnqueueAck]] = []
    # Connected and closed off the event loop's thread, where a blocking call is refused.
    producer = await asyncio.to_thread(SeppClient.connect, server.addr)

    @tasks.task
    def step(item: Item, ctx: JobCtx) -> None:
        payload = Payload(b"%d" % item.n, "text/plain")
        acks.append((item.n, producer.enqueue(job(follow_ups, payload=payload))))

    jobs = 1_000
    try:
        async with await sepp.SeppClient.connect(server.addr) as client:
            for start in range(0, jobs, 250):
                await step.enqueue_many(client, [Item(n) for n in range(start, start + 250)])
            worker = tasks.worker(client, max_in_flight=16, max_jobs=16, sync_threads=8)
            await run_until_drained(worker, server, timeout=120)
    finally:
        await asyncio.to_thread(producer.close)
    acks.sort(key=lambda pair: pair[0])
    assert [n for n, _ in acks] == list(range(jobs))
    assert len({ack.job_id for _, ack in acks}) == jobs
    assert sent_by(server, [ack for _, ack in acks]) == [b"%d" % n for n in range(jobs)]
    assert server.counts(follow_ups) == (jobs, 0, 0, 0)
