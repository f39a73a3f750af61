"""``sepp-lite worker --processes N``: a supervisor and N worker processes.

Each child is the same command run again (``python -m sepp_lite worker ...`` with the
same interpreter, arguments, working directory and environment) with a hidden
``--status-fd FD``: a pipe on which it writes one JSON line per heartbeat, its
readiness. Re-running the command (rather than ``multiprocessing``) keeps a child
exactly what ``sepp-lite worker`` is on its own: the same import of the user's
``MODULE:OBJECT``, the same options and signal handling; nothing has to be pickled,
children start from a clean interpreter (as with spawn), asyncio's subprocess support
lets the supervisor wait for them on its event loop, and it behaves the same on PyPy.

The supervisor restarts a child that exits non-zero, after a delay that doubles with
each consecutive crash (from 0.25 s up to 30 s; a child that ran 10 s resets it), and
gives up (stopping the others gracefully, exiting non-zero) when one dies at start-up
5 times in a row (within 10 s of starting, or before it ever became ready). A child
that exits 0 (``--until-idle``, or a handler that shut its worker down) is done.

The first SIGTERM/SIGINT is passed on to every child as SIGTERM (each drains as a single
worker does) and the supervisor exits 0 once all have; a second one stops them hard and
exits 1: each child gets SIGQUIT, which cancels its handlers and hands their jobs back to
their queues, and one still running ``HARD_STOP_S`` later is killed (SIGKILL). Children
treat every SIGTERM/SIGINT after the first as the same graceful stop, so a signal sent
to the whole process group (Ctrl-C in a terminal, systemd's default KillMode) is not a
hard stop. A signal is logged once, by the supervisor (a child logs the one it is
passed at DEBUG). A child whose status pipe breaks (the supervisor died) shuts down
gracefully too.

With ``--http``, the supervisor serves the endpoints for all of them: ``/livez``
and ``/readyz`` from the children's heartbeats, ``/metrics`` from prometheus-client's
multiprocess files (each child writes its own, in a directory the supervisor owns).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Optional

from sepp_lite import _metrics
from sepp_lite._httpd import HttpServer, Route, parse_listen_address
from sepp_lite._taskset import TaskSet
from sepp_lite.monitor import BEAT_S, Check, WorkerMonitor, health_routes
from sepp_lite.shutdown import ShutdownHandle, signal_handlers
from sepp_lite.worker import Worker

__all__ = ["Supervisor", "available_cpus", "cgroup_cpu_quota", "process_count", "run_supervised"]

logger = logging.getLogger("sepp_lite.supervisor")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's multiprocess mode
RESTART_DELAY_S = 0.25
RESTART_DELAY_MAX_S = 30.0
STABLE_AFTER_S = 10.0  # a child that ran this long (and became ready) is past its start-up
STARTUP_FAILURE_LIMIT = 5  # consecutive exits at start-up before giving up
STATUS_LINE_LIMIT = 4096
PIPE_DRAIN_S = 1.0  # after a child exits, how long its status pipe may stay open
KILL_WAIT_S = 10.0
# After a hard stop's SIGQUIT, how long a child has to hand its jobs back before SIGKILL:
# the worker's grace for cancelled handlers and for their hand-backs, and some to exit.
HARD_STOP_S = 5.0
# PyPy sizes its nursery (the young generation) from the CPU's cache, to 1 MB on many
# machines. A Worker allocates about 50 KiB per job there (asyncio is pure Python on
# PyPy) and spent about 30 % of its CPU in the GC; with 4 MB, about a fifth less CPU
# per job (`make bench`). Children get it unless the environment sets its own.
PYPY_NURSERY = "4MB"
_PYPY = sys.implementation.name == "pypy"
EXIT_HARD = 1
# Exits that count as a clean stop once stopping: a child still starting up has no
# signal handler yet and dies of the SIGTERM it was sent (it held no jobs).
_CLEAN_STOPS = (0, -signal.SIGTERM, -signal.SIGINT)


def available_cpus(
    cgroup_root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup"
) -> int:
    """The CPUs this process may use: its affinity where the OS tells it, and no more
    than its cgroup's CPU quota allows, rounded up (a container limited to 2 CPUs on a
    32-CPU node sees 32 in its affinity)."""
    if hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:
        count = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, self_cgroup)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def cgroup_cpu_quota(cgroup_root: str, self_cgroup: str) -> Optional[float]:
    """CPUs the process's cgroup quota allows (cgroup v2 ``cpu.max``, else v1's CFS
    quota), or None when unlimited or unknown."""
    paths: dict[str, str] = {}  # controller ("" for v2) -> the cgroup's path
    try:
        with open(self_cgroup) as fh:
            for line in fh:
                fields = line.rstrip("\n").split(":", 2)
                for controller in fields[1].split(",") if len(fields) == 3 else ():
                    paths[controller] = fields[2]
    except OSError:
        pass
    v2 = os.path.join(cgroup_root, paths.get("", "/").lstrip("/"), "cpu.max")
    v1 = os.path.join(cgroup_root, "cpu", paths.get("cpu", "/").lstrip("/"))
    try:
        quota, period = _read_words(v2)[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = _read_words(os.path.join(v1, "cpu.cfs_quota_us"))[0]
        period = _read_words(os.path.join(v1, "cpu.cfs_period_us"))[0]
        return None if int(quota) <= 0 else int(quota) / int(period)
    except (OSError, ValueError, IndexError):
        return None


def _read_words(path: str) -> list[str]:
    with open(path) as fh:
        return fh.read().split()


def process_count(text: str) -> int:
    """``--processes``: a count, or ``0``/``auto`` for one per available CPU."""
    if text.strip().lower() == "auto":
        return available_cpus()
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"expected a number of processes or auto, got {text!r}") from None
    if count < 0:
        raise ValueError(f"the number of processes must not be negative, got {count}")
    return count or available_cpus()


def child_command(argv: Sequence[str], status_fd: int) -> list[str]:
    """``argv`` (the supervisor's own ``sepp-lite`` arguments) as a child's command."""
    args = list(argv)
    at = args.index("worker") + 1  # the subcommand: the first "worker" (no option before
    # it takes a value), so the hidden option lands in the worker's own arguments
    args[at:at] = ["--status-fd", str(status_fd)]
    return [sys.executable, "-m", "sepp_lite", *args]


@dataclass
class _Child:
    """One of the N slots, and the process currently in it."""

    slot: int
    proc: Optional[asyncio.subprocess.Process] = None
    started_at: float = 0.0
    ready: bool = False
    detail: str = "not started"
    last_beat: Optional[float] = None
    ever_ready: bool = False
    crashes: int = 0
    startup_failures: int = 0
    done: bool = False

    @property
    def name(self) -> str:
        pid = f" (pid {self.proc.pid})" if self.proc is not None else ""
        return f"worker process {self.slot}{pid}"

    def lag(self, now: float) -> float:
        return 0.0 if self.last_beat is None else max(0.0, now - self.last_beat - BEAT_S)


class Supervisor:
    """Runs ``processes`` children of the ``sepp-lite`` command ``argv`` until they
    are done or a signal stops them; :meth:`run` returns the exit status."""

    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        *,
        http: Optional[str] = None,
        max_loop_lag: float = 10.0,
    ) -> None:
        self._argv = list(argv)
        self._children = [_Child(slot) for slot in range(1, processes + 1)]
        self._listen = parse_listen_address(http) if http else None
        self._max_lag = max_loop_lag
        self._stopping = False
        self._stop: Optional[asyncio.Event] = None
        self._hard = False
        self._failure: Optional[tuple[str, int]] = None  # (message, exit status)
        self._stop_exits: list[tuple[str, int]] = []
        self._metrics: Optional[_metrics.SupervisorMetrics] = None
        self._metrics_dir: Optional[str] = None
        self._endpoints: Optional[HttpServer] = None
        self._kill_later: Optional[asyncio.TimerHandle] = None

    # -- running ----------------------------------------------------------------------

    async def run(self) -> int:
        """Start the children and supervise them; the exit status when all are done.
        Raises ``OSError`` when ``--http``'s address cannot be bound."""
        self._stop = asyncio.Event()
        with self._metrics_files(), self._signals():
            if self._listen is not None:
                await self._serve(*self._listen)
            logger.info("supervising %d worker processes", len(self._children))
            slots = TaskSet("worker process")
            try:
                for child in self._children:
                    slots.spawn(self._keep(child))
                await slots.wait()
            except asyncio.CancelledError:
                self._kill_all()
                await slots.cancel(KILL_WAIT_S)
                raise
            finally:
                if self._kill_later is not None:
                    self._kill_later.cancel()
                if self._endpoints is not None:
                    await self._endpoints.close()
        return self._outcome()

    def _outcome(self) -> int:
        if self._hard:
            print(
                "error: stopped hard by a second signal: the worker processes handed their "
                "jobs in flight back (those that could not, or on their last attempt, go "
                "back when their leases expire)",
                file=sys.stderr,
            )
            return EXIT_HARD
        problem = self._failure or (self._stop_exits[0] if self._stop_exits else None)
        if problem is not None:
            print(f"error: {problem[0]}", file=sys.stderr)
            return problem[1]
        return 0

    async def _keep(self, child: _Child) -> None:
        """Keep the slot's process running until stopped, done or given up."""
        while not self._stopping:
            code = await self._run_child(child)
            if code == 0 or self._stopping:
                child.done = True
                if code not in _CLEAN_STOPS and not self._hard:
                    message = f"worker process {child.slot} exited {code} while stopping"
                    self._stop_exits.append((message, code if code > 0 else 1))
                return
            delay = self._after_crash(child, code)
            if delay is None:
                return
            assert self._stop is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._metrics is not None and not self._stopping:
                self._metrics.restarts.inc()

    def _after_crash(self, child: _Child, code: int) -> Optional[float]:
        """Count the crash; the delay before the next start, or None to give up."""
        stable = time.monotonic() - child.started_at >= STABLE_AFTER_S
        child.crashes = 1 if stable else child.crashes + 1
        # Dying young counts even after a moment of readiness: a worker whose first
        # reserve is refused (strict mode, a wrong key) is ready until it tries.
        child.startup_failures = 0 if stable and child.ever_ready else child.startup_failures + 1
        how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        if child.startup_failures >= STARTUP_FAILURE_LIMIT:
            message = (
                f"worker process {child.slot} {how} at start-up, {child.startup_failures} times "
                "in a row; giving up (its errors are above)"
            )
            # Reported once, as the command's last line (`error: ...`), when it exits.
            self._failure = (message, code if code > 0 else 1)
            self._begin_stop()
            return None
        delay = min(RESTART_DELAY_S * 2.0 ** (child.crashes - 1), RESTART_DELAY_MAX_S)
        logger.warning("worker process %d %s; starting it again in %.3g s", child.slot, how, delay)
        return delay

    async def _run_child(self, child: _Child) -> int:
        """Start the slot's process and wait for it to exit; its exit status."""
        read_fd, write_fd = os.pipe()
        pipe = os.fdopen(read_fd, "rb", 0)
        try:
            proc = await asyncio.create_subprocess_exec(
                *child_command(self._argv, write_fd),
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(write_fd,),
                env=self._child_env(),
            )
        except OSError as error:  # counted as a crash at start-up
            logger.error("cannot start worker process %d: %s", child.slot, error)
            pipe.close()
            return 1
        finally:
            os.close(write_fd)
        child.proc, child.started_at, child.ever_ready = proc, time.monotonic(), False
        child.ready, child.detail, child.last_beat = False, "starting", None
        self._count_running()
        if self._stopping:  # the stop came while it was starting
            self._signal(proc, signal.SIGTERM)
        reading = asyncio.ensure_future(self._read_status(child, pipe))
        try:
            return await proc.wait()
        finally:
            await self._reap(child, reading, pipe)

    async def _reap(self, child: _Child, reading: asyncio.Future[None], pipe: IO[bytes]) -> None:
        # The pipe closes when the child exits, unless a grandchild inherited it.
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(reading), PIPE_DRAIN_S)
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        pipe.close()
        pid = child.proc.pid if child.proc is not None else None
        child.proc, child.ready, child.detail = None, False, "not running"
        self._count_running()
        if pid is not None and self._metrics_dir is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, self._metrics_dir)  # type: ignore[no-untyped-call]

    async def _read_status(self, child: _Child, pipe: IO[bytes]) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STATUS_LINE_LIMIT)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # a line over the limit: skipped
                    continue
                if not line:
                    return
                self._status(child, line)
        finally:
            transport.close()

    def _status(self, child: _Child, line: bytes) -> None:
        try:
            status = json.loads(line)
            ready, detail = bool(status["ready"]), str(status["detail"])
        except (ValueError, KeyError, TypeError):
            logger.debug("%s: unreadable status line %r", child.name, line[:100])
            return
        child.last_beat = time.monotonic()
        child.ready, child.detail = ready, detail
        child.ever_ready = child.ever_ready or ready

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if _PYPY:
            env.setdefault("PYPY_GC_NURSERY", PYPY_NURSERY)
        if self._metrics_dir is not None:
            env[MULTIPROC_ENV] = self._metrics_dir
        return env

    def _count_running(self) -> None:
        if self._metrics is not None:
            self._metrics.processes.set(sum(c.proc is not None for c in self._children))

    # -- stopping ---------------------------------------------------------------------

    def _signals(self) -> contextlib.AbstractContextManager[None]:
        received: list[signal.Signals] = []

        def on_signal(signum: signal.Signals) -> None:
            received.append(signum)
            if len(received) == 1:
                logger.info(
                    "%s received: stopping the worker processes gracefully (again to stop now)",
                    signum.name,
                )
                self._begin_stop()
            elif not self._hard:
                logger.warning("%s received again: stopping the worker processes now", signum.name)
                self._hard = True
                self._stop_now()

        return signal_handlers(on_signal)

    def _begin_stop(self) -> None:
        self._signal_all(signal.SIGTERM)

    def _stop_now(self) -> None:
        """A hard stop: SIGQUIT to every child (it cancels its handlers and hands
        their jobs back), SIGKILL to those still running ``HARD_STOP_S`` later."""
        self._signal_all(signal.SIGQUIT)
        self._kill_later = asyncio.get_running_loop().call_later(HARD_STOP_S, self._kill_all)

    def _kill_all(self) -> None:
        self._signal_all(signal.SIGKILL)

    def _signal_all(self, signum: signal.Signals) -> None:
        """Stop supervising (no restarts) and send ``signum`` to every child."""
        self._stopping = True
        if self._stop is not None:
            self._stop.set()
        for child in self._children:
            if child.proc is not None:
                self._signal(child.proc, signum)

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, signum: signal.Signals) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    # -- the endpoints ----------------------------------------------------------------

    @contextlib.contextmanager
    def _metrics_files(self) -> Iterator[None]:
        """With --http and prometheus-client: the children's multiprocess directory."""
        if self._listen is None or not _metrics.AVAILABLE:
            yield
            return
        path = tempfile.mkdtemp(prefix="sepp-lite-metrics-")
        self._metrics_dir = path
        self._metrics = _metrics.supervisor_registry(path)
        try:
            yield
        finally:
            self._metrics_dir = None
            shutil.rmtree(path, ignore_errors=True)

    async def _serve(self, host: str, port: int) -> None:
        server = HttpServer(self.routes())
        await server.start(host, port)
        self._endpoints = server
        shown = f"[{server.host}]" if ":" in server.host else server.host
        logger.info("health endpoints on http://%s:%d: /livez /readyz /metrics", shown, server.port)
        if not _metrics.AVAILABLE:
            logger.warning("%s", _metrics.MISSING)

    def routes(self) -> dict[str, Route]:
        registry = self._metrics.registry if self._metrics is not None else None

        def metrics(accept: str) -> _metrics.Exposition:
            return _metrics.exposition(accept, registry)

        return health_routes(self.liveness, self.readiness, metrics)

    def liveness(self) -> Check:
        """Live while every running child keeps its heartbeat within the bound."""
        now = time.monotonic()
        lines, late = [], 0
        for child in self._children:
            if child.proc is None:
                lines.append(f"{child.name}: not running")
                continue
            lag = child.lag(now)
            late += lag > self._max_lag
            lines.append(f"{child.name}: event loop lag {lag:.3f} s")
        if late:
            head = f"not live: {late} worker process(es) blocked (bound {self._max_lag:g} s)"
            return Check(False, "\n".join([head, *lines]))
        return Check(True, "\n".join(["live", *lines]))

    def readiness(self) -> Check:
        """Ready when not stopping and every child is running and ready."""
        lines = [f"{child.name}: {child.detail}" for child in self._children]
        if self._stopping:
            return Check(False, "\n".join(["not ready: shutting down", *lines]))
        ready = all(child.proc is not None and child.ready for child in self._children)
        head = "ready" if ready else "not ready"
        return Check(ready, "\n".join([head, *lines]))


