"""``sepp-lite worker --processes N`` and ``--http`` as real processes, against the
in-process server (crashed and restarted where readiness is checked), over real HTTP
on 127.0.0.1: a batch shared by two children and counted by one ``/metrics``, a child
killed with SIGKILL replaced and its job redelivered, SIGTERM draining every child,
a second signal killing them, a child that dies at start-up making the supervisor give
up, ``/readyz`` and ``/livez`` following the server and a blocked loop, and
``/metrics`` without prometheus-client. Every process started is stopped by its PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import sepp_lite as sepp
from sepp_lite.cli import _supervisor, main
from sepp_lite.cli._supervisor import available_cpus, cgroup_cpu_quota, process_count
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import unique_queue, until
from tests.fault_helpers import RestartableServer
from tests.http_helpers import get, samples, wait_for_status

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

WORKER_MODULE = """
import asyncio
import logging
import os
import pathlib
import time

import sepp_lite as sepp

MARKS = pathlib.Path({marks!r})


def make_worker(client):
    worker = sepp.Worker(
        client, [{queue!r}], lease_duration={lease}, wait_timeout=1, max_in_flight=2,
        reserve_error_backoff=0.1,
    )

    @worker.handler("work")
    async def work(payload, ctx):
        (MARKS / f"work-{{ctx.id}}-{{os.getpid()}}").touch()
        logging.getLogger("app").info("work %s", ctx.id)
        await asyncio.sleep(0.02)

    @worker.handler("bad")
    async def bad(payload, ctx):
        raise sepp.HandlerError.permanent("never works")

    @worker.handler("hold")  # holds its first attempt for PAYLOAD seconds
    async def hold(payload, ctx):
        (MARKS / f"started-{{ctx.id}}-{{ctx.attempt}}-{{os.getpid()}}").touch()
        if ctx.attempt == 1:
            await asyncio.sleep(float(payload.data))
        (MARKS / f"done-{{ctx.id}}-{{ctx.attempt}}").touch()

    @worker.handler("block")  # blocks the event loop for PAYLOAD seconds
    async def block(payload, ctx):
        (MARKS / f"blocking-{{os.getpid()}}").touch()
        time.sleep(float(payload.data))

    return worker
"""

ENDPOINTS = re.compile(r"health endpoints on (http://127\.0\.0\.1:\d+)")


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SEPP_", "PROMETHEUS_"))}


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc; elsewhere none known)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = entry.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(entry.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process not yet reaped does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


class Command:
    """``python -m sepp_lite ARGS`` running, its stderr collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._changed = asyncio.Event()
        self._reading = asyncio.ensure_future(self._read())
        self.children: set[int] = set()

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace"))
            self._changed.set()
        self._changed.set()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    async def line(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """The first stderr line matching ``pattern`` (waiting for it to come)."""
        regex = re.compile(pattern)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        seen = 0
        while True:
            for text in self.lines[seen:]:
                match = regex.search(text)
                if match:
                    return match
            seen = len(self.lines)
            if self._reading.done() or loop.time() > end:
                raise AssertionError(f"no line matching {pattern!r}; stderr:\n{self.text}")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), end - loop.time())

    async def url(self) -> str:
        return (await self.line(ENDPOINTS.pattern)).group(1)

    def note_children(self) -> list[int]:
        """The worker processes running now (remembered for the cleanup)."""
        pids = children_of(self.proc.pid)
        self.children.update(pids)
        return pids

    async def exit_code(self, timeout: float = 30.0) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await asyncio.wait_for(self._reading, 10)
        return code

    async def close(self) -> None:
        self.note_children()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        for pid in self.children:  # orphans would stop by themselves; do not wait
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reading.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)


@contextlib.asynccontextmanager
async def sepp_lite(*args: str, python: Optional[list[str]] = None) -> AsyncIterator[Command]:
    command = python or [sys.executable, "-m", "sepp_lite"]
    proc = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    running = Command(proc)
    try:
        yield running
    finally:
        await running.close()


def app(tmp_path: Path, queue: str, lease: float = 30) -> list[str]:
    """The worker module in ``tmp_path``; the command's arguments that run it."""
    (tmp_path / "tasks.py").write_text(
        WORKER_MODULE.format(marks=str(tmp_path), queue=queue, lease=lease)
    )
    return ["worker", "tasks:make_worker", "--app-dir", str(tmp_path)]


