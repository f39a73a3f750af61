"""The Worker's event seam: :class:`WorkerObserver`, the public protocol of what a Worker
reports as it runs, and :class:`WorkerEvents`, the fan-out the Worker calls.

Every observer is treated alike: OpenTelemetry's instruments (``_otel_metrics.py``),
the Prometheus metrics (``_metrics.py``), the health monitor (``monitor.py``) and a
user's own, attached with ``Worker.add_observer``.

The fan-out keeps, for each event, the bound methods of the observers that override it,
so an event nobody listens to costs the Worker one call and an empty loop, however many
observers listen to other events.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Callable, Optional

from sepp_lite.types import JobCtx

__all__ = ["EVENTS", "WorkerEvents", "WorkerObserver"]

# Not _log.logger(): an observer's failure is not part of any job's span.
logger = logging.getLogger("sepp_lite")


class WorkerObserver:
    """What a :class:`~sepp_lite.Worker` reports as it runs; every method is a no-op
    here. Subclass it, override the events you need, and attach an instance with
    :meth:`Worker.add_observer <sepp_lite.Worker.add_observer>`: metrics, tracing,
    audit logs, health checks.

    The methods are called on the worker's event loop, in the order the events happen,
    and must return quickly (a slow observer slows every job): hand anything slow to
    another task or thread. An exception an observer raises is logged with its
    traceback and goes no further: it never fails a job or stops the worker. Methods
    you do not override cost nothing: the worker does not call them.

    For one job the events come in this order: ``job_started``, then ``lease_extended``
    any number of times while the handler runs, ``job_handled`` when the handler ends,
    ``job_acked`` or ``job_nacked`` when the worker settled it (neither when the handler
    settled the job itself, the lease was lost, or the settle call failed), and
    ``job_finished`` last, always. A job of a type the worker has no handler for has
    ``job_unhandled`` between ``job_started`` and ``job_finished``, and nothing else.
    """

    def run_started(self) -> None:
        """``Worker.run()`` began."""

    def run_finished(self, error: Optional[BaseException]) -> None:
        """``run()`` returned (``error`` is ``None``) or raised ``error`` (a
        cancellation included)."""

    def reserve_completed(self, empty: bool) -> None:
        """A reserve call was answered, with jobs or (``empty``) without."""

    def reserve_failed(self, error: BaseException) -> None:
        """A reserve call failed with ``error``; the worker backs off and tries again
        (or, for a refusal no retry can fix, stops: see ``Worker.run``)."""

    def job_started(self, ctx: JobCtx) -> None:
        """A reserved job was handed to its task; it counts as in flight from now."""

    def job_handled(self, ctx: JobCtx, seconds: float) -> None:
        """The job's handler ended (returned, raised or was cancelled) after
        ``seconds``."""

    def job_acked(self, ctx: JobCtx) -> None:
        """The worker acked the job."""

    def job_nacked(self, ctx: JobCtx, dead_lettered: bool) -> None:
        """The worker nacked the job after its handler failed; ``dead_lettered`` when the
        server moved it to the dead letters rather than scheduling a retry."""

    def job_unhandled(self, ctx: JobCtx) -> None:
        """The worker has no handler (and no catch-all) for the job's type: it hands
        the job back to wait for a worker that has one (``Worker``'s
        ``unknown_type_delay``), or dead-letters it on its last attempt."""

    def job_finished(self, ctx: JobCtx) -> None:
        """The job's task ended; it no longer counts as in flight."""

    def lease_extended(self, ctx: JobCtx, outcome: str) -> None:
        """The worker tried to extend the job's lease (its lease keeper, or once at a
        bounded shutdown). ``outcome``: ``"extended"``, ``"failed"`` (a transient error;
        the lease still holds and the keeper tries again) or ``"lost"`` (the handler is
        cancelled and the job is not settled)."""


EVENTS = (
    "run_started",
    "run_finished",
    "reserve_completed",
    "reserve_failed",
    "job_started",
    "job_handled",
    "job_acked",
    "job_nacked",
    "job_unhandled",
    "job_finished",
    "lease_extended",
)
"""The names of :class:`WorkerObserver`'s events."""