# -- the child's side -----------------------------------------------------------------


class _StatusPipe:
    """The child's side of the status pipe: its monitor's readiness, one JSON line per
    heartbeat; a broken pipe (the supervisor is gone) shuts the worker down."""

    def __init__(self, fd: int, handle: ShutdownHandle) -> None:
        self._fd = fd
        self._handle = handle
        self._orphaned = False
        os.set_blocking(fd, False)  # never stall the worker's loop on a full pipe

    def report(self, monitor: WorkerMonitor) -> None:
        check = monitor.readiness()
        line = json.dumps({"ready": check.ok, "detail": check.detail}) + "\n"
        try:
            os.write(self._fd, line.encode())
        except BlockingIOError:
            pass  # the supervisor is not reading: this beat is dropped, the next goes
        except OSError:
            if not self._orphaned:
                self._orphaned = True
                logger.warning("the supervisor is gone: shutting down gracefully")
                self._handle.shutdown()


def _child_signals(
    handle: ShutdownHandle, stopped_hard: list[bool]
) -> contextlib.AbstractContextManager[None]:
    """SIGINT/SIGTERM start the graceful stop; later ones change nothing (the
    supervisor decides on a hard stop): SIGQUIT stops at once, cancelling the task
    that runs the worker (which hands its jobs back), and notes it in
    ``stopped_hard``."""
    task = asyncio.current_task()

    def on_signal(signum: signal.Signals) -> None:
        # DEBUG: the supervisor logs the stop of them all, once; each child's own
        # "draining" (or hand-back) and "stopped" lines follow.
        if signum == signal.SIGQUIT:
            logger.debug("SIGQUIT received: stopping now")
            stopped_hard.append(True)
            if task is not None:
                task.cancel()
            return
        if handle.is_shutdown:
            logger.debug("%s received: already shutting down", signum.name)
            return
        logger.debug("%s received: shutting down gracefully", signum.name)
        handle.shutdown()

    return signal_handlers(on_signal, (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT))


async def run_supervised(
    worker: Worker, status_fd: int, *, until_idle: bool, max_loop_lag: float
) -> int:
    """Run ``worker`` as a supervised child reporting on ``status_fd``; 0 once it
    stopped gracefully, 1 after the supervisor's hard stop (``run()``'s errors
    propagate)."""
    metrics = bool(os.environ.get(MULTIPROC_ENV))
    pipe = _StatusPipe(status_fd, worker.shutdown_handle())
    monitor = WorkerMonitor(worker, max_loop_lag=max_loop_lag, metrics=metrics, on_beat=pipe.report)
    stopped_hard: list[bool] = []
    with _child_signals(worker.shutdown_handle(), stopped_hard):
        # Besides the heartbeat's reports, one as soon as the monitor runs and one
        # after it stopped (however run() ended), so the supervisor need not wait for
        # a beat to see either.
        try:
            async with monitor:
                pipe.report(monitor)
                await worker.run(until_idle=until_idle)
        except asyncio.CancelledError:
            if not stopped_hard:
                raise
            return EXIT_HARD  # the supervisor says why, once
        finally:
            pipe.report(monitor)
    return 0
