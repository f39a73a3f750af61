"""``Tasks``: a registry of typed tasks with shared defaults, lifecycle hooks and
middleware, and the Worker that serves them."""

from __future__ import annotations

import contextlib
import inspect
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from datetime import tzinfo
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union, overload

from sepp_lite import _log, _validate
from sepp_lite._clock import Clock
from sepp_lite._scheduler import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_LOOKAHEAD,
    PeriodicJob,
    PeriodicScheduler,
)
from sepp_lite._time import Duration, as_timedelta
from sepp_lite.tasks._codecs import BytesCodec, Codec, CodecFactory, codec_for
from sepp_lite.tasks._lifecycle import Lifecycle
from sepp_lite.tasks._periodic import schedule_of, scheduler_beside, task_function
from sepp_lite.tasks._signature import job_type_of, shape_of
from sepp_lite.tasks._task import Middleware, Options, Retry, Task
from sepp_lite.tasks._workflow import HandOff
from sepp_lite.types import JobCtx, Priority
from sepp_lite.worker import DuplicateHandlerError, Worker, keep_leases_by

if TYPE_CHECKING:
    from sepp_lite.client import SeppClient

__all__ = ["State", "TaskWorker", "Tasks"]

logger = _log.logger()

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

Hook = Callable[["State"], Awaitable[Any]]
Lifespan = Callable[["State"], contextlib.AbstractAsyncContextManager[Any]]

_DEFAULT_LEASE_S = 30.0


class State(types.SimpleNamespace):
    """What start-up hooks and the lifespan keep for handlers (``tasks.state.db``)."""


class TaskDecorator(typing.Protocol):
    """What ``tasks.task(...)`` returns: a decorator that makes a function a Task."""

    @overload
    def __call__(self, fn: Callable[[I, JobCtx], Awaitable[O]], /) -> Task[I, O]: ...

    @overload
    def __call__(self, fn: Callable[[I], Awaitable[O]], /) -> Task[I, O]: ...

    @overload
    def __call__(self, fn: Callable[[I, JobCtx], O], /) -> Task[I, O]: ...

    @overload
    def __call__(self, fn: Callable[[I], O], /) -> Task[I, O]: ...


class PeriodicDecorator(typing.Protocol):
    """What ``tasks.periodic(...)`` returns: a decorator that makes a function of the
    JobCtx, or of nothing, a periodic Task."""

    # A periodic task's one parameter receives the JobCtx: mypy flags another.
    @overload
    def __call__(self, fn: Callable[[JobCtx], Any], /) -> Task[bytes]: ...

    @overload
    def __call__(self, fn: Callable[[], Any], /) -> Task[bytes]: ...


