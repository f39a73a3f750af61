"""One benchmark workload with one client, in this process; prints a JSON line.

The same code drives sepp-py and sepp_lite (same API): ``--client sepp`` imports the
official client, ``--client sepp_lite`` this project. ``--client sepp_lite.sync`` runs
the blocking client (workloads of ``SYNC_WORKLOADS`` only). With
``SEPP_BENCH_BLOCK_OTEL=1`` in the environment opentelemetry cannot be imported, as if it
were not installed. Client CPU is
``time.process_time()`` over the measured phase (all threads, so grpcio's and the
blocking client's loop thread count too).

    python bench/workloads.py --client sepp_lite --addr 127.0.0.1:50051 --workload batch
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from functools import partial
from typing import Any

PAYLOAD = bytes(range(256))


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def request(sepp: Any, queue: str, index: int) -> Any:
    return sepp.EnqueueRequest(
        queue,
        "bench",
        payload=sepp.Payload(PAYLOAD, "application/octet-stream"),
        idempotency_key=f"k-{uuid.uuid4().hex}",
        priority=index % 10,
        custom={"tenant": "acme", "seq": index},
    )


class Meter:
    """Counts finished jobs and times (CPU and wall) those after the first ``skip``, so a
    run can leave out its warm-up (PyPy's JIT compiles during the first seconds)."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.done = 0
        self.cpu = self.wall = 0.0
        if skip == 0:
            self.cpu, self.wall = time.process_time(), time.perf_counter()

    def tick(self, count: int = 1) -> None:
        before = self.done
        self.done += count
        if before < self.skip <= self.done:
            self.cpu, self.wall = time.process_time(), time.perf_counter()

    def result(self) -> dict[str, float]:
        return _result(self.cpu, self.wall, max(0, self.done - self.skip))


async def batch(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    batches = [[request(sepp, queue, i) for i in range(256)] for _ in range(max(1, jobs // 256))]
    await client.enqueue_batch(batches[0])  # warm-up
    meter = Meter(skip)
    for jobs_ in batches[1:]:
        await client.enqueue_batch(jobs_)
        meter.tick(256)
    return meter.result()


async def enqueue_from_callers(
    sepp: Any, client: Any, jobs: int, skip: int, callers: int
) -> dict[str, float]:
    """``callers`` concurrent tasks (a web app's requests), each enqueueing one job per
    call."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    per_caller = max(1, jobs // callers)
    requests = [[request(sepp, queue, i) for i in range(per_caller)] for _ in range(callers)]
    await client.enqueue(request(sepp, queue, 0))
    meter = Meter(skip)

    async def caller(items: list[Any]) -> None:
        for item in items:
            await client.enqueue(item)
            meter.tick()

    await asyncio.gather(*(caller(items) for items in requests))
    return meter.result()


def plain_request(sepp: Any, queue: str) -> Any:
    return sepp.EnqueueRequest(queue, "bench", payload=sepp.Payload(PAYLOAD, "raw"))


async def batch_plain(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """enqueue_batch of 256 jobs with a 256-byte payload and nothing else."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    batches = [[plain_request(sepp, queue) for _ in range(256)] for _ in range(max(1, jobs // 256))]
    await client.enqueue_batch(batches[0])  # warm-up
    meter = Meter(skip)
    for jobs_ in batches[1:]:
        await client.enqueue_batch(jobs_)
        meter.tick(256)
    return meter.result()


THREADS = 8


def _per_thread(sepp: Any, jobs: int) -> list[list[Any]]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    per_thread = max(1, jobs // THREADS)
    return [[request(sepp, queue, i) for i in range(per_thread)] for _ in range(THREADS)]


def _run_threads(target: Any, work: list[list[Any]]) -> None:
    threads = [threading.Thread(target=target, args=(items,)) for items in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


async def threads8(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """8 threads, each enqueueing one job per call through an async client on the
    main thread's loop (``run_coroutine_threadsafe``): how a sepp-py user calls it
    from threaded code."""
    loop = asyncio.get_running_loop()
    work = _per_thread(sepp, jobs)
    await client.enqueue(work[0][0])
    meter, lock = Meter(skip), threading.Lock()

    def caller(items: list[Any]) -> None:
        for item in items:
            asyncio.run_coroutine_threadsafe(client.enqueue(item), loop).result()
            with lock:
                meter.tick()

    await loop.run_in_executor(None, _run_threads, caller, work)
    return meter.result()


def sync_threads8(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """``threads8`` with the blocking client: each thread calls it directly."""
    work = _per_thread(sepp, jobs)
    client.enqueue(work[0][0])
    meter, lock = Meter(skip), threading.Lock()

    def caller(items: list[Any]) -> None:
        for item in items:
            client.enqueue(item)
            with lock:
                meter.tick()

    _run_threads(caller, work)
    return meter.result()


def _single_jobs(sepp: Any, jobs: int) -> list[Any]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    return [request(sepp, queue, i) for i in range(jobs + 1)]


async def enqueue1(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """One job per call, one call at a time (what a web view does)."""
    first, *rest = _single_jobs(sepp, jobs)
    await client.enqueue(first)  # warm-up
    latencies = []
    meter = Meter(skip)
    for item in rest:
        start = time.perf_counter()
        await client.enqueue(item)
        latencies.append((time.perf_counter() - start) * 1e6)
        meter.tick()
    result = meter.result()
    result["p50_us"] = statistics.median(latencies[skip:] or latencies)
    return result


def sync_enqueue1(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """``enqueue1`` with the blocking client."""
    first, *rest = _single_jobs(sepp, jobs)
    client.enqueue(first)
    meter = Meter(skip)
    for item in rest:
        client.enqueue(item)
        meter.tick()
    return meter.result()


async def _fill(sepp: Any, client: Any, queue: str, jobs: int, payload: Any = None) -> None:
    payload = payload or sepp.Payload(PAYLOAD, "raw")
    for start in range(0, jobs, 256):
        await client.enqueue_batch(
            [sepp.EnqueueRequest(queue, "bench", payload=payload)
             for _ in range(min(256, jobs - start))]
        )  # fmt: skip


async def reserve_ack(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    await _fill(sepp, client, queue, jobs + 32)
    opts = sepp.ReserveOptions([queue], timedelta(seconds=60), timedelta(seconds=1), max_jobs=32)
    for job in await client.reserve(opts) or []:  # warm-up
        await client.ack(job.ctx)
    meter = Meter(skip)
    while meter.done < jobs:
        reserved = await client.reserve(opts)
        if not reserved:
            break
        for job in reserved:
            await client.ack(job.ctx)
        meter.tick(len(reserved))
    return meter.result()


async def worker(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    await _fill(sepp, client, queue, jobs)
    worker_ = sepp.Worker(client, [queue], timedelta(seconds=60), max_in_flight=64)
    handle = worker_.shutdown_handle()
    meter = Meter(skip)

    @worker_.handler("bench")
    async def noop(payload: Any, ctx: Any) -> None:
        meter.tick()
        if meter.done == jobs:
            handle.shutdown()

    await asyncio.wait_for(worker_.run(), 600)
    return meter.result()


# The typed-task Worker against the raw one: both get this small dataclass's JSON, the
# raw handler ignores it, the typed task's worker decodes and checks it into the class.
WELCOME = b'{"to":"ada@example.com","name":"Ada Lovelace","attempt":1,"vip":false}'


async def worker_json(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """The raw Worker on the typed workload's payloads (no decoding)."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    await _fill(sepp, client, queue, jobs, sepp.Payload(WELCOME, "application/json"))
    worker_ = sepp.Worker(client, [queue], timedelta(seconds=60), max_in_flight=64)
    return await _run_worker(worker_, "bench", jobs, skip)


async def typed_worker(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """A ``sepp_lite.Tasks`` worker: each payload decoded into a small dataclass."""
    from dataclasses import dataclass

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    await _fill(sepp, client, queue, jobs, sepp.Payload(WELCOME, "application/json"))

    @dataclass
    class Welcome:
        to: str
        name: str
        attempt: int
        vip: bool = False

    tasks = sepp.Tasks(queue=queue)
    meter = Meter(skip)
    handle: list[Any] = []

    async def bench(msg: Welcome, ctx: Any) -> None:
        meter.tick()
        if meter.done == jobs:
            handle[0].shutdown()

    tasks.task(input_type=Welcome)(bench)
    worker_ = tasks.worker(client, lease_duration=60, max_in_flight=64)
    handle.append(worker_.shutdown_handle())
    await asyncio.wait_for(worker_.run(), 600)
    return meter.result()


async def _three_steps(
    sepp: Any, client: Any, jobs: int, skip: int, chained: bool
) -> dict[str, float]:
    """``jobs`` three-step workflows, CPU per workflow: the producer's enqueues (one
    after another), then a tasks worker (max_in_flight=64) running every job. Chained:
    one ``chain.enqueue`` each, and the worker hands off twice; else three single
    ``task.enqueue`` calls of the same tasks by the producer. Both make three enqueue
    calls and run three jobs per workflow: the difference is what a hand-off costs
    more (or less) than a single enqueue."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    tasks = sepp.Tasks(queue=queue)
    finished = [0, 0]  # done, wanted
    handle: list[Any] = []

    async def one(n: int) -> int:
        return n + 1

    async def two(n: int) -> int:
        return n + 1

    async def three(n: int) -> None:
        finished[0] += 1
        if finished[0] == finished[1]:
            handle[-1].shutdown()

    first, second, last = (tasks.task(input_type=int)(fn) for fn in (one, two, three))
    chain = first.then(second).then(last)

    async def run(count: int) -> None:
        finished[1] += count
        for index in range(count):
            if chained:
                await chain.enqueue(client, index)
            else:
                await first.enqueue(client, index)
                await second.enqueue(client, index + 1)
                await last.enqueue(client, index + 2)
        worker_ = tasks.worker(client, lease_duration=60, max_in_flight=64)
        handle.append(worker_.shutdown_handle())
        await asyncio.wait_for(worker_.run(), 600)

    await run(max(skip, 50))  # warm-up
    cpu, wall = time.process_time(), time.perf_counter()
    await run(jobs)
    return _result(cpu, wall, jobs)


async def _run_worker(worker_: Any, job_type: str, jobs: int, skip: int) -> dict[str, float]:
    handle = worker_.shutdown_handle()
    meter = Meter(skip)

    async def noop(payload: Any, ctx: Any) -> None:
        meter.tick()
        if meter.done == jobs:
            handle.shutdown()

    worker_.handle(job_type, noop)
    await asyncio.wait_for(worker_.run(), 600)
    return meter.result()


# A CPU-bound plain def task: this many rounds of pure-Python arithmetic take about
# 10 ms on CPython 3.13 with the GIL on the bench machine (8 to 11 ms on 2026-12-05);
# every interpreter does the same work.
CPU_TASK_LOOPS = 80_000
CPU_TASK_THREADS = 2


def spin(loops: int) -> int:
    total = 0
    for i in range(loops):
        total = (total + i * i) % 1_000_003
    return total


async def cpu_tasks(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """A typed ``def`` task of ``spin(CPU_TASK_LOOPS)`` per job on a worker with
    ``CPU_TASK_THREADS`` threads (``sync_threads``; ``max_in_flight`` twice that, so a
    job is always ready for a thread): its wall time, measured from the worker's start
    to the last job's end. On a free-threaded CPython the threads run at once."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    tasks = sepp.Tasks(queue=queue)
    loop = asyncio.get_running_loop()
    lock, handle = threading.Lock(), []

    def crunch(n: int) -> None:
        spin(CPU_TASK_LOOPS)
        with lock:
            meter.tick()
            if meter.done == jobs:  # ShutdownHandle.shutdown is for the loop's thread
                loop.call_soon_threadsafe(handle[0].shutdown)

    task = tasks.task(crunch)
    for start in range(0, jobs, 256):
        await task.enqueue_many(client, range(start, min(jobs, start + 256)))
    worker_ = tasks.worker(
        client, lease_duration=60, max_in_flight=2 * CPU_TASK_THREADS,
        sync_threads=CPU_TASK_THREADS,
    )  # fmt: skip
    handle.append(worker_.shutdown_handle())
    meter = Meter(skip)
    await asyncio.wait_for(worker_.run(), 600)
    result = meter.result()
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    result["gil"] = is_gil_enabled() if is_gil_enabled else True
    return result


async def small_call(sepp: Any, client: Any, calls: int, skip: int) -> dict[str, float]:
    for _ in range(50):
        await client.get_server_info()
    latencies = []
    meter = Meter(skip)
    for _ in range(calls):
        start = time.perf_counter()
        await client.get_server_info()
        if meter.done >= skip:
            latencies.append((time.perf_counter() - start) * 1e6)
        meter.tick()
    result = meter.result()
    latencies.sort()
    result["p50_us"] = statistics.median(latencies)
    result["p99_us"] = latencies[int(len(latencies) * 0.99) - 1]
    return result


def _result(cpu: float, wall: float, done: int) -> dict[str, float]:
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    return {
        "jobs": done,
        "cpu_us_per_job": cpu / max(done, 1) * 1e6,
        "jobs_per_cpu_s": done / cpu if cpu else 0.0,
        "wall_s": wall,
    }


async def connect(sepp: Any, client: Any, jobs: int, skip: int) -> dict[str, float]:
    """Only connect (and one call): for the RSS of a connected client."""
    await client.get_server_info()
    return {"jobs": 0, "cpu_us_per_job": 0.0, "jobs_per_cpu_s": 0.0, "wall_s": 0.0}


WORKLOADS = {
    "connect": connect,
    "batch": batch,
    "enqueue1": enqueue1,
    "enqueue16": partial(enqueue_from_callers, callers=16),
    "enqueue64": partial(enqueue_from_callers, callers=64),
    "batch_plain": batch_plain,
    "threads8": threads8,
    "reserve_ack": reserve_ack,
    "worker": worker,
    "small_call": small_call,
    "worker_json": worker_json,
    "typed_worker": typed_worker,
    "cpu_tasks": cpu_tasks,
    "chain3": partial(_three_steps, chained=True),
    "singles3": partial(_three_steps, chained=False),
}
SYNC_WORKLOADS = {"enqueue1": sync_enqueue1, "threads8": sync_threads8}


# Set (to anything) in the environment: run as if OpenTelemetry were not installed
# (bench/run.py's row on the cost of unused OpenTelemetry).
BLOCK_OTEL = "SEPP_BENCH_BLOCK_OTEL"


def block_opentelemetry() -> None:
    """Make ``opentelemetry`` unimportable in this process, as if it were not installed:
    a ``None`` in ``sys.modules`` makes every ``import opentelemetry...`` raise
    ``ImportError``. Called before the client is imported."""
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sepp = importlib.import_module(args.client)
    client = await sepp.SeppClient.connect(args.addr)
    try:
        result = await WORKLOADS[args.workload](sepp, client, args.jobs, args.skip)
        result["rss_kib"] = rss_kib()
        result["otel_imported"] = "opentelemetry.trace" in sys.modules
        return result
    finally:
        await client.close()


def main_sync(args: argparse.Namespace) -> dict[str, Any]:
    import sepp_lite
    from sepp_lite.sync import SeppClient

    with SeppClient.connect(args.addr) as client:
        result = SYNC_WORKLOADS[args.workload](sepp_lite, client, args.jobs, args.skip)
        result["rss_kib"] = rss_kib()
        return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["sepp", "sepp_lite", "sepp_lite.sync"], required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument(
        "--skip", type=int, default=0, help="jobs to finish before measuring (warm-up)"
    )
    arguments = parser.parse_args()
    if os.environ.get(BLOCK_OTEL):
        block_opentelemetry()
    if arguments.client == "sepp_lite.sync":
        outcome = main_sync(arguments)
    else:
        outcome = asyncio.run(main(arguments))
    outcome.update(client=arguments.client, workload=arguments.workload)
    print(json.dumps(outcome))
