"""An asyncio event loop in a daemon thread, and calls into it from outside.

The small version of anyio's ``BlockingPortal``: start a loop in a thread, run
coroutines on it from other threads (:meth:`LoopThread.run`, blocking) or from other
event loops (:meth:`LoopThread.run_from_loop`, awaited), stop it cancelling whatever
is left, join the thread. ``SeppServerThread`` runs the in-process server here, and
the monitor its HTTP endpoint (``_httpd.ThreadedHttpServer``, which must answer while
the worker's loop is blocked). anyio would add a second concurrency layer (and a
dependency) for what these few lines do. (The blocking client does not hand its calls
to a thread: its callers run its loop themselves, ``_caller_loop.py``.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Generic, Optional, TypeVar

__all__ = ["LoopThread", "cancel_the_rest"]

T = TypeVar("T")

# How long stop() waits for the loop thread to finish its tasks and exit.
_JOIN_TIMEOUT_S = 10.0
# A waiting caller checks this often that the loop thread is still alive.
_ALIVE_CHECK_S = 1.0


class _PortalCall(Generic[T]):
    """One blocking call: its coroutine, its outcome, the lock its caller waits on."""

    __slots__ = ("coro", "done", "error", "result", "task")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.done = threading.Lock()
        self.done.acquire()
        self.task: Optional[asyncio.Task[None]] = None
        self.result: Optional[T] = None
        self.error: Optional[BaseException] = None


class LoopThread:
    """A running event loop in a daemon thread named ``name``; :meth:`run` runs a
    coroutine there and blocks the calling thread until it finishes."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.SelectorEventLoop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name=name)
        self._thread.daemon = True
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        loop = self.loop
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            try:
                cancel_the_rest(loop)
            finally:
                loop.close()

    def in_loop_thread(self) -> bool:
        """Whether the caller is this object's loop thread."""
        return threading.get_ident() == self._thread.ident

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and return its result or raise its exception. If
        waiting is interrupted (Ctrl-C's ``KeyboardInterrupt`` in the main thread),
        the coroutine is cancelled on the loop and the interruption propagates.
        Raises ``RuntimeError`` from the loop's own thread (that would deadlock),
        and when the loop stops before the call ends."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("a blocking call from the event loop thread it waits for")
        call = _PortalCall(coro)
        try:
            self.loop.call_soon_threadsafe(self._start, call)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise RuntimeError("the event loop thread is stopped") from None
        try:
            self._wait(call)
        except BaseException:
            self._cancel_soon(call)
            raise
        if call.error is None:
            return call.result  # type: ignore[return-value]
        if isinstance(call.error, asyncio.CancelledError):
            raise RuntimeError("the call was cancelled: its event loop thread stopped")
        raise call.error

    async def run_from_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and await its outcome from another event loop,
        which goes on running meanwhile. Cancelling the awaiting task cancels
        ``coro``; stopping this loop first raises ``CancelledError`` in the awaiting
        task. Raises ``RuntimeError`` when the loop is stopped already."""
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise RuntimeError("the event loop thread is stopped") from None
        return await asyncio.wrap_future(future)

    def _wait(self, call: _PortalCall[Any]) -> None:
        while not call.done.acquire(timeout=_ALIVE_CHECK_S):
            if not self._thread.is_alive() and not call.done.acquire(blocking=False):
                call.coro.close()
                raise RuntimeError("the event loop thread stopped before the call ended")

    def _start(self, call: _PortalCall[Any]) -> None:
        call.task = self.loop.create_task(self._settle(call))

    async def _settle(self, call: _PortalCall[Any]) -> None:
        # The outcome is recorded in the task's last step, not by a done callback (one
        # more loop iteration per call).
        try:
            call.result = await call.coro
        except BaseException as error:  # the caller's to raise, KeyboardInterrupt too
            call.error = error
        finally:
            call.done.release()

    def _cancel_soon(self, call: _PortalCall[Any]) -> None:
        def cancel() -> None:
            if call.task is not None:
                call.task.cancel()

        try:
            self.loop.call_soon_threadsafe(cancel)
        except RuntimeError:
            pass  # the loop is closed: nothing runs any more

    def stop(self) -> None:
        """Stop the loop (tasks still running are cancelled) and wait for the thread
        to end; idempotent. From the loop's own thread it only asks the loop to stop."""
        self.stop_soon()
        if not self.in_loop_thread():
            self._join()

    async def stop_from_loop(self) -> None:
        """:meth:`stop`, awaited from another event loop: the thread is joined in that
        loop's default executor, so that loop goes on running meanwhile."""
        self.stop_soon()
        await asyncio.get_running_loop().run_in_executor(None, self._join)

    def _join(self) -> None:
        self._thread.join(_JOIN_TIMEOUT_S)

    def stop_soon(self) -> None:
        """Ask the loop to stop, without waiting (safe from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:
            pass  # closed already


def cancel_the_rest(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on a stopped loop and let it unwind."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
