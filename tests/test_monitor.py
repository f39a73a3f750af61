"""``sepp_lite.monitor`` from Python: ``serve_endpoints`` around a Worker's ``run()``,
over real HTTP on 127.0.0.1, against the in-process server (crashed and restarted for
readiness); and the endpoints' HTTP server itself (limits, methods, timeouts)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Optional

import pytest

import sepp_lite as sepp
from sepp_lite import _httpd
from sepp_lite.monitor import WorkerMonitor, serve_endpoints
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import unique_queue, until, until_sync, worker_running
from tests.fault_helpers import RestartableServer, running
from tests.http_helpers import get, get_blocking, samples, wait_for_status

pytestmark = pytest.mark.timeout(60)


async def enqueue(client: sepp.SeppClient, queue: str, job_type: str, n: int = 1) -> None:
    await client.enqueue_batch([sepp.EnqueueRequest(queue, job_type) for _ in range(n)])


async def test_readyz_from_start_through_shutdown_to_stop(client: sepp.SeppClient) -> None:
    queue = unique_queue()
    worker = sepp.Worker(client, [queue], lease_duration=30, wait_timeout=5)
    holding, release = asyncio.Event(), asyncio.Event()

    @worker.handler("hold")
    async def hold(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        holding.set()
        await release.wait()

    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        url = endpoints.url + "/readyz"
        answer = await get(url)
        assert (answer.status, answer.body) == (503, "not ready: the worker is not running yet\n")
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        async with worker_running(worker, 10) as run:
            # The queue is empty: the long poll has not answered, the probe has.
            answer = await wait_for_status(url, 200)
            assert answer.body == f"ready: worker {worker.worker_id} is reserving\n"
            await enqueue(client, queue, "hold")
            await asyncio.wait_for(holding.wait(), 10)
            worker.shutdown_handle().shutdown()
            assert (await get(url)).body == "not ready: shutting down\n"
            assert (await get(url)).status == 503
            release.set()
            await asyncio.wait_for(run, 10)
        answer = await get(url)
        assert (answer.status, answer.body) == (503, "not ready: the worker has stopped\n")


async def test_readyz_503_while_the_server_is_down_and_200_when_it_is_back() -> None:
    async with RestartableServer() as server:
        client = await sepp.SeppClient.connect(server.addr)
        async with client:
            queue = unique_queue()
            worker = sepp.Worker(
                client, [queue], lease_duration=30, wait_timeout=5, reserve_error_backoff=0.1
            )
            async with (
                serve_endpoints(worker, "127.0.0.1:0") as endpoints,
                worker_running(worker, 10),
            ):
                url = endpoints.url + "/readyz"
                await wait_for_status(url, 200)
                await server.crash()
                answer = await wait_for_status(url, 503, says="reserve failing")
                assert "Error" in answer.body  # the error's class names what went wrong
                assert (await get(url)).status == 503
                await server.start()  # the same port again
                await wait_for_status(url, 200, says="is reserving")
                # SeppClient.connections_opened (1 after connect) feeds the reconnect
                # counter at each heartbeat: the crash made the client connect again.
                assert client.connections_opened >= 2
                reconnects = client.connections_opened - 1
                for _ in range(100):
                    metrics = (await get(endpoints.url + "/metrics")).body
                    if samples(metrics, "sepp_client_reconnects_total") == reconnects:
                        break
                    await asyncio.sleep(0.05)
    assert samples(metrics, "sepp_reserves_failed_total") >= 1
    assert samples(metrics, "sepp_client_reconnects_total") == reconnects


async def test_readyz_503_after_run_raised(server: SeppTestServer) -> None:
    client = await sepp.SeppClient.connect(server.addr)
    worker = sepp.Worker(client, [unique_queue()], lease_duration=30)
    await client.close()  # calls on a closed client raise RuntimeError: run() fails
    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        with pytest.raises(RuntimeError):
            await worker.run()
        answer = await get(endpoints.url + "/readyz")
    assert answer.status == 503
    assert answer.body == (
        "not ready: the worker failed: run() raised RuntimeError: this SeppClient is closed\n"
    )


async def test_readyz_503_after_run_was_cancelled(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(client, [unique_queue()], lease_duration=30, wait_timeout=5)
    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        url = endpoints.url + "/readyz"
        async with running(worker.run()):
            await wait_for_status(url, 200)
        answer = await get(url)
    assert answer.status == 503
    assert "stopped hard (run() was cancelled)" in answer.body


async def test_readyz_503_once_reserve_is_refused_for_good() -> None:
    """A reserve failure that is not the network (strict mode: an undeclared queue)
    stops the worker at once, and it stays unready although the server answers the
    probe."""
    async with SeppTestServer(strict_queues=True) as strict:
        async with await sepp.SeppClient.connect(strict.addr) as client:
            worker = sepp.Worker(client, ["undeclared"], lease_duration=30, wait_timeout=1)
            async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
                with pytest.raises(sepp.UnknownQueuesError):
                    await asyncio.wait_for(worker.run(), 30)  # fails fast, not retried
                url = endpoints.url + "/readyz"
                answer = await wait_for_status(url, 503, says="UnknownQueuesError")
    assert answer.body.startswith("not ready: ")


async def test_livez_503_with_the_lag_while_a_handler_blocks_the_loop(
    client: sepp.SeppClient,
) -> None:
    queue = unique_queue()
    worker = sepp.Worker(client, [queue], lease_duration=30, wait_timeout=5)
    blocking = threading.Event()

    @worker.handler("block")
    async def block(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        blocking.set()
        time.sleep(3)  # noqa: ASYNC251 (the mistake /livez is there to catch)

    def probe_while_blocked(url: str) -> tuple[float, str, int]:
        assert blocking.wait(20)
        time.sleep(1.5)
        answer = get_blocking(url)
        return time.monotonic(), answer.body, answer.status

    async with serve_endpoints(worker, "127.0.0.1:0", max_loop_lag=0.5) as endpoints:
        url = endpoints.url + "/livez"
        answer = await get(url)
        assert (answer.status, answer.body) == (200, "live: event loop lag 0.000 s\n")
        loop = asyncio.get_running_loop()
        probed = loop.run_in_executor(None, probe_while_blocked, url)
        async with worker_running(worker, 10):
            await enqueue(client, queue, "block")
            _, body, status = await asyncio.wait_for(probed, 30)
            assert status == 503
            assert body.startswith("not live: the event loop is blocked: lag ")
            assert body.endswith(" s (bound 0.5 s)\n")
            lag = float(body.split("lag ")[1].split(" s")[0])
            assert 0.5 < lag < 3.5
            await wait_for_status(url, 200)  # the handler returned: the loop beats again


async def test_metrics_count_what_the_worker_did(client: sepp.SeppClient) -> None:
    queue = unique_queue()
    worker = sepp.Worker(
        client, [queue], lease_duration=30, wait_timeout=1, auto_extend_interval=0.05
    )
    seen: list[str] = []

    @worker.handler("ok")
    async def ok(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        seen.append(ctx.id)
        await asyncio.sleep(0.5)  # long enough for the lease keeper to extend, even loaded

    @worker.handler("bad")
    async def bad(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        raise sepp.HandlerError.permanent("no")

    @worker.handler("flaky")
    async def flaky(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        if ctx.attempt == 1:
            raise sepp.HandlerError.retry_after("once", 0.01)

    await enqueue(client, queue, "ok", 5)
    await enqueue(client, queue, "bad", 2)
    await enqueue(client, queue, "flaky", 3)
    await enqueue(client, queue, "stray", 2)  # no handler: handed back to wait
    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        await worker.run(until_idle=True)
        answer = await get(endpoints.url + "/metrics")
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = answer.body

    def count(name: str, **labels: str) -> float:
        return samples(text, name, queue=queue, **labels)

    assert count("sepp_jobs_started_total", job_type="ok") == 5
    assert count("sepp_jobs_started_total", job_type="flaky") == 6  # 3 jobs, 2 attempts each
    assert count("sepp_jobs_processed_total", job_type="ok") == 5
    assert count("sepp_jobs_processed_total", job_type="flaky") == 3
    assert count("sepp_jobs_processed_total", job_type="bad") == 0
    assert count("sepp_jobs_nacked_total", job_type="bad", outcome="dead_letter") == 2
    assert count("sepp_jobs_nacked_total", job_type="flaky", outcome="retry") == 3
    assert count("sepp_jobs_unhandled_total", job_type="stray") == 2
    assert "sepp_jobs_unhandled_total{" + f'job_type="ok",queue="{queue}"' not in text
    assert count("sepp_handler_duration_seconds_count") == 5 + 2 + 6
    assert count("sepp_handler_duration_seconds_bucket", job_type="ok", le="0.25") == 0
    assert count("sepp_handler_duration_seconds_bucket", job_type="ok", le="2.5") == 5
    assert samples(text, "sepp_jobs_in_flight") == 0
    assert samples(text, "sepp_reserves_completed_total", jobs="some") >= 1
    assert samples(text, "sepp_lease_extensions_total", outcome="extended") >= 5
    assert len(seen) == 5


async def test_metrics_in_openmetrics_when_asked(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(client, [unique_queue()], lease_duration=30)
    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        answer = await get(
            endpoints.url + "/metrics", accept="application/openmetrics-text; version=1.0.0"
        )
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    assert answer.body.endswith("# EOF\n")


def test_two_workers_metrics_made_at_once_are_registered_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two workers' monitors made in two threads (truly at once on a free-threaded build):
    # the second comes while the first creates the instruments. Created twice, the
    # second registration would fail with "Duplicated timeseries".
    prometheus_client = pytest.importorskip("prometheus_client")
    from sepp_lite import _metrics

    monkeypatch.setattr(prometheus_client, "REGISTRY", prometheus_client.CollectorRegistry())
    monkeypatch.setattr(_metrics, "_made", None)
    made: list[_metrics.PrometheusObserver] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            made.append(_metrics.PrometheusObserver())
        except BaseException as error:
            errors.append(error)

    second = threading.Thread(target=make)
    counter = prometheus_client.Counter

    def in_instruments() -> bool:
        frame = sys._current_frames().get(second.ident or 0)
        while frame is not None and frame.f_code.co_name != "_instruments":
            frame = frame.f_back
        return frame is not None

    def first_counter_waits_for_the_second_monitor(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is not second and second.ident is None:
            second.start()
            # It reached the creation: it waits there, or creates too (or has already).
            until_sync(lambda: in_instruments() or not second.is_alive())
        return counter(*args, **kwargs)

    monkeypatch.setattr(prometheus_client, "Counter", first_counter_waits_for_the_second_monitor)
    make()
    second.join(10)
    assert not second.is_alive()
    assert errors == []
    first, other = made
    assert first._m is other._m


async def test_bad_addresses_and_a_busy_port(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(client, [unique_queue()], lease_duration=30)
    for addr in ("9464", "localhost", "::1:9464", "host:99999"):
        with pytest.raises(ValueError):
            async with serve_endpoints(worker, addr):
                pass
    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        with pytest.raises(OSError):
            async with serve_endpoints(worker, f"127.0.0.1:{endpoints.port}"):
                pass
        assert (await get(endpoints.url + "/livez")).status == 200


async def test_monitor_checks_without_http(client: sepp.SeppClient) -> None:
    """The checks are plain methods too, for an application's own HTTP server."""
    worker = sepp.Worker(client, [unique_queue()], lease_duration=30, wait_timeout=5)
    async with WorkerMonitor(worker, max_loop_lag=2, metrics=False) as monitor:
        assert monitor.readiness() == (False, "not ready: the worker is not running yet")
        assert monitor.liveness().ok and monitor.max_loop_lag == 2
        async with worker_running(worker, 10):
            await until(lambda: monitor.readiness().ok)
    with pytest.raises(ValueError, match="max_loop_lag"):
        WorkerMonitor(worker, max_loop_lag=0)


