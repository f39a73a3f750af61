"""One typed task: its options, how it becomes an EnqueueRequest (producing), and the
plain ``async def (payload, ctx)`` handler a Worker runs for it (consuming).

Everything a job needs is decided here once, when the worker is built: the codec, the
call with or without ``ctx``, the middleware chain, the time limit and the backoff. A
job then costs one decode and one or two more awaits than a raw handler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import random
from collections.abc import Awaitable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypeVar, Union, overload

from sepp_lite import _log
from sepp_lite._scheduler import DEFAULT_DEDUP_WINDOW
from sepp_lite._time import Duration, as_timedelta, seconds_text
from sepp_lite.tasks._codecs import Codec
from sepp_lite.tasks._convert import InputError, type_name
from sepp_lite.tasks._signature import is_async
from sepp_lite.tasks._workflow import WORKFLOW_KEY, Step, Where, new_root
from sepp_lite.types import EnqueueAck, EnqueueRequest, JobCtx, Payload, Primitive, Priority
from sepp_lite.types import RetryDirective as Directive
from sepp_lite.worker import HandlerError

if TYPE_CHECKING:
    from sepp_lite.client import SeppClient
    from sepp_lite.errors import JobRejection
    from sepp_lite.sync import SeppClient as SyncSeppClient

__all__ = ["Backoff", "Chain", "Middleware", "Retry", "Task"]

logger = _log.logger()

I = TypeVar("I")  # noqa: E741 - the task's input type, as in the docs
X = TypeVar("X")  # the output of a chain's next step
E = TypeVar("E")  # an element of a sequence a step returns, for map()
if TYPE_CHECKING:
    # The output defaults to Any, so ``Task[Welcome]`` (from before tasks had outputs)
    # still means what it did; only a type checker needs the default.
    from typing_extensions import TypeVar as TypeVarWithDefault

    O = TypeVarWithDefault("O", default=Any)  # noqa: E741 - the task's output type
else:
    O = TypeVar("O")  # noqa: E741

# The server's default max_attempts: with the default dedup window, how long a step's
# retries may last before a late delivery could hand off twice.
_DEFAULT_MAX_ATTEMPTS = 3

InThread = Callable[..., Awaitable[Any]]
"""How a plain ``def`` task's function is run: ``run_in_thread(fn, *args)``."""


Middleware = Callable[[Callable[[Any, JobCtx], Awaitable[Any]], Any, JobCtx], Awaitable[Any]]
"""``async def mw(call_next, input, ctx)``: wraps every call of every task of a
registry; ``await call_next(input, ctx)`` runs the rest (the task at the end)."""

Handler = Callable[[Optional[Payload], JobCtx], Awaitable[None]]

HandOff = Callable[[Any, JobCtx], Awaitable[None]]
"""What a tasks worker does with a task's value when its job is a step of a workflow:
``await hand_off(value, ctx)`` enqueues the next step (see ``_workflow``)."""


