"""Concurrent ``enqueue()`` calls of one client share EnqueueBatch calls.

The rule is Nagle's, for RPCs. While none of the client's enqueue calls is in flight,
a call goes out at once and alone, exactly as without coalescing (``SeppClient.enqueue``
sends it itself). A call made while one is in flight waits here; the waiting calls go
out together as the next batch when the calls in flight have ended, or at once when they
fill a batch (the server's ``max_enqueue_batch`` jobs, or ``_sending.MAX_BATCH_BYTES``) and
fewer than ``max_in_flight`` batches are in flight. No timer holds a call back.

Each caller keeps what it would have had alone:

- its result: the answer is split by position; a whole-call failure is every member's,
  except a refusal for the call's size. The server refuses a call with more jobs than its
  ``max_enqueue_batch`` (INVALID_ARGUMENT) or more bytes than its message limit
  (OUT_OF_RANGE) before it applies any of it, and a fresh client knows neither (the
  second is never advertised; either may change when the server restarts). So the
  members of such a call go back to their lane, in their place, and the coalescer sends
  at most half as many jobs, or bytes, a call from then on (``get_server_info()`` sets
  the job count to the server's own). A job refused alone gets what it would have had
  alone: a single job is never split;
- its retry decision: jobs with and without idempotency keys wait in separate lanes and
  never share a batch, so a batch is retried exactly when each of its jobs alone would
  be (``_retry.is_retryable``'s ``all_keyed``). The retry policy and ``rpc_timeout`` are
  the client's, the same for every call, so no other option can differ;
- its deadline, counted from its own call, whatever waits or runs ahead of it: a batch's
  RPC may run until its last member's deadline; a member whose deadline comes first
  fails then, with the error it would have had alone (the last failure, when the next
  retry would end past its deadline; else DEADLINE_EXCEEDED, which says the job may
  have been enqueued). One whose deadline passes while it waits to be sent (behind a
  batch, a call sent alone, a retry's backoff) fails then, unsent, with the words of a
  call whose deadline passed before it was sent;
- its cancellation: a call cancelled while it waits is never sent. One cancelled while
  its batch is in flight raises ``CancelledError`` at once and its job may still be
  enqueued, as when a call is cancelled after it went out alone; the RPC itself is
  cancelled only once every member of the batch is gone;
- its span and trace context: each caller encodes its own job in its own span (so the
  job carries that span); the RPC's ``traceparent`` metadata, and the retry warnings,
  are the first member's.

Order: jobs of one lane leave in call order (within a batch, and batch after batch;
a lane is kept in deadline order, which is call order as every call has the client's
``rpc_timeout``), but with more than one batch in flight, or one lane's batch beside
the other's, the server may apply a later call's job first. A call that has returned
was applied before any call started after it, as without coalescing.

Backpressure: at most ``max_waiting`` calls wait here with their encoded job (and,
for a moment, the members of a call refused for its size, which had room before).
Callers beyond that wait for room, in arrival order, before their job is encoded; that
wait counts against their deadline (an expired one is never sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import logging
import math
from collections import deque
from collections.abc import Awaitable
from typing import Callable, Optional, Protocol, Union

from sepp_lite import _log, _otel, errors
from sepp_lite._retry import OnRetry
from sepp_lite._sending import BatchLimits
from sepp_lite.types import EnqueueAck

__all__ = ["Coalescer"]

logger = _log.logger()

# Defaults of connect()'s max_enqueue_batches_in_flight and max_enqueues_waiting.
DEFAULT_MAX_IN_FLIGHT = 2
DEFAULT_MAX_WAITING = 1024

Result = Union[EnqueueAck, "errors.JobRejection"]
# The client's one EnqueueBatch call: (request, jobs, deadline, all keyed, on_retry) to
# the checked results, one per job; and the error of a call at its deadline.
SendBatch = Callable[[bytes, int, float, bool, OnRetry], Awaitable[list[Result]]]


class DeadlineError(Protocol):
    def __call__(self, method: str, *, sent: bool) -> errors.SeppError: ...


# The refusals of a whole call for its size (job count, bytes), which the server makes
# before it applies any job: its members can be sent again in smaller calls.
_REFUSED_FOR_SIZE = (errors.InvalidRequestError, errors.RequestTooLargeError)


def check_options(max_in_flight: object, max_waiting: object) -> None:
    """``ValueError`` (naming the option) unless both are positive ints."""
    for name, value in (
        ("max_enqueue_batches_in_flight", max_in_flight),
        ("max_enqueues_waiting", max_waiting),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int of at least 1, got {value!r}")


class _Entry:
    """One waiting call: its encoded job, its deadline, the future it waits on."""

    __slots__ = ("batch", "context", "deadline_at", "future", "part", "taken")

    def __init__(self, part: bytes, deadline_at: float, future: asyncio.Future[Result]) -> None:
        self.part = part
        self.deadline_at = deadline_at  # also its call order, across both lanes
        self.future = future
        self.taken = False  # out of its lane: in a batch, or failed before one
        self.batch: Optional[_Batch] = None
        # The caller's context (its span), for the RPC's trace metadata and retry logs.
        self.context = contextvars.copy_context() if _otel.AVAILABLE else None


class _Lane:
    """Waiting calls whose jobs all have an idempotency key, or none has."""

    __slots__ = ("bytes", "count", "entries", "keyed")

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed
        self.entries: deque[_Entry] = deque()  # cancelled ones are skipped when taken
        self.count = 0  # live entries
        self.bytes = 0

    def add(self, entry: _Entry) -> None:
        """Append ``entry``, or insert it in deadline order: a caller that waited for
        room may come in after a later caller that found room at once."""
        entries = self.entries
        if entries and entry.deadline_at < entries[-1].deadline_at:
            index = len(entries) - 1
            while index and entries[index - 1].deadline_at > entry.deadline_at:
                index -= 1
            entries.insert(index, entry)
        else:
            entries.append(entry)
        self.count += 1
        self.bytes += len(entry.part)

    def put_back(self, entries: list[_Entry]) -> None:
        """Entries taken out (in deadline order) to wait here again, in their place."""
        for entry in entries:
            entry.taken = False
            entry.batch = None
            self.bytes += len(entry.part)
        self.count += len(entries)
        self.entries = deque(heapq.merge(entries, self.entries, key=_deadline))

    def head(self) -> Optional[_Entry]:
        entries = self.entries
        while entries and entries[0].future.done():
            entries.popleft()
        return entries[0] if entries else None

    def take_head(self) -> _Entry:
        """The head (a live one: see :meth:`head`), out of the lane."""
        entry = self.entries.popleft()
        entry.taken = True
        self.count -= 1
        self.bytes -= len(entry.part)
        return entry


def _deadline(entry: _Entry) -> float:
    return entry.deadline_at


class _Batch:
    """One EnqueueBatch call in flight for its members."""

    __slots__ = ("deadline_at", "entries", "live", "started", "task", "timer")

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries = entries
        self.live = len(entries)  # members still waiting for the answer
        self.deadline_at = max(entry.deadline_at for entry in entries)
        self.task: Optional[asyncio.Task[None]] = None
        self.started = False  # a task cancelled before its first step never runs its body
        self.timer: Optional[asyncio.TimerHandle] = None


class Coalescer:
    """The enqueue calls of one client that wait for, or ride in, a shared batch."""

    def __init__(
        self,
        send: SendBatch,
        deadline_error: DeadlineError,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        """``send`` and ``deadline_error`` are the client's: its one call path, and the
        error a call of its gets at its deadline."""
        check_options(max_in_flight, max_waiting)
        self._send_batch = send
        self._call_deadline_error = deadline_error
        self._max_in_flight = max_in_flight
        self._max_waiting = max_waiting
        # The server's max_enqueue_batch once known; both lowered when a server refuses
        # a call's size.
        self.limits = BatchLimits()
        self.in_flight = 0  # enqueue RPCs: batches, and calls sent alone
        self.waiting = 0  # calls here, or with room reserved, not yet sent
        self._lanes = (_Lane(False), _Lane(True))
        self._room: deque[asyncio.Future[None]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        # One timer for the waiting calls' deadlines, at the earliest lane head's (or
        # earlier: it fires for nothing when the head has gone, and is armed again).
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at = math.inf

    @property
    def idle(self) -> bool:
        """Whether a call may go out alone now (nothing in flight, nothing waiting)."""
        return not (self.in_flight or self.waiting)

    # -- calls sent alone, by the client ----------------------------------------------

    def alone_started(self) -> None:
        self.in_flight += 1

    def alone_ended(self) -> None:
        self.in_flight -= 1
        if self.waiting:
            self._dispatch()

    # -- calls that wait for a batch ----------------------------------------------------

    async def take_room(self, deadline_at: float) -> None:
        """A waiting slot for the caller's job, at once when one is free; else wait for
        one (in arrival order), or fail at ``deadline_at``, unsent. The caller encodes
        its job after this (in its own span), then hands it to :meth:`enqueue`, or
        gives the slot back with :meth:`release_room` if it cannot."""
        if self.waiting >= self._max_waiting or self._room:
            await self._wait_for_room(deadline_at)
        else:
            self.waiting += 1

    async def enqueue(self, part: bytes, keyed: bool, deadline_at: float) -> Result:
        """The encoded job ``part``, in the slot :meth:`take_room` gave: its result once
        its batch is answered; raise what the batch's call raised, or the caller's own
        deadline error."""
        entry = _Entry(part, deadline_at, asyncio.get_running_loop().create_future())
        lane = self._lanes[keyed]
        lane.add(entry)
        if deadline_at < self._timer_at:
            self._arm_waiting(deadline_at)
        if not self.in_flight or self._full(lane):
            self._dispatch()
        try:
            return await entry.future
        except asyncio.CancelledError:
            self._abandon(entry, lane)
            raise

    def _full(self, lane: _Lane) -> bool:
        return lane.count >= self._max_waiting or self.limits.full(lane.count, lane.bytes)

    def _abandon(self, entry: _Entry, lane: _Lane) -> None:
        """A cancelled caller: out of its lane (never sent), or out of its batch."""
        if not entry.taken:
            entry.taken = True
            lane.count -= 1
            lane.bytes -= len(entry.part)
            self.release_room()
            return
        batch = entry.batch
        if batch is not None and entry.future.cancelled():  # else it was counted out
            self._member_gone(batch)

    def _member_gone(self, batch: _Batch) -> None:
        batch.live -= 1
        if batch.live == 0 and batch.started and batch.task is not None:
            batch.task.cancel()  # nobody waits for the answer: as a lone call cancelled

    # -- backpressure -----------------------------------------------------------------

    async def _wait_for_room(self, deadline_at: float) -> None:
        """Wait until a slot is reserved for this caller (FIFO), or fail at its
        deadline without having been sent."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._room.append(waiter)
        timer = loop.call_at(deadline_at, self._room_expired, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with contextlib.suppress(ValueError):
                    self._room.remove(waiter)
            elif waiter.exception() is None:
                self.release_room()  # woken with a slot, then cancelled: pass it on
            raise
        finally:
            timer.cancel()

    def _room_expired(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self._room.remove(waiter)
            waiter.set_exception(self._deadline_error(sent=False))

    def release_room(self) -> None:
        self.waiting -= 1
        self._wake_room()

    def _wake_room(self) -> None:
        room = self._room
        while room and self.waiting < self._max_waiting:
            waiter = room.popleft()
            if not waiter.done():
                self.waiting += 1  # the slot is the woken caller's
                waiter.set_result(None)

    # -- batches ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Send what the rule allows: everything waiting while nothing is in flight,
        full batches while fewer than the bound are."""
        while True:
            lane = self._next_lane()
            if lane is None:
                break
            entries = self._take(lane)
            if entries:
                self._start(entries, lane.keyed)
        self._wake_room()

    def _next_lane(self) -> Optional[_Lane]:
        plain, keyed = self._lanes
        if not self.in_flight:
            first, second = plain.head(), keyed.head()
            if first is None or second is None:
                return plain if first is not None else keyed if second is not None else None
            return plain if first.deadline_at <= second.deadline_at else keyed
        if self.in_flight >= self._max_in_flight:
            return None
        for lane in self._lanes:
            if lane.count and self._full(lane):
                return lane
        return None

    def _take(self, lane: _Lane) -> list[_Entry]:
        """The next batch of ``lane``, in arrival order; callers whose deadline has
        passed fail here, unsent."""
        entries: list[_Entry] = []
        size = 0
        fits = self.limits.fits
        now = asyncio.get_running_loop().time()
        while True:
            entry = lane.head()  # skips callers cancelled while they waited
            if entry is None:
                break
            part_size = len(entry.part)
            if not fits(len(entries), size, part_size):
                break
            lane.take_head()
            self.waiting -= 1
            if entry.deadline_at <= now:
                entry.future.set_exception(self._deadline_error(sent=False))
                continue
            size += part_size
            entries.append(entry)
        return entries

    def _start(self, entries: list[_Entry], keyed: bool) -> None:
        batch = _Batch(entries)
        for entry in entries:
            entry.batch = batch
        loop = asyncio.get_running_loop()
        context = entries[0].context
        coro = self._send(batch, keyed)
        # The task runs in the first member's context (its span), not in whichever
        # call's context happens to dispatch it.
        task = loop.create_task(coro) if context is None else context.run(loop.create_task, coro)
        batch.task = task
        self._tasks.add(task)
        self.in_flight += 1
        self._arm(batch)

    async def _send(self, batch: _Batch, keyed: bool) -> None:
        batch.started = True
        try:
            if batch.live:  # else every member left before the call started
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("enqueue: %d call(s) share one EnqueueBatch", batch.live)
                _answer(batch.entries, await self._call(batch, keyed))
        except asyncio.CancelledError:
            for entry in batch.entries:
                entry.future.cancel()
            raise
        except Exception as error:  # the whole call failed
            self._failed(batch, keyed, error)
        finally:
            if batch.timer is not None:
                batch.timer.cancel()
            self._tasks.discard(asyncio.current_task())
            self.in_flight -= 1
            if self.waiting:
                self._dispatch()

    def _failed(self, batch: _Batch, keyed: bool, error: Exception) -> None:
        """Every member's failure, unless they can be sent again in smaller calls."""
        if self._put_back(batch, keyed, error):
            return
        for entry in batch.entries:
            if not entry.future.done():
                entry.future.set_exception(error)

    def _put_back(self, batch: _Batch, keyed: bool, error: Exception) -> bool:
        """Whether ``error`` refused the batch's call for its size (so it applied no
        job) and there is a smaller call to make: then its callers wait again, in their
        lane, and later calls carry at most half as much."""
        jobs = len(batch.entries)
        if jobs < 2 or not isinstance(error, _REFUSED_FOR_SIZE):
            return False
        limits = self.limits
        if isinstance(error, errors.RequestTooLargeError):
            size = sum([len(entry.part) for entry in batch.entries])
            limits.size = min(limits.size, size // 2)
        else:
            limits.jobs = min(limits.jobs, (jobs + 1) // 2)
        logger.info(
            "enqueue: the server refused an EnqueueBatch of %d jobs (%s); sending them "
            "again, at most %d jobs and %d bytes a call",
            jobs,
            error,
            limits.jobs,
            limits.size,
        )
        live = [entry for entry in batch.entries if not entry.future.done()]
        if live:
            self._lanes[keyed].put_back(live)
            self.waiting += len(live)
            if live[0].deadline_at < self._timer_at:
                self._arm_waiting(live[0].deadline_at)
        return True

    async def _call(self, batch: _Batch, keyed: bool) -> list[Result]:
        """The batch's EnqueueBatch call, through the client's one call path: retried
        per its policy until the batch's deadline, each retry first failing the members
        whose deadline would pass before it fails (with the failure, as the retry loop
        of a call sent alone would have raised it)."""
        request = b"".join([entry.part for entry in batch.entries])
        on_retry = functools.partial(self._retrying, batch)
        return await self._send_batch(
            request, len(batch.entries), batch.deadline_at, keyed, on_retry
        )

    def _retrying(self, batch: _Batch, delay: float, error: errors.SeppError) -> None:
        self._expire(batch, asyncio.get_running_loop().time() + delay, error)

    # -- deadlines ----------------------------------------------------------------------

    def _arm_waiting(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._waiting_expired, at)

    def _waiting_expired(self, at: float) -> None:
        """Fail, unsent, the waiting calls whose deadline is ``at`` (this timer's time,
        so a timer run a clock tick early still fails them) or earlier; then arm the
        timer for the next one."""
        self._timer, self._timer_at = None, math.inf
        following = math.inf
        for lane in self._lanes:
            entry = lane.head()
            while entry is not None and entry.deadline_at <= at:
                lane.take_head()
                self.waiting -= 1
                entry.future.set_exception(self._deadline_error(sent=False))
                entry = lane.head()
            if entry is not None:
                following = min(following, entry.deadline_at)
        if following < math.inf:
            self._arm_waiting(following)
        self._wake_room()

    def _arm(self, batch: _Batch) -> None:
        """A timer for the earliest member deadline before the batch's own."""
        earliest = min(
            (entry.deadline_at for entry in batch.entries if not entry.future.done()),
            default=batch.deadline_at,
        )
        if earliest < batch.deadline_at:
            loop = asyncio.get_running_loop()
            batch.timer = loop.call_at(earliest, self._timer_fired, batch, earliest)

    def _timer_fired(self, batch: _Batch, at: float) -> None:
        batch.timer = None
        self._expire(batch, at, None)
        if batch.live:
            self._arm(batch)

    def _expire(self, batch: _Batch, until: float, error: Optional[errors.SeppError]) -> None:
        """Fail the members whose deadline is at or before ``until`` with ``error``
        (DEADLINE_EXCEEDED for ``None``); cancel the call once none is left."""
        for entry in batch.entries:
            if entry.deadline_at <= until and not entry.future.done():
                entry.future.set_exception(error or self._deadline_error(sent=True))
                self._member_gone(batch)

    def _deadline_error(self, *, sent: bool) -> errors.SeppError:
        """The error a call alone gets at its deadline (the client's)."""
        return self._call_deadline_error("EnqueueBatch", sent=sent)

    # -- closing ----------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for the batches in flight (the transport is closed, so they end now)."""
        while True:
            # A task cancelled before its first step (at loop shutdown) never ran the
            # part that removes it from the set.
            tasks = [task for task in self._tasks if not task.done()]
            if not tasks:
                break
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf


def _answer(entries: list[_Entry], results: list[Result]) -> None:
    """Each member's result from the batch's (checked) answer, by position."""
    for entry, result in zip(entries, results):
        if not entry.future.done():
            entry.future.set_result(result)
