"""``sepp-lite demo``: the workload it builds, and that its summary adds up, on the
embedded server (dead letters counted by draining) and on a given one (counted from
the worker's nacks)."""

from __future__ import annotations

import asyncio
import io
import random
import re
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timezone

import pytest

from sepp_lite import cli
from sepp_lite.cli import demo
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import free_port

pytestmark = pytest.mark.timeout(60)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def figures(summary: str) -> dict[str, float]:
    """The summary's rows as numbers: ``{"enqueued": 200.0, ...}``."""
    rows = {}
    for match in re.finditer(r"^  ([a-z>\-\d ]+?)\s{2,}([\d,.]+)", summary, re.MULTILINE):
        rows[match.group(1)] = float(match.group(2).replace(",", ""))
    return rows


async def run(*argv: str) -> int:
    return await asyncio.to_thread(cli.main, list(argv))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEPP_ADDR", raising=False)
    monkeypatch.delenv("SEPP_API_KEY", raising=False)


@pytest.fixture
async def plain_server() -> AsyncIterator[SeppTestServer]:
    async with SeppTestServer() as srv:  # no dead-letter retention, like many servers
        yield srv


def test_the_workload_mix() -> None:
    now = datetime.now(timezone.utc)
    jobs = demo.build_workload(3000, random.Random(1), ("orders", "emails"), "r", now)
    assert len(jobs) == 3000
    types = {job.job_type for job in jobs}
    assert types == {"order.charge", "order.ship", "email.send", "report.render", "webhook.deliver"}
    assert {job.queue for job in jobs} == {"orders", "emails"}
    assert sum(job.job_type == "webhook.deliver" for job in jobs) == 3
    scheduled = [job for job in jobs if job.scheduled_at is not None]
    assert len(scheduled) == 10 and all(job.scheduled_at > now for job in scheduled)
    assert all(job.job_type == "report.render" for job in scheduled)
    priorities = {job.priority.value for job in jobs if job.priority is not None}
    assert priorities == set(range(10))
    bounces = [job for job in jobs if job.payload and b'"bounce":true' in job.payload.data]
    assert len(bounces) == 3 and all(job.max_attempts == 3 for job in bounces)
    # The same seed gives the same workload.
    again = demo.build_workload(3000, random.Random(1), ("orders", "emails"), "r", now)
    assert [job.payload for job in again] == [job.payload for job in jobs]


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert demo.percentile(values, 50) == 50.0
    assert demo.percentile(values, 99) == 99.0
    assert demo.percentile([7.0], 99) == 7.0
    assert demo.percentile([], 50) is None


async def test_demo_on_the_embedded_server_adds_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert await run("demo", "--jobs", "300") == 0
    summary = capsys.readouterr().out
    assert "embedded sepp server" in summary
    rows = figures(summary)
    assert rows["enqueued"] == 300
    assert rows["acked"] + rows["dead-lettered"] == rows["enqueued"]
    # One webhook (rejected by its handler) and one bounced email (out of attempts).
    assert rows["dead-lettered"] == 2
    assert "1 attempts exhausted, 1 rejected" in summary
    assert rows["retried"] >= 2  # the bounced email's two failed attempts at least
    assert rows["jobs per second"] > 0 and rows["wall time"] > 0
    assert 0 < rows["enqueue->ack p50"] <= rows["enqueue->ack p99"]
    # The live progress line was drawn on the terminal, then erased.
    drawn = terminal.getvalue()
    assert "settled  acked" in drawn and "jobs/s" in drawn and drawn.endswith("\r\x1b[K")


async def test_demo_against_a_given_server_counts_dead_letters_from_nacks(
    plain_server: SeppTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run("demo", "--jobs", "100", "--addr", plain_server.addr) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # stderr is no terminal: no progress line
    summary = captured.out
    assert f"sepp server at {plain_server.addr}" in summary
    assert "counted from the worker's nacks" in summary
    rows = figures(summary)
    assert rows["acked"] + rows["dead-lettered"] == rows["enqueued"] == 100
    assert rows["dead-lettered"] == 2
    # It used fresh queues, and left nothing behind in them.
    queues = re.search(r"on queues (\S+), (\S+)", summary)
    assert queues is not None and queues.group(1).startswith("demo-orders-")
    for queue in queues.groups():
        counts = plain_server.counts(queue)
        assert (counts.ready, counts.scheduled, counts.in_flight) == (0, 0, 0)


async def test_demo_that_cannot_connect_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run("demo", "--jobs", "10", "--addr", f"127.0.0.1:{free_port()}") == 2
    assert capsys.readouterr().err.startswith("error: cannot connect")


async def test_tally_is_done_only_after_producing() -> None:
    tally = demo.Tally()
    tally.enqueued = 2
    tally.on_ack("a")
    tally.on_nack(True)
    assert not tally.done.is_set()  # the producer may still add jobs
    tally.finish_producing()
    assert tally.done.is_set() and tally.settled == 2 and tally.backlog == 0
    tally.on_nack(False)
    assert tally.retried == 1
