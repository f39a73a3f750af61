"""Health, readiness and metrics of a Worker, for Kubernetes probes and Prometheus.

``sepp-lite worker --http ADDR`` serves them; from Python, wrap your own ``run()``::

    async with serve_endpoints(worker, "127.0.0.1:9464"):
        await worker.run()

``GET /livez``: 200 while the worker's event loop keeps its beat (a task wakes every
0.5 s), 503 once it is late by more than ``max_loop_lag`` seconds, with the lag in the
body: a handler that blocks the loop (``time.sleep``, CPU-bound work) stops the whole
worker, and this is how it shows. The endpoints run on their own thread, so they
answer while the loop is blocked.

``GET /readyz``: 200 once the worker is running and its server answers (a reserve
completed, or the monitor's own GetServerInfo probe did), 503 before that, while
reserves fail (the probe retries every second while the server is unreachable),
once shutdown began, and after ``run()`` returned or raised. The body says why.

``GET /metrics``: the Prometheus exposition (see ``sepp_lite._metrics``); it needs
prometheus-client (the ``metrics`` extra) and answers 501 saying so without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from sepp_lite import _metrics
from sepp_lite._httpd import Response, Route, ThreadedHttpServer, parse_listen_address
from sepp_lite._observe import WorkerObserver
from sepp_lite._taskset import TaskSet
from sepp_lite._time import Duration, as_timedelta
from sepp_lite.errors import ConnectError, TransportError
from sepp_lite.worker import Worker

__all__ = [
    "DEFAULT_MAX_LOOP_LAG",
    "Check",
    "Endpoints",
    "WorkerMonitor",
    "serve_endpoints",
]

logger = logging.getLogger("sepp_lite.monitor")

DEFAULT_MAX_LOOP_LAG = 10.0
BEAT_S = 0.5  # the heartbeat's period: the resolution of the measured lag
PROBE_INTERVAL_S = 1.0  # between GetServerInfo probes while the server is unreachable
PROBE_TIMEOUT_S = 5.0


class Check(NamedTuple):
    """One probe's verdict and the line that explains it."""

    ok: bool
    detail: str


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _stopped_reason(error: Optional[BaseException]) -> str:
    if error is None:
        return "the worker has stopped"
    if isinstance(error, asyncio.CancelledError):
        return "the worker was stopped hard (run() was cancelled)"
    return f"the worker failed: run() raised {_describe(error)}"


