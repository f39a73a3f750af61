"""The default transport through nginx (a gRPC reverse proxy with its own HTTP/2 stack):
plain calls, five `nginx -s reload`s under a steady stream of jobs (each reload makes the
old worker send GOAWAY and finish what is in flight), and `nginx -s quit` during a long
poll."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import pytest

from sepp_lite import EnqueueAck, Payload, SeppClient, TransportError, Worker
from sepp_lite.types import JobCtx
from tests.client_helpers import (
    client_records,
    connected,
    elapsed,
    opts,
    sepp_server,
    text_job,
    unique_queue,
    until,
    worker_running,
)
from tests.h2_tap import FrameTap
from tests.nginx_helpers import NGINX, Nginx

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (CI installs it)")

RELOADS = 5


async def test_calls_through_nginx(tmp_path: Path) -> None:
    queue = unique_queue()
    async with sepp_server() as server, Nginx(server.port, tmp_path) as nginx:
        async with connected(nginx.addr) as client:
            assert (await client.get_server_info()).supported_protocol_versions == ["v1"]
            ack = await client.enqueue(text_job(queue, b"via nginx"))
            jobs = await client.reserve(opts(queue))
            assert jobs is not None and jobs[0].ctx.id == ack.job_id
            assert jobs[0].payload == Payload(b"via nginx", "text/plain")
            await client.ack(jobs[0].ctx)
            big = [text_job(queue, bytes(200_000)) for _ in range(40)]  # 8 MB in one call
            assert all(isinstance(a, EnqueueAck) for a in await client.enqueue_batch(big))
        assert server.counts(queue).ready == 40
    assert {entry[2] for entry in nginx.access_log()} == {"200"}


class Steady:
    """A producer enqueueing one job at a time, keyless and never retried (so a lost
    or duplicated enqueue would show), and a handler that records each delivery."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.enqueued: list[str] = []
        self.handled: Counter[str] = Counter()
        self.attempts: Counter[int] = Counter()
        self.failure: Optional[BaseException] = None
        self.progress = asyncio.Event()
        self.stop = asyncio.Event()

    async def produce(self, client: SeppClient) -> None:
        try:
            while not self.stop.is_set():
                ack = await client.enqueue(text_job(self.queue, b"%d" % len(self.enqueued)))
                self.enqueued.append(ack.job_id)
                await asyncio.sleep(0.005)  # a steady trickle, not a flood
        except Exception as exc:
            self.failure = exc
            self.progress.set()

    async def handle(self, payload: Optional[Payload], ctx: JobCtx) -> None:
        self.handled[ctx.id] += 1
        self.attempts[ctx.attempt] += 1
        self.progress.set()

    async def handled_more(self, count: int) -> None:
        """Wait until ``count`` more deliveries were handled."""
        target = sum(self.handled.values()) + count
        await self._until(lambda: sum(self.handled.values()) >= target)

    async def all_handled(self) -> None:
        await self._until(lambda: not set(self.enqueued) - set(self.handled))

    async def _until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            if self.failure is not None:
                raise AssertionError("the producer failed") from self.failure
            self.progress.clear()
            await asyncio.wait_for(self.progress.wait(), max(0.0, deadline - loop.time()))


async def test_worker_rides_out_five_reloads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    steady = Steady(unique_queue())
    async with sepp_server() as server, Nginx(server.port, tmp_path) as nginx:
        async with FrameTap(nginx.port) as tap:
            async with connected(tap.addr) as producer, connected(tap.addr) as consumer:
                worker = Worker(consumer, [steady.queue], 30, wait_timeout=5, max_in_flight=8)
                worker.handle("t", steady.handle)
                async with worker_running(worker, 10):
                    producing = asyncio.ensure_future(steady.produce(producer))
                    try:
                        await steady.handled_more(20)
                        mark = len(caplog.records)
                        for _ in range(RELOADS):
                            await nginx.reload()
                            await steady.handled_more(20)
                        reload_records = client_records(caplog.records[mark:])
                    finally:
                        steady.stop.set()
                        await asyncio.wait_for(producing, 10)
                    await steady.all_handled()

        totals = server.state.totals()
        assert server.counts(steady.queue) == (0, 0, 0, 0)
    assert reload_records == []
    assert sorted(steady.handled) == sorted(steady.enqueued)
    assert set(steady.handled.values()) == {1}, "a job was handled twice"
    assert set(steady.attempts) == {1}, "a lease was lost"
    assert totals["acked"] == totals["enqueued"] == len(steady.enqueued)
    assert totals["lease_expired"] == totals["nacked"] == totals["dead_lettered"] == 0
    # Each reload reached the clients as a graceful GOAWAY, and each generation of
    # nginx workers served them: they moved over every time.
    goaways = tap.goaways()
    assert len(goaways) >= RELOADS and {g.error_code for g in goaways} == {0}
    log = nginx.access_log()
    assert len({entry[0] for entry in log}) == RELOADS + 1
    # Every call answered OK, but the long poll the worker cancelled at its shutdown
    # (nginx logs 499: the client went away).
    assert len([entry for entry in log if (entry[2], entry[4]) != ("200", "0")]) <= 1, log


async def test_nginx_quit_during_a_long_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # nginx's graceful stop: GOAWAY, then the old worker waits for the long poll's
    # answer (empty, at its wait timeout) before it exits. The poll must end normally;
    # after that nothing listens, and the next call fails at once, not ambiguous.
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    queue = unique_queue()
    async with sepp_server() as server, Nginx(server.port, tmp_path) as nginx:
        async with connected(nginx.addr) as client:
            await client.get_server_info()
            poll = asyncio.ensure_future(elapsed(client.reserve(opts(queue, wait=2))))
            await until(lambda: server.state.stats()["waiters"] == 1)
            mark = len(caplog.records)
            await nginx.quit()
            seconds, result = await asyncio.wait_for(poll, 10)
            assert result is None, result
            assert 1.5 < seconds < 5
            assert client_records(caplog.records[mark:]) == []
            with pytest.raises(TransportError) as info:
                await client.get_server_info()
            assert info.value.code.name == "UNAVAILABLE"
            assert info.value.ambiguous is False
