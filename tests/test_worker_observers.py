"""The Worker's public observer API (``sepp_lite.WorkerObserver``, ``add_observer``,
``remove_observer``) over real sockets against the in-process server: the events of a
run and of each job in order, lease extensions, removal while running, events nobody
overrides never called, an observer that raises, and the monitor's ``on_beat`` seam."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from typing import Any, Optional

import pytest

import sepp_lite as sepp
from sepp_lite import _observe, _otel
from sepp_lite.monitor import WorkerMonitor
from tests.client_helpers import unique_queue, until, worker_running

pytestmark = pytest.mark.timeout(60)


class Recorder(sepp.WorkerObserver):
    """Every event, as (name, job type or None, detail)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Optional[str], Any]] = []

    def of(self, job_type: str) -> list[tuple[str, Any]]:
        return [(name, detail) for name, jt, detail in self.events if jt == job_type]

    def run_started(self) -> None:
        self.events.append(("run_started", None, None))

    def run_finished(self, error: Optional[BaseException]) -> None:
        self.events.append(("run_finished", None, error))

    def reserve_completed(self, empty: bool) -> None:
        self.events.append(("reserve_completed", None, empty))

    def reserve_failed(self, error: BaseException) -> None:
        self.events.append(("reserve_failed", None, error))

    def job_started(self, ctx: sepp.JobCtx) -> None:
        self.events.append(("job_started", ctx.job_type, None))

    def job_handled(self, ctx: sepp.JobCtx, seconds: float) -> None:
        self.events.append(("job_handled", ctx.job_type, seconds >= 0))

    def job_acked(self, ctx: sepp.JobCtx) -> None:
        self.events.append(("job_acked", ctx.job_type, None))

    def job_nacked(self, ctx: sepp.JobCtx, dead_lettered: bool) -> None:
        self.events.append(("job_nacked", ctx.job_type, dead_lettered))

    def job_finished(self, ctx: sepp.JobCtx) -> None:
        self.events.append(("job_finished", ctx.job_type, None))

    def lease_extended(self, ctx: sepp.JobCtx, outcome: str) -> None:
        self.events.append(("lease_extended", ctx.job_type, outcome))


def test_the_protocol_is_public_and_every_event_is_a_noop() -> None:
    assert sepp.WorkerObserver is _observe.WorkerObserver
    public = [name for name in vars(sepp.WorkerObserver) if not name.startswith("_")]
    assert public == list(_observe.EVENTS)
    observer = sepp.WorkerObserver()
    assert observer.job_nacked(None, True) is None  # type: ignore[arg-type, func-returns-value]


