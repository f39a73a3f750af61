"""Prometheus metrics of a Worker, through ``prometheus-client`` (the ``metrics`` extra).

Why that library: it is the reference implementation of the exposition formats (text
and OpenMetrics, chosen from the scraper's ``Accept``), pure Python with no
dependencies (so PyPy is fine), and its multiprocess mode is what lets one supervisor
serve the sum of all its worker processes: each child writes its values to files in
a directory the supervisor names (``PROMETHEUS_MULTIPROC_DIR``), and the supervisor
reads them all at every scrape. The metrics live in prometheus-client's default
registry, so an application that already serves it shows them as well, and metrics a
user defines in handlers are aggregated across processes the same way.

The names are the Prometheus forms of the OpenTelemetry instruments sepp_lite emits
(``sepp.jobs.processed`` becomes ``sepp_jobs_processed_total``, and so on), with
``queue`` and ``job_type`` labels added where a job is known.

Without the extra, :data:`AVAILABLE` is False and ``/metrics`` answers 501 saying
what to install; ``/livez`` and ``/readyz`` need nothing.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple, Optional

from sepp_lite._observe import WorkerObserver
from sepp_lite.types import JobCtx

try:
    import prometheus_client
    from prometheus_client.exposition import choose_encoder
except ImportError:  # the `metrics` extra is not installed
    AVAILABLE = False
else:
    AVAILABLE = True

__all__ = ["AVAILABLE", "MISSING", "PrometheusObserver", "exposition", "supervisor_registry"]

MISSING = (
    "/metrics needs the prometheus-client package (sepp_lite's metrics extra): "
    "pip install prometheus-client (/livez and /readyz work without it)"
)
TEXT = "text/plain; charset=utf-8"
JOB = ("queue", "job_type")
# Handlers run from milliseconds to minutes; the library's default buckets stop at 10 s.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Exposition(NamedTuple):
    status: int
    body: bytes
    content_type: str


class _Instruments(NamedTuple):
    started: Any
    processed: Any
    nacked: Any
    in_flight: Any
    duration: Any
    reserves: Any
    reserve_failures: Any
    extensions: Any
    reconnects: Any
    unhandled: Any


# Made at the first observer's start, under a lock: two workers in two threads (free
# threading runs them truly at once) would otherwise both create the instruments, and
# the second registration fails ("Duplicated timeseries"). functools.cache does not
# prevent that: it calls the function again for a caller that comes while it runs.
_made: Optional[_Instruments] = None
_making = threading.Lock()


def _instruments() -> _Instruments:
    """The worker metrics, created (and registered) once per process, on first use."""
    global _made
    made = _made
    if made is None:
        with _making:
            made = _made
            if made is None:
                made = _made = _create(prometheus_client.REGISTRY)
    return made


def _create(registry: Any) -> _Instruments:
    """The worker metrics, registered in ``registry``."""
    p = prometheus_client
    counter = functools.partial(p.Counter, registry=registry)
    gauge = functools.partial(p.Gauge, registry=registry)
    histogram = functools.partial(p.Histogram, registry=registry)
    return _Instruments(
        counter("sepp_jobs_started", "Jobs reserved and handed to a handler.", JOB),
        counter("sepp_jobs_processed", "Jobs handled and acked.", JOB),
        counter(
            "sepp_jobs_nacked",
            "Jobs nacked after a handler failure, by outcome (retry or dead_letter).",
            (*JOB, "outcome"),
        ),
        gauge(
            "sepp_jobs_in_flight", "Jobs whose handlers are running.", multiprocess_mode="livesum"
        ),
        histogram(
            "sepp_handler_duration_seconds",
            "How long handlers ran (returned, raised or were cancelled).",
            JOB,
            buckets=DURATION_BUCKETS,
        ),
        counter(
            "sepp_reserves_completed", "Reserve calls answered, by jobs=some|empty.", ("jobs",)
        ),
        counter("sepp_reserves_failed", "Reserve calls that failed, by error class.", ("error",)),
        counter(
            "sepp_lease_extensions",
            "Lease extensions by the worker (auto-extend, shutdown), by outcome "
            "(extended, failed, lost).",
            ("outcome",),
        ),
        counter("sepp_client_reconnects", "Connections the client opened after its first."),
        counter(
            "sepp_jobs_unhandled",
            "Jobs of a type the worker has no handler for, handed back to wait for one.",
            JOB,
        ),
    )


class _JobSeries(NamedTuple):
    """The labelled series of one (queue, job_type), looked up once."""

    started: Any
    processed: Any
    retried: Any
    dead_lettered: Any
    duration: Any


class PrometheusObserver(WorkerObserver):
    """Counts a Worker's events into the process's Prometheus metrics."""

    def __init__(self) -> None:
        self._m = _instruments()
        # labels() takes a lock and builds a key each time: keep the series per job kind.
        self._series: dict[tuple[str, str], _JobSeries] = {}
        self._reserves = {
            True: self._m.reserves.labels("empty"),
            False: self._m.reserves.labels("some"),
        }

    def _of(self, ctx: JobCtx) -> _JobSeries:
        key = (ctx.queue, ctx.job_type)
        series = self._series.get(key)
        if series is None:
            m = self._m
            series = self._series[key] = _JobSeries(
                m.started.labels(*key),
                m.processed.labels(*key),
                m.nacked.labels(*key, "retry"),
                m.nacked.labels(*key, "dead_letter"),
                m.duration.labels(*key),
            )
        return series

    def reserve_completed(self, empty: bool) -> None:
        self._reserves[empty].inc()

    def reserve_failed(self, error: BaseException) -> None:
        self._m.reserve_failures.labels(type(error).__name__).inc()

    def job_started(self, ctx: JobCtx) -> None:
        self._of(ctx).started.inc()
        self._m.in_flight.inc()

    def job_handled(self, ctx: JobCtx, seconds: float) -> None:
        self._of(ctx).duration.observe(seconds)

    def job_acked(self, ctx: JobCtx) -> None:
        self._of(ctx).processed.inc()

    def job_nacked(self, ctx: JobCtx, dead_lettered: bool) -> None:
        series = self._of(ctx)
        (series.dead_lettered if dead_lettered else series.retried).inc()

    def job_unhandled(self, ctx: JobCtx) -> None:
        # Looked up each time: rare, and no series of it for the types that have handlers.
        self._m.unhandled.labels(ctx.queue, ctx.job_type).inc()

    def job_finished(self, ctx: JobCtx) -> None:
        self._m.in_flight.dec()

    def lease_extended(self, ctx: JobCtx, outcome: str) -> None:
        self._m.extensions.labels(outcome).inc()

    def reconnected(self, count: int) -> None:
        """The client opened ``count`` more connections since the last report."""
        self._m.reconnects.inc(count)


def exposition(accept: str, registry: Optional[Any] = None) -> Exposition:
    """``registry`` (default: the process's) in the format ``accept`` asks for, or the
    501 answer that says what to install."""
    if not AVAILABLE:
        return Exposition(501, (MISSING + "\n").encode(), TEXT)
    encoder, content_type = choose_encoder(accept)
    return Exposition(200, encoder(registry or prometheus_client.REGISTRY), content_type)


class SupervisorMetrics(NamedTuple):
    registry: Any
    processes: Any
    restarts: Any


def supervisor_registry(path: str) -> SupervisorMetrics:
    """A registry with every child's metrics (the files under ``path``) and the
    supervisor's own: running processes and restarts."""
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = prometheus_client.CollectorRegistry()
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    processes = prometheus_client.Gauge(
        "sepp_worker_processes", "Worker processes running under the supervisor.", registry=registry
    )
    restarts = prometheus_client.Counter(
        "sepp_worker_process_restarts",
        "Worker processes the supervisor started again after one exited.",
        registry=registry,
    )
    return SupervisorMetrics(registry, processes, restarts)