def _listeners(observers: Iterable[WorkerObserver], event: str) -> tuple[Callable[..., Any], ...]:
    """The bound ``event`` methods of the observers that override the no-op."""
    noop = getattr(WorkerObserver, event)
    found = []
    for observer in observers:
        method = getattr(observer, event, None)
        if method is not None and getattr(method, "__func__", None) is not noop:
            found.append(method)
    return tuple(found)


def _failed(method: Callable[..., Any]) -> None:
    logger.exception("worker observer %r raised; ignored", method)


class WorkerEvents:
    """The fan-out a Worker reports to: every attached observer, in the order they
    were attached. ``attach`` and ``detach`` may be called while the worker runs."""

    __slots__ = ("_observers", *(f"_{event}" for event in EVENTS))

    # Per event, the bound methods to call (see _rebuild).
    _run_started: tuple[Callable[[], object], ...]
    _run_finished: tuple[Callable[[Optional[BaseException]], object], ...]
    _reserve_completed: tuple[Callable[[bool], object], ...]
    _reserve_failed: tuple[Callable[[BaseException], object], ...]
    _job_started: tuple[Callable[[JobCtx], object], ...]
    _job_handled: tuple[Callable[[JobCtx, float], object], ...]
    _job_acked: tuple[Callable[[JobCtx], object], ...]
    _job_nacked: tuple[Callable[[JobCtx, bool], object], ...]
    _job_unhandled: tuple[Callable[[JobCtx], object], ...]
    _job_finished: tuple[Callable[[JobCtx], object], ...]
    _lease_extended: tuple[Callable[[JobCtx, str], object], ...]

    def __init__(self, observers: Iterable[WorkerObserver] = ()) -> None:
        self._observers = list(observers)
        self._rebuild()

    @property
    def observers(self) -> tuple[WorkerObserver, ...]:
        """The attached observers, in order."""
        return tuple(self._observers)

    def attach(self, observer: WorkerObserver) -> None:
        """Report to ``observer`` too (after those attached before)."""
        self._observers.append(observer)
        self._rebuild()

    def detach(self, observer: WorkerObserver) -> None:
        """Stop reporting to ``observer`` (nothing happens if it is not attached)."""
        if observer in self._observers:
            self._observers.remove(observer)
            self._rebuild()

    def _rebuild(self) -> None:
        # Tuples, replaced whole: an event fanning out while an observer detaches
        # finishes with the observers it started with.
        for event in EVENTS:
            setattr(self, f"_{event}", _listeners(self._observers, event))

    def run_started(self) -> None:
        for method in self._run_started:
            try:
                method()
            except Exception:
                _failed(method)

    def run_finished(self, error: Optional[BaseException]) -> None:
        for method in self._run_finished:
            try:
                method(error)
            except Exception:
                _failed(method)

    def reserve_completed(self, empty: bool) -> None:
        for method in self._reserve_completed:
            try:
                method(empty)
            except Exception:
                _failed(method)

    def reserve_failed(self, error: BaseException) -> None:
        for method in self._reserve_failed:
            try:
                method(error)
            except Exception:
                _failed(method)

    def job_started(self, ctx: JobCtx) -> None:
        for method in self._job_started:
            try:
                method(ctx)
            except Exception:
                _failed(method)

    def job_handled(self, ctx: JobCtx, seconds: float) -> None:
        for method in self._job_handled:
            try:
                method(ctx, seconds)
            except Exception:
                _failed(method)

    def job_acked(self, ctx: JobCtx) -> None:
        for method in self._job_acked:
            try:
                method(ctx)
            except Exception:
                _failed(method)

    def job_nacked(self, ctx: JobCtx, dead_lettered: bool) -> None:
        for method in self._job_nacked:
            try:
                method(ctx, dead_lettered)
            except Exception:
                _failed(method)

    def job_unhandled(self, ctx: JobCtx) -> None:
        for method in self._job_unhandled:
            try:
                method(ctx)
            except Exception:
                _failed(method)

    def job_finished(self, ctx: JobCtx) -> None:
        for method in self._job_finished:
            try:
                method(ctx)
            except Exception:
                _failed(method)

    def lease_extended(self, ctx: JobCtx, outcome: str) -> None:
        for method in self._lease_extended:
            try:
                method(ctx, outcome)
            except Exception:
                _failed(method)