def test_the_protocol_loads_on_first_use_without_the_worker() -> None:
    script = (
        "import sys, sepp_lite\n"
        "assert 'sepp_lite._observe' not in sys.modules\n"
        "assert sepp_lite.WorkerObserver.__module__ == 'sepp_lite._observe'\n"
        "assert 'sepp_lite.worker' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


async def test_an_observer_sees_the_run_and_each_job_in_order(client: sepp.SeppClient) -> None:
    queue = unique_queue()
    await client.enqueue_batch(
        [
            sepp.EnqueueRequest(queue, "ok"),
            sepp.EnqueueRequest(queue, "retry", max_attempts=2),
            sepp.EnqueueRequest(queue, "dead"),
        ]
    )
    worker = sepp.Worker(client, [queue], 30)
    recorder = Recorder()
    worker.add_observer(recorder)
    assert worker.observers[-1] is recorder

    @worker.handler("ok")
    async def ok(payload: Any, ctx: sepp.JobCtx) -> None:
        pass

    @worker.handler("retry")
    async def retry(payload: Any, ctx: sepp.JobCtx) -> None:
        if ctx.attempt == 1:
            raise sepp.HandlerError.retry_after("again", 0.05)

    @worker.handler("dead")
    async def dead(payload: Any, ctx: sepp.JobCtx) -> None:
        raise sepp.HandlerError.permanent("no")

    async def run_until_settled() -> None:
        while len([e for e in recorder.events if e[0] == "job_finished"]) < 4:
            await worker.run(until_idle=True)  # the retry comes back after its delay
            await asyncio.sleep(0.02)

    await asyncio.wait_for(run_until_settled(), 30)
    acked = [("job_started", None), ("job_handled", True), ("job_acked", None)]
    acked.append(("job_finished", None))
    assert recorder.of("ok") == acked
    assert recorder.of("dead") == [
        ("job_started", None),
        ("job_handled", True),
        ("job_nacked", True),
        ("job_finished", None),
    ]
    assert recorder.of("retry") == [
        ("job_started", None),
        ("job_handled", True),
        ("job_nacked", False),
        ("job_finished", None),
        *acked,
    ]
    assert recorder.events[0] == ("run_started", None, None)
    assert recorder.events[-1] == ("run_finished", None, None)
    assert ("reserve_completed", None, False) in recorder.events


async def test_lease_extensions_are_reported(client: sepp.SeppClient) -> None:
    queue = unique_queue()
    await client.enqueue(sepp.EnqueueRequest(queue, "slow"))
    worker = sepp.Worker(client, [queue], 30, auto_extend_interval=0.05)
    recorder = Recorder()
    worker.add_observer(recorder)

    @worker.handler("slow")
    async def slow(payload: Any, ctx: sepp.JobCtx) -> None:
        await until(lambda: ("lease_extended", "extended") in recorder.of("slow"))

    await asyncio.wait_for(worker.run(until_idle=True), 30)
    events = [name for name, _ in recorder.of("slow")]
    assert events[0] == "job_started" and events[-3:] == [
        "job_handled",
        "job_acked",
        "job_finished",
    ]
    assert "lease_extended" in events[1:-3]


async def test_an_observer_removed_while_running_hears_no_more(client: sepp.SeppClient) -> None:
    queue = unique_queue()
    await client.enqueue_batch(
        [
            sepp.EnqueueRequest(queue, "first", priority=9),
            sepp.EnqueueRequest(queue, "second", priority=0),
        ]
    )
    worker = sepp.Worker(client, [queue], 30, max_in_flight=1)
    recorder = Recorder()
    worker.add_observer(recorder)

    @worker.handler("first")
    async def first(payload: Any, ctx: sepp.JobCtx) -> None:
        worker.remove_observer(recorder)

    @worker.handler("second")
    async def second(payload: Any, ctx: sepp.JobCtx) -> None:
        pass

    await asyncio.wait_for(worker.run(until_idle=True), 30)
    assert [name for name, _ in recorder.of("first")] == ["job_started"]
    assert recorder.of("second") == []
    assert recorder not in worker.observers
    worker.remove_observer(recorder)  # not there: nothing happens


async def test_events_an_observer_does_not_override_are_never_called(
    client: sepp.SeppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fan-out skips the inherited no-ops: a worker pays only for the events its
    observers listen to."""
    called: list[str] = []
    for event in _observe.EVENTS:
        monkeypatch.setattr(
            sepp.WorkerObserver, event, lambda self, *args, _e=event: called.append(_e)
        )

    class AckCounter(sepp.WorkerObserver):
        def __init__(self) -> None:
            self.acked = 0

        def job_acked(self, ctx: sepp.JobCtx) -> None:
            self.acked += 1

    queue = unique_queue()
    await client.enqueue_batch([sepp.EnqueueRequest(queue, "t") for _ in range(3)])
    worker = sepp.Worker(client, [queue], 30)
    counter = AckCounter()
    worker.add_observer(counter)
    worker.handle("t", _noop)
    await asyncio.wait_for(worker.run(until_idle=True), 30)
    assert counter.acked == 3
    assert called == []


async def _noop(payload: Any, ctx: sepp.JobCtx) -> None:
    pass


async def test_an_observer_that_raises_is_logged_and_the_jobs_go_on(
    client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(sepp.WorkerObserver):
        def job_started(self, ctx: sepp.JobCtx) -> None:
            raise RuntimeError("observer bug")

        def job_acked(self, ctx: sepp.JobCtx) -> None:
            raise RuntimeError("observer bug")

    queue = unique_queue()
    await client.enqueue_batch([sepp.EnqueueRequest(queue, "t") for _ in range(2)])
    worker = sepp.Worker(client, [queue], 30)
    worker.add_observer(Broken())
    after = Recorder()
    worker.add_observer(after)  # later observers still hear the event
    worker.handle("t", _noop)
    caplog.set_level(logging.ERROR, logger="sepp_lite")
    await asyncio.wait_for(worker.run(until_idle=True), 30)
    assert [name for name, _ in after.of("t")].count("job_acked") == 2
    failures = [r for r in caplog.records if "worker observer" in r.getMessage()]
    assert len(failures) == 4 and all(r.exc_info for r in failures)
    info = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0.05))
    assert info is None  # both jobs were acked


async def test_otel_instruments_are_the_default_observer(
    client: sepp.SeppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = sepp.Worker(client, [unique_queue()], 30)
    if _otel.AVAILABLE:
        [default] = worker.observers
        assert isinstance(default, sepp.WorkerObserver)
        assert type(default).__name__ == "OTelWorkerMetrics"
    else:
        assert worker.observers == ()
    monkeypatch.setattr(_otel, "AVAILABLE", False)
    assert sepp.Worker(client, [unique_queue()], 30).observers == ()


async def test_the_monitor_calls_on_beat_with_itself(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(client, [unique_queue()], 30, wait_timeout=0.1)
    beats: list[WorkerMonitor] = []
    monitor = WorkerMonitor(worker, metrics=False, on_beat=beats.append)
    async with monitor:
        assert monitor in worker.observers
        async with worker_running(worker, 10):
            await until(lambda: len(beats) >= 2 and monitor.readiness().ok, timeout=20)
    assert set(map(id, beats)) == {id(monitor)}
    assert monitor not in worker.observers