# -- the HTTP server --------------------------------------------------------------------


@pytest.fixture
async def httpd() -> AsyncIterator[_httpd.HttpServer]:
    def hello(accept: str) -> _httpd.Response:
        return _httpd.Response(200, f"hello {accept or '-'}\n".encode())

    def broken(accept: str) -> _httpd.Response:
        raise RuntimeError("bug")

    server = _httpd.HttpServer({"/hello": hello, "/broken": broken}, read_timeout=0.5)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


async def raw(server: _httpd.HttpServer, data: bytes, *, half_close: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_http_routes_methods_and_errors(httpd: _httpd.HttpServer) -> None:
    base = f"http://127.0.0.1:{httpd.port}"
    answer = await get(base + "/hello?x=1", accept="text/plain")
    assert (answer.status, answer.body) == (200, "hello text/plain\n")
    assert answer.headers["connection"] == "close"
    assert answer.headers["content-length"] == str(len(answer.body))
    head = await get(base + "/hello", method="HEAD")
    assert (head.status, head.body, head.headers["content-length"]) == (200, "", "8")
    assert (await get(base + "/nope")).status == 404
    assert (await get(base + "/hello", method="POST")).status == 405
    assert (await get(base + "/broken")).status == 500
    answer = await get(base + "/broken")
    assert "bug" not in answer.body  # the traceback goes to the log, not to the client
    assert (await raw(httpd, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")


async def test_http_bounds_the_head_and_the_wait(httpd: _httpd.HttpServer) -> None:
    huge = b"GET /hello HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 10_000 + b"\r\n\r\n"
    assert (await raw(httpd, huge)).startswith(b"HTTP/1.1 431 ")
    started = time.monotonic()
    assert await raw(httpd, b"GET /hel") == b""  # never finished: dropped after 0.5 s
    assert time.monotonic() - started < 5
    assert (await raw(httpd, b"GET /hello HTT", half_close=True)).startswith(b"HTTP/1.1 400 ")


async def test_http_bounds_the_connections() -> None:
    def hello(accept: str) -> _httpd.Response:
        return _httpd.Response(200, b"hello\n")

    httpd = _httpd.HttpServer({"/hello": hello}, read_timeout=30)
    await httpd.start("127.0.0.1", 0)
    try:
        idle = [await asyncio.open_connection("127.0.0.1", httpd.port) for _ in range(32)]
        try:
            await asyncio.sleep(0.2)  # let the server take them all
            try:  # one too many: closed unanswered (with a reset, as it was not read)
                assert await raw(httpd, b"GET /hello HTTP/1.1\r\n\r\n") == b""
            except ConnectionResetError:
                pass
        finally:
            for _, writer in idle:
                writer.close()
        answer = await get(f"http://127.0.0.1:{httpd.port}/hello")
        assert answer.status == 200
    finally:
        await httpd.close()