class Tasks:
    """A registry of typed tasks: the defaults they share, the hooks that run around the
    life of its workers (once for all of them: :meth:`running`), the middleware around
    every call, and :meth:`worker`.

    ``queue``, ``priority``, ``max_attempts``, ``timeout`` (seconds or ``timedelta``:
    the handler is cancelled and the job nacked for a retry, on the last attempt
    dead-lettered), ``retry`` (a :class:`Backoff` or a function of the attempt; default:
    the queue's policy on the server) and ``codec`` (a :class:`Codec` for every task, or
    a function of the input type returning one or None) are defaults that each
    :meth:`task` can override.
    """

    def __init__(
        self,
        *,
        queue: Optional[str] = None,
        priority: Union[Priority, int, None] = None,
        max_attempts: Optional[int] = None,
        timeout: Optional[Duration] = None,
        retry: Optional[Retry] = None,
        codec: Union[Codec, CodecFactory, None] = None,
    ) -> None:
        self._defaults = _checked(queue, priority, max_attempts, timeout, retry)
        self._codec = codec
        self._tasks: dict[str, Task[Any]] = {}
        self._middleware: list[Middleware] = []
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._lifespans: list[Lifespan] = []
        self._periodic: dict[str, PeriodicJob] = {}
        self._lifecycle = Lifecycle(self._start)
        self.state = State()

    # -- registering -------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[[I, JobCtx], Awaitable[O]], /) -> Task[I, O]: ...

    @overload
    def task(self, fn: Callable[[I], Awaitable[O]], /) -> Task[I, O]: ...

    @overload
    def task(self, fn: Callable[[I, JobCtx], O], /) -> Task[I, O]: ...

    @overload
    def task(self, fn: Callable[[I], O], /) -> Task[I, O]: ...

    @overload
    def task(
        self,
        *,
        job_type: Optional[str] = None,
        queue: Optional[str] = None,
        priority: Union[Priority, int, None] = None,
        max_attempts: Optional[int] = None,
        timeout: Optional[Duration] = None,
        retry: Optional[Retry] = None,
        idempotency_key: Optional[Callable[[Any], str]] = None,
        codec: Optional[Codec] = None,
        input_type: Any = None,
    ) -> TaskDecorator: ...

    def task(  # type: ignore[misc]
        self, fn: Any = None, /, **options: Any
    ) -> Any:
        """Register a function as a task: ``@tasks.task`` or ``@tasks.task(...)``. An
        ``async def`` runs on the worker's event loop, a plain ``def`` in one of its
        threads (``sync_threads``; no ``timeout=`` then, as a thread cannot be stopped).

        The function takes its input (one parameter, annotated with its type) and
        optionally the job's :class:`~sepp_lite.JobCtx`. ``job_type`` defaults to the
        function's name; ``idempotency_key`` is a function of the input giving the key
        each enqueue sends; ``input_type`` overrides the annotation. Raises
        ``TypeError`` for a function or an input type that cannot be a task,
        :class:`~sepp_lite.DuplicateHandlerError` for a job type registered already.
        """
        if fn is None:
            return lambda f: self._register(f, **options)
        return self._register(fn, **options)

    def _register(
        self,
        fn: Callable[..., Any],
        *,
        job_type: Optional[str] = None,
        queue: Optional[str] = None,
        idempotency_key: Optional[Callable[[Any], str]] = None,
        codec: Optional[Codec] = None,
        input_type: Any = None,
        **overrides: Any,
    ) -> Task[Any]:
        param, hinted, takes_ctx = shape_of(fn, hinted=input_type is None)
        tp = hinted if input_type is None else input_type
        name = job_type_of(fn, job_type)
        _validate.job_type(name)
        if name in self._tasks:
            raise DuplicateHandlerError(name)
        defaults = self._defaults
        given = _checked(queue or defaults["queue"], **_merged(defaults, overrides))
        if given["queue"] is None:
            raise TypeError(f"task {name!r}: no queue (give queue= to the task or to Tasks)")
        if idempotency_key is not None and not callable(idempotency_key):
            raise TypeError("idempotency_key must be a function of the input")
        options = Options(job_type=name, idempotency_key=idempotency_key, **given)
        chosen = codec if codec is not None else self._task_codec(tp)
        task: Task[Any] = Task(fn, options, tp, param, takes_ctx, chosen)
        self._tasks[name] = task
        return task

    def _task_codec(self, tp: Any) -> Codec:
        default = self._codec
        if default is None:
            return codec_for(tp)
        if isinstance(default, Codec):
            return default
        return codec_for(tp, default)

    def _step_codec(self, job_type: str, value: Any) -> Codec:
        """The codec a workflow's value goes to step ``job_type`` in: that task's, or,
        when these tasks lack it, the one they would choose for the value's type."""
        task = self._tasks.get(job_type)
        return task.codec if task is not None else self._task_codec(type(value))

    def periodic(
        self,
        *,
        every: Optional[Duration] = None,
        cron: Optional[str] = None,
        tz: Union[str, tzinfo, None] = None,
        lookahead: Duration = DEFAULT_LOOKAHEAD,
        misfire_grace: Optional[Duration] = None,
        **options: Any,
    ) -> PeriodicDecorator:
        """Register an ``async def fn(ctx)`` (or ``fn()``) to run once per slot of a
        schedule: ``every=`` (``timedelta`` or seconds, whole seconds; slots counted from
        the Unix epoch in UTC) or ``cron=`` (5 fields, in ``tz``; the ``cron`` extra).
        Every worker of these tasks keeps the next slots enqueued (``lookahead``, 10 min
        by default), each under its own idempotency key, so the server runs each slot
        once however many workers there are; a slot more than ``misfire_grace`` late
        is skipped. The other options are :meth:`task`'s (``job_type``, ``queue``,
        ``priority``, ``max_attempts``, ``timeout``, ``retry``). The documentation's
        "Periodic jobs" page (docs/periodic.md) says what this guarantees and needs. A decorator."""
        schedule: dict[str, Any] = {"every": every, "cron": cron, "tz": tz}
        schedule.update(lookahead=lookahead, misfire_grace=misfire_grace)

        def register(fn: Callable[..., Any]) -> Task[bytes]:
            rest = {key: value for key, value in options.items() if key != "job_type"}
            run = task_function(fn)
            name = job_type_of(fn, options.get("job_type"))
            task: Task[bytes] = self._register(
                run, job_type=name, input_type=bytes, codec=BytesCodec(), **rest
            )
            try:
                self._periodic[name] = schedule_of(task, **schedule)
            except BaseException:
                del self._tasks[name]  # a schedule that cannot be is no task either
                raise
            return task

        return register

    @property
    def periodic_jobs(self) -> list[PeriodicJob]:
        """The schedules of the periodic tasks, in the order they were registered."""
        return list(self._periodic.values())

    def middleware(self, mw: Middleware) -> Middleware:
        """Wrap every call of every task: ``async def mw(call_next, input, ctx)``
        returning ``await call_next(input, ctx)`` (or raising). The first registered is
        the outermost. Returns ``mw`` (a decorator). Applies to workers built after."""
        if not inspect.iscoroutinefunction(mw):
            raise TypeError("middleware must be an async def (call_next, input, ctx)")
        self._middleware.append(mw)
        return mw

    def on_startup(self, hook: Hook) -> Hook:
        """Run ``await hook(state)`` before the workers of these tasks reserve their
        first job (open pools, warm caches: keep them on ``state``): once for any number
        of workers, by the first to start (see :meth:`running`). A decorator."""
        self._startup.append(hook)
        return hook

    def on_shutdown(self, hook: Hook) -> Hook:
        """Run ``await hook(state)`` after the last running worker of these tasks has
        drained (in reverse order of registration, also when it or the start failed).
        A decorator."""
        self._shutdown.append(hook)
        return hook

    def lifespan(self, factory: Lifespan) -> Lifespan:
        """One async context manager around the workers' life, as Starlette's
        lifespan: ``factory(state)`` is entered before the first job of the first
        worker to start and left after the drain of the last to stop (see
        :meth:`running`). A decorator (for an ``@contextlib.asynccontextmanager``
        function)."""
        self._lifespans.append(factory)
        return factory

    # -- what it holds -----------------------------------------------------------------

    def __iter__(self) -> Iterator[Task[Any]]:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, job_type: str) -> Task[Any]:
        return self._tasks[job_type]

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._tasks

    @property
    def job_types(self) -> list[str]:
        """The job types, in the order they were registered."""
        return list(self._tasks)

    @property
    def queues(self) -> list[str]:
        """The tasks' queues, each once, in the order of registration."""
        return list(dict.fromkeys(task.queue for task in self._tasks.values()))

    def __repr__(self) -> str:
        return f"<Tasks {', '.join(self._tasks) or '(none)'}>"

    # -- running -----------------------------------------------------------------------

    def worker(
        self,
        client: SeppClient,
        *,
        queues: Optional[Iterable[str]] = None,
        lease_duration: Duration = _DEFAULT_LEASE_S,
        periodic: bool = True,
        dedup_window: Duration = DEFAULT_DEDUP_WINDOW,
        periodic_clock: Optional[Clock] = None,
        **options: Any,
    ) -> TaskWorker:
        """A :class:`~sepp_lite.Worker` (the subclass :class:`TaskWorker`) on ``client``
        for every task of ``queues`` (default: all of the tasks' queues). Its ``run()``
        runs inside :meth:`running`: the start-up hooks and the lifespan first, the
        shutdown hooks last, once for all the workers of these tasks.
        ``options`` are the Worker's (``max_in_flight``, ``auto_extend``, ...);
        ``lease_duration`` defaults to 30 s. ``ValueError`` for a queue no task uses.

        The worker also keeps the slots of the :meth:`periodic` tasks of its queues
        enqueued, unless ``periodic=False`` (a pool that only consumes); it still skips
        their misfired slots. ``dedup_window`` is the server's (24 h by default): a
        look-ahead plus grace beyond it raises ``ValueError`` here. ``periodic_clock``
        is for tests: the in-process server's manual clock, which the worker's lease
        keeper then keeps time by too."""
        chosen = self.queues if queues is None else list(queues)
        unknown = [queue for queue in chosen if queue not in self.queues]
        if unknown:
            raise ValueError(
                f"no task uses queue(s) {', '.join(unknown)} (the tasks' queues: "
                f"{', '.join(self.queues) or 'none'})"
            )
        lease = as_timedelta(lease_duration, "lease_duration", positive=True)
        scheduler = PeriodicScheduler(
            client,
            [job for job in self._periodic.values() if job.queue in chosen],
            dedup_window=dedup_window,
            clock=periodic_clock,
        )
        worker = TaskWorker(self, client, chosen, lease, **options)
        if periodic_clock is not None:
            keep_leases_by(worker, periodic_clock)  # the server's, as its leases are
        worker.scheduler = scheduler if periodic else None
        hand_off = HandOff(client, self._step_codec)
        for task in self._tasks.values():
            if task.queue in chosen:
                handler = task.handler(self._middleware, worker.run_in_thread, hand_off)
                if task.job_type in self._periodic:
                    handler = scheduler.guard(handler, lease_duration=lease)
                worker.handle(task.job_type, handler)
                _warn_if_outlived(task, lease.total_seconds(), options)
        return worker

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[State]:
        """The hooks around the life of the workers of these tasks, as each
        :class:`TaskWorker`'s ``run()`` uses them; yields :attr:`state`.

        However many workers use them, started together or one after another, the
        start-up hooks and lifespans run once, for the first to start, and the shutdown
        hooks once, for the last to stop. A worker that starts while they are starting
        waits for that, and raises what a failing start-up hook raised (a cancelled
        start it makes itself); a worker that starts after all have stopped runs them
        afresh. All the workers of one registry must run on one event loop while any of
        them runs: on another, this raises ``RuntimeError`` (what the hooks open belongs
        to their loop)."""
        async with self._lifecycle.held():
            yield self.state

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        state = self.state
        for hook in self._shutdown:
            stack.push_async_callback(hook, state)  # left in reverse order of pushing
        for hook in self._startup:
            await hook(state)
        for factory in self._lifespans:
            await stack.enter_async_context(factory(state))


