"""Graceful shutdown: the worker's ShutdownHandle, and an opt-in helper that turns
SIGINT/SIGTERM into a graceful shutdown (and a second signal into a hard stop)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence

from sepp_lite import _log

logger = _log.logger()

__all__ = ["ShutdownHandle", "shutdown_on_signals"]


class ShutdownHandle:
    """Stops a :class:`~sepp_lite.worker.Worker`: :meth:`shutdown` ends reserving and
    starts the drain; :attr:`is_shutdown` tells whether it was called. Call it from the
    event loop's thread (a signal handler installed with ``loop.add_signal_handler``
    qualifies). It may be created outside a running loop."""

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def shutdown(self) -> None:
        """Signal the worker to stop reserving and drain its in-flight jobs."""
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def is_shutdown(self) -> bool:
        """Whether :meth:`shutdown` has been called."""
        return self._set

    async def wait(self) -> None:
        """Return once :meth:`shutdown` has been called."""
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


@contextlib.contextmanager
def signal_handlers(
    on_signal: Callable[[signal.Signals], None],
    signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[None]:
    """While the block runs, the running loop calls ``on_signal(signum)`` for each of
    ``signals``; the handlers are removed on the way out."""
    loop = asyncio.get_running_loop()
    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


@contextlib.contextmanager
def shutdown_on_signals(
    *handles: ShutdownHandle,
    signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[None]:
    """While the block runs, the first SIGINT/SIGTERM calls ``shutdown()`` on every
    handle (a graceful drain); a second one cancels the task that entered the block
    (a hard stop: the Worker cancels its handlers and hands their jobs back).

    Use it inside a running event loop on the main thread::

        with shutdown_on_signals(worker.shutdown_handle()):
            await worker.run()
    """
    task = asyncio.current_task()
    received = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        if len(received) == 1:
            logger.info("%s received: shutting down gracefully (again to stop now)", signum.name)
            for handle in handles:
                handle.shutdown()
        elif task is not None:
            logger.warning("%s received again: stopping now", signum.name)
            task.cancel()

    with signal_handlers(on_signal, signals):
        yield
