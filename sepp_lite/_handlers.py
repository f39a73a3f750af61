"""Handlers as a Worker keeps them: checked when they are registered, so that a
mistake fails at start-up with a message naming the function rather than on every
delivery, and sorted into the two ways a Worker runs them: an ``async def`` (or an
object whose ``__call__`` is one) on the event loop, a plain ``def`` in one of the
Worker's threads, :class:`HandlerThreads`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import reprlib
from typing import Any, Callable, Optional, TypeVar

from sepp_lite import _log

__all__ = ["HandlerThreads", "RegisteredHandler", "check_handler", "handler_name", "thread_count"]

logger = _log.logger()

T = TypeVar("T")

_EXPECTED = (
    "expected an async def taking (payload, ctx), or a plain def taking (payload, ctx), "
    "which runs in a worker thread"
)


class RegisteredHandler:
    """A checked handler: the callable, whether it runs in a thread, and its name."""

    __slots__ = ("fn", "name", "threaded")

    def __init__(self, fn: Callable[..., Any], threaded: bool, name: str) -> None:
        self.fn = fn
        self.threaded = threaded
        self.name = name


def handler_name(handler: object) -> str:
    """How messages name ``handler``: its qualified name, ``partial(name)`` or
    ``<class> instance``."""
    if isinstance(handler, functools.partial):
        return f"functools.partial({handler_name(handler.func)})"
    if inspect.iscoroutine(handler):
        return f"{handler.__qualname__}(...)"
    name = getattr(handler, "__qualname__", None) or getattr(handler, "__name__", None)
    if isinstance(name, str) and not inspect.isroutine(handler) and not inspect.isclass(handler):
        name = None  # an instance that happens to carry a __name__ attribute
    if isinstance(name, str):
        module = getattr(handler, "__module__", None)
        return f"{module}.{name}" if module and module not in ("__main__", "builtins") else name
    return f"{type(handler).__qualname__} instance"


def _is_async(handler: object) -> bool:
    if isinstance(handler, functools.partial):
        return _is_async(handler.func)
    if inspect.iscoroutinefunction(handler):
        return True
    if inspect.isroutine(handler):
        return False
    # An object whose class has an async __call__ (checked after callable()).
    return inspect.iscoroutinefunction(type(handler).__call__)


def _signature_problem(handler: Callable[..., Any]) -> Optional[str]:
    """Why ``handler(payload, ctx)`` cannot be called, or None (also when Python cannot
    read the signature, as for some builtins: then the call will tell)."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, None)
    except TypeError as exc:
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        return f"its signature is {bare}, which cannot take (payload, ctx): {exc}"
    return None


def check_handler(handler: object, where: str) -> RegisteredHandler:
    """``handler`` checked for registration; ``TypeError`` naming it and ``where`` (the
    registration, e.g. ``handle('email')``) when a Worker could not call it as
    ``handler(payload, ctx)``."""
    name = handler_name(handler)
    if inspect.isawaitable(handler):
        if inspect.iscoroutine(handler):
            handler.close()  # never to be awaited: spare the "never awaited" warning
        raise TypeError(
            f"{where}: {name} is an awaitable, not a function: pass the handler itself, "
            f"without calling it; {_EXPECTED}"
        )
    if inspect.isclass(handler):
        raise TypeError(
            f"{where}: {name} is a class; pass a function (or an instance whose __call__ "
            f"takes (payload, ctx)); {_EXPECTED}"
        )
    if not callable(handler):
        shown = reprlib.repr(handler)
        raise TypeError(f"{where}: {shown} ({type(handler).__name__}) is not callable; {_EXPECTED}")
    problem = _signature_problem(handler)
    if problem is not None:
        raise TypeError(f"{where}: {name}: {problem}; {_EXPECTED}")
    return RegisteredHandler(handler, not _is_async(handler), name)


# -- the threads plain-def handlers run in --------------------------------------------


def thread_count(value: Optional[int], max_in_flight: int) -> int:
    """``sync_threads``: min(32, max_in_flight) by default, else a positive int."""
    if value is None:
        return min(32, max_in_flight)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"sync_threads must be an int of at least 1 or None, got {value!r}")
    return value


class HandlerThreads:
    """A Worker's threads: at most ``count``, started on the first call, for its plain
    ``def`` handlers and ``Worker.run_in_thread``; :meth:`close` lets them go."""

    def __init__(self, count: int, prefix: str) -> None:
        self.count = count
        self._prefix = prefix
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    async def call(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        name: str = "",
        submitted: Optional[Callable[[concurrent.futures.Future[Any]], None]] = None,
    ) -> T:
        """``fn(*args)`` in one of the threads, in a copy of the calling task's context
        (its tracing span), awaited. ``submitted`` is handed the call as it waits for a
        thread (a shutdown may cancel it then). A thread cannot be cancelled: a
        cancellation that comes while it runs waits for it to return, then propagates;
        ``name`` names ``fn`` in the warning about that wait."""
        pool = self._pool
        if pool is None:
            pool = self._pool = concurrent.futures.ThreadPoolExecutor(
                self.count, thread_name_prefix=self._prefix
            )
        call = contextvars.copy_context().run
        running = pool.submit(call, fn, *args)
        waiter = asyncio.wrap_future(running)
        if submitted is not None:
            submitted(running)  # until it ends: cancelled only while it waits
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            if not running.cancel():
                logger.warning(
                    "%s runs in a thread, which cannot be cancelled; waiting for it to return",
                    name or handler_name(fn),
                )
                await asyncio.wait({waiter})  # a second cancellation ends this wait
                if not waiter.cancelled():
                    waiter.exception()  # its outcome no longer counts: seen, not raised
            raise

    def close(self) -> None:
        """Let the threads go. Threads still running (their jobs given up at a bounded
        shutdown or a hard stop) finish on their own; the interpreter waits for them at
        exit. A later call starts new ones."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
