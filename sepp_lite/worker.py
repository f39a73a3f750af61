"""Worker: the reserve -> handle -> ack/nack loop, with sepp-py 0.1.0's API.

One reserve long poll at a time, only while there is room (``max_in_flight``); one task
per job, owned by ``run()``; at most one ack or nack per delivery, none once its lease
was released (lost, or settled by the handler itself); an optional lease keeper beside
each handler; a graceful drain on shutdown, optionally bounded; a reserve refusal no
retry can fix ends ``run()`` with that error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Awaitable, Iterable
from datetime import timedelta
from typing import Any, Callable, Optional, TypeVar

from sepp_lite import _otel
from sepp_lite._lease import Lease
from sepp_lite._observe import WorkerEvents, WorkerObserver
from sepp_lite._retry import (
    DEFAULT_RESERVE_ERROR_BACKOFF,
    EARLY_EMPTY_PAUSE_S,
    EARLY_EMPTY_S,
    is_permanent,
)
from sepp_lite._tasks import TaskSet
from sepp_lite._time import Duration, as_timedelta, now_ms, seconds_text
from sepp_lite.client import SeppClient
from sepp_lite.errors import (
    AttemptMismatchError,
    JobNotFoundError,
    LeaseError,
    SeppError,
)
from sepp_lite.shutdown import ShutdownHandle
from sepp_lite.types import Job, JobCtx, Payload, ReserveOptions, RetryDirective

__all__ = ["DuplicateHandlerError", "Handler", "HandlerError", "ShutdownHandle", "Worker"]

logger = _otel.logger()

Handler = Callable[[Optional[Payload], JobCtx], Awaitable[None]]
"""``async def handler(payload, ctx) -> None``: return to ack, raise to nack."""

T = TypeVar("T")

# In run(until_idle=True), how long each reserve waits before reporting the queues empty.
_IDLE_WAIT_S = 0.5
# After a bounded shutdown cancels handlers, how long to wait for them to stop.
_CANCEL_GRACE_S = 1.0
_UNHANDLED_REASON = "no handler registered for job_type"


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

    __slots__ = ("abandoned", "job", "lease_lost", "owner", "settling", "stopped", "task")

    def __init__(self, job: Job, owner: TaskSet) -> None:
        self.job = job
        self.owner = owner  # the TaskSet that runs the job's task
        self.task: asyncio.Task[None] | None = None
        self.lease_lost = False
        self.abandoned = False
        self.settling = False
        self.stopped = False  # run() was cancelled: a hard stop

    def stop_handler(self) -> None:
        """Cancel the handler: it runs in the job's task, whose ``_handle`` turns this
        cancellation (the run flagged abandoned or its lease lost first) into
        ``_STOPPED``."""
        if self.task is not None:
            self.owner.stop(self.task)


_STOPPED = object()  # the verdict of a run whose lease was lost or that was abandoned


def _unsettled_reason(run: _Run, outcome: object) -> str | None:
    """Why this delivery must not be acked or nacked, or None when it may be."""
    if run.lease_lost:
        return "its lease was lost"
    if run.stopped:
        return "the worker was stopped"
    if run.abandoned or outcome is _STOPPED:
        return "shutdown timed out"
    return None


def _released(ctx: JobCtx) -> bool:
    lease = ctx.lease
    return lease is not None and lease.released


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
    (and optionally :meth:`catch_all`), then ``await run()``. A handler returning acks
    the job; :class:`HandlerError` nacks it as chosen; any other exception nacks it for
    the queue's retry (logged with its traceback). Jobs of a type without a handler are
    nacked with a growing delay, min(2**attempt, 60) s, so a worker that lacks the
    handler does not burn their attempts.

    ``max_in_flight`` bounds concurrent handlers; reserve asks for at most the free
    capacity (and ``max_jobs``). With ``auto_extend`` (or ``auto_extend_interval``) a
    lease keeper extends each job's lease at a third of the time the server granted;
    if the lease is lost the handler is cancelled and the job is neither acked nor
    nacked. Beware: auto-extend keeps a hung handler's job leased forever; bound your
    handlers' work. At start the worker reads the server's limits (GetServerInfo) and
    clamps ``max_jobs``, the lease and the wait to them, logging what it changed.

    Shutdown (:meth:`shutdown_handle`) stops reserving and waits for the jobs in
    flight; with ``shutdown_timeout`` it extends their leases once, waits that long,
    then cancels the remaining handlers without settling them (their leases lapse and
    the server redelivers). Cancelling ``run()`` cancels everything at once.
    """

    def __init__(
        self,
        client: SeppClient,
        queues: Iterable[str],
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
    ) -> None:
        options: dict[str, Any] = {"max_jobs": max_jobs}
        options["worker_id"] = default_worker_id() if worker_id is None else worker_id
        if wait_timeout is not None:
            options["wait_timeout"] = as_timedelta(wait_timeout, "wait_timeout", positive=True)
        lease = as_timedelta(lease_duration, "lease_duration", positive=True)
        self._opts = ReserveOptions(list(queues), lease, **options)
        self._client = client
        self._handlers: dict[str, Handler] = {}
        self._catch_all: Handler | None = None
        self._max_in_flight = max(1, int(max_in_flight))
        self._error_backoff = as_timedelta(
            reserve_error_backoff, "reserve_error_backoff"
        ).total_seconds()
        self._auto_extend = auto_extend or auto_extend_interval is not None
        self._extend_every: float | None = None
        # Lease extensions under way; each job's keeper cancels its own when it stops.
        self._extensions = TaskSet("lease extension")
        if auto_extend_interval is not None:
            interval = as_timedelta(auto_extend_interval, "auto_extend_interval")
            self._extend_every = max(interval.total_seconds(), 0.001)
        self._shutdown_timeout: float | None = None
        if shutdown_timeout is not None:
            bound = as_timedelta(shutdown_timeout, "shutdown_timeout")
            self._shutdown_timeout = bound.total_seconds()
        self._shutdown = ShutdownHandle()
        self._metrics = WorkerEvents()
        self._in_flight = 0
        self._active: set[_Run] = set()
        self._unhandled_types: set[str] = set()
        self._running = False
        self._fatal: SeppError | None = None  # the permanent reserve error run() raises

    # -- registration -----------------------------------------------------------------

    def handle(self, job_type: str, handler: Handler) -> Worker:
        """Register ``handler`` for ``job_type``; raise :class:`DuplicateHandlerError` if
        one is registered already. Returns the worker (for chaining)."""
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = handler
        return self

    def handler(self, job_type: str) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`handle`."""

        def register(fn: Handler) -> Handler:
            self.handle(job_type, fn)
            return fn

        return register

    def replace_handler(self, job_type: str, handler: Handler) -> Worker:
        """Register ``handler`` for ``job_type``, replacing any existing one."""
        self._handlers[job_type] = handler
        return self

    def remove_handler(self, job_type: str) -> Worker:
        """Unregister the handler of ``job_type`` (no error if there is none)."""
        self._handlers.pop(job_type, None)
        return self

    def catch_all(self, handler: Handler) -> Handler:
        """Use ``handler`` for job types without their own (replacing an earlier one);
        returns it, so it also works as a decorator."""
        self._catch_all = handler
        return handler

    def shutdown_handle(self) -> ShutdownHandle:
        """The handle that stops this worker (shareable, e.g. with a signal handler)."""
        return self._shutdown

    def _observe(self, observer: WorkerObserver) -> Callable[[], None]:
        """Report this worker's events to ``observer`` too (the seam ``sepp_lite.monitor``
        plugs into); returns the function that detaches it."""
        return self._metrics.attach(observer)

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
        refusal of the GetServerInfo call at start raises at once. Other reserve errors
        (an unreachable or overloaded server) are logged and retried after
        ``reserve_error_backoff``, without end.
        """
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._metrics.run_started()
        error: BaseException | None = None
        try:
            await self._apply_server_limits()
            await self._run(until_idle)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._running = False
            self._metrics.run_finished(error)

    async def _run(self, until_idle: bool) -> None:
        permits = asyncio.Semaphore(self._max_in_flight)
        jobs = TaskSet("job")
        logger.info(
            "worker %s started: queues=%s max_in_flight=%d handlers=%d auto_extend=%s",
            self.worker_id,
            ",".join(self._opts.queues),
            self._max_in_flight,
            len(self._handlers),
            self._auto_extend,
        )
        try:
            while not self._shutdown.is_shutdown:
                if not await self._poll(permits, jobs, until_idle):
                    break
        except asyncio.CancelledError:
            for run in self._active:
                # A handler may swallow its cancellation and return: that must not
                # become an ack. A hard stop leaves every job to its lease.
                run.stopped = True
            await jobs.cancel(_CANCEL_GRACE_S)
            raise
        logger.info("worker %s draining %d in-flight job(s)", self.worker_id, len(jobs))
        await self._drain(jobs)
        logger.info("worker %s stopped", self.worker_id)
        fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise fatal

    async def _race(self, awaitable: Awaitable[T]) -> tuple[T | None, bool]:
        """Await ``awaitable`` against shutdown: ``(result, False)`` when it finished
        (its exception propagates), ``(None, True)`` when shutdown came first (it is
        cancelled). When both finish in the same step the result wins: jobs a reserve
        returned just as shutdown came are leased to us, so they must be processed."""
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
            self._metrics.reserve_failed(error)
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
            logger.warning("reserve failed: %s; retrying in %.3g s", error, self._error_backoff)
            return not (await self._race(asyncio.sleep(self._error_backoff)))[1]
        if not reserved:
            permits.release()
            if not stopped:
                self._metrics.reserve_completed(empty=True)
            if stopped or (until_idle and self._in_flight == 0):
                return False
            early = min(EARLY_EMPTY_S, self._opts.wait_timeout.total_seconds() / 2)
            if time.monotonic() - started < early:
                return not (await self._race(asyncio.sleep(EARLY_EMPTY_PAUSE_S)))[1]
            return True
        self._metrics.reserve_completed(empty=False)
        self._start(reserved[0], permits, jobs)  # the first job takes the permit we hold
        for job in reserved[1:]:
            await permits.acquire()  # immediate: we asked for no more than the free room
            self._start(job, permits, jobs)
        return True

    async def _reserve(self, limit: int, until_idle: bool) -> list[Job] | None:
        # A copy asking for no more than the free room; self._opts keeps the user's max_jobs.
        opts = dataclasses.replace(self._opts, max_jobs=limit)
        if until_idle and opts.wait_timeout.total_seconds() > _IDLE_WAIT_S:
            opts.wait_timeout = timedelta(seconds=_IDLE_WAIT_S)
        return await self._client.reserve(opts)

    def _start(self, job: Job, permits: asyncio.Semaphore, jobs: TaskSet) -> None:
        run = _Run(job, jobs)
        self._active.add(run)
        self._in_flight += 1
        self._metrics.job_started(job.ctx)

        def finished(_: asyncio.Task[None]) -> None:
            self._active.discard(run)
            self._in_flight -= 1
            self._metrics.job_finished(job.ctx)
            permits.release()

        run.task = jobs.spawn(self._process(run), finished)

    # -- one job ----------------------------------------------------------------------

    async def _process(self, run: _Run) -> None:
        ctx = run.job.ctx
        if not _otel.AVAILABLE:
            await self._execute(run, None)
            return
        with _otel.consumer_span(ctx.id, ctx.job_type, ctx.attempt, ctx.trace_context) as span:
            await self._execute(run, span)

    async def _execute(self, run: _Run, span: Any) -> None:
        ctx = run.job.ctx
        handler = self._handlers.get(ctx.job_type) or self._catch_all
        if handler is None:
            await self._nack_unhandled(ctx)
            return
        started = time.monotonic()
        if self._auto_extend:
            outcome = await self._handle_with_keeper(run, handler)
        else:
            outcome = await self._handle(run, handler)
        self._metrics.job_handled(ctx, time.monotonic() - started)
        reason = _unsettled_reason(run, outcome)
        if reason is not None:
            # Another delivery may own the job now: settling it could ack someone
            # else's work, so the lease is left to lapse instead.
            logger.error("job %s not settled: %s (handler cancelled)", ctx.id, reason)
            _otel.mark_error(span, f"not settled: {reason}")
            return
        if outcome is not None:
            _otel.mark_error(span, outcome)  # type: ignore[arg-type]
        if _released(ctx):
            # The handler settled the job itself (client.ack/nack on its ctx): a second
            # settle would only meet NOT_FOUND, or worse, another delivery's lease.
            logger.debug("job %s: already settled by its handler", ctx.id)
            return
        run.settling = True
        await self._settle(ctx, outcome)  # type: ignore[arg-type]

    async def _handle(self, run: _Run, handler: Handler) -> object:
        """Run the handler in this task; its outcome: None, the exception, or _STOPPED."""
        job = run.job
        try:
            await handler(job.payload, job.ctx)
        except asyncio.CancelledError:
            if run.abandoned or run.lease_lost:
                return _STOPPED  # our own cancellation; the caller's must propagate
            raise
        except Exception as exc:
            return exc
        return None

    async def _handle_with_keeper(self, run: _Run, handler: Handler) -> object:
        """Run the handler (in this task) with a lease keeper beside it."""
        lease = run.job.ctx.lease
        if lease is None:
            return await self._handle(run, handler)
        keeper = _LeaseKeeper(self, run, lease)
        try:
            return await self._handle(run, handler)
        finally:
            keeper.stop()

    def _keeper_interval(self, known_expiry_ms: int) -> float:
        if self._extend_every is not None:
            return self._extend_every
        # A third of what is left of the lease the server *granted*: if it clamped the
        # lease below the request, an interval from the request would fire too late.
        return max((known_expiry_ms - now_ms()) / 3000.0, 0.001)

    async def _settle(self, ctx: JobCtx, outcome: BaseException | None) -> None:
        """Exactly one ack or nack for this delivery; failures are logged, never raised."""
        client = self._client
        try:
            if outcome is None:
                await client.ack(ctx)
                self._metrics.job_acked(ctx)
                return
            if isinstance(outcome, HandlerError):
                # A retry the handler asked for is the plan working, not a warning; a job
                # sent to the dead letters for good is worth an operator's look.
                log = logger.warning if outcome.directive.kind == "dead_letter" else logger.info
                log(
                    "job %s: handler asked for %s: %s",
                    ctx.id,
                    outcome.directive.kind,
                    outcome.reason,
                )
                directive, reason = outcome.directive, outcome.reason
            else:
                logger.error(
                    "job %s: handler raised %s", ctx.id, type(outcome).__name__, exc_info=outcome
                )
                directive = RetryDirective.DEFAULT
                reason = f"handler raised {type(outcome).__name__}: {outcome}"
            self._metrics.job_nacked(ctx, await client.nack(ctx, directive, reason))
        except LeaseError as error:
            logger.error(
                "job %s: %s (the lease lapsed and the job went back to the queue, or a retried "
                "call had already settled it)",
                ctx.id,
                error,
            )
        except SeppError as error:
            logger.error("job %s: ack/nack failed (%s); it will be redelivered", ctx.id, error)

    async def _nack_unhandled(self, ctx: JobCtx) -> None:
        if ctx.job_type not in self._unhandled_types:
            self._unhandled_types.add(ctx.job_type)
            logger.warning("no handler registered for job_type %r; nacking such jobs", ctx.job_type)
        delay = min(2 ** min(ctx.attempt, 6), 60)
        try:
            await self._client.nack(ctx, RetryDirective.after(delay), _UNHANDLED_REASON)
        except SeppError as error:
            logger.warning("job %s: nack of an unhandled job type failed: %s", ctx.id, error)

    # -- start and stop ---------------------------------------------------------------

    async def _apply_server_limits(self) -> None:
        try:
            info = await self._client.get_server_info()
        except SeppError as error:
            if is_permanent(error):
                raise  # a wrong key or the like: no reserve could succeed either
            logger.warning(
                "could not read the server's limits (%s); using the options as given", error
            )
            return
        opts, changes = self._opts, []
        if (
            opts.max_jobs is not None
            and info.max_reserve_batch
            and opts.max_jobs > info.max_reserve_batch
        ):
            changes.append(f"max_jobs {opts.max_jobs} -> {info.max_reserve_batch}")
            opts.max_jobs = info.max_reserve_batch
        if info.max_lease_duration and opts.lease_duration > info.max_lease_duration:
            changes.append(
                f"lease {seconds_text(opts.lease_duration)} -> "
                f"{seconds_text(info.max_lease_duration)}"
            )
            opts.lease_duration = info.max_lease_duration
        if info.max_wait_timeout and opts.wait_timeout > info.max_wait_timeout:
            changes.append(
                f"wait {seconds_text(opts.wait_timeout)} -> {seconds_text(info.max_wait_timeout)}"
            )
            opts.wait_timeout = info.max_wait_timeout
        if changes:
            logger.info("clamped to the server's limits: %s", ", ".join(changes))

    async def _drain(self, jobs: TaskSet) -> None:
        if not len(jobs) or self._shutdown_timeout is None:
            await jobs.wait()
            return
        await self._extend_in_flight()
        if await jobs.wait(self._shutdown_timeout):
            return
        stopped = [run for run in self._active if not run.settling]
        logger.warning(
            "shutdown timeout (%.3g s) reached: cancelling %d handler(s); their jobs will be "
            "redelivered",
            self._shutdown_timeout,
            len(stopped),
        )
        for run in stopped:
            run.abandoned = True
            run.stop_handler()
        if not await jobs.wait(_CANCEL_GRACE_S):
            logger.error("%d job task(s) ignored cancellation; leaving them behind", len(jobs))

    async def _extend_in_flight(self) -> None:
        """Give every in-flight job one more full lease to finish in during the drain."""

        async def extend(run: _Run) -> None:
            lease = run.job.ctx.lease
            if lease is None:
                return
            try:
                await lease.extend(self._opts.lease_duration)
                self._metrics.lease_extended(run.job.ctx, "extended")
            except SeppError as error:
                logger.warning(
                    "job %s: lease extension at shutdown failed: %s", run.job.ctx.id, error
                )
                self._metrics.lease_extended(run.job.ctx, "failed")

        holding = [run for run in self._active if not (run.settling or _released(run.job.ctx))]
        await asyncio.gather(*(extend(run) for run in holding))


