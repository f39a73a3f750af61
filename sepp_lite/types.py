"""Public value types: what producers send, what workers receive, what the server reports.

These mirror sepp-py 0.1.0's ``sepp.types`` field for field, so code written for the
official client runs unchanged; durations also accept float seconds.

Each value is checked where it enters, by the rules of :mod:`sepp_lite._validate`: at
construction, what sepp-py checks there; when it is sent, the rest, and again what may
have changed since (the dataclasses are mutable): :func:`check_enqueue_request` for a
job, :func:`reserve_request` for reserve options, which are checked again only when a
field changed since they were last checked.
"""

from __future__ import annotations

import contextlib
import enum
import operator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Union

from sepp_lite import _otel, _validate
from sepp_lite._time import Duration

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Protocol, TypeVar

    from sepp_lite._lease import Lease

    _T_co = TypeVar("_T_co", covariant=True)

    # A str is an Iterable[str] and a Sequence[str], so those types let
    # Worker(client, "emails", 30) through (six one-letter queues). str's __contains__
    # takes only a str, which is what these two protocols use to tell it apart; they
    # exist for type checkers only (the runtime check is in _validate.queue_names).

    class QueueCollection(Protocol[_T_co]):
        """A list, tuple, set or dict view of queue names; not a str."""

        def __iter__(self) -> Iterator[_T_co]: ...
        def __len__(self) -> int: ...
        def __contains__(self, value: object, /) -> bool: ...

    class QueueSequence(QueueCollection[_T_co], Protocol[_T_co]):
        """A list or tuple of queue names; not a str."""

        def __getitem__(self, index: int, /) -> _T_co: ...

    QueueNames = Union[QueueCollection[str], Iterator[str]]
    """Queue names as a Worker takes them: a collection or an iterator, not a str."""

__all__ = [
    "DeadLetterCause",
    "DeadLetterRecord",
    "EnqueueAck",
    "EnqueueRequest",
    "Job",
    "JobCtx",
    "Payload",
    "Primitive",
    "Priority",
    "PriorityOutOfRangeError",
    "ReserveOptions",
    "RetryDirective",
    "RetryPolicy",
    "ServerInfo",
    "TraceContext",
    "TraceContextError",
]

Primitive = Union[str, int, float, bool]
"""A value of a job's ``custom`` map."""

_DEFAULT_WAIT_TIMEOUT = timedelta(seconds=30)


class PriorityOutOfRangeError(ValueError):
    """A priority outside ``0..=9``, or not an ``int`` (``bool`` is refused)."""

    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(f"priority must be an int from 0 to 9, got {value!r}")


class TraceContextError(ValueError):
    """A ``traceparent`` that is not a valid W3C trace-context header."""


@dataclass(frozen=True)
class Payload:
    """A job's opaque body and the encoding hint that says how to read it.

    The server requires non-empty ``data``; a job without a body uses ``payload=None``.
    """

    data: bytes
    encoding: str


@dataclass(frozen=True, order=True)
class Priority:
    """A priority from 0 (lowest, the default) to 9 (served first)."""

    value: int

    MIN: ClassVar[Priority]
    MAX: ClassVar[Priority]
    P0: ClassVar[Priority]
    P1: ClassVar[Priority]
    P2: ClassVar[Priority]
    P3: ClassVar[Priority]
    P4: ClassVar[Priority]
    P5: ClassVar[Priority]
    P6: ClassVar[Priority]
    P7: ClassVar[Priority]
    P8: ClassVar[Priority]
    P9: ClassVar[Priority]

    def __post_init__(self) -> None:
        if not _validate.is_priority(self.value):
            raise PriorityOutOfRangeError(self.value)

    def __int__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return str(self.value)