@dataclass(frozen=True)
class Backoff:
    """A task's retry delay after a failure: ``initial * multiplier**(attempt - 1)``
    seconds, at most ``max``, times a random factor in [0.5, 1) with ``jitter`` (so
    jobs that failed together do not come back together). Durations take
    ``timedelta`` or seconds."""

    initial: Duration = 1.0
    multiplier: float = 2.0
    max: Duration = 600.0
    jitter: bool = True
    _seconds: tuple[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        initial = as_timedelta(self.initial, "initial").total_seconds()
        cap = as_timedelta(self.max, "max").total_seconds()
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, (int, float)):
            raise TypeError(f"multiplier must be a number, got {type(self.multiplier).__name__}")
        if not self.multiplier >= 1.0:
            raise ValueError(f"multiplier must be at least 1.0, got {self.multiplier!r}")
        object.__setattr__(self, "_seconds", (initial, cap))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1 for the first)."""
        initial, cap = self._seconds
        exponent = min(max(attempt - 1, 0), 256)  # beyond this every delay is at max
        try:
            base = min(cap, initial * self.multiplier**exponent)
        except OverflowError:
            base = cap
        return base * random.uniform(0.5, 1.0) if self.jitter else base


Retry = Union[Backoff, Callable[[int], Duration]]
"""``retry=``: a :class:`Backoff`, or a function of the attempt number giving the
delay (``timedelta`` or seconds)."""


def _delay_of(retry: Retry, attempt: int) -> float:
    if isinstance(retry, Backoff):
        return retry.delay(attempt)
    return as_timedelta(retry(attempt), "retry delay").total_seconds()


@dataclass(frozen=True)
class Options:
    """A task's settings after the registry's defaults were applied."""

    queue: str
    job_type: str
    priority: Optional[Priority]
    max_attempts: Optional[int]
    timeout: Optional[float]
    retry: Optional[Retry]
    idempotency_key: Optional[Callable[[Any], str]]


class Task(Generic[I, O]):
    """A function registered with :meth:`Tasks.task`: what producers enqueue and what a
    worker runs. ``I`` is its input type, from the function's first parameter; ``O`` its
    output, the function's return type (what :meth:`then` hands to the next step).

    Attributes: ``job_type``, ``queue``, ``priority``, ``max_attempts``, ``timeout``
    (seconds or None), ``retry``, ``input_type``, ``codec``, ``fn`` (the function).
    Calling the task calls the function (``await send_welcome(msg, ctx)`` in a unit
    test), without the codec, the middleware or the time limit.
    """

    if not TYPE_CHECKING:  # type checkers read O's default instead

        def __class_getitem__(cls, params: Any) -> Any:
            # ``Task[Welcome]``, from before tasks had an output, is ``Task[Welcome, Any]``
            # at run time too (evaluated annotations, pydantic, get_type_hints).
            if not isinstance(params, tuple):
                params = (params, Any)
            return super().__class_getitem__(params)

    def __init__(
        self,
        fn: Callable[..., Any],
        options: Options,
        input_type: Any,
        param: str,
        takes_ctx: bool,
        codec: Codec,
    ) -> None:
        self.fn = fn
        self._options = options
        self.input_type = input_type
        self.codec = codec
        self._param = param
        self._takes_ctx = takes_ctx
        self.threaded = not is_async(fn)
        if self.threaded and options.timeout is not None:
            raise TypeError(
                f"task {options.job_type!r}: timeout= needs an async def; a plain def runs "
                "in a worker thread, which cannot be stopped (drop timeout=, or make it an "
                "async def that awaits asyncio.to_thread() for its blocking part)"
            )
        # A function's attributes are copied as functools.wraps does; a callable
        # object's are its state, which would land on the task over the task's own.
        copied = ("__dict__",) if inspect.isroutine(fn) else ()
        functools.update_wrapper(self, fn, updated=copied)

    # -- what it is --------------------------------------------------------------------

    @property
    def job_type(self) -> str:
        return self._options.job_type

    @property
    def queue(self) -> str:
        return self._options.queue

    @property
    def priority(self) -> Optional[Priority]:
        return self._options.priority

    @property
    def max_attempts(self) -> Optional[int]:
        return self._options.max_attempts

    @property
    def timeout(self) -> Optional[float]:
        return self._options.timeout

    @property
    def retry(self) -> Optional[Retry]:
        return self._options.retry

    def __repr__(self) -> str:
        return (
            f"<Task {self.job_type} on {self.queue!r}: {self._param}: {type_name(self.input_type)}>"
        )

    def __call__(self, input: I, ctx: Optional[JobCtx] = None) -> Any:
        """The function itself, called with ``input`` (and ``ctx`` if it takes one): an
        awaitable for an ``async def`` task, the result for a plain ``def``."""
        if self._takes_ctx:
            return self.fn(input, ctx)
        return self.fn(input)

    # -- producing ---------------------------------------------------------------------

    def payload(self, input: I) -> Optional[Payload]:
        """``input`` encoded by this task's codec (``None`` for empty bytes or text:
        the server wants a payload's data non-empty). Raises
        :class:`~sepp_lite.tasks.InputError` (a ``ValueError``) naming the field when
        the value does not fit the task's type."""
        try:
            data = self.codec.encode(input)
        except InputError as error:
            raise InputError(f"{self.job_type}: {self._param}{_located(error)}") from None
        return Payload(data, self.codec.encoding) if data else None

    def decode(self, data: bytes) -> I:
        """The input that a payload's ``data`` carries, as the worker reads it (for
        tools: ``sepp-lite enqueue --tasks`` checks its input so). Raises
        :class:`~sepp_lite.tasks.InputError` naming the field that does not fit."""
        try:
            value: I = self.codec.decode(data)
        except ValueError as exc:
            raise InputError(f"{self.job_type}: {self._param}{_located(exc)}") from None
        return value

    def request(
        self,
        input: I,
        *,
        delay: Optional[Duration] = None,
        scheduled_at: Optional[datetime] = None,
        priority: Union[Priority, int, None] = None,
        idempotency_key: Optional[str] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> EnqueueRequest:
        """The :class:`~sepp_lite.EnqueueRequest` for one job of this task (for
        ``client.enqueue_atomic``, say). ``delay`` (``timedelta`` or seconds from now)
        or ``scheduled_at`` holds it back; the other arguments override the task's."""
        options = self._options
        if delay is not None:
            if scheduled_at is not None:
                raise ValueError("give delay or scheduled_at, not both")
            scheduled_at = datetime.now(timezone.utc) + as_timedelta(delay, "delay")
        if idempotency_key is None and options.idempotency_key is not None:
            idempotency_key = options.idempotency_key(input)
        return EnqueueRequest(
            queue=options.queue,
            job_type=options.job_type,
            payload=self.payload(input),
            idempotency_key=idempotency_key,
            priority=options.priority if priority is None else priority,
            max_attempts=options.max_attempts if max_attempts is None else max_attempts,
            custom=dict(custom) if custom else {},
            scheduled_at=scheduled_at,
        )

    @overload
    def enqueue(
        self,
        client: SeppClient,
        input: I,
        *,
        delay: Optional[Duration] = None,
        scheduled_at: Optional[datetime] = None,
        priority: Union[Priority, int, None] = None,
        idempotency_key: Optional[str] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> Coroutine[Any, Any, EnqueueAck]: ...

    @overload
    def enqueue(
        self,
        client: SyncSeppClient,
        input: I,
        *,
        delay: Optional[Duration] = None,
        scheduled_at: Optional[datetime] = None,
        priority: Union[Priority, int, None] = None,
        idempotency_key: Optional[str] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> EnqueueAck: ...

    def enqueue(self, client: Any, input: I, **options: Any) -> Any:
        """Enqueue one job with ``input``. With the async ``SeppClient`` this returns
        the awaitable of the :class:`~sepp_lite.EnqueueAck`; with a
        ``sepp_lite.sync.SeppClient``, the ack itself. Raises as ``client.enqueue``
        (:class:`~sepp_lite.errors.JobRejectedError` when refused), and
        :class:`~sepp_lite.tasks.InputError` at once when ``input`` does not fit."""
        return client.enqueue(self.request(input, **options))

    @overload
    def enqueue_many(
        self, client: SeppClient, inputs: Iterable[I]
    ) -> Coroutine[Any, Any, list[Union[EnqueueAck, JobRejection]]]: ...

    @overload
    def enqueue_many(
        self, client: SyncSeppClient, inputs: Iterable[I]
    ) -> list[Union[EnqueueAck, JobRejection]]: ...

    def enqueue_many(self, client: Any, inputs: Iterable[I]) -> Any:
        """Enqueue one job per input in one EnqueueBatch call: one result per input, in
        order, an ack or a :class:`~sepp_lite.errors.JobRejection` value (awaitable
        with the async client, as :meth:`enqueue`)."""
        return client.enqueue_batch([self.request(value) for value in inputs])

    # -- workflows ---------------------------------------------------------------------

    def then(self, next: Union[Task[O, X], Chain[O, X]]) -> Chain[I, X]:
        """A workflow: this task, then ``next`` (a task or a :class:`Chain`) with this
        task's value as its input. The tasks worker that runs this step enqueues the
        next before it acks the step (see :class:`Chain`)."""
        chain: Chain[I, O] = Chain(self, [])
        return chain.then(next)

    @overload
    def map(self: Task[I, list[E]], next: Union[Task[E, X], Chain[E, X]]) -> Chain[I, X]: ...

    @overload
    def map(self: Task[I, tuple[E, ...]], next: Union[Task[E, X], Chain[E, X]]) -> Chain[I, X]: ...

    @overload
    def map(self: Task[I, Sequence[E]], next: Union[Task[E, X], Chain[E, X]]) -> Chain[I, X]: ...

    def map(self, next: Any) -> Any:
        """A workflow: this task, whose value is a sequence, then one job of ``next``
        (a task or a :class:`Chain`) per element, all enqueued together before this
        step is acked (see :class:`Chain`)."""
        return Chain(self, []).map(next)

    # -- consuming ---------------------------------------------------------------------

    def handler(
        self,
        middleware: Sequence[Middleware] = (),
        run_in_thread: Optional[InThread] = None,
        hand_off: Optional[HandOff] = None,
    ) -> Handler:
        """The ``async def (payload, ctx)`` a :class:`~sepp_lite.Worker` runs for this
        task: decode (a payload that does not fit is dead-lettered at once, with the
        field in the reason), then the function, through ``middleware``, under the
        time limit and the backoff. A plain ``def`` task's function runs through
        ``run_in_thread`` (the worker's :meth:`~sepp_lite.Worker.run_in_thread`;
        ``asyncio.to_thread`` when not given). When the job is a step of a workflow,
        ``hand_off`` gets the function's value before the handler returns (and so
        before the worker acks the job)."""
        decode = self._decoder()
        call = self._call(middleware, run_in_thread)
        options = self._options
        if options.timeout is not None or options.retry is not None:
            call = _Guarded(self.job_type, call, options.timeout, options.retry).run
        if hand_off is None:

            async def handle(payload: Optional[Payload], ctx: JobCtx) -> None:
                await call(decode(payload), ctx)

            return handle

        async def handle_step(payload: Optional[Payload], ctx: JobCtx) -> None:
            value = await call(decode(payload), ctx)
            if WORKFLOW_KEY in ctx.custom:  # one look-up for a job of no workflow
                await hand_off(value, ctx)

        return handle_step

    def _decoder(self) -> Callable[[Optional[Payload]], Any]:
        codec_decode = self.codec.decode
        encoding = self.codec.encoding

        def decode(payload: Optional[Payload]) -> Any:
            try:
                return codec_decode(payload.data if payload is not None else b"")
            except ValueError as exc:
                raise HandlerError.permanent(self._unfit(exc, payload, encoding)) from None

        return decode

    def _unfit(self, exc: ValueError, payload: Optional[Payload], encoding: str) -> str:
        where = _located(exc) if isinstance(exc, InputError) else f": {exc}"
        reason = f"payload does not fit {type_name(self.input_type)}: {self._param}{where}"
        if payload is not None and payload.encoding != encoding:
            reason += f" (payload encoding {payload.encoding!r}, expected {encoding!r})"
        return reason

    def _call(
        self, middleware: Sequence[Middleware], run_in_thread: Optional[InThread]
    ) -> Callable[[Any, JobCtx], Awaitable[Any]]:
        fn = self.fn
        call: Callable[[Any, JobCtx], Awaitable[Any]]
        if self.threaded:
            in_thread: InThread = run_in_thread or asyncio.to_thread
            takes_ctx = self._takes_ctx

            def call(value: Any, ctx: JobCtx) -> Awaitable[Any]:
                return in_thread(fn, value, ctx) if takes_ctx else in_thread(fn, value)

        elif self._takes_ctx:
            call = fn
        else:

            def call(value: Any, ctx: JobCtx) -> Awaitable[Any]:
                awaitable: Awaitable[Any] = fn(value)
                return awaitable

        for mw in reversed(middleware):
            call = functools.partial(mw, call)
        return call


def _located(error: ValueError) -> str:
    if isinstance(error, InputError):
        return f"{error.path}: {error.problem}"
    return f": {error}"


class _Guarded:
    """A task's call under its time limit and its backoff."""

    __slots__ = ("_call", "_job_type", "_retry", "_timeout")

    def __init__(
        self,
        job_type: str,
        call: Callable[[Any, JobCtx], Awaitable[Any]],
        timeout: Optional[float],
        retry: Optional[Retry],
    ) -> None:
        self._job_type = job_type
        self._call = call
        self._timeout = timeout
        self._retry = retry

    async def run(self, value: Any, ctx: JobCtx) -> Any:
        try:
            if self._timeout is None:
                return await self._call(value, ctx)
            return await self._limited(self._call(value, ctx), self._timeout, ctx)
        except HandlerError:
            raise
        except Exception as exc:
            if self._retry is None:
                raise  # the Worker nacks it for the queue's own retry policy
            delay = _delay_of(self._retry, ctx.attempt)
            reason = f"handler raised {type(exc).__name__}: {exc}"
            # Raised from the exception: the Worker logs the attempt once, naming it,
            # with its traceback when this was the job's last attempt.
            raise HandlerError(reason, Directive.after(delay)) from exc

    async def _limited(self, call: Awaitable[Any], seconds: float, ctx: JobCtx) -> Any:
        """Await ``call`` in this task; after ``seconds`` cancel it and raise the
        HandlerError of a timed-out attempt. No second task: a timer cancels this one,
        and only while the call is still running (it is where this task waits)."""
        task = asyncio.current_task()
        assert task is not None
        state = [False, False]  # fired, done

        def expire() -> None:
            if not state[1]:
                state[0] = True
                task.cancel()

        timer = asyncio.get_running_loop().call_later(seconds, expire)
        try:
            value = await call
        except asyncio.CancelledError as cancelled:
            if not state[0] or _cancelled_by_others(task):
                raise  # the worker's own cancellation (shutdown, lost lease)
            # From the cancellation: its traceback shows where the call was waiting.
            raise self._timed_out(seconds, ctx) from cancelled
        finally:
            state[1] = True
            timer.cancel()
        if state[0]:  # the call swallowed the cancellation and went on: still too late
            if _cancelled_by_others(task):
                raise asyncio.CancelledError
            raise self._timed_out(seconds, ctx) from asyncio.TimeoutError()
        return value

    def _timed_out(self, seconds: float, ctx: JobCtx) -> HandlerError:
        """The nack of a timed-out attempt; the Worker logs it (raised from what timed
        out, so that it is logged as a failure the handler did not plan for)."""
        last = ctx.attempt >= ctx.max_attempts > 0
        limit = seconds_text(timedelta(seconds=seconds))
        if last:
            reason = f"timed out after {limit} on its last attempt ({ctx.attempt})"
        else:
            reason = f"timed out after {limit} (attempt {ctx.attempt} of {ctx.max_attempts})"
        if self._retry is None:
            return HandlerError(reason, Directive.DEFAULT)
        return HandlerError(reason, Directive.after(_delay_of(self._retry, ctx.attempt)))


def _cancelled_by_others(task: asyncio.Task[Any]) -> bool:
    """After our own cancel: whether someone else cancelled this task too (Python 3.11+
    counts cancellations; before that, the Worker's own flags tell it apart)."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is None:
        return False
    remaining: int = uncancel()
    return remaining > 0


class Chain(Generic[I, O]):
    """Tasks run one after another, built by :meth:`Task.then` and :meth:`Task.map`:
    each step's value is the next step's input. ``I`` is the first step's input;
    ``O`` the last step's output (of each branch, after a :meth:`map`).

    :meth:`enqueue` enqueues the first step; from there the tasks workers hand each
    value on, each step as exactly one job (within the server's dedup window), and
    each handler run at least once. The documentation's "Workflows" page
    (docs/workflows.md) says what this guarantees and needs.
    """

    def __init__(self, first: Task[I, Any], steps: Sequence[tuple[Task[Any, Any], bool]]) -> None:
        self.first = first
        self._tasks = tuple(steps)
        self._steps = tuple(_step_of(task, fan) for task, fan in steps)

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The steps after the first, as each job carries them in its
        ``sepp.workflow`` entry: ``{"type": ..., "queue": ..., "map": true, ...}``
        (the Workflows page documents the format)."""
        return [step.to_json() for step in self._steps]

    @property
    def tasks(self) -> list[Task[Any, Any]]:
        """The tasks of the steps, first to last."""
        return [self.first, *(task for task, _ in self._tasks)]

    def __repr__(self) -> str:
        rest = "".join(f" -> {step.describe()}" for step in self._steps)
        return f"<Chain {self.first.job_type} ({self.first.queue}){rest}>"

    def describe(self) -> str:
        """The steps, one a line: ``1. fetch (queue)``, ``3. map handle (queue)``."""
        lines = [f"1. {self.first.job_type} ({self.first.queue})"]
        lines += [f"{n}. {step.describe()}" for n, step in enumerate(self._steps, 2)]
        return "\n".join(lines)

    # -- building ----------------------------------------------------------------------

    def then(self, next: Union[Task[O, X], Chain[O, X]]) -> Chain[I, X]:
        """This chain, then ``next`` (a task or a chain) with the last step's value as
        its input. After a :meth:`map`, each branch goes on alone (there is no join)."""
        return self._joined(_steps_of(next, fan=False))

    @overload
    def map(self: Chain[I, list[E]], next: Union[Task[E, X], Chain[E, X]]) -> Chain[I, X]: ...

    @overload
    def map(self: Chain[I, tuple[E, ...]], next: Union[Task[E, X], Chain[E, X]]) -> Chain[I, X]: ...

    @overload
    def map(self: Chain[I, Sequence[E]], next: Union[Task[E, X], Chain[E, X]]) -> Chain[I, X]: ...

    def map(self, next: Any) -> Any:
        """This chain, then one job of ``next`` (a task or a chain) per element of the
        sequence the last step returns, all enqueued together (see the Workflows page
        for how a long sequence is split)."""
        return self._joined(_steps_of(next, fan=True))

    def _joined(self, steps: list[tuple[Task[Any, Any], bool]]) -> Chain[I, Any]:
        added = [task for task, _ in steps] if self._tasks else [self.first, *(t for t, _ in steps)]
        _warn_if_outlasting(added)  # each task once, when it joins a chain
        return Chain(self.first, [*self._tasks, *steps])

    # -- producing ---------------------------------------------------------------------

    def request(
        self,
        input: I,
        *,
        root: Optional[str] = None,
        delay: Optional[Duration] = None,
        scheduled_at: Optional[datetime] = None,
        priority: Union[Priority, int, None] = None,
        idempotency_key: Optional[str] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> EnqueueRequest:
        """The :class:`~sepp_lite.EnqueueRequest` of the first step's job, carrying
        the workflow (root id ``root``, a fresh random one by default). The options
        are :meth:`Task.request`'s, for that job only."""
        where = Where(root or new_root(), 0, (), self._steps)
        return self.first.request(
            input,
            delay=delay,
            scheduled_at=scheduled_at,
            priority=priority,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            custom={**(custom or {}), **where.entries()},
        )

    @overload
    def enqueue(
        self,
        client: SeppClient,
        input: I,
        *,
        root: Optional[str] = None,
        delay: Optional[Duration] = None,
        scheduled_at: Optional[datetime] = None,
        priority: Union[Priority, int, None] = None,
        idempotency_key: Optional[str] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> Coroutine[Any, Any, EnqueueAck]: ...

    @overload
    def enqueue(
        self,
        client: SyncSeppClient,
        input: I,
        *,
        root: Optional[str] = None,
        delay: Optional[Duration] = None,
        scheduled_at: Optional[datetime] = None,
        priority: Union[Priority, int, None] = None,
        idempotency_key: Optional[str] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, Primitive]] = None,
    ) -> EnqueueAck: ...

    def enqueue(self, client: Any, input: I, **options: Any) -> Any:
        """Enqueue the first step's job with ``input``: the awaitable of its
        :class:`~sepp_lite.EnqueueAck` with the async client, the ack with the sync
        one. ``options`` are :meth:`request`'s. Raises as :meth:`Task.enqueue`."""
        return client.enqueue(self.request(input, **options))

    @overload
    def enqueue_many(
        self, client: SeppClient, inputs: Iterable[I]
    ) -> Coroutine[Any, Any, list[Union[EnqueueAck, JobRejection]]]: ...

    @overload
    def enqueue_many(
        self, client: SyncSeppClient, inputs: Iterable[I]
    ) -> list[Union[EnqueueAck, JobRejection]]: ...

    def enqueue_many(self, client: Any, inputs: Iterable[I]) -> Any:
        """One workflow per input, each with its own root, their first jobs in one
        EnqueueBatch call: one ack or rejection per input, in order."""
        return client.enqueue_batch([self.request(value) for value in inputs])


def _steps_of(next: Any, fan: bool) -> list[tuple[Task[Any, Any], bool]]:
    if isinstance(next, Chain):
        return [(next.first, fan), *next._tasks]
    if not isinstance(next, Task):
        raise TypeError(f"a workflow's step must be a Task or a Chain, not {type(next).__name__}")
    return [(next, fan)]


def _step_of(task: Task[Any, Any], fan: bool) -> Step:
    priority = task.priority
    level = None if priority is None else int(priority.value)
    return Step(task.job_type, task.queue, fan, level, task.max_attempts)


def retry_span(task: Task[Any, Any]) -> float:
    """The longest a task's own backoff and time limit may keep its job going over
    all its attempts, in seconds (without jitter, which only shortens it)."""
    retry = task.retry
    attempts = task.max_attempts or _DEFAULT_MAX_ATTEMPTS
    total = (task.timeout or 0.0) * attempts
    if retry is None:
        return total
    steady = dataclasses.replace(retry, jitter=False) if isinstance(retry, Backoff) else retry
    for attempt in range(1, min(attempts, 100)):
        total += _delay_of(steady, attempt)
    return total


def _warn_if_outlasting(tasks: list[Task[Any, Any]]) -> None:
    window = DEFAULT_DEDUP_WINDOW.total_seconds()
    for task in tasks:
        span = retry_span(task)
        if span > window:
            logger.warning(
                "workflow step %s: its retries may take %s, longer than the server's "
                "default dedup window (%s): a step delivered again after the window "
                "would hand off a second time (shorten retry=/max_attempts, or make sure "
                "the server's dedup_window_ms is longer)",
                task.job_type,
                seconds_text(timedelta(seconds=span)),
                seconds_text(DEFAULT_DEDUP_WINDOW),
            )
