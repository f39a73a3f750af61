"""The queue state machine of the in-process server, independent of any transport.

It applies the real server's semantics (sepp's server reference, not part of this
repository) to the request records the codec decodes (``sepp_lite._codec``'s ``*In``
classes) and returns what its response encoders take. All operations run to completion
synchronously (one "committer"), each stamped with one time from the clock; only the
long-poll wait is a coroutine. Request errors raise :class:`RpcError` with the gRPC
status code and message the real server sends; what makes a request invalid, or a job
refused, is ``_rules.py``'s.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import logging
import os
from bisect import insort
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple, Optional

from sepp_lite import errors
from sepp_lite._codec.dead_letters import DeadLetterOut
from sepp_lite._codec.enqueue import EnqueueIn, EnqueueOutcome
from sepp_lite._codec.job import JobRecord, ReserveIn
from sepp_lite._codec.lease import LeaseIn
from sepp_lite._time import ms_to_datetime
from sepp_lite.testing._clock import Clock, RealClock, TimerHandle
from sepp_lite.testing._config import EffectiveLimits, ServerConfig
from sepp_lite.testing._names import rust_debug_list
from sepp_lite.testing._rules import (
    I64_MAX,
    batch_error,
    drain_error,
    duration_ms,
    extend_error,
    fence_error,
    job_error,
    limit_rejection,
    nack_error,
    policy_delay_ms,
    reserve_error,
    reserve_limit_error,
    timestamp_ms,
)
from sepp_lite.types import ServerInfo

if TYPE_CHECKING:
    from sepp_lite.types import QueueNames

__all__ = [
    "AtomicResult",
    "Backlog",
    "Code",
    "Delivery",
    "JobView",
    "QueueCounts",
    "QueueState",
    "ReservePlan",
    "RpcError",
]

log = logging.getLogger(__name__)

# Stale lease-heap entries (acked, extended, nacked jobs) are dropped lazily; rebuild
# the heap when they outnumber the live ones by this much.
_COMPACT_AT = 4096
# The running totals kept by QueueState.totals().
_TOTALS = (
    "enqueued",
    "deduplicated",
    "delivered",
    "acked",
    "nacked",
    "dead_lettered",
    "lease_expired",
)

Delivery = tuple[JobRecord, int, int]
"""``(job, attempt, lease_expires_ms)``, as :func:`encode_reserve` takes it."""


class Code(enum.IntEnum):
    """The gRPC status codes the server answers with."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    FAILED_PRECONDITION = 9
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A whole-request failure: the status code and message the server sends."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _invalid(message: str) -> RpcError:
    return RpcError(Code.INVALID_ARGUMENT, message)


class Cause(enum.IntEnum):
    """``DeadLetterCause`` wire values."""

    ATTEMPTS_EXHAUSTED = 1
    REJECTED = 2
    LEASE_EXPIRED = 3


class _S(enum.Enum):
    READY = "ready"
    SCHEDULED = "scheduled"
    IN_FLIGHT = "in_flight"
    GONE = "gone"


class QueueCounts(NamedTuple):
    """A queue's jobs by state; ``dead`` counts stored dead-letter records (always 0
    when retention is off)."""

    ready: int
    scheduled: int
    in_flight: int
    dead: int


class Backlog(NamedTuple):
    """The work left on some queues: jobs ``ready``, ``scheduled`` (delayed enqueues
    and retries not yet due) and ``in_flight``, and ``next_due_ms``, when the earliest
    scheduled job falls due (``None`` when none is scheduled)."""

    ready: int
    scheduled: int
    in_flight: int
    next_due_ms: Optional[int]


class JobView(NamedTuple):
    """A live job as the server holds it (for tests). ``due_ms`` is set while
    scheduled, ``lease_expires_ms`` while in flight."""

    id: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    priority: int
    enqueued_ms: int
    due_ms: Optional[int]
    lease_expires_ms: Optional[int]
    record: JobRecord