def marks(tmp_path: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in tmp_path.glob(prefix + "*"))


async def enqueue(addr: str, queue: str, job_type: str, n: int = 1, data: str = "") -> list[str]:
    payload = sepp.Payload(data.encode(), "text/plain") if data else None
    async with await sepp.SeppClient.connect(addr) as client:
        acks = await client.enqueue_batch(
            [sepp.EnqueueRequest(queue, job_type, payload=payload) for _ in range(n)]
        )
    return [ack.job_id for ack in acks]  # type: ignore[union-attr]


@pytest.fixture
def server_options() -> dict[str, Any]:
    """conftest.py's ``server`` without dead-letter retention: the "bad" jobs the workers
    dead-letter leave the queue, and its counts go back to all zeros."""
    return {}


async def metrics_once(url: str, done: Callable[[str], bool], timeout: float = 20.0) -> str:
    """Scrape ``url``/metrics until ``done(exposition)`` (counters only grow)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        answer = await get(url + "/metrics")
        assert answer.status == 200, answer
        if done(answer.body) or loop.time() > end:
            return answer.body
        await asyncio.sleep(0.05)


def assert_clean(text: str) -> None:
    assert "Traceback" not in text, text


async def test_two_processes_share_a_batch_and_one_metrics_endpoint_counts_it(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    await enqueue(server.addr, queue, "work", 60)
    await enqueue(server.addr, queue, "bad", 4)
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2"]
    async with sepp_lite(*argv, "--http", "127.0.0.1:0") as supervisor:
        url = await supervisor.url()
        await until(lambda: server.counts(queue) == (0, 0, 0, 0), timeout=60)

        # A child counts a job once its ack or nack is answered, just after the server
        # applied it: the last counts may come a moment after the queue is empty.
        def counted(text: str) -> bool:
            processed = samples(text, "sepp_jobs_processed_total", queue=queue, job_type="work")
            return processed == 60 and samples(text, "sepp_jobs_nacked_total") == 4

        text = await metrics_once(url, counted)
        # Both children answered the scrape through the supervisor's one endpoint.
        assert samples(text, "sepp_jobs_processed_total", queue=queue, job_type="work") == 60
        assert samples(text, "sepp_jobs_started_total", queue=queue) == 64
        nacked = samples(text, "sepp_jobs_nacked_total", queue=queue, outcome="dead_letter")
        assert nacked == 4
        assert samples(text, "sepp_jobs_in_flight") == 0
        assert samples(text, "sepp_handler_duration_seconds_count", queue=queue) == 64
        assert samples(text, "sepp_worker_processes") == 2
        ready = await wait_for_status(url + "/readyz", 200)
        pids = supervisor.note_children()
        assert len(pids) == 2
        assert all(f"(pid {pid}): ready: worker " in ready.body for pid in pids)
        workers = {name.rsplit("-", 1)[1] for name in marks(tmp_path, "work-")}
        assert workers == {str(pid) for pid in pids}  # the batch was shared
        supervisor.proc.send_signal(signal.SIGTERM)
        assert await supervisor.exit_code() == 0, supervisor.text
    assert "SIGTERM received: stopping the worker processes gracefully" in supervisor.text
    assert_clean(supervisor.text)
    assert not any(alive(pid) for pid in pids)


async def test_until_idle_returns_when_every_child_has(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    await enqueue(server.addr, queue, "work", 20)
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2", "--until-idle"]
    async with sepp_lite(*argv) as supervisor:
        assert await supervisor.exit_code(60) == 0, supervisor.text
    assert server.counts(queue) == (0, 0, 0, 0)
    assert len(marks(tmp_path, "work-")) == 20
    assert supervisor.text.count(" stopped\n") == 2  # "worker ID stopped", once per child
    assert_clean(supervisor.text)


async def test_every_process_writes_json_lines_naming_the_job_of_a_job_s_records(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    work = await enqueue(server.addr, queue, "work", 6)
    bad = await enqueue(server.addr, queue, "bad", 2)
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2", "--until-idle"]
    async with sepp_lite(*argv, "--log-format", "json") as supervisor:
        assert await supervisor.exit_code(60) == 0, supervisor.text
    records = [json.loads(line) for line in supervisor.lines]  # the children's too
    assert sum(r["logger"] == "sepp_lite.supervisor" for r in records) == 1  # supervising 2
    assert sum(" started: queues=" in r["message"] for r in records) == 2  # one per child
    mine = [r for r in records if r["logger"] == "app"]
    assert sorted(r["job_id"] for r in mine) == sorted(work)
    for record in mine:
        assert record["message"] == f"work {record['job_id']}"
        assert (record["job_type"], record["queue"], record["attempt"]) == ("work", queue, 1)
    dead = [r for r in records if "dead-lettered" in r["message"]]
    assert sorted(r["job_id"] for r in dead) == sorted(bad)
    assert {(r["level"], r["job_type"]) for r in dead} == {("WARNING", "bad")}


async def test_a_child_killed_with_sigkill_is_replaced_and_its_job_comes_back(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    [job_id] = await enqueue(server.addr, queue, "hold", data="600")
    argv = [*app(tmp_path, queue, lease=2), "--addr", server.addr, "--processes", "2"]
    async with sepp_lite(*argv, "--http", "127.0.0.1:0") as supervisor:
        url = await supervisor.url()
        await until(lambda: marks(tmp_path, f"started-{job_id}-1-"), timeout=60)
        holder = int(marks(tmp_path, f"started-{job_id}-1-")[0].rsplit("-", 1)[1])
        supervisor.note_children()
        os.kill(holder, signal.SIGKILL)
        restart = await supervisor.line(r"worker process (\d) was killed by signal 9; starting")
        # The lease (2 s) lapses and the job is handed out again, to either child.
        await until(lambda: marks(tmp_path, f"done-{job_id}-2"), timeout=30)
        await until(lambda: server.counts(queue) == (0, 0, 0, 0))
        ready = await wait_for_status(url + "/readyz", 200)
        pids = supervisor.note_children()
        assert len(pids) == 2 and holder not in pids
        assert f"worker process {restart.group(1)} (pid " in ready.body
        metrics = (await get(url + "/metrics")).body
        assert samples(metrics, "sepp_worker_process_restarts_total") == 1
        supervisor.proc.send_signal(signal.SIGTERM)
        assert await supervisor.exit_code() == 0, supervisor.text
    assert not alive(holder)
    assert_clean(supervisor.text)


async def test_sigterm_drains_every_child_and_exits_0(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    jobs = await enqueue(server.addr, queue, "hold", 3, data="2")
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2"]
    async with sepp_lite(*argv, "--http", "127.0.0.1:0") as supervisor:
        url = await supervisor.url()
        for job_id in jobs:
            await until(lambda job_id=job_id: marks(tmp_path, f"started-{job_id}-1-"), 60)
        pids = supervisor.note_children()
        supervisor.proc.send_signal(signal.SIGTERM)
        answer = await wait_for_status(url + "/readyz", 503, says="shutting down", timeout=5)
        assert answer.body.startswith("not ready: shutting down\nworker process 1 (pid ")
        assert await supervisor.exit_code() == 0, supervisor.text
    assert all(marks(tmp_path, f"done-{job_id}-1") for job_id in jobs)
    assert server.counts(queue) == (0, 0, 0, 0)  # acked before the children left
    # The signal is logged once, by the supervisor; each child logs its own drain.
    assert supervisor.text.count("SIGTERM") == 1
    assert "SIGTERM received: stopping the worker processes gracefully" in supervisor.text
    assert supervisor.text.count(" draining ") == 2 and supervisor.text.count(" stopped\n") == 2
    assert not any(alive(pid) for pid in pids)
    assert_clean(supervisor.text)


async def test_a_second_signal_stops_the_children_hard_and_exits_1(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    [job_id] = await enqueue(server.addr, queue, "hold", data="600")
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2"]
    async with sepp_lite(*argv) as supervisor:
        await until(lambda: marks(tmp_path, f"started-{job_id}-1-"), timeout=60)
        pids = supervisor.note_children()
        supervisor.proc.send_signal(signal.SIGTERM)
        await supervisor.line("SIGTERM received: stopping the worker processes gracefully")
        supervisor.proc.send_signal(signal.SIGINT)
        assert await supervisor.exit_code() == 1, supervisor.text
    assert supervisor.lines[-1].startswith("error: stopped hard by a second signal")
    assert not any(alive(pid) for pid in pids)
    assert not marks(tmp_path, f"done-{job_id}")
    # Its child cancelled the handler and handed the job back, long before its lease
    # (30 s) would have lapsed.
    assert server.counts(queue) == (1, 0, 0, 0), supervisor.text
    assert server.state.totals()["lease_expired"] == 0


async def test_children_of_a_killed_supervisor_shut_down_by_themselves(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    [job_id] = await enqueue(server.addr, queue, "hold", data="1")
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2"]
    async with sepp_lite(*argv) as supervisor:
        await until(lambda: marks(tmp_path, f"started-{job_id}-1-"), timeout=60)
        pids = supervisor.note_children()
        supervisor.proc.kill()
        await supervisor.exit_code()
        # Their status pipe broke: each drains (the job finishes) and exits.
        await until(lambda: not any(alive(pid) for pid in pids), timeout=30)
    assert marks(tmp_path, f"done-{job_id}-1")
    assert server.counts(queue) == (0, 0, 0, 0)
    assert supervisor.text.count("the supervisor is gone: shutting down gracefully") == 2


async def test_a_child_that_keeps_dying_at_startup_makes_the_supervisor_give_up(
    server: SeppTestServer, tmp_path: Path
) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('misconfigured')\n")
    argv = ["worker", "broken:make_worker", "--app-dir", str(tmp_path), "--addr", server.addr]
    async with sepp_lite(*argv, "--processes", "2") as supervisor:
        assert await supervisor.exit_code(60) == 2, supervisor.text
    assert supervisor.text.count("error: cannot import 'broken'") >= 5
    assert supervisor.text.count("giving up") == 1  # the command's last line, only
    assert re.fullmatch(
        r"error: worker process \d exited 2 at start-up, 5 times in a row; "
        r"giving up \(its errors are above\)\n",
        supervisor.lines[-1],
    )
    assert "starting it again in 0.25 s" in supervisor.text
    assert "starting it again in 2 s" in supervisor.text  # the delay grew


async def test_single_process_endpoints_follow_the_server_and_a_blocked_loop(
    tmp_path: Path,
) -> None:
    queue = unique_queue()
    argv = [*app(tmp_path, queue), "--http", "127.0.0.1:0", "--max-loop-lag", "0.5"]
    async with RestartableServer() as server, sepp_lite(*argv, "--addr", server.addr) as worker:
        url = await worker.url()
        await wait_for_status(url + "/readyz", 200, says="is reserving")
        await server.crash()
        await wait_for_status(url + "/readyz", 503, says="reserve failing")
        await server.start()
        await wait_for_status(url + "/readyz", 200, says="is reserving")
        assert children_of(worker.proc.pid) == []  # no supervisor: one process
        await enqueue(server.addr, queue, "block", data="4")
        answer = await wait_for_status(url + "/livez", 503)
        assert answer.body.startswith("not live: the event loop is blocked: lag ")
        await wait_for_status(url + "/livez", 200)
        metrics = await metrics_once(
            url, lambda text: samples(text, "sepp_jobs_processed_total", queue=queue) == 1
        )
        assert samples(metrics, "sepp_jobs_processed_total", queue=queue, job_type="block") == 1
        worker.proc.send_signal(signal.SIGTERM)
        assert await worker.exit_code() == 0, worker.text
    assert_clean(worker.text)


async def test_supervisor_endpoints_follow_the_server_and_a_blocked_child(
    tmp_path: Path,
) -> None:
    queue = unique_queue()
    argv = [*app(tmp_path, queue), "--processes", "2", "--max-loop-lag", "0.5"]
    async with RestartableServer() as server:
        async with sepp_lite(*argv, "--addr", server.addr, "--http", "127.0.0.1:0") as supervisor:
            url = await supervisor.url()
            await wait_for_status(url + "/readyz", 200)
            await server.crash()
            answer = await wait_for_status(url + "/readyz", 503, says="reserve failing")
            assert answer.body.startswith("not ready\nworker process 1 (pid ")
            await server.start()
            await wait_for_status(url + "/readyz", 200)
            await enqueue(server.addr, queue, "block", data="4")
            answer = await wait_for_status(url + "/livez", 503)
            blocked = marks(tmp_path, "blocking-")[0].rsplit("-", 1)[1]
            assert answer.body.startswith("not live: 1 worker process(es) blocked (bound 0.5 s)")
            assert re.search(rf"\(pid {blocked}\): event loop lag \d+\.\d+ s", answer.body)
            await wait_for_status(url + "/livez", 200)
            supervisor.proc.send_signal(signal.SIGTERM)
            assert await supervisor.exit_code() == 0, supervisor.text
    assert_clean(supervisor.text)


BLOCK_PROMETHEUS = (
    "import sys; sys.modules['prometheus_client'] = None; "
    "from sepp_lite.cli import main; sys.exit(main())"
)


async def test_without_prometheus_client_metrics_says_what_to_install(
    server: SeppTestServer, tmp_path: Path
) -> None:
    queue = unique_queue()
    argv = [*app(tmp_path, queue), "--addr", server.addr, "--processes", "2"]
    python = [sys.executable, "-c", BLOCK_PROMETHEUS]
    async with sepp_lite(*argv, "--http", "127.0.0.1:0", python=python) as supervisor:
        url = await supervisor.url()
        answer = await get(url + "/metrics")
        assert answer.status == 501
        assert "pip install prometheus-client" in answer.body
        assert (await get(url + "/livez")).status == 200
        await wait_for_status(url + "/readyz", 200)
        supervisor.proc.send_signal(signal.SIGTERM)
        assert await supervisor.exit_code() == 0, supervisor.text
    assert "/metrics needs the prometheus-client package" in supervisor.text


def test_process_counts() -> None:
    assert process_count("3") == 3
    assert process_count("auto") == process_count("0") == available_cpus()
    if hasattr(os, "sched_getaffinity"):
        assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
    with pytest.raises(ValueError):
        process_count("-1")
    with pytest.raises(ValueError):
        process_count("many")


def test_a_cgroup_cpu_quota_caps_the_count(tmp_path: Path) -> None:
    """In a container the affinity shows the node's CPUs; the quota is what it gets."""
    own = tmp_path / "self-cgroup"
    own.write_text("0::/kubepods/pod1/c1\n")
    v2 = tmp_path / "v2"
    (v2 / "kubepods/pod1/c1").mkdir(parents=True)
    (v2 / "kubepods/pod1/c1/cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(str(v2), str(own)) == 1.5
    assert available_cpus(str(v2), str(own)) == min(2, available_cpus())
    (v2 / "kubepods/pod1/c1/cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(str(v2), str(own)) is None
    own.write_text("5:memory:/x\n4:cpu,cpuacct:/\n")
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu/cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu/cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(str(v1), str(own)) == 1.0
    assert available_cpus(str(v1), str(own)) == 1
    (v1 / "cpu/cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(str(v1), str(own)) is None
    assert cgroup_cpu_quota(str(tmp_path / "none"), str(tmp_path / "none")) is None


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--processes", "-1"], "must not be negative"),
        (["--processes", "many"], "expected a number of processes or auto"),
        (["--http", "9464"], "expected HOST:PORT"),
        (["--max-loop-lag", "0"], "--max-loop-lag"),
    ],
)
def test_usage_errors(option: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "tasks:make_worker", *option]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("on_pypy", [True, False])
def test_children_on_pypy_get_a_larger_gc_nursery_unless_one_is_set(
    monkeypatch: pytest.MonkeyPatch, on_pypy: bool
) -> None:
    assert _supervisor._PYPY == (sys.implementation.name == "pypy")
    monkeypatch.setattr(_supervisor, "_PYPY", on_pypy)
    monkeypatch.delenv("PYPY_GC_NURSERY", raising=False)
    env = _supervisor.Supervisor(["worker", "app:worker"], 1)._child_env()
    assert env.get("PYPY_GC_NURSERY") == ("4MB" if on_pypy else None)
    monkeypatch.setenv("PYPY_GC_NURSERY", "16MB")
    env = _supervisor.Supervisor(["worker", "app:worker"], 1)._child_env()
    assert env["PYPY_GC_NURSERY"] == "16MB"


@pytest.mark.skipif(sys.implementation.name != "pypy", reason="PyPy's own GC setting")
def test_pypy_takes_the_nursery_size_the_children_get() -> None:
    env = {**os.environ, "PYPY_GC_NURSERY": _supervisor.PYPY_NURSERY}
    code = "import gc; print(gc.get_stats().nursery_size)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "4.0MB", out
