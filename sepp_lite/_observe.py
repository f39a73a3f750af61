"""The Worker's event seam: what it reports as it runs, fanned out to OpenTelemetry's
instruments and to the observers attached to it (the monitor of ``sepp_lite.monitor``).

The worker calls :class:`WorkerEvents` once per event; observers are plain objects with
the :class:`WorkerObserver` methods. Without observers an event costs one OpenTelemetry
call (itself a no-op without the ``otel`` extra) and one empty loop.
"""

from __future__ import annotations

from typing import Callable, Optional

from sepp_lite import _otel
from sepp_lite.types import JobCtx

__all__ = ["WorkerEvents", "WorkerObserver"]


class WorkerObserver:
    """What a Worker reports, every method a no-op here: override the ones you need.

    Methods are called on the worker's event loop and must return quickly.
    ``lease_extended`` outcomes: ``"extended"``, ``"failed"`` (a transient error, the
    lease still holds) and ``"lost"``.
    """

    def run_started(self) -> None:
        """``run()`` began."""

    def run_finished(self, error: Optional[BaseException]) -> None:
        """``run()`` returned (``None``) or raised ``error`` (cancellation included)."""

    def reserve_completed(self, empty: bool) -> None:
        """A reserve was answered, with jobs or empty."""

    def reserve_failed(self, error: BaseException) -> None:
        """A reserve failed with ``error``; the worker backs off and retries."""

    def job_started(self, ctx: JobCtx) -> None:
        """A reserved job was handed to its task (it counts as in flight)."""

    def job_handled(self, ctx: JobCtx, seconds: float) -> None:
        """The job's handler ended (returned, raised or was cancelled) after ``seconds``."""

    def job_acked(self, ctx: JobCtx) -> None:
        """The job was acked."""

    def job_nacked(self, ctx: JobCtx, dead_lettered: bool) -> None:
        """The job was nacked after a handler failure."""

    def job_finished(self, ctx: JobCtx) -> None:
        """The job's task ended (it no longer counts as in flight)."""

    def lease_extended(self, ctx: JobCtx, outcome: str) -> None:
        """The worker tried to extend the job's lease."""


class WorkerEvents:
    """The fan-out a Worker reports to: OpenTelemetry's worker instruments (sepp-py's
    names) first, then every attached observer in order."""

    __slots__ = ("_observers", "_otel")

    def __init__(self) -> None:
        self._otel = _otel.WorkerMetrics()
        self._observers: list[WorkerObserver] = []

    def attach(self, observer: WorkerObserver) -> Callable[[], None]:
        """Add ``observer``; returns the function that detaches it again."""
        self._observers.append(observer)

        def detach() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return detach

    def run_started(self) -> None:
        for observer in self._observers:
            observer.run_started()

    def run_finished(self, error: Optional[BaseException]) -> None:
        for observer in self._observers:
            observer.run_finished(error)

    def reserve_completed(self, empty: bool) -> None:
        self._otel.reserve_completed(empty)
        for observer in self._observers:
            observer.reserve_completed(empty)

    def reserve_failed(self, error: BaseException) -> None:
        self._otel.reserve_failed()
        for observer in self._observers:
            observer.reserve_failed(error)

    def job_started(self, ctx: JobCtx) -> None:
        self._otel.in_flight(1)
        for observer in self._observers:
            observer.job_started(ctx)

    def job_handled(self, ctx: JobCtx, seconds: float) -> None:
        for observer in self._observers:
            observer.job_handled(ctx, seconds)

    def job_acked(self, ctx: JobCtx) -> None:
        self._otel.processed()
        for observer in self._observers:
            observer.job_acked(ctx)

    def job_nacked(self, ctx: JobCtx, dead_lettered: bool) -> None:
        self._otel.nacked(dead_lettered)
        for observer in self._observers:
            observer.job_nacked(ctx, dead_lettered)

    def job_finished(self, ctx: JobCtx) -> None:
        self._otel.in_flight(-1)
        for observer in self._observers:
            observer.job_finished(ctx)

    def lease_extended(self, ctx: JobCtx, outcome: str) -> None:
        for observer in self._observers:
            observer.lease_extended(ctx, outcome)
