"""Worker: the reserve -> handle -> ack/nack loop, with sepp-py 0.1.0's API.

One reserve long poll at a time, only while there is room (``max_in_flight``); one task
per job, owned by ``run()``; at most one ack or nack per delivery, none once its lease
was released (lost, or settled by the handler itself); an optional lease keeper beside
each handler; a graceful drain on shutdown, optionally bounded; a reserve refusal no
retry can fix ends ``run()`` with that error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import socket
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, TypeVar, Union

from sepp_lite import _log, _otel, _otel_metrics, _validate
from sepp_lite._clock import Clock, TimerHandle, WallClock
from sepp_lite._handlers import (
    HandlerThreads,
    RegisteredHandler,
    check_handler,
    thread_count,
)
from sepp_lite._lease import Lease
from sepp_lite._observe import WorkerEvents, WorkerObserver
from sepp_lite._reach import StartOptions, Stopped, clamped, error_text, start_info
from sepp_lite._retry import (
    DEFAULT_RESERVE_ERROR_BACKOFF,
    DEFAULT_WAIT_FOR_SERVER,
    EARLY_EMPTY_PAUSE_S,
    EARLY_EMPTY_S,
    is_permanent,
)
from sepp_lite._taskset import TaskSet
from sepp_lite._time import Duration, as_timedelta, seconds_text
from sepp_lite.client import SeppClient
from sepp_lite.errors import (
    AttemptMismatchError,
    ClientError,
    JobNotFoundError,
    LeaseError,
    SeppError,
    Status,
    TransportError,
)
from sepp_lite.shutdown import ShutdownHandle
from sepp_lite.types import (
    Job,
    JobCtx,
    Payload,
    ReserveOptions,
    RetryDirective,
    checked_reserve_options,
)

if TYPE_CHECKING:
    from sepp_lite.types import QueueNames

__all__ = ["DuplicateHandlerError", "Handler", "HandlerError", "ShutdownHandle", "Worker"]

logger = _log.logger()
_enter_job = _log.CURRENT_JOB.set

Handler = Callable[[Optional[Payload], JobCtx], Union[Awaitable[None], None]]
"""``async def handler(payload, ctx) -> None``: return to ack, raise to nack. A plain
``def handler(payload, ctx) -> None`` runs in one of the Worker's threads."""

T = TypeVar("T")
H = TypeVar("H", bound=Handler)

# In run(until_idle=True), how long each reserve waits before reporting the queues empty.
_IDLE_WAIT_S = 0.5
# After shutdown cancels handlers (shutdown_timeout, or run() cancelled), how long to
# wait for them to stop; then how long each hand-back (a nack) may still take.
_CANCEL_GRACE_S = 1.0
_HAND_BACK_S = 2.0  # a nack's bound at shutdown: ms on a healthy link, seconds on a stalled machine
_HAND_BACK = RetryDirective.after(0)  # ready at once, whatever the queue's retry policy
_UNHANDLED_REASON = "no handler registered for job_type"
DEFAULT_UNKNOWN_TYPE_DELAY = timedelta(minutes=5)
"""How long a job of a type the worker has no handler for waits before its second
attempt; each further attempt waits twice as long as the one before."""
# The longest such a wait grows to (the server also caps it at its schedule horizon).
_UNKNOWN_DELAY_MAX_S = 86400.0
# At most one ERROR line per queue and unknown job type this often.
_UNKNOWN_REPORT_S = 60.0
# A nack reason longer than this is cut (an exception's text can be megabytes).
_REASON_LIMIT = 4096


def _unknown_type_delay(value: Duration) -> float:
    """``unknown_type_delay`` in seconds: a ``timedelta`` or seconds, 0 or more."""
    return as_timedelta(value, "unknown_type_delay").total_seconds()


def _retry_delay(error: SeppError, backoff: float) -> float:
    """How long to wait after ``error`` before the next call: the worker's own
    backoff, or longer while the client waits out its reconnect backoff (a call
    before then would fail at once)."""
    after = error.retry_after if isinstance(error, ClientError) else None
    return backoff if after is None else max(backoff, after)


def _attempts(ctx: JobCtx) -> str:
    """``attempt 2/3`` (``attempt 2`` when the server did not say the maximum)."""
    if ctx.max_attempts:
        return f"attempt {ctx.attempt}/{ctx.max_attempts}"
    return f"attempt {ctx.attempt}"


class HandlerError(Exception):
    """Raise it from a handler to nack the job in a chosen way (it is deliberately not a
    :class:`~sepp_lite.errors.SeppError`). Use the constructors below."""

    def __init__(self, reason: str, directive: RetryDirective) -> None:
        self.reason = reason
        self.directive = directive
        super().__init__(reason)

    @classmethod
    def retry(cls, reason: str) -> HandlerError:
        """Retry under the queue's retry policy."""
        return cls(reason, RetryDirective.DEFAULT)

    @classmethod
    def retry_after(cls, reason: str, delay: Duration) -> HandlerError:
        """Retry no sooner than ``delay`` (``timedelta`` or seconds) from now."""
        return cls(reason, RetryDirective.after(delay))

    @classmethod
    def permanent(cls, reason: str) -> HandlerError:
        """Give up: dead-letter the job now."""
        return cls(reason, RetryDirective.dead_letter())


class DuplicateHandlerError(SeppError):
    """A second handler registered with :meth:`Worker.handle` for the same job type."""

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type
        super().__init__(f"a handler for job_type {job_type!r} is already registered")


