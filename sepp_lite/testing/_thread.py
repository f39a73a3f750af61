"""``SeppServerThread``: the in-process server on an event loop of its own, for
synchronous tests and for code running on other event loops."""

from __future__ import annotations

import inspect
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional

from sepp_lite._loop_thread import LoopThread
from sepp_lite._time import ms_to_datetime
from sepp_lite.testing._clock import Clock, ManualClock
from sepp_lite.testing._config import ServerConfig
from sepp_lite.testing._server import SeppTestServer
from sepp_lite.testing._state import Backlog, JobView, QueueCounts

if TYPE_CHECKING:
    from sepp_lite.types import QueueNames

__all__ = ["SeppServerThread", "ServerClock"]


class SeppServerThread:
    """A :class:`SeppTestServer` serving from an event loop in a daemon thread.

    Takes :class:`SeppTestServer`'s arguments. Every method is a plain blocking
    call, safe from any thread, including a thread that runs another event loop (an
    async test): the server never waits for its callers' loops. Use it as a context
    manager, or call :meth:`start` and :meth:`stop`::

        with SeppServerThread(clock=ManualClock()) as server:
            client = sepp_lite.sync.SeppClient.connect(server.addr)
            ...
            server.clock.advance(60)

    ``server`` is the :class:`SeppTestServer` itself; touch it only through
    :meth:`call`, which runs a function on the server's thread.
    """

    def __init__(
        self,
        config: Optional[ServerConfig] = None,
        *,
        clock: Optional[Clock] = None,
        **overrides: Any,
    ) -> None:
        self.server = SeppTestServer(config, clock=clock, **overrides)
        self.clock = ServerClock(self)
        self._portal: Optional[LoopThread] = None

    def start(self) -> SeppServerThread:
        """Start the thread and the server; returns ``self``. Raises what
        :meth:`SeppTestServer.start` raises."""
        if self._portal is not None:
            raise RuntimeError("a SeppServerThread can be started only once")
        portal = LoopThread("sepp-lite-test-server")
        try:
            portal.run(self.server.start())
        except BaseException:
            portal.stop()
            raise
        self._portal = portal
        return self

    def stop(self) -> None:
        """Stop the server as :meth:`SeppTestServer.stop` does, then the thread.
        Idempotent."""
        portal, self._portal = self._portal, None
        if portal is None:
            return
        try:
            portal.run(self.server.stop())
        finally:
            portal.stop()

    def __enter__(self) -> SeppServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()

    @property
    def addr(self) -> str:
        """``host:port`` of the listening socket."""
        return self.server.addr

    @property
    def config(self) -> ServerConfig:
        """The server's configuration."""
        return self.server.config

    @property
    def connections_accepted(self) -> int:
        """How many client connections the server has accepted (closed ones too)."""
        return self.server.connections_accepted

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the server's thread and return its result (awaited
        there when it is awaitable). Raises ``RuntimeError`` when the server is not
        running."""
        portal = self._portal
        if portal is None:
            raise RuntimeError("the SeppServerThread is not running")

        async def invoke() -> Any:
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        return portal.run(invoke())

    def counts(self, queue: str) -> QueueCounts:
        """``(ready, scheduled, in_flight, dead)`` of ``queue``."""
        counts: QueueCounts = self.call(self.server.counts, queue)
        return counts

    def backlog(self, queues: Optional[QueueNames] = None) -> Backlog:
        """What is left to do on ``queues`` (every queue when ``None``); see
        :meth:`QueueState.backlog`."""
        backlog: Backlog = self.call(self.server.backlog, queues)
        return backlog

    def job(self, job_id: str) -> Optional[JobView]:
        """A live job as the server holds it, or ``None``; see :meth:`QueueState.job`."""
        view: Optional[JobView] = self.call(self.server.state.job, job_id)
        return view

    def totals(self) -> dict[str, int]:
        """Running totals since the start; see :meth:`QueueState.totals`."""
        totals: dict[str, int] = self.call(self.server.state.totals)
        return totals


class ServerClock:
    """The clock of a :class:`SeppServerThread`, read and moved from any thread."""

    def __init__(self, owner: SeppServerThread) -> None:
        self._owner = owner

    @property
    def manual(self) -> bool:
        """Whether it is a :class:`ManualClock` (only then can it be advanced)."""
        return isinstance(self._owner.server.clock, ManualClock)

    def now_ms(self) -> int:
        """The server's current time in milliseconds since the epoch."""
        now: int = self._owner.call(self._owner.server.clock.now_ms)
        return now

    def now(self) -> datetime:
        """The server's current time as an aware UTC ``datetime``."""
        return ms_to_datetime(self.now_ms())

    def advance(self, seconds: float) -> None:
        """Move a manual clock forward, run the timers that fall due (lease expiries,
        schedules, retry delays, long-poll deadlines) and let woken calls proceed;
        see :meth:`SeppTestServer.advance`. Raises ``TypeError`` with a real clock."""
        self._owner.call(self._owner.server.advance, seconds)
