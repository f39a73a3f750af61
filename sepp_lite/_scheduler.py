"""Periodic jobs without a leader: every replica enqueues the same slots under the same
idempotency keys, and the server's deduplication leaves one job per slot.

A schedule is a set of instants ("slots"): ``every=`` counts them from the Unix epoch
in UTC (so every replica computes the same ones), ``cron=`` reads a 5-field expression
in a time zone (the ``cron`` extra, cronsim: Debian cron's rules, DST included). The
job of slot ``S`` is enqueued with ``scheduled_at = S`` and the idempotency key
``periodic:<job_type>:<S as YYYY-MM-DDTHH:MM:SSZ>``.

Why one job per slot: the server keeps a key for ``dedup_window`` from its *first*
enqueue. A scheduler enqueues slot ``S`` no earlier than ``S - lookahead`` and no later
than ``S + misfire_grace``, so every enqueue of ``S`` falls within ``lookahead +
misfire_grace`` of the first; the scheduler refuses settings where that (plus
:data:`CLOCK_SKEW_ALLOWANCE` for the replicas' clocks) does not fit in the window.

Whose clock: the server's. A scheduler reads it (``GetServerInfo``'s ``server_time``)
when it starts, every minute, at once when its own clock went back, and before it counts
a slot missed (as a step forward would make it), and keeps its slots by its own clock
corrected by the last reading, so replicas whose clocks are far apart still enqueue each slot at the
same moment of the server's time. A worker judges a delivery's lateness by the server's
time of that delivery, which the job carries: the server sets ``lease_expires_at`` to
its time plus the lease it grants, at most the lease the worker asked for.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Callable, Optional, Protocol, TypeVar, Union

from sepp_lite._clock import Clock, WallClock
from sepp_lite._codec.enqueue import encode_enqueue_batch_request
from sepp_lite._reach import error_text, until_reachable
from sepp_lite._retry import is_permanent
from sepp_lite._sending import BatchLimits, fit_batches, sent_size
from sepp_lite._time import Duration, as_timedelta, datetime_to_ms, ms_to_datetime
from sepp_lite.errors import SeppError
from sepp_lite.types import (
    EnqueueAck,
    EnqueueRequest,
    JobCtx,
    Payload,
    Primitive,
    ServerInfo,
)

if TYPE_CHECKING:
    from sepp_lite.errors import JobRejection

__all__ = [
    "CLOCK_SKEW_ALLOWANCE",
    "MAX_SLOTS_AHEAD",
    "SLOT_KEY",
    "PeriodicJob",
    "PeriodicScheduler",
    "periodic_slot",
    "slot_key",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

SLOT_KEY = "periodic_slot"
"""The ``custom`` entry of a periodic job: its slot, as in its idempotency key."""

MAX_SLOTS_AHEAD = 16
"""At most this many future slots of one schedule are kept enqueued, however long the
look-ahead (an ``every=1 s`` schedule keeps 16 s ahead, not ten minutes' worth)."""

CLOCK_SKEW_ALLOWANCE = timedelta(minutes=1)
"""How far apart the schedulers' ideas of the server's time may be (each reads it every
minute; a clock drifts or steps in between): part of the dedup-window check. Also how
far ahead of the server's a worker's clock may run where a guard has no lease to read
the server's time from."""

DEFAULT_LOOKAHEAD = timedelta(minutes=10)
_DEFAULT_GRACE_CAP = timedelta(minutes=10)
DEFAULT_DEDUP_WINDOW = timedelta(hours=24)
# The longest a scheduler sleeps between passes: a stepped wall clock or a slot that
# a server refused is looked at again within this.
_MAX_SLEEP_MS = 60_000
# How often a scheduler reads the server's clock again (a worker's clock drifts, or is
# stepped by NTP, against the server's).
_CLOCK_READ_MS = 60_000
_SKEW_MS = CLOCK_SKEW_ALLOWANCE // timedelta(milliseconds=1)
_KEY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_MS = timedelta(milliseconds=1)


# -- schedules ---------------------------------------------------------------------------


class Schedule(Protocol):
    """When a periodic job's slots fall: ``every=``'s or ``cron=``'s."""

    def slots_after(self, after_ms: int) -> Iterator[int]:
        """The slots strictly after ``after_ms``, ascending (epoch ms)."""
        ...

    def describe(self) -> str: ...


class _Every:
    """Slots ``k * period`` after the Unix epoch (UTC)."""

    def __init__(self, period: timedelta) -> None:
        if period < timedelta(seconds=1) or period % timedelta(seconds=1):
            raise ValueError(f"every must be a whole number of seconds, at least 1, got {period!r}")
        self.period_ms = period // _MS

    def slots_after(self, after_ms: int) -> Iterator[int]:
        slot = (after_ms // self.period_ms + 1) * self.period_ms
        while True:
            yield slot
            slot += self.period_ms

    def describe(self) -> str:
        return f"every {self.period_ms // 1000} s"


def _zone(tz: Union[str, tzinfo, None]) -> tzinfo:
    if tz is None:
        return timezone.utc
    if isinstance(tz, tzinfo):
        return tz
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"tz: unknown time zone {tz!r} ({exc}); without a system time zone database, "
            "install the tzdata package (the cron extra does)"
        ) from None


class _Cron:
    """A 5-field cron expression read in a time zone by cronsim (Debian cron's rules:
    a job at a fixed local time whose hour is skipped runs once right after the
    change, one in a repeated hour runs once, on its first occurrence)."""

    def __init__(self, expr: str, tz: Union[str, tzinfo, None]) -> None:
        try:
            import cronsim
        except ImportError:
            raise ImportError(
                "cron= schedules need the cron extra: pip install 'sepp-lite[cron]'"
            ) from None
        if len(expr.split()) != 5:
            raise ValueError(f"cron must have 5 fields (minute hour day month weekday): {expr!r}")
        self.expr = expr
        self.tz = _zone(tz)
        self._cronsim = cronsim.CronSim
        try:
            next(self.slots_after(0))
        except (cronsim.CronSimError, ValueError, KeyError) as exc:
            raise ValueError(f"cron: invalid expression {expr!r}: {exc}") from None
        except StopIteration:
            raise ValueError(f"cron: {expr!r} never matches") from None

    def slots_after(self, after_ms: int) -> Iterator[int]:
        start = ms_to_datetime(after_ms).astimezone(self.tz)
        last = after_ms
        for moment in self._cronsim(self.expr, start):
            slot = datetime_to_ms(moment)
            # cronsim reads a fixed-time expression in naive local time, so a start in
            # the second pass of a repeated hour can yield the first pass's instant.
            if slot > last:
                last = slot
                yield slot

    def describe(self) -> str:
        return f"cron {self.expr!r} in {self.tz}"


def slot_key(job_type: str, slot_ms: int) -> str:
    """The idempotency key of ``job_type``'s job for the slot at ``slot_ms``:
    ``periodic:<job_type>:<YYYY-MM-DDTHH:MM:SSZ>``."""
    return f"periodic:{job_type}:{_slot_text(slot_ms)}"


def _slot_text(slot_ms: int) -> str:
    return ms_to_datetime(slot_ms).strftime(_KEY_FORMAT)


def periodic_slot(ctx: JobCtx) -> Optional[datetime]:
    """The slot (an aware UTC ``datetime``) a periodic job runs for, or ``None`` for a
    job that a schedule did not enqueue."""
    text = ctx.custom.get(SLOT_KEY)
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, _KEY_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


# -- what to enqueue ---------------------------------------------------------------------


class PeriodicJob:
    """A job to enqueue once per slot of a schedule: ``every=`` (a ``timedelta`` or
    seconds, a whole number of seconds; slots counted from the Unix epoch in UTC) or
    ``cron=`` (5 fields, read in ``tz``, UTC by default; needs the ``cron`` extra).

    ``lookahead`` (default 10 min): slots up to this far ahead are kept enqueued, at
    most :data:`MAX_SLOTS_AHEAD` of them. ``misfire_grace``: a slot this late is no
    longer run (its job, if already enqueued, is acked without running: see
    :meth:`PeriodicScheduler.guard`); by default the time to the next slot, at most
    10 min. ``payload``, ``priority``, ``max_attempts`` and ``custom`` go into every
    job. Raises ``ValueError`` for a bad option and ``ImportError`` for ``cron=``
    without the extra.
    """

    def __init__(
        self,
        job_type: str,
        queue: str,
        *,
        every: Optional[Duration] = None,
        cron: Optional[str] = None,
        tz: Union[str, tzinfo, None] = None,
        lookahead: Duration = DEFAULT_LOOKAHEAD,
        misfire_grace: Optional[Duration] = None,
        payload: Optional[Payload] = None,
        priority: Optional[int] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> None:
        EnqueueRequest(queue, job_type, priority=priority)  # checks the names and priority
        if (every is None) == (cron is None):
            raise ValueError("give exactly one of every= and cron=")
        self.job_type = job_type
        self.queue = queue
        if every is not None and tz is not None:
            raise ValueError("tz applies to cron= only: every= counts from the epoch in UTC")
        self.schedule: Schedule
        if cron is not None:
            self.schedule = _Cron(cron, tz)
        else:
            self.schedule = _Every(as_timedelta(every or 0, "every", positive=True))
        self.lookahead = as_timedelta(lookahead, "lookahead")
        self.misfire_grace: Optional[timedelta] = None
        if misfire_grace is not None:
            self.misfire_grace = as_timedelta(misfire_grace, "misfire_grace", positive=True)
        self.payload = payload
        self.priority = priority
        self.max_attempts = max_attempts
        self.custom = dict(custom or {})

    def __repr__(self) -> str:
        return f"PeriodicJob({self.job_type!r}, {self.queue!r}, {self.describe()})"

    @property
    def lookahead_ms(self) -> int:
        return self.lookahead // _MS

    @property
    def max_grace(self) -> timedelta:
        """The longest grace any slot gets."""
        return _DEFAULT_GRACE_CAP if self.misfire_grace is None else self.misfire_grace

    def grace_ms(self, slot_ms: int) -> int:
        """The misfire grace of the slot at ``slot_ms``."""
        if self.misfire_grace is not None:
            return self.misfire_grace // _MS
        gap = next(self.schedule.slots_after(slot_ms)) - slot_ms
        return min(gap, _DEFAULT_GRACE_CAP // _MS)

    def next_slots(self, after: datetime, count: int = 1) -> list[datetime]:
        """The next ``count`` slots strictly after ``after`` (aware UTC datetimes)."""
        slots = self.schedule.slots_after(datetime_to_ms(after))
        return [ms_to_datetime(next(slots)) for _ in range(count)]

    def describe(self) -> str:
        return self.schedule.describe()

    def request(self, slot_ms: int) -> EnqueueRequest:
        """The enqueue request of the slot at ``slot_ms``."""
        return EnqueueRequest(
            queue=self.queue,
            job_type=self.job_type,
            payload=self.payload,
            idempotency_key=slot_key(self.job_type, slot_ms),
            priority=self.priority,
            max_attempts=self.max_attempts,
            custom={**self.custom, SLOT_KEY: _slot_text(slot_ms)},
            scheduled_at=ms_to_datetime(slot_ms),
        )


# -- the scheduler -----------------------------------------------------------------------


class Producer(Protocol):
    """What a scheduler enqueues with: :class:`~sepp_lite.client.SeppClient` has it."""

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> list[Union[EnqueueAck, JobRejection]]: ...

    async def get_server_info(self) -> ServerInfo: ...


@dataclass
class _Track:
    """One schedule's progress in one scheduler: slots up to ``settled`` are enqueued
    or were missed; ``enqueued`` holds the later ones the server has."""

    settled: Optional[int] = None
    enqueued: set[int] = field(default_factory=set)


@dataclass
class _Plan:
    send: list[int]
    missed: list[int]
    wake_ms: int


class PeriodicScheduler:
    """Keeps the next slots of each :class:`PeriodicJob` enqueued; run one in every
    worker replica (``await scheduler.run()`` beside ``worker.run()``).

    ``dedup_window`` is the server's ``dedup_window_ms`` for these queues (24 h by
    default): the constructor raises ``ValueError`` when a job's ``lookahead`` plus
    its grace plus :data:`CLOCK_SKEW_ALLOWANCE` does not fit in it, and :meth:`run`
    raises ``ValueError`` at start when a look-ahead is beyond the server's schedule
    horizon or a key beyond its key length limit. Failed enqueues (an unreachable
    server) are logged and retried with backoff; :meth:`run` returns only when
    cancelled. ``clock`` defaults to the wall clock; the scheduler keeps the server's
    time by it, reading the server's clock at start and every minute (see the module's
    docstring), so the replicas' clocks need not agree.
    """

    def __init__(
        self,
        client: Producer,
        jobs: Sequence[PeriodicJob],
        *,
        dedup_window: Duration = DEFAULT_DEDUP_WINDOW,
        clock: Optional[Clock] = None,
    ) -> None:
        self._client = client
        self._jobs = list(jobs)
        self._window = as_timedelta(dedup_window, "dedup_window", positive=True)
        self._clock: Clock = clock if clock is not None else WallClock()
        self._tracks = {id(job): _Track() for job in self._jobs}
        self._by_type = {(job.queue, job.job_type): job for job in self._jobs}
        self._limits = BatchLimits()
        self._checked = False
        self._sleeping_until: Optional[int] = None
        # The server's clock less ours, as last read (at _read_at, by ours).
        self._offset_ms = 0
        self._read_at: Optional[int] = None
        for job in self._jobs:
            self._check_window(job)

    def _check_window(self, job: PeriodicJob) -> None:
        needed = job.lookahead + job.max_grace + CLOCK_SKEW_ALLOWANCE
        if needed > self._window:
            raise ValueError(
                f"periodic {job.job_type}: lookahead ({job.lookahead}) + misfire_grace "
                f"({job.max_grace}) + clock skew allowance ({CLOCK_SKEW_ALLOWANCE}) is "
                f"{needed}, beyond the dedup window ({self._window}): a slot could run "
                "twice; shorten them or raise dedup_window to the server's setting"
            )

    @property
    def jobs(self) -> list[PeriodicJob]:
        """The scheduled jobs."""
        return list(self._jobs)

    @property
    def sleeping_until(self) -> Optional[datetime]:
        """When the scheduler next looks at its schedules (by the server's clock, as it
        keeps it), while it sleeps; ``None`` while it is not running or busy (enqueuing,
        backing off)."""
        ms = self._sleeping_until
        return None if ms is None else ms_to_datetime(ms)

    async def check(self) -> None:
        """Read the server's limits and clock (waiting while it is unreachable) and
        raise ``ValueError`` for a schedule it cannot keep; :meth:`run` does it first."""
        info = await self._retrying("cannot read the server's limits", self._read_server)
        for job in self._jobs:
            check_server_limits(job, info)
        self._limits = BatchLimits.of(info)
        self._checked = True

    async def run(self) -> None:
        """Enqueue slots until cancelled; see the class docstring for what raises."""
        if not self._checked:
            await self.check()
        logger.info(
            "periodic: keeping the next slots enqueued of %s",
            "; ".join(f"{job.job_type} ({job.describe()})" for job in self._jobs) or "nothing",
        )
        while True:
            if self._reading_is_old():
                await self._retrying("cannot read the server's clock", self._read_server)
            wake = await self._retrying("enqueue failed", self._pass)
            await self._sleep_until(wake)

    async def _read_server(self) -> ServerInfo:
        """The server's info, whose clock this scheduler keeps from now on."""
        before = self._clock.now_ms()
        info = await self._client.get_server_info()
        after = self._clock.now_ms()
        # The server read its clock somewhere within the call: take the middle.
        self._offset_ms = datetime_to_ms(info.server_time) - (before + after) // 2
        self._read_at = after
        return info

    def _reading_is_old(self) -> bool:
        since = None if self._read_at is None else self._clock.now_ms() - self._read_at
        return since is None or not 0 <= since < _CLOCK_READ_MS  # or our clock stepped back

    def _now(self) -> int:
        """The server's time, as this scheduler keeps it."""
        return self._clock.now_ms() + self._offset_ms

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``'s result, calling it again while it fails, for as long as it takes
        (``_reach``: a growing pause, one WARNING line each); a refusal no retry can fix
        (a bad API key) raises."""

        async def attempt() -> T:
            try:
                return await call()
            except SeppError:
                raise
            except Exception:  # a bug must not stop the worker beside it
                logger.exception("periodic: %s", what)
                raise

        return await until_reachable(
            attempt,
            math.inf,
            text=lambda error: f"periodic: {what} ({error_text(error)})",
            retried=_transient,
        )

    async def _sleep_until(self, deadline_ms: int) -> None:
        if deadline_ms <= self._now():
            return
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake() -> None:  # may run on another thread (a test server's clock)
            loop.call_soon_threadsafe(_resolve, woken)

        handle = self._clock.call_at(deadline_ms - self._offset_ms, wake)
        self._sleeping_until = deadline_ms
        try:
            await woken
        finally:
            self._sleeping_until = None
            handle.cancel()

    async def _pass(self) -> int:
        """Enqueue what is due now; return when to look again."""
        now, plans = await self._plans()
        requests = [(job, slot, job.request(slot)) for job, plan in plans for slot in plan.send]
        for chunk in fit_batches(requests, self._limits, _sent_size):
            results = await self._client.enqueue_batch([request for _, _, request in chunk])
            for (job, slot, _), result in zip(chunk, results):
                self._record(job, slot, result)
        for job, plan in plans:
            self._settle(job, plan, now)
        return min([now + _MAX_SLEEP_MS] + [plan.wake_ms for _, plan in plans])

    async def _plans(self) -> tuple[int, list[tuple[PeriodicJob, _Plan]]]:
        """The time now and each schedule's plan. Slots missed while this scheduler
        ran mean a frozen process, or a clock stepped forward since the last reading:
        the server's clock, read again, tells which."""
        now = self._now()
        plans = [(job, self._plan(job, now)) for job in self._jobs]
        if any(plan.missed and self._tracks[id(job)].settled is not None for job, plan in plans):
            await self._read_server()
            now = self._now()
            plans = [(job, self._plan(job, now)) for job in self._jobs]
        return now, plans

    def _plan(self, job: PeriodicJob, now: int) -> _Plan:
        track = self._tracks[id(job)]
        done = track.settled  # slots up to here need nothing more
        # From the first slot not settled (or, at the first pass, the oldest one that
        # may still be caught up), but at most from now: future slots are counted.
        start = now - job.max_grace // _MS if done is None else min(done, now)
        send: list[int] = []
        missed: list[int] = []
        ahead = 0
        horizon = now + job.lookahead_ms
        for slot in job.schedule.slots_after(start):
            if slot > now:
                if slot > horizon:
                    return _Plan(send, missed, slot - job.lookahead_ms)
                if ahead == MAX_SLOTS_AHEAD:
                    return _Plan(send, missed, self._first_after(job, now))
                ahead += 1
            if (done is not None and slot <= done) or slot in track.enqueued:
                continue
            if slot <= now and slot + job.grace_ms(slot) <= now:
                missed.append(slot)
            else:
                send.append(slot)
        raise AssertionError("a schedule's slots never end")  # pragma: no cover

    @staticmethod
    def _first_after(job: PeriodicJob, now: int) -> int:
        return next(job.schedule.slots_after(now))

    def _record(self, job: PeriodicJob, slot: int, result: object) -> None:
        if isinstance(result, EnqueueAck):
            self._tracks[id(job)].enqueued.add(slot)
            return
        logger.warning(
            "periodic %s: the server refused the job of slot %s: %s",
            job.job_type,
            _slot_text(slot),
            result,
        )

    def _settle(self, job: PeriodicJob, plan: _Plan, now: int) -> None:
        track = self._tracks[id(job)]
        if plan.missed and track.settled is not None:
            logger.warning(
                "periodic %s: %d slot(s) from %s to %s not run: more than misfire_grace late",
                job.job_type,
                len(plan.missed),
                _slot_text(plan.missed[0]),
                _slot_text(plan.missed[-1]),
            )
        done = set(plan.missed)
        start = track.settled
        if start is None:
            start = now - job.max_grace // _MS
        for slot in job.schedule.slots_after(start):
            if slot in track.enqueued:
                track.enqueued.discard(slot)
            elif slot not in done:
                break
            start = slot
        track.settled = start

    # -- the worker's side ---------------------------------------------------------------

    def misfired(self, ctx: JobCtx, *, lease_duration: Optional[Duration] = None) -> bool:
        """Whether ``ctx`` is a first delivery of one of these schedules' jobs that
        came more than its slot's misfire grace late (then it logs one line). The
        worker acks such a job without running its handler.

        Late by the server's clock: with ``lease_duration``, the lease the worker
        reserves with, the delivery's time is ``ctx.lease_expires_at`` less that lease
        (the server grants at most it, so this is never after the delivery), and the
        worker's clock plays no part. Without it, the worker's clock stands in,
        corrected by this scheduler's last reading of the server's (if it runs) and
        less :data:`CLOCK_SKEW_ALLOWANCE`, so that a clock up to that far ahead cannot
        make an on-time slot late. ``ValueError`` for a lease that is not positive."""
        return self._misfired(ctx, _lease_ms(lease_duration))

    def _misfired(self, ctx: JobCtx, lease_ms: Optional[int]) -> bool:
        job = self._by_type.get((ctx.queue, ctx.job_type))
        slot = periodic_slot(ctx)
        if job is None or slot is None or ctx.attempt != 1:
            return False
        slot_ms = datetime_to_ms(slot)
        if lease_ms is None:
            delivered = self._now() - _SKEW_MS
        else:
            delivered = datetime_to_ms(ctx.lease_expires_at) - lease_ms
        late = delivered - slot_ms
        if late < job.grace_ms(slot_ms):
            return False
        logger.warning(
            "periodic %s: slot %s skipped: delivered %.1f s late, beyond misfire_grace",
            job.job_type,
            _slot_text(slot_ms),
            late / 1000,
        )
        return True

    def guard(
        self,
        handler: Callable[[Optional[Payload], JobCtx], Awaitable[None]],
        *,
        lease_duration: Optional[Duration] = None,
    ) -> Callable[[Optional[Payload], JobCtx], Awaitable[None]]:
        """``handler`` for a :class:`~sepp_lite.worker.Worker`, except that a job
        :meth:`misfired` says is too late returns at once (so it is acked unrun).
        Give ``lease_duration``, the worker's, to judge by the server's clock alone
        (``Tasks`` workers do); ``ValueError`` for one that is not positive."""
        lease_ms = _lease_ms(lease_duration)

        async def guarded(payload: Optional[Payload], ctx: JobCtx) -> None:
            if self._misfired(ctx, lease_ms):
                return
            await handler(payload, ctx)

        return guarded


def check_server_limits(job: PeriodicJob, info: ServerInfo) -> None:
    """Raise ``ValueError`` when the server cannot take ``job``'s slots: a look-ahead
    beyond its schedule horizon, or a key longer than it accepts."""
    if job.lookahead > info.max_schedule_horizon:
        raise ValueError(
            f"periodic {job.job_type}: lookahead ({job.lookahead}) is beyond the server's "
            f"schedule horizon ({info.max_schedule_horizon})"
        )
    key = slot_key(job.job_type, 0)
    if len(key.encode()) > info.max_idempotency_key_bytes:
        raise ValueError(
            f"periodic {job.job_type}: its keys ({len(key.encode())} bytes, e.g. {key!r}) "
            f"are longer than the server accepts ({info.max_idempotency_key_bytes})"
        )


def _sent_size(item: tuple[PeriodicJob, int, EnqueueRequest]) -> int:
    request = item[2]
    return sent_size(request, len(encode_enqueue_batch_request([request])))


def _transient(error: Exception) -> bool:
    """Whether the scheduler tries again after ``error``: anything but a refusal no
    retry can fix."""
    return not (isinstance(error, SeppError) and is_permanent(error))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _lease_ms(lease_duration: Optional[Duration]) -> Optional[int]:
    if lease_duration is None:
        return None
    return as_timedelta(lease_duration, "lease_duration", positive=True) // _MS