class WorkerMonitor(WorkerObserver):
    """Tracks one :class:`~sepp_lite.worker.Worker`: readiness from its events,
    liveness from a heartbeat on its loop, and (with prometheus-client installed and
    ``metrics=True``) its Prometheus metrics.

    Use it as an async context manager on the worker's loop, around ``run()``:
    entering attaches it to the worker and starts the heartbeat and the probe;
    leaving stops them and detaches it. :meth:`readiness` and :meth:`liveness` may
    be called from any thread. ``on_beat``, when given, is called with the monitor on
    the worker's loop at every heartbeat (every 0.5 s while the loop is free), to pass
    its checks on: a supervised worker process reports them to its supervisor so.

    The monitor is a :class:`~sepp_lite.WorkerObserver`: it learns what the worker does
    the way any observer does.
    """

    def __init__(
        self,
        worker: Worker,
        *,
        max_loop_lag: Duration = DEFAULT_MAX_LOOP_LAG,
        metrics: bool = True,
        on_beat: Optional[Callable[[WorkerMonitor], None]] = None,
    ) -> None:
        lag = as_timedelta(max_loop_lag, "max_loop_lag", positive=True).total_seconds()
        self._worker = worker
        self._max_lag = lag
        self._prometheus: Optional[_metrics.PrometheusObserver] = None
        if metrics and _metrics.AVAILABLE:
            self._prometheus = _metrics.PrometheusObserver()
        self._on_beat = on_beat
        self._phase = "idle"  # -> running -> stopped
        self._stopped = ""
        self._connected = False
        self._reserve_error: Optional[str] = None
        self._reserve_error_is_transport = False
        self._last_beat: Optional[float] = None
        self._connections_seen = 1
        self._probe_wanted: Optional[asyncio.Event] = None
        self._tasks = TaskSet("monitor")

    @property
    def worker(self) -> Worker:
        return self._worker

    @property
    def max_loop_lag(self) -> float:
        return self._max_lag

    # -- the checks -------------------------------------------------------------------

    def readiness(self) -> Check:
        """Ready when running, not shutting down, and its server answers."""
        if self._phase == "idle":
            return Check(False, "not ready: the worker is not running yet")
        if self._phase == "stopped":
            return Check(False, f"not ready: {self._stopped}")
        if self._worker.shutdown_handle().is_shutdown:
            return Check(False, "not ready: shutting down")
        if self._reserve_error is not None:
            return Check(False, f"not ready: reserve failing: {self._reserve_error}")
        if not self._connected:
            return Check(False, "not ready: waiting for the sepp server to answer")
        return Check(True, f"ready: worker {self._worker.worker_id} is reserving")

    def loop_lag(self) -> float:
        """How late the heartbeat is now, in seconds (0 before the monitor starts)."""
        if self._last_beat is None:
            return 0.0
        return max(0.0, time.monotonic() - self._last_beat - BEAT_S)

    def liveness(self) -> Check:
        """Live while the event loop keeps its beat within ``max_loop_lag``."""
        lag = self.loop_lag()
        if lag > self._max_lag:
            return Check(
                False,
                f"not live: the event loop is blocked: lag {lag:.3f} s (bound {self._max_lag:g} s)",
            )
        return Check(True, f"live: event loop lag {lag:.3f} s")

    def routes(self) -> dict[str, Route]:
        """The three endpoints, for :class:`~sepp_lite._httpd.HttpServer`."""
        return health_routes(self.liveness, self.readiness, _metrics.exposition)

    # -- start and stop ---------------------------------------------------------------

    async def __aenter__(self) -> WorkerMonitor:
        self._probe_wanted = asyncio.Event()
        if self._phase == "running" and not self._connected:
            self._probe_wanted.set()
        self._worker.add_observer(self)
        if self._prometheus is not None:
            self._worker.add_observer(self._prometheus)
        self._last_beat = time.monotonic()
        self._tasks.spawn(self._heartbeat())
        self._tasks.spawn(self._probe())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tasks.cancel(PROBE_TIMEOUT_S)
        self._worker.remove_observer(self)
        if self._prometheus is not None:
            self._worker.remove_observer(self._prometheus)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            self._last_beat = time.monotonic()
            self._count_reconnects()
            if self._on_beat is not None:
                self._on_beat(self)

    def _count_reconnects(self) -> None:
        # SeppClient.connections_opened: 1 after connect, +1 per new connection.
        opened = self._worker.client.connections_opened
        if self._prometheus is None:
            return
        if opened > self._connections_seen:
            self._prometheus.reconnected(opened - self._connections_seen)
            self._connections_seen = opened

    async def _probe(self) -> None:
        """While the server has not answered, ask it with GetServerInfo every second."""
        assert self._probe_wanted is not None
        while True:
            await self._probe_wanted.wait()
            try:
                await asyncio.wait_for(self._worker.client.get_server_info(), PROBE_TIMEOUT_S)
            except Exception as error:  # any failure just means "not yet"
                logger.debug("readiness probe failed: %s", _describe(error))
            else:
                self._answered(transport_only=True)
            await asyncio.sleep(PROBE_INTERVAL_S)

    def _answered(self, *, transport_only: bool) -> None:
        self._connected = True
        if not transport_only or self._reserve_error_is_transport:
            self._reserve_error = None
        if self._probe_wanted is not None:
            self._probe_wanted.clear()

    # -- the worker's events ----------------------------------------------------------

    def run_started(self) -> None:
        self._phase, self._connected, self._reserve_error = "running", False, None
        if self._probe_wanted is not None:
            self._probe_wanted.set()

    def run_finished(self, error: Optional[BaseException]) -> None:
        self._phase, self._stopped = "stopped", _stopped_reason(error)
        if self._probe_wanted is not None:
            self._probe_wanted.clear()

    def reserve_completed(self, empty: bool) -> None:
        self._answered(transport_only=False)

    def reserve_failed(self, error: BaseException) -> None:
        self._reserve_error = _describe(error)
        # An unreachable server is probed until it answers; any other failure (an
        # overloaded server, a refused request) lasts until a reserve succeeds.
        self._reserve_error_is_transport = isinstance(error, (TransportError, ConnectError))
        if self._reserve_error_is_transport:
            self._connected = False
            if self._probe_wanted is not None:
                self._probe_wanted.set()


def _check_route(check: Callable[[], Check]) -> Route:
    def route(accept: str) -> Response:
        result = check()
        return Response(200 if result.ok else 503, (result.detail + "\n").encode())

    return route


def health_routes(
    live: Callable[[], Check],
    ready: Callable[[], Check],
    metrics: Callable[[str], _metrics.Exposition],
) -> dict[str, Route]:
    """``/livez``, ``/readyz`` and ``/metrics`` from the two checks and an exposition."""

    def metrics_route(accept: str) -> Response:
        return Response(*metrics(accept))

    return {"/livez": _check_route(live), "/readyz": _check_route(ready), "/metrics": metrics_route}


@dataclass(frozen=True)
class Endpoints:
    """Where :func:`serve_endpoints` listens, and the monitor behind it."""

    monitor: WorkerMonitor
    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@contextlib.asynccontextmanager
async def serve_endpoints(
    worker: Worker, addr: str, *, max_loop_lag: Duration = DEFAULT_MAX_LOOP_LAG
) -> AsyncIterator[Endpoints]:
    """Serve ``/livez``, ``/readyz`` and ``/metrics`` of ``worker`` on ``addr``
    (``HOST:PORT``, ``[IPv6]:PORT``, or ``:PORT`` for every interface; port 0 picks a
    free one, see :attr:`Endpoints.port`) while the block runs. Enter it on the
    worker's loop, around ``run()``. Raises ``ValueError`` for a malformed address and
    ``OSError`` when it cannot be bound."""
    host, port = parse_listen_address(addr)
    async with WorkerMonitor(worker, max_loop_lag=max_loop_lag) as monitor:
        server = ThreadedHttpServer(monitor.routes())
        await server.start(host, port)
        endpoints = Endpoints(monitor, server.host, server.port)
        logger.info("health endpoints on %s: /livez /readyz /metrics", endpoints.url)
        if not _metrics.AVAILABLE:
            logger.warning("%s", _metrics.MISSING)
        try:
            yield endpoints
        finally:
            await server.close()