PRIORITIES: tuple[Priority, ...] = tuple(Priority(i) for i in range(10))
(
    Priority.P0,
    Priority.P1,
    Priority.P2,
    Priority.P3,
    Priority.P4,
    Priority.P5,
    Priority.P6,
    Priority.P7,
    Priority.P8,
    Priority.P9,
) = PRIORITIES
Priority.MIN = Priority.P0
Priority.MAX = Priority.P9


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context carried by a job from its producer to its worker.

    The ``traceparent`` is checked on construction (``TraceContextError``). With the
    ``otel`` extra, the client fills it in on enqueue and the worker links to it.
    """

    traceparent: str
    tracestate: Optional[str] = None

    def __post_init__(self) -> None:
        problem = _validate.trace_context_problem(self.traceparent, self.tracestate)
        if problem is not None:
            raise TraceContextError(problem)

    @classmethod
    def from_current_otel(cls) -> TraceContext | None:
        """The active OpenTelemetry span as a trace context, or ``None`` when there is
        no valid span or OpenTelemetry is not installed."""
        headers = _otel.current_headers()
        if headers is None:
            return None
        try:
            return TraceContext(*headers)
        except TraceContextError:
            return None

    def attach_to_otel(self) -> contextlib.AbstractContextManager[None]:
        """A context manager that makes this the current OpenTelemetry context;
        a no-op without OpenTelemetry."""
        return _otel.attach_trace_context(self)

    def otel_span_context(self) -> Any:
        """This context as an OpenTelemetry ``SpanContext`` (for a span link), or
        ``None`` when it is not valid or OpenTelemetry is not installed."""
        return _otel.span_context_of(self)


@dataclass
class EnqueueRequest:
    """One job to enqueue. ``queue`` and ``job_type`` are required; every other field
    left as ``None`` stays off the wire, so the queue's server-side default applies.

    ``priority`` takes a :class:`Priority` or an int from 0 to 9. ``scheduled_at`` holds
    the job back until then (naive datetimes are read as UTC; instants before 1970 are
    dropped, as sepp-py does). Custom values must be ``str``, ``int`` (64-bit),
    ``float`` or ``bool``; they are checked when the request is sent, before any RPC.
    """

    queue: str
    job_type: str
    payload: Optional[Payload] = None
    idempotency_key: Optional[str] = None
    priority: Union[Priority, int, None] = None
    max_attempts: Optional[int] = None
    custom: Mapping[str, Primitive] = field(default_factory=dict)
    trace_context: Optional[TraceContext] = None
    scheduled_at: Optional[datetime] = None

    def __post_init__(self) -> None:
        # What sepp-py checks here; the rest is checked when the request is sent
        # (check_enqueue_request).
        _validate.queue(self.queue)
        _validate.job_type(self.job_type)
        if self.priority is not None and not isinstance(self.priority, Priority):
            self.priority = Priority(self.priority)


@dataclass(frozen=True)
class EnqueueAck:
    """An accepted job: its id and whether an idempotency key matched an existing job
    (then ``job_id`` is that job's id and nothing new was created)."""

    job_id: str
    deduplicated: bool


@dataclass
class JobCtx:
    """Everything about a reserved job but its payload, plus its lease.

    ``lease_expires_at`` is the expiry granted at reserve time; :meth:`extend` returns
    the new one, and :attr:`lease` follows it.
    """

    id: str
    queue: str
    job_type: str
    priority: Priority
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    custom: dict[str, Primitive]
    trace_context: Optional[TraceContext]
    lease_expires_at: datetime
    scheduled_at: Optional[datetime] = None
    # sepp-py's field and constructor parameter; the client sets it through bind_lease.
    _lease: Optional[Lease] = field(default=None, repr=False, compare=False)

    @property
    def lease(self) -> Optional[Lease]:
        """This delivery's lease handle (:class:`~sepp_lite.client.Lease`: its
        ``worker_id``, ``known_expiry_ms`` and ``released``), or None on a ctx that did
        not come from ``reserve``."""
        return self._lease

    async def extend(self, extension: Duration) -> datetime:
        """Extend this job's lease to ``extension`` from now and return the new expiry.

        Raises :class:`~sepp_lite.errors.LeaseError` when the lease is gone, and
        ``RuntimeError`` on a ctx that did not come from ``reserve``.
        """
        if self._lease is None:
            raise RuntimeError("this JobCtx has no lease: it was not returned by reserve()")
        return await self._lease.extend(extension)

    def __str__(self) -> str:
        return (
            f"JobCtx(id={self.id}, job_type={self.job_type}, "
            f"attempt={self.attempt}/{self.max_attempts}, priority={self.priority.value})"
        )


def bind_lease(ctx: JobCtx, lease: Lease) -> None:
    """Attach ``lease`` to ``ctx``: how ``SeppClient.reserve`` hands each job its lease
    (internal, hence not in ``__all__``; read it back as ``ctx.lease``)."""
    ctx._lease = lease


@dataclass
class Job:
    """A reserved job: its payload (``None`` when it has none) and its context."""

    payload: Optional[Payload]
    ctx: JobCtx


@dataclass
class ReserveOptions:
    """What to reserve: queues polled in order, the lease to take, how long to wait.

    ``lease_duration`` must be positive; ``wait_timeout`` (default 30 s) must not be
    negative; ``max_jobs`` (default: the server's 1) must be at least 1.
    """

    queues: QueueSequence[str]
    lease_duration: timedelta
    wait_timeout: timedelta = _DEFAULT_WAIT_TIMEOUT
    worker_id: Optional[str] = None
    max_jobs: Optional[int] = None

    def __post_init__(self) -> None:
        # Run again by reserve_request when a field changed since: the dataclass is mutable.
        self.queues = _validate.queue_names(self.queues)
        self.lease_duration = _validate.duration(
            self.lease_duration, "lease_duration", positive=True
        )
        self.wait_timeout = _validate.duration(self.wait_timeout, "wait_timeout")
        _validate.worker_id(self.worker_id)
        _validate.max_jobs(self.max_jobs)
        _mark_checked(self)


@dataclass(frozen=True)
class ServerInfo:
    """The server's version and its global limits (a queue may override some)."""

    version: str
    supported_protocol_versions: list[str]
    server_time: datetime
    restricts_encodings: bool
    allowed_encodings: list[str]
    max_payload_bytes: int
    max_custom_entries: int
    max_custom_total_bytes: int
    max_custom_key_bytes: int
    max_queue_name_bytes: int
    max_job_type_bytes: int
    max_idempotency_key_bytes: int
    max_schedule_horizon: timedelta
    max_enqueue_batch: int
    max_reserve_batch: int
    max_reserve_queues: int
    max_wait_timeout: timedelta
    max_lease_duration: timedelta
    strict_queues: bool
    dead_letter_retention_enabled: bool


class DeadLetterCause(enum.Enum):
    """Why a job was dead-lettered. Unknown wire values read as ``UNSPECIFIED``."""

    UNSPECIFIED = "unspecified"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    REJECTED = "rejected"
    LEASE_EXPIRED = "lease_expired"
    ADMIN = "admin"


@dataclass(frozen=True)
class DeadLetterRecord:
    """A dead-lettered job as drained from the server, with why and when it failed."""

    queue: str
    job_id: str
    job_type: str
    payload: Optional[Payload]
    priority: Priority
    max_attempts: int
    custom: dict[str, Primitive]
    trace_context: Optional[TraceContext]
    enqueued_at: datetime
    scheduled_at: Optional[datetime]
    cause: DeadLetterCause
    failed_at: datetime
    final_attempt: int
    last_reason: Optional[str]

    def to_enqueue_request(self) -> EnqueueRequest:
        """A request that replays this job now, as a new job: same queue, type, payload,
        priority, custom map and trace context; no idempotency key, no schedule, and
        ``max_attempts`` 0 falls back to the queue default."""
        return EnqueueRequest(
            queue=self.queue,
            job_type=self.job_type,
            payload=self.payload,
            priority=self.priority,
            max_attempts=self.max_attempts or None,
            custom=dict(self.custom),
            trace_context=self.trace_context,
        )


@dataclass
class RetryPolicy:
    """How the client retries a failed RPC (not a failed job: see :class:`RetryDirective`).

    Off by default (``max_attempts=1`` counts the first call). Retried: UNAVAILABLE,
    DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED and lost connections; never
    ``reserve`` (a long poll) nor ``drain_dead_letters`` (destructive). An enqueue in
    which some job has no idempotency key is not retried when the server may already
    have committed it. Delay before retry n: ``initial_backoff * multiplier**(n-1)``,
    capped at ``max_backoff`` from the second retry on, times a jitter in [0.5, 1).
    ``max_attempts`` below 1 and ``multiplier`` below 1.0 are raised to those floors.
    """

    max_attempts: int = 1
    initial_backoff: timedelta = timedelta(milliseconds=100)
    max_backoff: timedelta = timedelta(seconds=10)
    multiplier: float = 2.0
    jitter: bool = True

    def __post_init__(self) -> None:
        self.max_attempts, self.multiplier, self.initial_backoff, self.max_backoff = (
            _validate.retry_policy(
                self.max_attempts, self.multiplier, self.initial_backoff, self.max_backoff
            )
        )


@dataclass(frozen=True)
class RetryDirective:
    """What the server does with a nacked job: ``default`` (the queue's retry policy),
    ``after`` (retry no sooner than ``delay``) or ``dead_letter`` (no more attempts)."""

    kind: str
    delay: Optional[timedelta] = None

    DEFAULT: ClassVar[RetryDirective]
    DEAD_LETTER: ClassVar[RetryDirective]

    def __post_init__(self) -> None:
        object.__setattr__(self, "delay", _validate.retry_directive(self.kind, self.delay))

    @classmethod
    def default(cls) -> RetryDirective:
        """Retry under the queue's own policy (its delay and backoff)."""
        return cls("default")

    @classmethod
    def after(cls, delay: Duration) -> RetryDirective:
        """Retry, but not before ``delay`` (``timedelta`` or seconds) has passed."""
        return cls("after", delay)  # type: ignore[arg-type]

    @classmethod
    def dead_letter(cls) -> RetryDirective:
        """Stop retrying: dead-letter the job now."""
        return cls("dead_letter")


RetryDirective.DEFAULT = RetryDirective.default()
RetryDirective.DEAD_LETTER = RetryDirective.dead_letter()


# ---------------------------------------------------------------------------------------
# The checks made when a value is sent


def check_enqueue_request(job: EnqueueRequest) -> None:
    """Everything about one job the client would refuse to send, checked in field
    order; the dataclass is mutable, so this runs on what is sent (the client runs it
    on every job of an enqueue, the CLI on every job it reads). Limits the server
    advertises are not checked here."""
    queue, job_type = job.queue, job.job_type
    if queue.__class__ is not str or not queue:
        raise ValueError("queue must be a non-empty str")
    if job_type.__class__ is not str or not job_type:
        raise ValueError("job_type must be a non-empty str")
    # Each field's usual value (exact class) is let through inline; anything else gets
    # the full rule, which raises or accepts it (subclasses, bytearray data...).
    body = job.payload
    if body is not None and (
        body.__class__ is not Payload
        or body.data.__class__ is not bytes
        or body.encoding.__class__ is not str
    ):
        _check_payload(body)
    key = job.idempotency_key
    if key is not None and key.__class__ is not str and not isinstance(key, str):
        raise TypeError("idempotency_key must be a str or None")
    value = job.priority
    if value is not None and value.__class__ is not Priority and not isinstance(value, Priority):
        Priority(value)  # PriorityOutOfRangeError, unless it is an int from 0 to 9
    attempts = job.max_attempts
    if attempts is not None and (
        attempts.__class__ is not int or not 0 <= attempts <= _validate.UINT32_MAX
    ):
        _validate.uint32(attempts, "max_attempts")
    if job.trace_context is not None and not isinstance(job.trace_context, TraceContext):
        raise TypeError("trace_context must be a TraceContext or None")
    if job.custom:
        _validate.custom_map(job.custom)
    when = job.scheduled_at
    if when is not None and not isinstance(when, datetime):
        raise TypeError("scheduled_at must be a datetime or None")


def _check_payload(value: object) -> None:
    if not isinstance(value, Payload):
        raise TypeError(f"payload must be a Payload or None, got {type(value).__name__}")
    _validate.payload_data(value.data)
    if not isinstance(value.encoding, str):
        raise TypeError("payload.encoding must be a str")


class _Checked:
    """What a ``ReserveOptions`` held when it was last checked (the very objects), and
    the request the client made of it."""

    def __init__(self, opts: ReserveOptions) -> None:
        self.queues = opts.queues
        self.names = tuple(opts.queues)
        self.fields = (opts.lease_duration, opts.wait_timeout, opts.worker_id, opts.max_jobs)
        self.request: Optional[bytes] = None

    def holds(self, opts: ReserveOptions) -> bool:
        """Whether every field of ``opts`` is still the object that was checked (and
        the list of queues still holds the names that were checked)."""
        queues, (lease, wait, worker_id, max_jobs) = opts.queues, self.fields
        return (
            queues is self.queues
            and opts.lease_duration is lease
            and opts.wait_timeout is wait
            and opts.worker_id is worker_id
            and opts.max_jobs is max_jobs
            and len(queues) == len(self.names)
            and all(map(operator.is_, queues, self.names))
        )


def _mark_checked(opts: ReserveOptions) -> None:
    # Kept outside the fields: not compared, not shown, not a parameter.
    opts.__dict__["_checked"] = _Checked(opts)


def reserve_request(opts: ReserveOptions, encode: Callable[[ReserveOptions], bytes]) -> bytes:
    """``encode(opts)`` for ``SeppClient.reserve``, from checked options: when a field
    was set (or the list of queues changed) since ``opts`` was last checked, it is
    checked and normalised again first, as at construction (the dataclass is mutable).
    The bytes are kept with the options while they stay unchanged, so options sent
    again (a Worker's, on every poll) cost neither a check nor an encoding."""
    checked: Optional[_Checked] = opts.__dict__.get("_checked")
    if checked is None or not checked.holds(opts):
        opts.__post_init__()
        checked = opts.__dict__.get("_checked")
        if checked is None:  # a subclass whose __post_init__ does not call ours
            return encode(opts)
    request = checked.request
    if request is None:
        request = checked.request = encode(opts)
    return request


def checked_reserve_options(
    queues: QueueSequence[str],
    lease_duration: timedelta,
    wait_timeout: Optional[timedelta],
    worker_id: Optional[str],
    max_jobs: Optional[int],
) -> ReserveOptions:
    """``ReserveOptions`` of values the caller has checked by the same rules
    (``_validate``'s), made without checking them again: how a Worker, which checks its
    own arguments once (in its order, and with a stricter rule for the wait), makes the
    options it reserves with. ``wait_timeout`` ``None`` is the default wait."""
    opts: ReserveOptions = object.__new__(ReserveOptions)
    opts.queues = queues
    opts.lease_duration = lease_duration
    opts.wait_timeout = _DEFAULT_WAIT_TIMEOUT if wait_timeout is None else wait_timeout
    opts.worker_id = worker_id
    opts.max_jobs = max_jobs
    _mark_checked(opts)
    return opts
