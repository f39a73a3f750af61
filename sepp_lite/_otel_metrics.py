"""sepp-py's OpenTelemetry worker instruments (meter ``sepp``), as a Worker observer.

A Worker attaches :class:`OTelWorkerMetrics` when it is built if ``opentelemetry-api``
(the ``otel`` extra) is installed, and nothing otherwise, so a worker without
OpenTelemetry pays nothing for it. Otherwise it is an observer like the monitor, the
Prometheus metrics (``_metrics.py``) or a user's. Until a meter provider is set its
instruments are the API's proxies (an ``add`` is a test and a return); once one is, at
any time, they count into it.
"""

from __future__ import annotations

from sepp_lite import _otel
from sepp_lite._observe import WorkerObserver
from sepp_lite._version import __version__
from sepp_lite.types import JobCtx

__all__ = ["OTelWorkerMetrics", "default_observers"]


class OTelWorkerMetrics(WorkerObserver):
    """Counts a Worker's events into sepp-py's instruments: ``sepp.jobs.processed``,
    ``sepp.jobs.nacked`` (by outcome), ``sepp.jobs.in_flight``,
    ``sepp.reserves.completed`` (by jobs=some|empty) and ``sepp.reserves.failed``, and
    sepp_lite's ``sepp.jobs.unhandled`` (by queue and job_type). Needs
    ``opentelemetry-api``."""

    def __init__(self) -> None:
        from opentelemetry import metrics

        meter = metrics.get_meter("sepp", __version__)
        self._processed = meter.create_counter(
            "sepp.jobs.processed", description="Jobs handled and acked."
        )
        self._nacked = meter.create_counter(
            "sepp.jobs.nacked", description="Jobs nacked after a handler failure, by outcome."
        )
        self._in_flight = meter.create_up_down_counter(
            "sepp.jobs.in_flight", description="Jobs whose handlers are running."
        )
        self._completed = meter.create_counter(
            "sepp.reserves.completed", description="Reserve calls answered, by jobs=some|empty."
        )
        self._failed = meter.create_counter(
            "sepp.reserves.failed", description="Reserve calls that failed."
        )
        self._unhandled = meter.create_counter(
            "sepp.jobs.unhandled",
            description="Jobs of a type without a handler, handed back, by queue and job_type.",
        )

    def reserve_completed(self, empty: bool) -> None:
        self._completed.add(1, {"jobs": "empty" if empty else "some"})

    def reserve_failed(self, error: BaseException) -> None:
        self._failed.add(1)

    def job_started(self, ctx: JobCtx) -> None:
        self._in_flight.add(1)

    def job_acked(self, ctx: JobCtx) -> None:
        self._processed.add(1)

    def job_nacked(self, ctx: JobCtx, dead_lettered: bool) -> None:
        self._nacked.add(1, {"outcome": "dead_letter" if dead_lettered else "retry"})

    def job_unhandled(self, ctx: JobCtx) -> None:
        self._unhandled.add(1, {"queue": ctx.queue, "job_type": ctx.job_type})

    def job_finished(self, ctx: JobCtx) -> None:
        self._in_flight.add(-1)


def default_observers() -> list[WorkerObserver]:
    """What every Worker reports to from the start: the OpenTelemetry instruments when
    ``opentelemetry-api`` is installed (and not switched off), else nothing."""
    return [OTelWorkerMetrics()] if _otel.AVAILABLE else []