class TaskWorker(Worker):
    """The Worker :meth:`Tasks.worker` builds: a plain :class:`~sepp_lite.Worker`
    whose handlers are the tasks', and whose ``run()`` runs inside
    :meth:`Tasks.running` (its start line, the Worker's, lists the job types it
    serves)."""

    def __init__(self, tasks: Tasks, client: SeppClient, queues: list[str], *a: Any, **k: Any):
        super().__init__(client, queues, *a, **k)
        self.tasks = tasks
        self.scheduler: Optional[PeriodicScheduler] = None  # set by Tasks.worker

    @property
    def job_types(self) -> list[str]:
        """The job types this worker has handlers for."""
        return [
            job_type
            for job_type in self.tasks.job_types
            if self.tasks[job_type].queue in set(self.queues)
        ]

    async def run(self, *, until_idle: bool = False) -> None:
        """As :meth:`Worker.run`, inside the tasks' start-up and shutdown hooks."""
        async with self.tasks.running():
            async with scheduler_beside(self.scheduler):
                await super().run(until_idle=until_idle)


def _checked(
    queue: Optional[str],
    priority: Union[Priority, int, None] = None,
    max_attempts: Optional[int] = None,
    timeout: Optional[Duration] = None,
    retry: Optional[Retry] = None,
) -> dict[str, Any]:
    """Options checked once, at registration (``TypeError``/``ValueError`` naming them)."""
    if queue is not None:
        _validate.queue(queue)
    if priority is not None and not isinstance(priority, Priority):
        priority = Priority(priority)
    if max_attempts is not None:
        _validate.max_attempts(max_attempts)
    seconds = None
    if timeout is not None:
        seconds = as_timedelta(timeout, "timeout", positive=True).total_seconds()
    if retry is not None and not callable(retry) and not hasattr(retry, "delay"):
        raise TypeError("retry must be a Backoff or a function of the attempt number")
    return {
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "timeout": seconds,
        "retry": retry,
    }


def _merged(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = set(overrides) - {"priority", "max_attempts", "timeout", "retry"}
    if unknown:
        raise TypeError(f"task() got unexpected option(s): {', '.join(sorted(unknown))}")
    return {
        name: overrides.get(name, defaults[name])
        if overrides.get(name) is not None
        else defaults[name]
        for name in ("priority", "max_attempts", "timeout", "retry")
    }


def _warn_if_outlived(task: Task[Any], lease_s: float, options: dict[str, Any]) -> None:
    extends = options.get("auto_extend") or options.get("auto_extend_interval") is not None
    if task.timeout is not None and task.timeout > lease_s and not extends:
        logger.warning(
            "task %s: its timeout (%.3g s) is longer than the lease (%.3g s) and "
            "auto_extend is off: a job still running when its lease expires is "
            "delivered again",
            task.job_type,
            task.timeout,
            lease_s,
        )