class ReservePlan(NamedTuple):
    """A validated Reserve with its clamped parameters."""

    queues: tuple[str, ...]
    lease_ms: int
    max_jobs: int
    wait_ms: int


class AtomicResult(NamedTuple):
    """EnqueueAtomic's answer: ``acks`` when committed, else the refused jobs."""

    acks: Optional[list[tuple[str, bool]]]
    errors: Optional[list[tuple[int, errors.JobRejection]]]


class _Job(JobRecord):
    """A stored job with its mutable state."""

    __slots__ = ("attempt", "due_ms", "lease_ms", "lease_seq", "state")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.attempt = 1
        self.state = _S.READY
        self.due_ms = 0
        self.lease_ms = 0
        self.lease_seq = 0


class _Queue:
    __slots__ = ("dead", "in_flight", "name", "ready", "scheduled", "waiters")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: list[tuple[int, int, str, _Job]] = []
        self.scheduled = 0
        self.in_flight = 0
        self.dead = 0
        self.waiters: set[asyncio.Future[str]] = set()

    def live_depth(self) -> int:
        return len(self.ready) + self.scheduled + self.in_flight

    def is_idle(self) -> bool:
        return not (self.ready or self.scheduled or self.in_flight or self.dead or self.waiters)


def new_job_id() -> str:
    """A random UUID v4, lower-case hyphenated (``str(uuid.uuid4())``, faster)."""
    h = os.urandom(16).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


def _raise_if(message: Optional[str], worker_id: Optional[str] = None) -> None:
    if message is None and worker_id == "":
        message = "worker_id must not be empty"
    if message is not None:
        raise _invalid(message)


