"""A blocking SeppClient for synchronous code: Django and Flask views, management
commands, cron scripts, notebooks.

    from sepp_lite.sync import SeppClient

    client = SeppClient.connect("127.0.0.1:50051")  # once, e.g. at import time
    client.enqueue(EnqueueRequest("emails", "send_welcome"))

It is not a second implementation of the protocol: every call runs the coroutine of
the same name of an async :class:`sepp_lite.SeppClient` on an event loop that this
client owns, so errors, deadlines and retries are the async client's. The calling
thread runs that loop itself while it waits (``_caller_loop.py``), and a daemon
thread runs it briefly between calls for the keepalive pings. One client is shared
safely by many threads over one connection. After ``os.fork()`` the child never
touches the parent's connection: it connects again, with the same arguments, on
its first call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
import weakref
from collections.abc import Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, Optional

from sepp_lite import _connect_defaults, errors
from sepp_lite._caller_loop import CallerLoop
from sepp_lite._time import Duration, as_timedelta
from sepp_lite.client import SeppClient as AsyncSeppClient
from sepp_lite.types import (
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobCtx,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    ServerInfo,
)

__all__ = ["SeppClient"]

_IN_LOOP = (
    "sepp_lite.sync.SeppClient was called from a thread that is running an asyncio "
    "event loop, where a blocking call would stall the loop (or deadlock it). In async "
    "code use the async client, sepp_lite.SeppClient, and await its methods; or move "
    "this call to a worker thread (await asyncio.to_thread(...))."
)

# Connections inherited from a parent process. The child must never close them: the
# loop's epoll instance is shared with the parent across fork(), and unregistering
# from it would break the parent's loop. Kept alive here so no finalizer runs either.
_INHERITED: list[object] = []
_fork_lock = threading.Lock()


def _fresh_fork_lock() -> None:
    global _fork_lock
    _fork_lock = threading.Lock()  # another thread may have held it at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_fork_lock)


class _Connection:
    """An async client and the loop it lives on, in the process that made them."""

    __slots__ = ("client", "loop", "pid")

    def __init__(self, loop: CallerLoop, client: AsyncSeppClient) -> None:
        self.loop = loop
        self.client = client
        self.pid = os.getpid()

    @classmethod
    def open(cls, addr: str, options: dict[str, Any]) -> _Connection:
        loop = CallerLoop("sepp-lite-sync", _tick_seconds(options))
        try:
            client = loop.run(AsyncSeppClient.connect(addr, **options))
        except BaseException:
            loop.close()
            raise
        return cls(loop, client)

    def close(self) -> None:
        """Close the client and its loop; waits unless called from inside the loop."""
        self.loop.close(self.client.close())

    def release(self) -> None:
        """Close for a client collected unclosed, or still open at exit. A collection
        can happen on any thread."""
        if self.pid != os.getpid():
            return  # inherited through fork(): the parent's, not ours to close
        with contextlib.suppress(Exception):
            self.close()


def _tick_seconds(options: dict[str, Any]) -> float:
    """How often the loop runs between calls: twice per keepalive period and timeout,
    at most every 5 s (``connect`` itself reports invalid durations)."""
    try:
        time = as_timedelta(options["keepalive_time"], "keepalive_time").total_seconds()
        timeout = as_timedelta(options["keepalive_timeout"], "keepalive_timeout").total_seconds()
    except (TypeError, ValueError):
        return 5.0
    return max(0.05, min(5.0, time / 2, timeout / 2))


def _check_no_running_loop() -> None:
    if asyncio._get_running_loop() is not None:
        raise RuntimeError(_IN_LOOP)


class SeppClient:
    """A blocking client for one sepp server; create it with :meth:`connect`.

    Its methods have the names, arguments, return values and exceptions of
    :class:`sepp_lite.SeppClient`'s coroutines and block until the call is done;
    Ctrl-C interrupts a waiting call (and cancels it). Calling them from a thread
    that runs an asyncio event loop raises ``RuntimeError``. Close it with
    :meth:`close` or use ``with``; a client still open when it is collected or when
    the interpreter exits is closed then.
    """

    def __init__(self, addr: str, options: dict[str, Any]) -> None:
        """Internal: use :meth:`connect`."""
        self._addr = addr
        self._options = options
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._conn: Optional[_Connection] = None
        self._finalizer: Optional[weakref.finalize[Any, Any]] = None
        self._closed = False

    @classmethod
    def connect(
        cls,
        addr: str,
        *,
        api_key: str | None = None,
        retry_policy: RetryPolicy | None = None,
        tls: bool = False,
        tls_ca_cert: bytes | None = None,
        tls_domain: str | None = None,
        credentials: ssl.SSLContext | None = None,
        connect_timeout: Duration = _connect_defaults.CONNECT_TIMEOUT,
        rpc_timeout: Duration = _connect_defaults.RPC_TIMEOUT,
        max_receive_message_bytes: int | None = None,
        keepalive_time: Duration = _connect_defaults.KEEPALIVE_TIME,
        keepalive_timeout: Duration = _connect_defaults.KEEPALIVE_TIMEOUT,
        check_payload_limit: bool = True,
        coalesce_enqueues: bool | None = None,
        max_enqueue_batches_in_flight: int = _connect_defaults.MAX_ENQUEUE_BATCHES_IN_FLIGHT,
        max_enqueues_waiting: int = _connect_defaults.MAX_ENQUEUES_WAITING,
    ) -> SeppClient:
        """Connect to the server at ``addr`` and return a ready client. The arguments,
        their defaults and the errors are those of :meth:`sepp_lite.SeppClient.connect`
        (``ConnectError`` when the server cannot be reached within
        ``connect_timeout``)."""
        options = dict(locals())  # every keyword argument, so none can be forgotten
        del options["cls"], options["addr"]
        client = cls(addr, options)
        client._connection()
        return client

    # -- the connection ---------------------------------------------------------------

    def _connection(self) -> _Connection:
        _check_no_running_loop()
        if self._pid != os.getpid():
            self._forget_parent()
        conn = self._conn
        if conn is None:
            conn = self._open()
        return conn

    def _open(self) -> _Connection:
        with self._lock:
            if self._closed:
                raise RuntimeError("this SeppClient is closed")
            if self._conn is None:
                conn = _Connection.open(self._addr, self._options)
                self._finalizer = weakref.finalize(self, conn.release)
                self._conn = conn
            return self._conn

    def _forget_parent(self) -> None:
        """In a forked child: set the parent's connection aside, untouched."""
        with _fork_lock:
            if self._pid == os.getpid():
                return  # another thread of this child did it
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            if self._conn is not None:
                _INHERITED.append(self._conn)
                self._conn = None
            self._lock = threading.Lock()  # a parent thread may have held it at fork
            self._pid = os.getpid()

    def close(self) -> None:
        """Close the connection and stop the client's thread; idempotent. Calls made
        afterwards raise ``RuntimeError``."""
        if self._pid != os.getpid():
            self._forget_parent()
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()
        if conn is not None:
            conn.close()

    def __enter__(self) -> SeppClient:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"sepp_lite.sync.SeppClient({self._addr!r})"

    @property
    def enqueues_waiting(self) -> int:
        """How many :meth:`enqueue` calls, from all threads, wait to share a call to
        the server; see :attr:`sepp_lite.SeppClient.enqueues_waiting`."""
        conn = self._conn if self._pid == os.getpid() else None
        return conn.client.enqueues_waiting if conn is not None else 0

    @property
    def server_info(self) -> ServerInfo | None:
        """The answer of the last :meth:`get_server_info` call of this process's
        connection, if any."""
        conn = self._conn if self._pid == os.getpid() else None
        return conn.client.server_info if conn is not None else None

    # -- producing --------------------------------------------------------------------

    def enqueue(self, job: EnqueueRequest) -> EnqueueAck:
        """Enqueue one job; see :meth:`sepp_lite.SeppClient.enqueue`."""
        conn = self._connection()
        return conn.loop.run(conn.client.enqueue(job))

    def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> list[EnqueueAck | errors.JobRejection]:
        """Enqueue jobs best-effort, one result per job; see
        :meth:`sepp_lite.SeppClient.enqueue_batch`."""
        conn = self._connection()
        return conn.loop.run(conn.client.enqueue_batch(jobs))

    def enqueue_atomic(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck]:
        """Enqueue all jobs or none; see :meth:`sepp_lite.SeppClient.enqueue_atomic`."""
        conn = self._connection()
        return conn.loop.run(conn.client.enqueue_atomic(jobs))

    # -- consuming --------------------------------------------------------------------

    def reserve(self, opts: ReserveOptions) -> list[Job] | None:
        """Long-poll for jobs; see :meth:`sepp_lite.SeppClient.reserve`. Extend a
        job's lease with :meth:`extend` (``ctx.extend`` is a coroutine)."""
        conn = self._connection()
        return conn.loop.run(conn.client.reserve(opts))

    def ack(self, ctx: JobCtx) -> None:
        """Acknowledge a job; see :meth:`sepp_lite.SeppClient.ack`."""
        conn = self._connection()
        conn.loop.run(conn.client.ack(ctx))

    def nack(
        self, ctx: JobCtx, retry: RetryDirective = RetryDirective.DEFAULT, reason: str = ""
    ) -> bool:
        """Report a failed job; True when it was dead-lettered. See
        :meth:`sepp_lite.SeppClient.nack`."""
        conn = self._connection()
        return conn.loop.run(conn.client.nack(ctx, retry, reason))

    def extend(self, ctx: JobCtx, extension: Duration) -> datetime:
        """Extend a job's lease; the new expiry. See :meth:`sepp_lite.SeppClient.extend`."""
        conn = self._connection()
        return conn.loop.run(conn.client.extend(ctx, extension))

    # -- the rest ---------------------------------------------------------------------

    def get_server_info(self) -> ServerInfo:
        """The server's version and limits; see :meth:`sepp_lite.SeppClient.get_server_info`."""
        conn = self._connection()
        return conn.loop.run(conn.client.get_server_info())

    def drain_dead_letters(
        self, queue: str | None = None, max_records: int = 1
    ) -> list[DeadLetterRecord]:
        """Remove and return dead letters; see
        :meth:`sepp_lite.SeppClient.drain_dead_letters`."""
        conn = self._connection()
        return conn.loop.run(conn.client.drain_dead_letters(queue, max_records))