class _Run:
    """One delivery being processed: the flags that decide whether it may be settled."""

    __slots__ = ("began", "given_up", "job", "lease_lost", "owner", "pending", "settling", "task")

    def __init__(self, job: Job, owner: TaskSet) -> None:
        self.job = job
        self.owner = owner  # the TaskSet that runs the job's task
        self.task: asyncio.Task[None] | None = None
        self.lease_lost = False
        self.settling = False  # its ack or nack is under way
        self.began = False  # its handler was called
        # Its call waiting for one of the worker's threads (run_in_thread), if any.
        self.pending: concurrent.futures.Future[Any] | None = None
        # Why shutdown gave up on it (it goes back to its queue), or None.
        self.given_up: str | None = None

    def submitted(self, call: concurrent.futures.Future[Any]) -> None:
        """Its handler's call waits for one of the worker's threads (or runs in it)."""
        self.pending = call

    def stop_handler(self) -> None:
        """Cancel the handler: it runs in the job's task, whose ``_handle`` turns this
        cancellation (the run given up on or its lease lost first) into ``_STOPPED``."""
        if self.task is not None:
            self.owner.stop(self.task)


class _Unhandled:
    """A job type without a handler on one queue: when its ERROR line was last logged,
    and how many of its jobs came since."""

    __slots__ = ("logged_at", "since")

    def __init__(self) -> None:
        self.logged_at = 0.0
        self.since = 0


_STOPPED = object()  # the verdict of a run whose lease was lost or that was given up on


def _released(ctx: JobCtx) -> bool:
    lease = ctx.lease
    return lease is not None and lease.released


def _last_attempt(ctx: JobCtx) -> bool:
    """Whether a nack would dead-letter this delivery (also when the server did not
    say the maximum)."""
    return not ctx.max_attempts or ctx.attempt >= ctx.max_attempts


async def _shielded(call: Awaitable[T], seconds: float) -> T:
    """``await call`` for at most ``seconds`` (then ``asyncio.TimeoutError``), and to
    its end even when the caller is cancelled meanwhile: a nack cut off half-way leaves
    the job's fate unknown. The caller's cancellation propagates once the call ended
    (a second one stops waiting for it)."""
    task = asyncio.ensure_future(asyncio.wait_for(call, seconds))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_outcome_seen)
        await asyncio.wait({task})
        raise


def _outcome_seen(task: asyncio.Future[Any]) -> None:
    # Nobody awaits it any more: its exception is not "never retrieved".
    if not task.cancelled():
        task.exception()


def _unavailable(message: str) -> TransportError:
    """The error of a worker that gave up waiting for its server."""
    gave_up = TransportError(message)
    gave_up.code = Status.UNAVAILABLE
    return gave_up


def _nack_of(outcome: BaseException) -> tuple[RetryDirective, str]:
    """The nack a handler's failure asks for: its directive, and the reason recorded."""
    if isinstance(outcome, HandlerError):
        return outcome.directive, outcome.reason[:_REASON_LIMIT]
    reason = f"handler raised {type(outcome).__name__}: {outcome}"
    return RetryDirective.DEFAULT, reason[:_REASON_LIMIT]


def _what_failed(outcome: BaseException) -> tuple[str, BaseException | None]:
    """A failed attempt in words (what the handler raised, with its message), and the
    exception whose traceback shows where it failed: the exception itself; none for a
    :class:`HandlerError` raised on purpose; for one raised ``from`` another exception
    (typed tasks do so for a backoff's retry and for a timeout), that exception, its
    reason being the words."""
    if not isinstance(outcome, HandlerError):
        return _nack_of(outcome)[1], outcome
    if outcome.__cause__ is None:
        return f"handler raised {type(outcome).__name__}: {outcome.reason}"[:_REASON_LIMIT], None
    return outcome.reason[:_REASON_LIMIT], outcome.__cause__


def _next_attempt(directive: RetryDirective) -> str:
    if directive.delay is None:
        # The queue's own policy decides; its delay is the server's, not told to us.
        return "next attempt after the queue's retry delay"
    delay = timedelta(milliseconds=round(directive.delay.total_seconds() * 1000))
    return f"next attempt in {seconds_text(delay)}"


def _traceback_of(error: BaseException | None) -> BaseException | None:
    """``error`` when it has a traceback to show (one made but never raised has none)."""
    return error if error is not None and error.__traceback__ is not None else None


def _log_nacked(
    ctx: JobCtx, outcome: BaseException, directive: RetryDirective, reason: str, dead: bool
) -> None:
    """The one record of a failed attempt, once the server has answered its nack. A
    retry is a WARNING without the traceback (a DEBUG logger gets it too); the end of
    the job is :func:`_log_dead_letter`'s, with the traceback when an exception the
    handler did not plan for ended its last attempt."""
    what, error = _what_failed(outcome)
    if dead:
        _log_dead_letter(ctx, directive, reason, error)
        return
    logger.warning(
        "job %s (type %r, %s): %s; %s",
        ctx.id,
        ctx.job_type,
        _attempts(ctx),
        what,
        _next_attempt(directive),
        exc_info=_traceback_of(error) if logger.isEnabledFor(logging.DEBUG) else None,
    )


def _unsent(outcome: BaseException | None) -> str:
    """What a nack that failed was to report (its attempt is logged nowhere else)."""
    return "" if outcome is None else f"; the attempt had failed: {_what_failed(outcome)[0]}"


def _log_dead_letter(
    ctx: JobCtx, directive: RetryDirective, reason: str, error: BaseException | None = None
) -> None:
    """The one record of a job this worker's nack sent to the dead letters: a WARNING,
    or an ERROR with ``error``'s traceback when an exception caused it."""
    if directive.kind == "dead_letter":
        why = "a permanent failure (HandlerError.permanent), not retried"
    else:
        why = "its attempts are used up"
    log = logger.warning if error is None else logger.error
    log(
        "job %s dead-lettered: type %r, queue %r, %s; %s; cause: %s",
        ctx.id,
        ctx.job_type,
        ctx.queue,
        _attempts(ctx),
        why,
        reason,
        exc_info=_traceback_of(error),
    )


def default_worker_id() -> str:
    """``<hostname>-<pid>-<8 hex chars>``, as the official clients make it."""
    try:
        host = socket.gethostname() or "unknown"
    except OSError:
        host = "unknown"
    return f"{host}-{os.getpid()}-{os.urandom(4).hex()}"