class QueueState:
    """The server's queues, jobs, leases, dedup records and dead letters.

    Create it with a :class:`ServerConfig` and a clock (wall clock by default). The
    RPC methods take the codec's request structs and return what its encoders take;
    request errors raise :class:`RpcError`.
    """

    def __init__(
        self, config: Optional[ServerConfig] = None, *, clock: Optional[Clock] = None
    ) -> None:
        self.config = config if config is not None else ServerConfig()
        self.clock: Clock = clock if clock is not None else RealClock()
        self._global = self.config.global_limits()
        self._declared = {q.name: self._global.merged_with(q) for q in self.config.queues}
        every = [self._global, *self._declared.values()]
        self._min_max_lease = min(lim.max_lease_duration_ms for lim in every)
        self._any_retry_policy = any(lim.retry_delay_ms > 0 for lim in every)
        self._retention = self.config.dead_letter_retention_ms
        self._queues: dict[str, _Queue] = {}
        self._jobs: dict[str, _Job] = {}
        self._scheduled: list[tuple[int, str, _Job]] = []
        self._leases: list[tuple[int, str, int, _Job]] = []
        self._stale_leases = 0
        self._dedup: dict[tuple[str, str], tuple[str, int]] = {}
        self._dedup_timers: list[tuple[int, str, str]] = []
        self._dead: list[tuple[int, int, bytes, str]] = []
        self._dead_records: dict[tuple[int, int, bytes, str], DeadLetterOut] = {}
        self._woken: set[_Queue] = set()
        self._waiters: set[asyncio.Future[str]] = set()
        self._timer: Optional[TimerHandle] = None
        self._timer_at: Optional[int] = None
        self._next_due: Optional[int] = None
        self._closing = False
        self._totals = dict.fromkeys(_TOTALS, 0)

    # -- bookkeeping -------------------------------------------------------------------

    def limits_for(self, queue: str) -> EffectiveLimits:
        """The effective settings of ``queue`` (global ones when not declared)."""
        return self._declared.get(queue, self._global)

    @property
    def closing(self) -> bool:
        """True once :meth:`close` ran (the server is shutting down)."""
        return self._closing

    def _queue(self, name: str) -> _Queue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = _Queue(name)
        return queue

    def _begin(self) -> int:
        """Stamp an operation, first doing any timer work that is already due (the
        server's committer sweeps before it applies ops once a deadline has passed)."""
        now = self.clock.now_ms()
        if self._next_due is not None and self._next_due <= now:
            self._sweep(now)
        return now

    def _end(self) -> None:
        if self._woken:
            woken, self._woken = self._woken, set()
            for queue in woken:
                self._notify(queue)
        self._rearm()

    def _lease_valid(self, entry: tuple[int, str, int, _Job]) -> bool:
        job = entry[3]
        return job.state is _S.IN_FLIGHT and job.lease_seq == entry[2]

    def _next_deadline(self) -> Optional[int]:
        leases = self._leases
        while leases and not self._lease_valid(leases[0]):
            heapq.heappop(leases)
            self._stale_leases -= 1
        timers = self._dedup_timers
        while timers and self._dedup.get(timers[0][1:]) is None:
            heapq.heappop(timers)
        candidates = [h[0][0] for h in (self._scheduled, leases, timers) if h]
        if self._retention > 0 and self._dead:
            candidates.append(self._dead[0][0] + self._retention)
        return min(candidates) if candidates else None

    def _rearm(self) -> None:
        if self._stale_leases > _COMPACT_AT and self._stale_leases > len(self._leases) // 2:
            self._leases = [e for e in self._leases if self._lease_valid(e)]
            heapq.heapify(self._leases)
            self._stale_leases = 0
        due = self._next_due = self._next_deadline()
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        if due is not None and not self._closing:
            self._timer = self.clock.call_at(due, self._on_timer)
            self._timer_at = due

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self._begin()
        self._end()

    def _push_ready(self, job: _Job, queue: _Queue) -> None:
        job.state = _S.READY
        heapq.heappush(queue.ready, (9 - job.priority, job.enqueued_ms, job.id, job))
        self._woken.add(queue)

    def _schedule(self, job: _Job, queue: _Queue, due_ms: int) -> None:
        job.state = _S.SCHEDULED
        job.due_ms = due_ms
        heapq.heappush(self._scheduled, (due_ms, job.id, job))
        queue.scheduled += 1

    def _release_lease(self, job: _Job) -> _Queue:
        queue = self._queues[job.queue]
        queue.in_flight -= 1
        self._stale_leases += 1
        return queue

    def _dead_letter(self, job: _Job, cause: Cause, now: int, reason: Optional[str]) -> None:
        self._totals["dead_lettered"] += 1
        job.state = _S.GONE
        del self._jobs[job.id]
        if self._retention <= 0:
            return
        name = job.queue.encode()
        key = (now, len(name), name, job.id)
        insort(self._dead, key)
        self._dead_records[key] = DeadLetterOut(job, int(cause), now, job.attempt, reason)
        self._queues[job.queue].dead += 1

    # -- timers ("sweep") --------------------------------------------------------------

    def _sweep(self, now: int) -> None:
        """Promote due scheduled jobs, expire due leases, drop expired dedup records
        and, with retention on, expired dead letters. The server caps each phase at
        ``sweep_limit`` per pass and sweeps again while work is due; doing all due work
        at once is the same except under a backlog of more than 10 000 timers."""
        self._promote_due(now)
        self._expire_leases(now)
        timers = self._dedup_timers
        while timers and timers[0][0] <= now:
            _, queue, key = heapq.heappop(timers)
            record = self._dedup.get((queue, key))
            if record is not None and record[1] <= now:
                del self._dedup[(queue, key)]
        if self._retention > 0:
            self._expire_dead_letters(now - self._retention)

    def _promote_due(self, now: int) -> None:
        scheduled = self._scheduled
        while scheduled and scheduled[0][0] <= now:
            job = heapq.heappop(scheduled)[2]
            queue = self._queues[job.queue]
            queue.scheduled -= 1
            self._push_ready(job, queue)

    def _expire_leases(self, now: int) -> None:
        leases = self._leases
        while leases and leases[0][0] <= now:
            entry = heapq.heappop(leases)
            if not self._lease_valid(entry):
                self._stale_leases -= 1
                continue
            job = entry[3]
            queue = self._queues[job.queue]
            queue.in_flight -= 1
            self._totals["lease_expired"] += 1
            if job.attempt >= job.max_attempts:
                log.info("job %s dead-lettered: lease expired on its last attempt", job.id)
                self._dead_letter(job, Cause.LEASE_EXPIRED, now, None)
            else:
                job.attempt += 1
                self._push_ready(job, queue)

    def _expire_dead_letters(self, cutoff: int) -> None:
        dead = self._dead
        count = 0
        while count < len(dead) and dead[count][0] <= cutoff:
            key = dead[count]
            record = self._dead_records.pop(key)
            self._queues[record.job.queue].dead -= 1
            count += 1
        if count:
            del dead[:count]

    def sweep(self) -> None:
        """Do every piece of timer work that is due now (normally timers do it)."""
        self._begin()
        self._end()

    # -- long-poll readiness -----------------------------------------------------------

    def _notify(self, queue: _Queue) -> None:
        for waiter in queue.waiters:
            if not waiter.done():
                waiter.set_result("notified")

    async def wait_for_jobs(self, queues: Iterable[str], deadline_ms: int) -> str:
        """Wait until one of ``queues`` gets ready jobs, the clock reaches
        ``deadline_ms`` or the state closes; return ``"notified"``, ``"deadline"`` or
        ``"closing"``. Cancelling the wait leaves nothing behind."""
        if self._closing:
            return "closing"
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def expire() -> None:
            if not waiter.done():
                waiter.set_result("deadline")

        watched = [self._queue(name) for name in dict.fromkeys(queues)]
        for queue in watched:
            queue.waiters.add(waiter)
        self._waiters.add(waiter)
        timer = self.clock.call_at(deadline_ms, expire)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)
            for queue in watched:
                queue.waiters.discard(waiter)
                if queue.is_idle():
                    self._queues.pop(queue.name, None)

    @property
    def waiter_count(self) -> int:
        """How many long polls are waiting right now."""
        return len(self._waiters)

    def close(self) -> None:
        """Shut down: every pending and future long poll answers empty at once, and
        no timer is armed any more (operations still work, catching up lazily)."""
        self._closing = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result("closing")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None

    # -- EnqueueBatch / EnqueueAtomic --------------------------------------------------

    def classify(self, job: EnqueueIn, now: int) -> Optional[errors.JobRejection]:
        """The rejection the server gives ``job`` before committing it, or ``None``."""
        message = job_error(job)
        if message is not None:
            return errors.InvalidRequest(message)
        if self.config.strict_queues and job.queue not in self._declared:
            return errors.UnknownQueue(job.queue)
        return limit_rejection(job, self.config.limits, self.limits_for(job.queue), now)

    def _dedup_hit(self, job: EnqueueIn, now: int) -> Optional[tuple[str, bool]]:
        key = job.idempotency_key
        if key is None:
            return None
        record = self._dedup.get((job.queue, key))
        if record is not None and now < record[1]:
            return record[0], True
        return None

    def _insert(self, req: EnqueueIn, queue: _Queue, now: int) -> tuple[str, bool]:
        lim = self.limits_for(req.queue)
        job_id = new_job_id()
        max_attempts = lim.default_max_attempts if req.max_attempts is None else req.max_attempts
        job = _Job(
            job_id,
            req.queue,
            req.job_type,
            payload=req.payload,
            priority=lim.default_priority if req.priority is None else req.priority,
            trace=req.trace,
            enqueued_ms=now,
            max_attempts=min(max_attempts, lim.max_attempts_ceiling),
            custom=req.custom,
            scheduled_at=req.scheduled_at,
        )
        self._jobs[job_id] = job
        self._totals["enqueued"] += 1
        at = req.scheduled_at
        due = None if at is None else timestamp_ms(*at)
        if due is not None and due > now:
            self._schedule(job, queue, due)
        else:
            self._push_ready(job, queue)
        key = req.idempotency_key
        if key is not None:
            deadline = min(now + lim.dedup_window_ms, I64_MAX)
            self._dedup[(req.queue, key)] = (job_id, deadline)
            heapq.heappush(self._dedup_timers, (deadline, req.queue, key))
        return job_id, False

    def _commit(self, job: EnqueueIn, now: int) -> EnqueueOutcome:
        hit = self._dedup_hit(job, now)
        if hit is not None:
            self._totals["deduplicated"] += 1
            return hit
        queue = self._queue(job.queue)
        cap = self.limits_for(job.queue).max_queue_depth
        if cap is not None and queue.live_depth() >= cap:
            return errors.QueueFull(job.queue, cap)
        return self._insert(job, queue, now)

    def enqueue_batch(self, jobs: Sequence[EnqueueIn]) -> list[EnqueueOutcome]:
        """EnqueueBatch: one ``(job_id, deduplicated)`` or rejection per job, in order.
        Raises :class:`RpcError` for an empty or oversized batch."""
        _raise_if(batch_error(jobs, self.config.limits.max_enqueue_batch))
        now = self._begin()
        try:
            results: list[EnqueueOutcome] = []
            for job in jobs:
                rejection = self.classify(job, now)
                results.append(rejection if rejection is not None else self._commit(job, now))
            return results
        finally:
            self._end()

    def enqueue_atomic(self, jobs: Sequence[EnqueueIn]) -> AtomicResult:
        """EnqueueAtomic: all jobs committed, or none and every refused job listed.
        Raises :class:`RpcError` for an empty or oversized batch."""
        _raise_if(batch_error(jobs, self.config.limits.max_enqueue_batch))
        now = self._begin()
        try:
            refused = []
            for index, job in enumerate(jobs):
                rejection = self.classify(job, now)
                if rejection is not None:
                    refused.append((index, rejection))
            if not refused:
                refused = self._atomic_full(jobs)
            if refused:
                return AtomicResult(None, refused)
            acks = []
            for job in jobs:
                hit = self._dedup_hit(job, now)
                if hit is not None:
                    self._totals["deduplicated"] += 1
                acks.append(
                    hit if hit is not None else self._insert(job, self._queue(job.queue), now)
                )
            return AtomicResult(acks, None)
        finally:
            self._end()

    def _atomic_full(self, jobs: Sequence[EnqueueIn]) -> list[tuple[int, errors.JobRejection]]:
        """Every job of each queue the batch would overfill (dedup hits count too)."""
        wanted: dict[str, list[int]] = {}
        for job in jobs:
            entry = wanted.setdefault(job.queue, [0])
            entry[0] += 1
        full: dict[str, int] = {}
        for name, (count,) in wanted.items():
            cap = self.limits_for(name).max_queue_depth
            queue = self._queues.get(name)
            depth = 0 if queue is None else queue.live_depth()
            if cap is not None and depth + count > cap:
                full[name] = cap
        return [
            (index, errors.QueueFull(job.queue, full[job.queue]))
            for index, job in enumerate(jobs)
            if job.queue in full
        ]

    # -- Reserve -----------------------------------------------------------------------

    def prepare_reserve(self, req: ReserveIn) -> ReservePlan:
        """Validate a Reserve and clamp its lease, batch size and wait. Raises
        :class:`RpcError` (INVALID_ARGUMENT, or FAILED_PRECONDITION in strict mode)."""
        g = self.config.limits
        _raise_if(reserve_error(req) or reserve_limit_error(req, g))
        if self.config.strict_queues:
            unknown = [name for name in req.queues if name not in self._declared]
            if unknown:
                raise RpcError(
                    Code.FAILED_PRECONDITION,
                    f"queue(s) not declared (strict mode): {rust_debug_list(unknown)}",
                )
        cap = min(self.limits_for(name).max_lease_duration_ms for name in req.queues)
        lease = max(1, min(duration_ms(req.lease_duration), cap))
        max_jobs = 1 if req.max_jobs is None else min(max(req.max_jobs, 1), g.max_reserve_batch)
        wait = min(duration_ms(req.wait_timeout), g.max_wait_timeout_ms)
        return ReservePlan(tuple(req.queues), lease, max_jobs, wait)

    def reserve_once(self, plan: ReservePlan) -> list[Delivery]:
        """One reservation: drain the queues in request order, each in ready order, up
        to ``plan.max_jobs``; the jobs go in flight with a lease from now."""
        now = self._begin()
        try:
            out: list[Delivery] = []
            expires = now + plan.lease_ms
            for name in plan.queues:
                queue = self._queues.get(name)
                if queue is None:
                    continue
                ready = queue.ready
                while ready and len(out) < plan.max_jobs:
                    job = heapq.heappop(ready)[3]
                    job.state = _S.IN_FLIGHT
                    job.lease_ms = expires
                    job.lease_seq += 1
                    heapq.heappush(self._leases, (expires, job.id, job.lease_seq, job))
                    queue.in_flight += 1
                    out.append((job, job.attempt, expires))
                if len(out) >= plan.max_jobs:
                    break
            self._totals["delivered"] += len(out)
            return out
        finally:
            self._end()

    async def reserve(self, req: ReserveIn) -> list[Delivery]:
        """Reserve with long poll: jobs as soon as there are any, else ``[]`` once the
        (clamped) wait is over or the state closes."""
        plan = self.prepare_reserve(req)
        deadline = self.clock.now_ms() + plan.wait_ms
        while True:
            jobs = self.reserve_once(plan)
            if jobs:
                return jobs
            if self._closing or self.clock.now_ms() >= deadline:
                return []
            if await self.wait_for_jobs(plan.queues, deadline) != "notified":
                return []

    # -- Ack / Nack / Extend -----------------------------------------------------------

    def _in_flight(self, job_id: str, attempt: int) -> _Job:
        job = self._jobs.get(job_id)
        if job is None or job.state is not _S.IN_FLIGHT:
            raise RpcError(Code.NOT_FOUND, "job not found")
        if job.attempt != attempt:
            raise RpcError(Code.FAILED_PRECONDITION, "attempt mismatch")
        return job

    def ack(self, req: LeaseIn) -> str:
        """Ack: delete the in-flight job (its dedup record stays). Returns the job id;
        raises :class:`RpcError` NOT_FOUND / FAILED_PRECONDITION / INVALID_ARGUMENT."""
        _raise_if(fence_error(req), req.worker_id)
        self._begin()
        try:
            job = self._in_flight(req.job_id, req.attempt)
            self._release_lease(job)
            job.state = _S.GONE
            del self._jobs[job.id]
            self._totals["acked"] += 1
            return job.id
        finally:
            self._end()

    def _retry_delay_ms(self, req: LeaseIn) -> int:
        """Resolved before the fence check, as the server does."""
        retry = req.retry
        kind = None if retry is None else retry[0]
        if kind == "dead_letter":
            return 0
        if kind != "delay" and not self._any_retry_policy:
            return 0
        job = self._jobs.get(req.job_id)
        if job is None or job.state is not _S.IN_FLIGHT:
            return 0  # fenced off below
        lim = self.limits_for(job.queue)
        if kind == "delay":
            return min(duration_ms(retry[1:3]), lim.max_schedule_horizon_ms)  # type: ignore[index,arg-type]
        return policy_delay_ms(lim, req.attempt, req.job_id)

    def nack(self, req: LeaseIn) -> tuple[str, bool]:
        """Nack: retry (now, or after the directive's or the queue policy's delay) or
        dead-letter. Returns ``(job_id, dead_lettered)``; raises :class:`RpcError`."""
        _raise_if(nack_error(req), req.worker_id)
        now = self._begin()
        try:
            delay = self._retry_delay_ms(req)
            job = self._in_flight(req.job_id, req.attempt)
            queue = self._release_lease(job)
            self._totals["nacked"] += 1
            forced = req.retry is not None and req.retry[0] == "dead_letter"
            if forced or job.attempt >= job.max_attempts:
                cause = Cause.REJECTED if forced else Cause.ATTEMPTS_EXHAUSTED
                self._dead_letter(job, cause, now, req.reason)
                return job.id, True
            job.attempt += 1
            if delay > 0:
                self._schedule(job, queue, min(now + delay, I64_MAX))
            else:
                self._push_ready(job, queue)
            return job.id, False
        finally:
            self._end()

    def extend(self, req: LeaseIn) -> tuple[str, int]:
        """Extend: a new lease measured from now, clamped to the job's queue cap.
        Returns ``(job_id, lease_expires_ms)``; raises :class:`RpcError`."""
        _raise_if(extend_error(req), req.worker_id)
        now = self._begin()
        try:
            lease = max(1, duration_ms(req.lease_duration))
            if lease > self._min_max_lease:
                job = self._jobs.get(req.job_id)
                if job is None or job.state is not _S.IN_FLIGHT:
                    raise RpcError(Code.NOT_FOUND, "job not found")
                lease = min(lease, self.limits_for(job.queue).max_lease_duration_ms)
            job = self._in_flight(req.job_id, req.attempt)
            expires = min(now + lease, I64_MAX)
            self._stale_leases += 1
            job.lease_ms = expires
            job.lease_seq += 1
            heapq.heappush(self._leases, (expires, job.id, job.lease_seq, job))
            return job.id, expires
        finally:
            self._end()

    # -- DrainDeadLetters / GetServerInfo ----------------------------------------------

    def drain(self, queue: Optional[str], max_records: Optional[int]) -> list[DeadLetterOut]:
        """DrainDeadLetters: remove and return up to ``max`` records, oldest first,
        examining at most ``sweep_limit`` records. Always ``[]`` with retention off."""
        _raise_if(drain_error(queue, max_records))
        self._begin()
        try:
            if self._retention <= 0:
                return []
            return self._take_dead_letters(queue, max_records)
        finally:
            self._end()

    def _take_dead_letters(
        self, queue: Optional[str], max_records: Optional[int]
    ) -> list[DeadLetterOut]:
        limit = min(max(max_records or 1, 1), self.config.limits.max_reserve_batch)
        wanted = None if queue is None else queue.encode()
        chosen: list[int] = []
        for examined, key in enumerate(self._dead):
            if len(chosen) >= limit or examined >= self.config.sweep_limit:
                break
            if wanted is None or key[2] == wanted:
                chosen.append(examined)
        records = []
        for index in chosen:
            record = self._dead_records.pop(self._dead[index])
            self._queues[record.job.queue].dead -= 1
            records.append(record)
        for index in reversed(chosen):
            del self._dead[index]
        log.warning(
            "dead letters drained (destructive): queue=%s count=%d",
            "*" if queue is None else queue,
            len(records),
        )
        return records

    def server_info(self) -> ServerInfo:
        """GetServerInfo: the version and the global limits."""
        g = self.config.limits
        return ServerInfo(
            version=self.config.version,
            supported_protocol_versions=["v1"],
            server_time=ms_to_datetime(self.clock.now_ms()),
            restricts_encodings=g.allowed_encodings is not None,
            allowed_encodings=list(g.allowed_encodings or ()),
            max_payload_bytes=g.max_payload_bytes,
            max_custom_entries=g.max_custom_entries,
            max_custom_total_bytes=g.max_custom_total_bytes,
            max_custom_key_bytes=g.max_custom_key_bytes,
            max_queue_name_bytes=g.max_queue_name_bytes,
            max_job_type_bytes=g.max_job_type_bytes,
            max_idempotency_key_bytes=g.max_idempotency_key_bytes,
            max_schedule_horizon=timedelta(milliseconds=g.max_schedule_horizon_ms),
            max_enqueue_batch=g.max_enqueue_batch,
            max_reserve_batch=g.max_reserve_batch,
            max_reserve_queues=g.max_reserve_queues,
            max_wait_timeout=timedelta(milliseconds=g.max_wait_timeout_ms),
            max_lease_duration=timedelta(milliseconds=g.max_lease_duration_ms),
            strict_queues=self.config.strict_queues,
            dead_letter_retention_enabled=self._retention > 0,
        )

    # -- inspection --------------------------------------------------------------------

    def counts(self, queue: str) -> QueueCounts:
        """``(ready, scheduled, in_flight, dead)`` of ``queue`` right now."""
        self.sweep()
        q = self._queues.get(queue)
        if q is None:
            return QueueCounts(0, 0, 0, 0)
        return QueueCounts(len(q.ready), q.scheduled, q.in_flight, q.dead)

    def backlog(self, queues: Optional[QueueNames] = None) -> Backlog:
        """The work left on ``queues`` (every queue when ``None``) right now, after
        any due timer work: what a test waits for before it calls a queue drained."""
        self.sweep()
        if queues is None:
            chosen = list(self._queues.values())
            due = [self._scheduled[0][0]] if self._scheduled else []
        else:
            if isinstance(queues, str):
                raise TypeError(f"queues must be a list of queue names, not the str {queues!r}")
            names = set(queues)
            chosen = [q for q in map(self._queues.get, names) if q is not None]
            due = [entry[0] for entry in self._scheduled if entry[2].queue in names]
        return Backlog(
            sum(len(q.ready) for q in chosen),
            sum(q.scheduled for q in chosen),
            sum(q.in_flight for q in chosen),
            min(due, default=None),
        )

    def job(self, job_id: str) -> Optional[JobView]:
        """A live job (ready, scheduled or in flight), or ``None`` once it is acked,
        dead-lettered or unknown."""
        self.sweep()
        job = self._jobs.get(job_id)
        if job is None:
            return None
        return JobView(
            job.id,
            job.queue,
            job.state.value,
            job.attempt,
            job.max_attempts,
            job.priority,
            job.enqueued_ms,
            job.due_ms if job.state is _S.SCHEDULED else None,
            job.lease_ms if job.state is _S.IN_FLIGHT else None,
            job,
        )

    def dead_letters(self, queue: Optional[str] = None) -> list[DeadLetterOut]:
        """The stored dead-letter records, oldest first, without removing them."""
        self.sweep()
        records = (self._dead_records[key] for key in self._dead)
        return [r for r in records if queue is None or r.job.queue == queue]

    def dedup_record(self, queue: str, key: str) -> Optional[tuple[str, int]]:
        """``(job_id, deadline_ms)`` of a live idempotency record, else ``None``."""
        self.sweep()
        record = self._dedup.get((queue, key))
        if record is None or record[1] <= self.clock.now_ms():
            return None
        return record

    def totals(self) -> dict[str, int]:
        """Running totals since this state was created, after any due timer work:
        ``enqueued`` (new jobs; deduplicated enqueues not included), ``deduplicated``
        (enqueues answered with an existing job), ``delivered`` (jobs handed out by
        Reserve), ``acked``, ``nacked``, ``dead_lettered`` (any cause) and
        ``lease_expired`` (leases that ran out, whether the job went back to its queue
        or was dead-lettered). For load, soak and fault tests."""
        self.sweep()
        return dict(self._totals)

    def stats(self) -> dict[str, int]:
        """Internal sizes (jobs, queues, waiters, timers), for leak checks in tests."""
        return {
            "jobs": len(self._jobs),
            "queues": len(self._queues),
            "waiters": len(self._waiters),
            "dedup_records": len(self._dedup),
            "dead_letters": len(self._dead),
            "timer_armed": int(self._timer is not None),
        }
