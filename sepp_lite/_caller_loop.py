"""An asyncio event loop that blocking callers run themselves, in their own threads.

The blocking client (``sepp_lite.sync``) drives the async client here. A call runs
the loop in the calling thread until its coroutine is done, the way grpcio's blocking
calls poll their completion queue in the caller's thread. Handing each call to a loop
thread and back instead costs two context switches per call: about 60 % more CPU
than the async client, against the 10-15 % this costs.

- One thread at a time runs the loop (it *drives* it). A thread that calls while
  another one drives hands its coroutine to the loop and waits; when the driver's own
  call is done it leaves, and one of the waiting threads takes the loop over.
- Between calls a daemon thread (the *keeper*) runs one loop iteration every few
  seconds, if no caller did meanwhile: keepalive pings go out, their answers (or
  their absence) are noticed, a server's pings are answered, and a connection the
  server closed is seen closed before the next call.
- Ctrl-C while the main thread drives cancels the call and raises
  ``KeyboardInterrupt`` once the cancellation has run (the way ``asyncio.run`` treats
  it), so the loop is never left half-way through a callback.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.signal without its enum wrappers
import asyncio
import selectors
import signal
import threading
import time
from collections.abc import Coroutine
from typing import Any, Callable, Generic, Optional, TypeVar

from sepp_lite._loop_thread import cancel_the_rest

__all__ = ["CallerLoop"]

T = TypeVar("T")

_SIGINT = int(signal.SIGINT)

# How long closing waits for the keeper to run the final coroutine and exit.
_CLOSE_TIMEOUT_S = 10.0


class _Call(Generic[T]):
    """One blocking call: its coroutine, its task, its outcome."""

    __slots__ = (
        "cancelled",
        "coro",
        "error",
        "finished",
        "interrupted",
        "result",
        "task",
        "waiter",
        "woken",
    )

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.task: Optional[asyncio.Task[None]] = None
        self.finished = False
        self.cancelled = False  # asked to cancel before its task existed
        self.interrupted = False  # by Ctrl-C
        self.result: Optional[T] = None
        self.error: Optional[BaseException] = None
        # A following thread blocks on a lock of its own, which is released (once:
        # ``woken``) when its call ends or when it may drive next. With one shared
        # condition every call's end woke every waiting thread, and each woken thread
        # then waited again for the loop's lock, which the waker still held.
        self.waiter: Any = None  # a threading.Lock
        self.woken = False


# A loop that never waits (callbacks that keep scheduling callbacks) still wakes the
# threads of ended calls after this many iterations.
_MAX_ITERATIONS_UNWOKEN = 4


class _Selector(selectors.DefaultSelector):
    """The loop's selector, which first calls ``before_select(waits)``: ``waits``
    when the loop is about to wait for I/O or a timer, not just to poll."""

    def __init__(self, before_select: Callable[[bool], None]) -> None:
        super().__init__()
        self._before_select = before_select

    def select(self, timeout: Optional[float] = None) -> Any:
        self._before_select(timeout is None or timeout > 0)
        return super().select(timeout)


class CallerLoop:
    """An event loop, its keeper thread (named ``name``, running an iteration every
    ``tick_s`` seconds while no caller runs the loop), and :meth:`run`."""

    def __init__(self, name: str, tick_s: float) -> None:
        # The threads of calls that end are woken when the loop is about to wait, not
        # at once: a thread woken at once woke only to wait again for the GIL, which
        # the thread running the loop still held (two more context switches a call;
        # with 8 threads calling, a sixth of the CPU).
        self.loop = asyncio.SelectorEventLoop(_Selector(self._wake_ended))
        self._ended: list[_Call[Any]] = []  # followers' calls ended, threads not woken
        self._unwoken_for = 0  # loop iterations since the first of them ended
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the driver left (for closing)
        self._followers: list[_Call[Any]] = []  # calls whose threads wait in _follow
        # Followers' calls the loop has not started yet. Only the first of them wakes the
        # loop (call_soon_threadsafe: a write to its self-pipe, which releases the GIL);
        # the others ride on that wake-up (see _follow).
        self._incoming: list[_Call[Any]] = []
        self._driving = False  # some thread is inside loop.run_forever()
        self._stop_for: Optional[_Call[Any]] = None  # the driver's call: its end stops the loop
        self._closing = False
        self._final: Optional[_Call[Any]] = None
        self._last_driven = time.monotonic()
        self._stopping = threading.Event()
        self._keeper = threading.Thread(target=self._keep, args=(tick_s,), name=name, daemon=True)
        self._keeper.start()

    def drives_here(self) -> bool:
        """Whether the calling thread is inside the loop (a blocking call would hang)."""
        return asyncio._get_running_loop() is self.loop

    # -- calls ----------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and return its result or raise its exception.
        Ctrl-C (``KeyboardInterrupt``) cancels it. Raises ``RuntimeError`` once
        :meth:`close` was called."""
        if self.drives_here():
            coro.close()
            raise RuntimeError("a blocking call from inside the event loop it waits for")
        call = _Call(coro)
        with self._cond:
            if self._closing:
                coro.close()
                raise RuntimeError("the event loop is closed")
            lead = not self._driving
            if lead:
                self._driving = True
                self._stop_for = call
        if lead:
            self._drive(call, start=True)
        else:
            self._follow(call)
        if call.error is None:
            return call.result  # type: ignore[return-value]
        if isinstance(call.error, asyncio.CancelledError):
            if call.interrupted:
                raise KeyboardInterrupt
            raise RuntimeError("the call was cancelled: its event loop was closed")
        raise call.error

    def _follow(self, call: _Call[Any]) -> None:
        """Hand ``call`` to the driving thread, wait, and drive if it leaves first."""
        waiter = threading.Lock()
        waiter.acquire()
        with self._cond:
            call.waiter = waiter
            self._followers.append(call)
            self._incoming.append(call)
            wake = len(self._incoming) == 1  # else a wake-up is on its way already
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._start_incoming)
            except RuntimeError:  # the loop is closed
                self._refuse_incoming()
        try:
            while not self._woken_to_drive(call):
                if call.finished:
                    return
                waiter.acquire()
                if call.finished:  # set before the release: no need for the loop's lock
                    return
        except BaseException:  # Ctrl-C while waiting
            self._unfollow(call)
            self._cancel_soon(call)
            raise
        self._drive(call)

    def _start_incoming(self) -> None:
        with self._cond:
            calls, self._incoming = self._incoming, []
        for call in calls:
            self._start(call)

    def _refuse_incoming(self) -> None:
        """The loop is closed: every call waiting to start ends with that error."""
        with self._cond:
            calls, self._incoming = self._incoming, []
            for call in calls:
                call.coro.close()
                call.error = RuntimeError("the event loop is closed")
                call.finished = True
                if call in self._followers:
                    self._followers.remove(call)
                    self._wake(call)

    def _woken_to_drive(self, call: _Call[Any]) -> bool:
        """Whether ``call``'s thread has just taken the driving role; else it waits
        again (after its next release)."""
        with self._cond:
            if call.finished:
                return False
            if self._driving:
                if call.woken:  # released for nothing (another thread took over): re-arm
                    call.waiter.acquire(False)  # the release not waited for yet, if any
                    call.woken = False
                return False
            self._followers.remove(call)
            if self.loop.is_closed():
                raise RuntimeError("the event loop was closed before the call ended")
            self._driving = True
            self._stop_for = call
            return True

    def _unfollow(self, call: _Call[Any]) -> None:
        with self._cond:
            if call in self._followers:
                self._followers.remove(call)

    def _wake(self, call: _Call[Any]) -> None:
        # Under the loop's lock.
        if not call.woken:
            call.woken = True
            call.waiter.release()

    def _start(self, call: _Call[Any]) -> None:
        if call.cancelled:
            call.coro.close()
            self._finish(call, None, asyncio.CancelledError())
        else:
            call.task = self.loop.create_task(self._settle(call))

    async def _settle(self, call: _Call[Any]) -> None:
        # The outcome is recorded in the task's last step, not by a done callback (one
        # more loop iteration per call).
        try:
            result = await call.coro
        except BaseException as error:  # the caller's to raise, KeyboardInterrupt too
            self._finish(call, None, error)
        else:
            self._finish(call, result, None)

    def _finish(self, call: _Call[Any], result: Any, error: Optional[BaseException]) -> None:
        call.result, call.error = result, error
        with self._cond:
            call.finished = True
            if self._stop_for is call:
                self.loop.stop()  # after this iteration: the driver's call is done
            elif call in self._followers:
                self._followers.remove(call)
                self._ended.append(call)  # woken before the loop waits, or leaves

    def _wake_ended(self, waits: bool = True) -> None:
        """Wake the threads of the calls that ended, if the loop is about to wait (or
        to leave), or has polled on too long without waiting."""
        if not self._ended:
            return
        if not waits and self._unwoken_for < _MAX_ITERATIONS_UNWOKEN:
            self._unwoken_for += 1
            return
        self._unwoken_for = 0
        with self._cond:
            calls, self._ended = self._ended, []
            for call in calls:
                self._wake(call)

    def _cancel(self, call: _Call[Any]) -> None:
        call.cancelled = True
        if call.task is not None:
            call.task.cancel()

    def _cancel_soon(self, call: _Call[Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self._cancel, call)
        except RuntimeError:
            pass  # the loop is closed: nothing runs any more

    # -- driving --------------------------------------------------------------------------

    def _drive(self, call: _Call[Any], start: bool = False) -> None:
        """Run the loop in this thread until ``call`` is done (first making its task,
        with ``start``); this thread has taken the driving role, and gives it up."""
        loop = self.loop
        restore = None
        try:
            if start:
                call.task = loop.create_task(self._settle(call))
            restore = self._catch_ctrl_c(call)
            while not call.finished:
                loop.run_forever()
        except BaseException:
            # Raised into this thread from outside the loop (another signal handler's
            # exception): cancel the call; whoever drives next unwinds it.
            if call.task is None and start:
                call.coro.close()
            self._cancel(call)
            raise
        finally:
            if restore is not None:
                _signal.signal(_SIGINT, restore)
            self._leave()

    def _catch_ctrl_c(self, call: _Call[Any]) -> Any:
        """In the main thread, with Python's own SIGINT handler in place: make Ctrl-C
        cancel ``call`` (a second one raises at once); return the handler to restore."""
        if threading.current_thread() is not threading.main_thread():
            return None
        # The C functions: signal.signal's enum conversions cost more than the rest.
        previous = _signal.getsignal(_SIGINT)
        if previous is not _signal.default_int_handler:
            return None
        loop = self.loop

        def on_ctrl_c(signum: int, frame: Any) -> None:
            if call.finished or call.interrupted:
                raise KeyboardInterrupt
            call.interrupted = True
            self._cancel(call)
            loop.call_soon_threadsafe(_nothing)  # wake the selector

        _signal.signal(_SIGINT, on_ctrl_c)
        return previous

    def _leave(self) -> None:
        self._wake_ended()
        with self._cond:
            self._driving = False
            self._stop_for = None
            self._last_driven = time.monotonic()
            if self._followers:  # the first of them drives next
                self._wake(self._followers[0])
            self._cond.notify_all()

    def _keep(self, tick_s: float) -> None:
        """The keeper thread: ticks while nobody calls, then the final coroutine."""
        while not self._stopping.wait(tick_s):
            with self._cond:
                if self._driving or time.monotonic() - self._last_driven < tick_s:
                    continue
                self._driving = True
            try:
                self.loop.call_soon(self.loop.stop)
                self.loop.run_forever()  # one iteration: due timers and I/O
            finally:
                self._leave()
        self._close_loop()

    # -- closing --------------------------------------------------------------------------

    def close(self, final: Optional[Coroutine[Any, Any, Any]] = None) -> None:
        """Run ``final`` (the client's close), if given, on the loop, then close the
        loop and stop the keeper; idempotent. Later calls raise ``RuntimeError``.
        Waits for the end unless called from inside the loop or from the keeper (as a
        garbage collection may), where it only starts it."""
        call = None if final is None else _Call(final)
        with self._cond:
            if self._closing:
                if final is not None:
                    final.close()
                return
            self._closing = True
            self._final = call
        if call is not None:
            try:  # started now, it cuts short the calls in flight
                self.loop.call_soon_threadsafe(self._start, call)
            except RuntimeError:
                call.coro.close()
        self._stopping.set()
        if not self.drives_here() and threading.current_thread() is not self._keeper:
            self._keeper.join(_CLOSE_TIMEOUT_S)

    def _close_loop(self) -> None:
        cond, final = self._cond, self._final
        with cond:
            while self._driving:
                cond.wait()
            self._driving = True
            self._stop_for = final
        loop = self.loop
        try:
            if final is not None and not final.finished:
                give_up = loop.call_later(_CLOSE_TIMEOUT_S, loop.stop)
                loop.run_forever()
                give_up.cancel()
            cancel_the_rest(loop)
        finally:
            loop.close()
            self._leave()


def _nothing() -> None:
    pass