class Worker:
    """Runs handlers for the jobs of ``queues`` (polled in order) on a
    :class:`~sepp_lite.client.SeppClient`.

    Register one handler per job type with :meth:`handle` or ``@worker.handler(...)``
    (and optionally :meth:`catch_all`), then ``await run()``; ``queues`` is a list of
    names (a ``str`` raises ``TypeError``). A handler is an ``async def (payload,
    ctx)``, or a plain ``def (payload, ctx)``, which runs in one of the worker's
    ``sync_threads`` threads (default min(32, max_in_flight), started on the first such
    job); anything else raises ``TypeError`` when registered. A handler returning acks
    the job; :class:`HandlerError` nacks it as chosen; any other exception nacks it for
    the queue's retry (docs/logging.md says what is logged).

    A job of a type without a handler (and no catch-all) is handed back to wait for a
    worker that has one: nacked to wait ``unknown_type_delay`` (default 5 min) before its
    second attempt, twice that before its third, and so on (up to a day, and the
    server's ``max_schedule_horizon``), so that with the default ``max_attempts`` of 3
    it outlives 15 minutes of workers that lack its handler (a rolling deploy, a
    tasks module the worker forgot to import). Its last attempt's nack dead-letters
    it. An ERROR line names the type, its queue and the types this worker handles,
    at most once a minute per type and queue.

    ``max_in_flight`` bounds concurrent handlers; reserve asks for at most the free
    capacity (and ``max_jobs``). With ``auto_extend`` (or ``auto_extend_interval``) a
    lease keeper extends each job's lease at a third of the time the server granted;
    if the lease is lost the handler is cancelled and the job is neither acked nor
    nacked. Beware: auto-extend keeps a hung handler's job leased forever; bound your
    handlers' work. At start the worker reads the server's limits (GetServerInfo) and
    clamps ``max_jobs``, the lease and the wait to them, logging what it changed. While
    the server cannot be reached at start, it tries again for up to
    ``wait_for_server`` (default 60 s; 0 fails at once), one log line per attempt.

    Shutdown (:meth:`shutdown_handle`) stops reserving, hands the jobs whose handlers
    have not begun back to their queues, and waits for the others; with
    ``shutdown_timeout`` it extends their leases once, waits that long, then cancels
    the remaining handlers and hands their jobs back. Cancelling ``run()`` cancels
    every handler at once and hands every job back. Handing back is a nack with no
    delay: the job is ready at once for another worker, its attempt counted as a lease
    expiry would count it. A job on its last attempt is not handed back (the nack
    would dead-letter it): one not begun yet still runs in a graceful drain, one whose
    handler was cancelled is left to its lease. A job whose lease was lost, or that its
    handler settled itself, is not touched.

    Observers (:meth:`add_observer`, a :class:`~sepp_lite.WorkerObserver`) are told
    what the worker does: jobs started, handled, settled; reserves; lease extensions.
    """

    def __init__(
        self,
        client: SeppClient,
        queues: QueueNames,
        lease_duration: Duration,
        *,
        wait_timeout: Duration | None = None,
        max_jobs: int | None = None,
        max_in_flight: int = 16,
        reserve_error_backoff: Duration = DEFAULT_RESERVE_ERROR_BACKOFF,
        auto_extend: bool = False,
        auto_extend_interval: Duration | None = None,
        worker_id: str | None = None,
        shutdown_timeout: Duration | None = None,
        sync_threads: int | None = None,
        wait_for_server: Duration = DEFAULT_WAIT_FOR_SERVER,
        unknown_type_delay: Duration = DEFAULT_UNKNOWN_TYPE_DELAY,
    ) -> None:
        if isinstance(queues, str):
            raise TypeError(
                f"Worker(): queues must be a list of queue names, not the str {queues!r} "
                f"(write [{queues!r}] for one queue)"
            )
        # Each reserve option checked once, here, in this order; a zero wait is refused
        # (a busy loop), which ReserveOptions allows.
        worker_id = default_worker_id() if worker_id is None else worker_id
        wait = None
        if wait_timeout is not None:
            wait = as_timedelta(wait_timeout, "wait_timeout", positive=True)
        lease = as_timedelta(lease_duration, "lease_duration", positive=True)
        names = _validate.queue_names(queues)
        _validate.worker_id(worker_id)
        _validate.max_jobs(max_jobs)
        self._opts = checked_reserve_options(names, lease, wait, worker_id, max_jobs)
        # What each poll sends, by (max_jobs, until_idle): built once, so that a poll
        # neither checks nor encodes its options again.
        self._poll_options: dict[tuple[int, bool], ReserveOptions] = {}
        self._client = client
        self._handlers: dict[str, RegisteredHandler] = {}
        self._catch_all: RegisteredHandler | None = None
        self._max_in_flight = max(1, int(max_in_flight))
        self._threads = HandlerThreads(
            thread_count(sync_threads, self._max_in_flight), f"sepp-worker-{self.worker_id}"
        )
        self._wait_for_server = as_timedelta(wait_for_server, "wait_for_server").total_seconds()
        self._unknown_delay = _unknown_type_delay(unknown_type_delay)
        self._unknown_delay_cap = _UNKNOWN_DELAY_MAX_S  # lowered to the server's horizon
        self._error_backoff = as_timedelta(
            reserve_error_backoff, "reserve_error_backoff"
        ).total_seconds()
        self._auto_extend = auto_extend or auto_extend_interval is not None
        self._extend_every_ms: int | None = None
        # Lease extensions under way; each job's keeper cancels its own when it stops.
        self._extensions = TaskSet("lease extension")
        if auto_extend_interval is not None:
            interval = as_timedelta(auto_extend_interval, "auto_extend_interval")
            self._extend_every_ms = max(round(interval.total_seconds() * 1000), 1)
        # The clock leases are kept by (the keeper's timers, a lease's known expiry): the
        # wall clock, or in a test the in-process server's ManualClock.
        self._clock: Clock = WallClock()
        self._shutdown_timeout: float | None = None
        if shutdown_timeout is not None:
            bound = as_timedelta(shutdown_timeout, "shutdown_timeout")
            self._shutdown_timeout = bound.total_seconds()
        self._shutdown = ShutdownHandle()
        self._events = WorkerEvents(_otel_metrics.default_observers())
        self._keeping = self._keeper_terms()
        self._in_flight = 0
        self._active: set[_Run] = set()
        self._unhandled: dict[tuple[str, str], _Unhandled] = {}  # by (queue, job type)
        self._running = False
        self._fatal: SeppError | None = None  # the permanent reserve error run() raises

    # -- registration -----------------------------------------------------------------

    def handle(self, job_type: str, handler: Handler) -> Worker:
        """Register ``handler`` for ``job_type``; raise :class:`DuplicateHandlerError` if
        one is registered already, and ``TypeError`` (naming the handler) when it
        cannot be called as ``handler(payload, ctx)``: an ``async def`` or an object
        with an ``async def __call__`` runs on the event loop, a plain ``def`` in one of
        the worker's threads (``sync_threads``). Returns the worker (for chaining)."""
        self._register(job_type, handler, "handle")
        return self

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Decorator form of :meth:`handle` (it returns the function unchanged)."""

        def register(fn: H) -> H:
            self._register(job_type, fn, "handler")
            return fn

        return register

    def _register(self, job_type: str, handler: Handler, how: str) -> None:
        checked = self._checked(job_type, handler, how)
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = checked

    @staticmethod
    def _checked(job_type: str, handler: Handler, how: str) -> RegisteredHandler:
        if not isinstance(job_type, str) or not job_type:
            raise TypeError(f"Worker.{how}(): job_type must be a non-empty str, got {job_type!r}")
        return check_handler(handler, f"Worker.{how}({job_type!r})")

    def replace_handler(self, job_type: str, handler: Handler) -> Worker:
        """Register ``handler`` for ``job_type``, replacing any existing one (checked
        as :meth:`handle` does)."""
        self._handlers[job_type] = self._checked(job_type, handler, "replace_handler")
        return self

    def remove_handler(self, job_type: str) -> Worker:
        """Unregister the handler of ``job_type`` (no error if there is none)."""
        self._handlers.pop(job_type, None)
        return self

    def catch_all(self, handler: H) -> H:
        """Use ``handler`` for job types without their own (replacing an earlier one);
        returns it, so it also works as a decorator. Checked as :meth:`handle` does."""
        self._catch_all = check_handler(handler, "Worker.catch_all()")
        return handler

    def shutdown_handle(self) -> ShutdownHandle:
        """The handle that stops this worker (shareable, e.g. with a signal handler)."""
        return self._shutdown

    def add_observer(self, observer: WorkerObserver) -> None:
        """Report this worker's events to ``observer`` too (a
        :class:`~sepp_lite.WorkerObserver`), after the observers added before it. It may
        be added (and removed) while the worker runs."""
        self._events.attach(observer)

    def remove_observer(self, observer: WorkerObserver) -> None:
        """Stop reporting to ``observer`` (nothing happens if it was not added)."""
        self._events.detach(observer)

    @property
    def observers(self) -> tuple[WorkerObserver, ...]:
        """The observers this worker reports to, in order: with ``opentelemetry-api``
        installed, its OpenTelemetry instruments first, then those added."""
        return self._events.observers

    @property
    def client(self) -> SeppClient:
        """The client this worker reserves and settles jobs with."""
        return self._client

    @property
    def queues(self) -> list[str]:
        """The queues this worker polls, in order."""
        return list(self._opts.queues)

    @property
    def worker_id(self) -> str:
        """The id sent with every reserve, ack, nack and extend."""
        return self._opts.worker_id or ""

    @property
    def wait_for_server(self) -> float:
        """Seconds :meth:`run` keeps trying to reach a server it cannot reach at start
        (settable: a ``timedelta`` or seconds, 0 to fail at once)."""
        return self._wait_for_server

    @wait_for_server.setter
    def wait_for_server(self, value: Duration) -> None:
        self._wait_for_server = as_timedelta(value, "wait_for_server").total_seconds()

    @property
    def unknown_type_delay(self) -> float:
        """Seconds a job of a type without a handler waits before its second attempt,
        doubled for each further one (settable: a ``timedelta`` or seconds; 0 hands
        such jobs back at once)."""
        return self._unknown_delay

    @unknown_type_delay.setter
    def unknown_type_delay(self, value: Duration) -> None:
        self._unknown_delay = _unknown_type_delay(value)

    @property
    def in_flight(self) -> int:
        """How many jobs are being processed now."""
        return self._in_flight

    # -- running ----------------------------------------------------------------------

    async def run(self, *, until_idle: bool = False) -> None:
        """Process jobs until :meth:`ShutdownHandle.shutdown`, then drain and return.

        With ``until_idle=True`` it also returns as soon as a reserve comes back empty
        while this worker has nothing in flight (each reserve then waits at most 0.5 s):
        handy for tests, scripts and batch jobs. Idle means only what a reserve can see:
        no job *ready* in the worker's queues. Jobs scheduled for later are not ready,
        so it returns while they wait: jobs enqueued with ``scheduled_at``, and jobs
        nacked with a delay (``HandlerError.retry_after``, a queue's retry backoff, the
        backoff for job types without a handler). So are jobs leased to other workers.
        On the in-process server, ``sepp_lite.testing.run_until_drained(worker,
        server)`` runs until nothing is ready, in flight or scheduled either.

        A reserve refused in a way no retry can fix (:class:`~sepp_lite.errors.
        UnauthenticatedError` for UNAUTHENTICATED or PERMISSION_DENIED,
        :class:`~sepp_lite.errors.InvalidRequestError`, or
        :class:`~sepp_lite.errors.UnknownQueuesError` from a strict server) stops the
        worker: it finishes the jobs in flight, then raises that error; the same
        refusal of the GetServerInfo call at start raises at once. A server that
        cannot be reached at start is tried again for ``wait_for_server``, then
        :class:`~sepp_lite.errors.TransportError` is raised. Once started, other reserve
        errors (an unreachable or overloaded server) are logged and retried without
        end, after ``reserve_error_backoff`` or, while the client waits out its
        reconnect backoff, when it will connect again.
        """
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._events.run_started()
        error: BaseException | None = None
        try:
            await self._apply_server_limits()
            self._keeping = self._keeper_terms()  # the lease as clamped
            await self._run(until_idle)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._running = False
            self._threads.close()
            self._events.run_finished(error)

    async def _run(self, until_idle: bool) -> None:
        permits = asyncio.Semaphore(self._max_in_flight)
        jobs = TaskSet("job")
        self._log_start()
        try:
            while not self._shutdown.is_shutdown:
                if not await self._poll(permits, jobs, until_idle):
                    break
            logger.info("worker %s draining %d in-flight job(s)", self.worker_id, len(jobs))
            await self._drain(jobs)
        except asyncio.CancelledError:
            # A hard stop (also during the drain: a second signal): every handler is
            # cancelled and every job handed back. A handler may swallow its
            # cancellation and return: that is no ack either.
            self._give_up("the worker was stopped")
            await self._reap(jobs)
            raise
        logger.info("worker %s stopped", self.worker_id)
        fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise fatal

    def _log_start(self) -> None:
        handlers = list(self._handlers.values())
        types = ",".join(self._handlers) or "none"
        if self._catch_all is not None:
            types += " (+ catch-all)"
            handlers.append(self._catch_all)
        threads = ""
        if any(handler.threaded for handler in handlers):
            threads = f" sync_threads={self._threads.count}"
        logger.info(
            "worker %s started: queues=%s job types=%s max_in_flight=%d%s auto_extend=%s",
            self.worker_id,
            ",".join(self._opts.queues),
            types,
            self._max_in_flight,
            threads,
            self._auto_extend,
        )
        if not handlers:
            logger.warning(
                "worker %s has no handlers: every job it reserves goes back to wait for a "
                "worker that has its handler (register them with @worker.handler(job_type) "
                "before run())",
                self.worker_id,
            )

    async def _race(self, awaitable: Awaitable[T]) -> tuple[T | None, bool]:
        """Await ``awaitable`` against shutdown: ``(result, False)`` when it finished
        (its exception propagates), ``(None, True)`` when shutdown came first (it is
        cancelled). When both finish in the same step the result wins: jobs a reserve
        returned just as shutdown came are leased to us, so they must not be dropped (the
        drain hands them back)."""
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._shutdown.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            stop.cancel()
            await asyncio.gather(work, stop, return_exceptions=True)
            raise
        loser = stop if work.done() else work
        loser.cancel()
        await asyncio.gather(loser, return_exceptions=True)
        if work.done() and not work.cancelled():
            return work.result(), False
        return None, True

    async def _poll(self, permits: asyncio.Semaphore, jobs: TaskSet, until_idle: bool) -> bool:
        """One reserve round; False when the loop should end."""
        if permits.locked():
            _, stopped = await self._race(permits.acquire())
            if stopped:
                return False
        else:
            await permits.acquire()
        capacity = max(1, self._max_in_flight - self._in_flight)
        limit = capacity if self._opts.max_jobs is None else min(self._opts.max_jobs, capacity)
        started = time.monotonic()
        try:
            reserved, stopped = await self._race(self._reserve(limit, until_idle))
        except SeppError as error:
            permits.release()
            self._events.reserve_failed(error)
            if is_permanent(error):
                # The caller reports the refusal itself, once: this line only explains
                # the drain that comes first.
                logger.info(
                    "worker %s stops reserving: the server refused in a way no retry can "
                    "fix, and run() raises that once the jobs in flight are done",
                    self.worker_id,
                )
                self._fatal = error
                return False
            delay = _retry_delay(error, self._error_backoff)
            logger.warning("reserve failed: %s; retrying in %.3g s", error_text(error), delay)
            return not (await self._race(asyncio.sleep(delay)))[1]
        if not reserved:
            permits.release()
            if not stopped:
                self._events.reserve_completed(empty=True)
            if stopped or (until_idle and self._in_flight == 0):
                return False
            early = min(EARLY_EMPTY_S, self._opts.wait_timeout.total_seconds() / 2)
            if time.monotonic() - started < early:
                return not (await self._race(asyncio.sleep(EARLY_EMPTY_PAUSE_S)))[1]
            return True
        self._events.reserve_completed(empty=False)
        self._start(reserved[0], permits, jobs)  # the first job takes the permit we hold
        for job in reserved[1:]:
            await permits.acquire()  # immediate: we asked for no more than the free room
            self._start(job, permits, jobs)
        return True

    async def _reserve(self, limit: int, until_idle: bool) -> list[Job] | None:
        opts = self._poll_options.get((limit, until_idle))
        if opts is None:
            opts = self._poll_options[limit, until_idle] = self._options_for(limit, until_idle)
        return await self._client.reserve(opts)

    def _options_for(self, limit: int, until_idle: bool) -> ReserveOptions:
        # A copy asking for no more than the free room; self._opts keeps the user's max_jobs.
        # Its values are checked already, but for the count: max_in_flight has no upper
        # bound of its own (checked here once per count, not per poll).
        _validate.max_jobs(limit)
        base = self._opts
        wait = base.wait_timeout
        if until_idle and wait.total_seconds() > _IDLE_WAIT_S:
            wait = timedelta(seconds=_IDLE_WAIT_S)
        return checked_reserve_options(
            base.queues, base.lease_duration, wait, base.worker_id, limit
        )

    def _start(self, job: Job, permits: asyncio.Semaphore, jobs: TaskSet) -> None:
        run = _Run(job, jobs)
        self._active.add(run)
        self._in_flight += 1
        self._events.job_started(job.ctx)

        def finished(_: asyncio.Task[None]) -> None:
            self._active.discard(run)
            self._in_flight -= 1
            self._events.job_finished(job.ctx)
            permits.release()

        # Without OpenTelemetry in use the task runs _execute itself: a coroutine less
        # per job, and one frame less that each of its steps passes through.
        untraced = not _otel.AVAILABLE or _otel.unused()
        work = self._execute(run, None) if untraced else self._traced(run)
        run.task = jobs.spawn(work, finished)

    # -- one job ----------------------------------------------------------------------

    async def _traced(self, run: _Run) -> None:
        ctx = run.job.ctx
        with _otel.consumer_span(ctx.id, ctx.job_type, ctx.attempt, ctx.trace_context) as span:
            await self._execute(run, span)

    async def _execute(self, run: _Run, span: Any) -> None:
        ctx = run.job.ctx
        _enter_job(ctx)  # this task's own context: what it logs names the job
        handler = self._handler_of(ctx)
        if handler is None:
            await self._nack_unhandled(ctx)
            return
        if run.given_up is not None:  # shutdown came before its handler began
            await self._hand_back(run)
            return
        started = time.monotonic()
        if self._auto_extend:
            outcome = await self._handle_with_keeper(run, handler)
        else:
            outcome = await self._handle(run, handler)
        self._events.job_handled(ctx, time.monotonic() - started)
        if run.lease_lost:
            # Another delivery may own the job now: settling it could ack someone
            # else's work, so the lease is left to lapse instead. The lease keeper
            # logged the loss when it found it.
            _otel.mark_error(span, "not settled: its lease was lost")
            return
        if _released(ctx):
            # The handler settled the job itself (client.ack/nack on its ctx): a second
            # settle would only meet NOT_FOUND, or worse, another delivery's lease.
            logger.debug("job %s: already settled by its handler", ctx.id)
            return
        if run.given_up is not None:
            _otel.mark_error(span, f"handed back: {run.given_up}")
            await self._hand_back(run)
            return
        if outcome is not None:
            _otel.mark_error(span, outcome)  # type: ignore[arg-type]
        run.settling = True
        await self._settle(ctx, outcome)  # type: ignore[arg-type]

    def _handler_of(self, ctx: JobCtx) -> RegisteredHandler | None:
        return self._handlers.get(ctx.job_type) or self._catch_all

    async def _hand_back(self, run: _Run) -> None:
        """Give a job that shutdown gave up on back to its queue at once (a nack with
        no delay), rather than leave it to its lease. Not on its last attempt, where
        the nack would dead-letter it: the lease's expiry does that too, but later, and
        as what it is (``LEASE_EXPIRED``)."""
        ctx, why = run.job.ctx, str(run.given_up)
        if _last_attempt(ctx):
            logger.warning(
                "job %s (type %r, %s): %s; left to its lease, not handed back, as on its "
                "last attempt that would dead-letter it",
                ctx.id,
                ctx.job_type,
                _attempts(ctx),
                why,
            )
            return
        lease = ctx.lease
        if lease is not None and self._keeping.clock.now_ms() >= lease.known_expiry_ms:
            # The server has taken it back already (its nack would meet NOT_FOUND, or a
            # newer attempt's lease).
            logger.info("job %s not handed back: its lease has expired", ctx.id)
            return
        run.settling = True
        try:
            nack = self._client.nack(ctx, _HAND_BACK, f"handed back: {why}")
            dead = await _shielded(nack, _HAND_BACK_S)
        except LeaseError as error:
            logger.info("job %s not handed back: its lease is gone already (%s)", ctx.id, error)
            return
        except (SeppError, asyncio.TimeoutError) as error:
            logger.warning(
                "job %s not handed back (%s); it is redelivered when its lease expires",
                ctx.id,
                str(error) or f"no answer within {_HAND_BACK_S:g} s",
            )
            return
        logger.debug(
            "job %s (type %r, %s) handed back: %s", ctx.id, ctx.job_type, _attempts(ctx), why
        )
        if dead:  # the server's max_attempts is lower than the job said
            _log_dead_letter(ctx, _HAND_BACK, f"handed back: {why}")

    async def _handle(self, run: _Run, handler: RegisteredHandler) -> object:
        """Run the handler in this task (a plain def in a thread, awaited here); its
        outcome: None, the exception, or _STOPPED."""
        job = run.job
        run.began = True
        try:
            if handler.threaded:
                await self._in_thread(handler, run)
            else:
                await handler.fn(job.payload, job.ctx)
        except asyncio.CancelledError:
            if run.given_up is not None or run.lease_lost:
                return _STOPPED  # our own cancellation; the caller's must propagate
            raise
        except Exception as exc:
            return exc
        return None

    async def _in_thread(self, handler: RegisteredHandler, run: _Run) -> None:
        job = run.job
        name = f"job {job.ctx.id}: its handler {handler.name}"
        result = await self._threads.call(handler.fn, (job.payload, job.ctx), name, run.submitted)
        if inspect.isawaitable(result):
            # A plain def that returned an awaitable (a sync wrapper around an async
            # function): awaited here, once, on the event loop.
            await result

    async def run_in_thread(self, fn: Callable[..., T], *args: Any, name: str = "") -> T:
        """Run ``fn(*args)`` in one of this worker's threads (``sync_threads``, the
        pool plain-def handlers run in), in a copy of the calling task's context (its
        tracing span), and wait for it; typed tasks written as a plain ``def`` run
        this way. A thread cannot be cancelled: a cancellation that comes while it
        runs waits for it to return (so the job keeps its slot in max_in_flight until
        then), then propagates; one that comes while it still waits for a free thread
        stops it from starting, and so does a shutdown that hands its job back (see
        :class:`Worker`). ``name`` names ``fn`` in the warning about that wait."""
        run = self._run_of(asyncio.current_task())
        return await self._threads.call(fn, args, name, None if run is None else run.submitted)

    def _run_of(self, task: asyncio.Task[Any] | None) -> _Run | None:
        """The job that ``task`` runs, if it is one of this worker's job tasks. Looked
        up rather than kept per job: only a typed task's thread call needs it."""
        for run in self._active:
            if run.task is task:
                return run
        return None

    async def _handle_with_keeper(self, run: _Run, handler: RegisteredHandler) -> object:
        """Run the handler (in this task) with a lease keeper beside it."""
        lease = run.job.ctx.lease
        if lease is None:
            return await self._handle(run, handler)
        keeper = _LeaseKeeper(run, lease, self._keeping)
        try:
            return await self._handle(run, handler)
        finally:
            keeper.stop()

    def _keeper_terms(self) -> _Keeping:
        return _Keeping(
            self._opts.lease_duration,
            self._extend_every_ms,
            self._clock,
            self._extensions,
            self._events,
        )

    async def _settle(self, ctx: JobCtx, outcome: BaseException | None) -> None:
        """Exactly one ack or nack for this delivery; failures are logged, never raised."""
        client = self._client
        try:
            if outcome is None:
                await client.ack(ctx)
                self._events.job_acked(ctx)
                return
            directive, reason = _nack_of(outcome)
            dead = await client.nack(ctx, directive, reason)
            self._events.job_nacked(ctx, dead)
        except LeaseError as error:
            logger.error(
                "job %s: %s (the lease lapsed and the job went back to the queue, or a retried "
                "call had already settled it)%s",
                ctx.id,
                error,
                _unsent(outcome),
            )
            return
        except SeppError as error:
            logger.error(
                "job %s: %s failed (%s); it will be redelivered%s",
                ctx.id,
                "ack" if outcome is None else "nack",
                error,
                _unsent(outcome),
            )
            return
        _log_nacked(ctx, outcome, directive, reason, dead)

    async def _nack_unhandled(self, ctx: JobCtx) -> None:
        """Hand a job of a type without a handler back, to wait for a worker that has
        one: the longer, the more attempts it has had."""
        delay = self._unknown_delay * 2 ** min(max(ctx.attempt - 1, 0), 32)
        delay = min(delay, self._unknown_delay_cap)
        self._report_unhandled(ctx, delay)
        self._events.job_unhandled(ctx)
        directive = RetryDirective.after(delay)
        try:
            if await self._client.nack(ctx, directive, _UNHANDLED_REASON):
                _log_dead_letter(ctx, directive, _UNHANDLED_REASON)
        except SeppError as error:
            logger.warning("job %s: nack of an unhandled job type failed: %s", ctx.id, error)

    def _report_unhandled(self, ctx: JobCtx, delay: float) -> None:
        """The ERROR line of a job type without a handler: at its first job, then at
        most once per ``_UNKNOWN_REPORT_S`` for each queue and type, with the count of
        its jobs since the line before."""
        now = time.monotonic()
        seen = self._unhandled.get((ctx.queue, ctx.job_type))
        if seen is None:
            seen = self._unhandled[ctx.queue, ctx.job_type] = _Unhandled()
        elif now - seen.logged_at < _UNKNOWN_REPORT_S:
            seen.since += 1
            return
        more = f"; {seen.since} more of its jobs since the last such line" if seen.since else ""
        seen.logged_at, seen.since = now, 0
        if _last_attempt(ctx):
            fate = "is on its last attempt: its nack dead-letters it"
        else:
            wait = seconds_text(timedelta(seconds=delay))
            fate = f"goes back to wait {wait} before attempt {ctx.attempt + 1}"
        logger.error(
            "no handler for job type %r on queue %r (this worker handles: %s): job %s (%s) %s%s",
            ctx.job_type,
            ctx.queue,
            ", ".join(self._handlers) or "none",
            ctx.id,
            _attempts(ctx),
            fate,
            more,
        )

    # -- start and stop ---------------------------------------------------------------

    async def _apply_server_limits(self) -> None:
        """The start-up handshake: the server's limits, waited for (``_reach``), and
        this worker's options clamped to them."""
        info = await start_info(
            self._client.get_server_info, self._wait_for_server, _unavailable, self._pause
        )
        if info is None:
            return
        start = StartOptions(self._opts, self._unknown_delay, self._unknown_delay_cap)
        opts, self._unknown_delay, self._unknown_delay_cap = clamped(start, info)
        if opts is not self._opts:
            self._opts = opts
            self._poll_options.clear()  # made from the options before the clamp

    async def _pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds; raise ``_reach.Stopped`` when shutdown comes first."""
        if (await self._race(asyncio.sleep(delay)))[1]:
            raise Stopped

    async def _drain(self, jobs: TaskSet) -> None:
        handed = self._hand_back_unstarted()
        if handed:
            logger.info(
                "worker %s hands %d job(s) whose handlers had not begun back to their queues",
                self.worker_id,
                handed,
            )
        if not len(jobs) or self._shutdown_timeout is None:
            await jobs.wait()
            return
        await self._extend_in_flight()
        if await jobs.wait(self._shutdown_timeout):
            return
        cancelled = self._give_up("shutdown timed out")
        logger.warning(
            "shutdown timeout (%.3g s) reached: cancelling %d handler(s); their jobs go back "
            "to their queues",
            self._shutdown_timeout,
            cancelled,
        )
        await self._reap(jobs)

    def _hand_back_unstarted(self) -> int:
        """As shutdown begins, give up on the jobs whose handlers have not begun (or
        wait for a thread): their tasks hand them back instead of running them. A job
        on its last attempt, which a hand-back would dead-letter, still runs. Returns
        how many were given up on."""
        count = 0
        for run in self._active:
            ctx = run.job.ctx
            if run.given_up is not None or _last_attempt(ctx) or self._handler_of(ctx) is None:
                continue
            # A thread's call that cancel() stops has not begun, and never will.
            if not run.began or (run.pending is not None and run.pending.cancel()):
                run.given_up = "shutdown began before its handler"
                count += 1
        return count

    def _give_up(self, why: str) -> int:
        """Give up on every job in flight but those being settled: cancel the handlers
        that began; each job goes back to its queue once its handler stopped (see
        :meth:`_hand_back`). Returns how many handlers were cancelled."""
        cancelled = 0
        for run in list(self._active):
            if run.settling or run.given_up is not None:
                continue
            run.given_up = why
            if run.began:
                run.stop_handler()
                cancelled += 1
        return cancelled

    async def _reap(self, jobs: TaskSet) -> None:
        """After :meth:`_give_up`: wait for the handlers to stop, then for the
        hand-backs and settles under way; report the job tasks left behind."""
        if await jobs.wait(_CANCEL_GRACE_S):
            return
        settling = {run.task for run in self._active if run.settling and run.task is not None}
        if settling:
            await asyncio.wait(settling, timeout=_HAND_BACK_S)
        if len(jobs):
            logger.error(
                "%d job task(s) ignored cancellation or are still settling; leaving them behind",
                len(jobs),
            )

    async def _extend_in_flight(self) -> None:
        """Give every in-flight job one more full lease to finish in during the drain."""

        async def extend(run: _Run) -> None:
            lease = run.job.ctx.lease
            if lease is None:
                return
            try:
                await lease.extend(self._opts.lease_duration)
                self._events.lease_extended(run.job.ctx, "extended")
            except SeppError as error:
                logger.warning(
                    "job %s: lease extension at shutdown failed: %s", run.job.ctx.id, error
                )
                self._events.lease_extended(run.job.ctx, "failed")

        holding = [
            run
            for run in self._active
            if not (run.settling or run.given_up is not None or _released(run.job.ctx))
        ]
        await asyncio.gather(*(extend(run) for run in holding))


def keep_leases_by(worker: Worker, clock: Clock) -> None:
    """Keep ``worker``'s leases by ``clock`` from its next ``run()`` on: its lease
    keeper's timers, and a lease's known expiry read against it. The wall clock unless
    the test tools set the in-process server's clock (``run_until_drained``,
    ``Tasks.worker(periodic_clock=...)``), whose leases the server expires by that clock;
    a Worker takes no clock in its signature. A running worker goes on by its clock
    until its next ``run()``."""
    worker._clock = clock


class _Keeping(NamedTuple):
    """What a lease keeper takes from its worker, handed to it rather than read off the
    Worker: the lease to extend to, how often to extend (``auto_extend_interval`` in ms,
    or None for a third of what is left), the clock it keeps time by, the task set its
    extensions run in, and where to report them."""

    lease_duration: timedelta
    every_ms: Optional[int]
    clock: Clock
    extensions: TaskSet
    events: WorkerEvents


class _LeaseKeeper:
    """Extends one job's lease while its handler runs. A timer fires a third of the way
    to the lease's known expiry (or every ``extend_every``); only then does an extension
    run, as a task of its own. Most handlers end long before that, so a job costs one
    timer here, not a task. When the lease is lost, the handler is cancelled."""

    __slots__ = ("_extending", "_lease", "_run", "_stopped", "_terms", "_timer")

    def __init__(self, run: _Run, lease: Lease, terms: _Keeping) -> None:
        self._terms = terms
        self._run = run
        self._lease = lease
        self._timer: Optional[TimerHandle] = None
        self._extending: Optional[asyncio.Task[None]] = None
        self._stopped = False
        self._schedule()

    def _schedule(self) -> None:
        clock, every_ms = self._terms.clock, self._terms.every_ms
        now = clock.now_ms()
        if every_ms is None:
            # A third of what is left of the lease the server *granted*: if it clamped the
            # lease below the request, an interval from the request would fire too late.
            every_ms = max((self._lease.known_expiry_ms - now) // 3, 1)
        self._timer = clock.call_at(now + every_ms, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._stopped or self._run.given_up is not None or self._lease.released:
            # Shutdown gave up on the job (its handler ignored that), or the handler
            # settled it already: nothing left to keep.
            return
        if self._lease.settling:
            # The handler's ack or nack is on its way: its answer decides the lease, and
            # an extension meanwhile would only meet NOT_FOUND (or keep a nacked job).
            self._again()
            return
        self._extending = self._terms.extensions.spawn(self._extend())

    def stop(self) -> None:
        """The handler ended: no more extensions (one in flight is cancelled)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._extending is not None:
            self._terms.extensions.stop(self._extending)

    async def _extend(self) -> None:
        run, lease, terms = self._run, self._lease, self._terms
        ctx = run.job.ctx
        try:
            await lease.extend(terms.lease_duration)
            terms.events.lease_extended(ctx, "extended")
            self._again()
            return
        except (AttemptMismatchError, JobNotFoundError) as error:
            if lease.released:
                return  # the handler's own ack or nack won the race with this extend
            logger.error("job %s: lease lost (%s); cancelling its handler", ctx.id, error)
        except SeppError as error:
            if terms.clock.now_ms() < lease.known_expiry_ms:
                logger.warning("job %s: lease extension failed (%s); will retry", ctx.id, error)
                terms.events.lease_extended(ctx, "failed")
                self._again()
                return
            logger.error("job %s: lease expired (%s); cancelling its handler", ctx.id, error)
        terms.events.lease_extended(ctx, "lost")
        run.lease_lost = True
        lease.mark_released()
        if not self._stopped:
            run.stop_handler()

    def _again(self) -> None:
        if not self._stopped:
            self._schedule()