class _LeaseKeeper:
    """Extends one job's lease while its handler runs. A timer fires a third of the way
    to the lease's known expiry (or every ``extend_every``); only then does an extension
    run, as a task of its own. Most handlers end long before that, so a job costs one
    timer here, not a task. When the lease is lost, the handler is cancelled."""

    __slots__ = ("_extending", "_lease", "_run", "_stopped", "_timer", "_worker")

    def __init__(self, worker: Worker, run: _Run, lease: Lease) -> None:
        self._worker = worker
        self._run = run
        self._lease = lease
        self._timer: Optional[asyncio.TimerHandle] = None
        self._extending: Optional[asyncio.Task[None]] = None
        self._stopped = False
        self._schedule()

    def _schedule(self) -> None:
        delay = self._worker._keeper_interval(self._lease.known_expiry_ms)
        self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._stopped or self._run.abandoned or self._lease.released:
            # Shutdown gave up on the job (its handler ignored that), or the handler
            # settled it already: nothing left to keep.
            return
        self._extending = self._worker._extensions.spawn(self._extend())

    def stop(self) -> None:
        """The handler ended: no more extensions (one in flight is cancelled)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._extending is not None:
            self._worker._extensions.stop(self._extending)

    async def _extend(self) -> None:
        run, lease, worker = self._run, self._lease, self._worker
        ctx = run.job.ctx
        try:
            await lease.extend(worker._opts.lease_duration)
            worker._metrics.lease_extended(ctx, "extended")
            self._again()
            return
        except (AttemptMismatchError, JobNotFoundError) as error:
            if lease.released:
                return  # the handler's own ack or nack won the race with this extend
            logger.error("job %s: lease lost (%s); cancelling its handler", ctx.id, error)
        except SeppError as error:
            if now_ms() < lease.known_expiry_ms:
                logger.warning("job %s: lease extension failed (%s); will retry", ctx.id, error)
                worker._metrics.lease_extended(ctx, "failed")
                self._again()
                return
            logger.error("job %s: lease expired (%s); cancelling its handler", ctx.id, error)
        worker._metrics.lease_extended(ctx, "lost")
        run.lease_lost = True
        lease.mark_released()
        if not self._stopped:
            run.stop_handler()

    def _again(self) -> None:
        if not self._stopped:
            self._schedule()
