"""``sepp-lite demo``: a mixed workload through a server and a Worker, with a summary.

By default the server is an embedded :class:`~sepp_lite.testing.SeppTestServer` with
dead-letter retention on, so dead-lettered jobs are counted by draining them; with
``--addr`` a real server is used (on queues with a unique suffix) and dead letters are
counted from the worker's nacks, which report whether the server dead-lettered the job.

The workload: orders (charges at high priority, shipments at low priority, a few
scheduled reports) and emails (sends, some webhooks). Some handlers fail once and are
retried (after a delay, or after raising a plain exception); bounced emails run out of
attempts; one handler dead-letters its jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Optional, cast

from sepp_lite.cli.common import EXIT_OK, EXIT_REFUSED, Commands, StatusLine, connect, int_in
from sepp_lite.client import SeppClient
from sepp_lite.errors import JobRejection
from sepp_lite.types import EnqueueAck, EnqueueRequest, JobCtx, Payload, RetryDirective
from sepp_lite.worker import HandlerError, Worker

__all__ = ["DemoResult", "Tally", "add_parser", "build_workload", "render_summary", "run_demo"]

_LEASE_S = 30.0
_MAX_IN_FLIGHT = 64
_DEADLINE_S = 120.0  # a run that has not settled every job by then is reported as failed
_RETENTION_MS = 3_600_000
_SCHEDULE_DELAY_S = (0.5, 1.0)
_FLAKY_SHARE = 0.04
# The producers send batches of this many jobs and stop while more than _BACKLOG jobs
# wait to be settled: a steady flow, as from a busy app, rather than one burst whose
# enqueue-to-ack times would only measure how long the burst takes to drain.
_PRODUCER_BATCH = 64
_BACKLOG = 4 * _MAX_IN_FLIGHT


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to ``commands``."""
    parser = commands.add_parser(
        "demo",
        parents=parents,
        help="run a mixed workload through an embedded server and a Worker",
        description="Start an embedded sepp server (or use --addr), enqueue a mixed "
        "workload on two queues, process it with a Worker and print a summary. SEPP_ADDR "
        "is ignored: the demo uses a real server only when --addr is given.",
    )
    parser.add_argument(
        "--jobs", type=int_in(10, 1_000_000), default=3000, metavar="N", help="default 3000"
    )
    parser.add_argument("--seed", type=int, default=1, help="workload random seed (default 1)")
    parser.set_defaults(handler=run_demo)


@dataclass
class Tally:
    """What happened so far, counted as the worker's acks and nacks succeed."""

    enqueued: int = 0
    rejected: int = 0
    acked: int = 0
    retried: int = 0
    dead: int = 0
    producing: bool = True
    last_settled: float = 0.0
    enqueued_at: dict[str, float] = field(default_factory=dict)
    acked_at: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def settled(self) -> int:
        """Jobs that reached an end: acked or dead-lettered."""
        return self.acked + self.dead

    @property
    def backlog(self) -> int:
        """Jobs enqueued and not settled yet."""
        return self.enqueued - self.settled

    def on_ack(self, job_id: str) -> None:
        """Record a successful ack."""
        self.last_settled = self.acked_at[job_id] = time.monotonic()
        self.acked += 1
        self._check()

    def on_nack(self, dead_lettered: bool) -> None:
        """Record a successful nack: dead-lettered, or to be retried."""
        if dead_lettered:
            self.last_settled = time.monotonic()
            self.dead += 1
            self._check()
        else:
            self.retried += 1

    def finish_producing(self) -> None:
        """Every job is enqueued; from now on the tally can be complete."""
        self.producing = False
        self._check()

    def _check(self) -> None:
        self.progress.set()
        if not self.producing and self.settled >= self.enqueued:
            self.done.set()


class _CountingClient(SeppClient):
    """A client that reports the worker's acks and nacks to a :class:`Tally`: the
    Worker settles every job through its client, and a nack's answer says whether the
    server dead-lettered the job."""

    tally: Optional[Tally] = None

    async def ack(self, ctx: JobCtx) -> None:
        await super().ack(ctx)
        if self.tally is not None:
            self.tally.on_ack(ctx.id)

    async def nack(
        self, ctx: JobCtx, retry: RetryDirective = RetryDirective.DEFAULT, reason: str = ""
    ) -> bool:
        dead = await super().nack(ctx, retry, reason)
        if self.tally is not None:
            self.tally.on_nack(dead)
        return dead


# -- the workload ---------------------------------------------------------------------


def _json(body: dict[str, Any]) -> Payload:
    return Payload(json.dumps(body, separators=(",", ":")).encode(), "application/json")


def _charge(i: int, rng: random.Random, queue: str, run_id: str) -> EnqueueRequest:
    body = {"order": i, "amount_cents": rng.randrange(500, 50_000)}
    body["flaky"] = rng.random() < _FLAKY_SHARE
    return EnqueueRequest(
        queue,
        "order.charge",
        payload=_json(body),
        priority=rng.randint(6, 9),
        idempotency_key=f"charge-{run_id}-{i}",
    )


def _ship(i: int, rng: random.Random, queue: str) -> EnqueueRequest:
    body = {"order": i, "carrier": rng.choice(["ups", "dhl", "post"])}
    return EnqueueRequest(queue, "order.ship", payload=_json(body), priority=rng.randint(0, 4))


def _email(i: int, rng: random.Random, queue: str, *, bounce: bool = False) -> EnqueueRequest:
    body: dict[str, Any] = {"to": f"user{i}@example.com"}
    body["template"] = rng.choice(["welcome", "receipt"])
    body["flaky"] = not bounce and rng.random() < _FLAKY_SHARE
    body["bounce"] = bounce
    return EnqueueRequest(
        queue,
        "email.send",
        payload=_json(body),
        priority=rng.randint(3, 6),
        max_attempts=3,
        custom={"tenant": rng.choice(["acme", "globex"]), "bulk": False},
    )


def _special(
    kind: str, i: int, rng: random.Random, queues: Sequence[str], now: datetime
) -> EnqueueRequest:
    orders, emails = queues
    if kind == "webhook":
        body = {"url": f"https://hooks.example.com/{i}", "event": "order.paid"}
        return EnqueueRequest(emails, "webhook.deliver", payload=_json(body), priority=5)
    if kind == "bounce":
        return _email(i, rng, emails, bounce=True)
    delay = rng.uniform(*_SCHEDULE_DELAY_S)
    return EnqueueRequest(
        orders,
        "report.render",
        payload=_json({"report": f"daily-{i}"}),
        scheduled_at=now + timedelta(seconds=delay),
    )


def build_workload(
    count: int, rng: random.Random, queues: Sequence[str], run_id: str, now: datetime
) -> list[EnqueueRequest]:
    """``count`` jobs on ``queues`` (orders, emails), shuffled: one webhook and one
    bounced email per thousand (at least one each), up to ten scheduled reports, and
    for the rest charges, shipments and emails (some of them flaky)."""
    rare = max(1, count // 1000)
    kinds = ["webhook"] * rare + ["bounce"] * rare + ["report"] * min(10, max(1, count // 300))
    jobs = [_special(kind, i, rng, queues, now) for i, kind in enumerate(kinds)]
    orders, emails = queues
    while len(jobs) < count:
        i, pick = len(jobs), rng.random()
        if pick < 0.3:
            jobs.append(_charge(i, rng, orders, run_id))
        elif pick < 0.6:
            jobs.append(_ship(i, rng, orders))
        else:
            jobs.append(_email(i, rng, emails))
    rng.shuffle(jobs)
    return jobs


def _body(payload: Optional[Payload]) -> dict[str, Any]:
    if payload is None:
        return {}
    body: dict[str, Any] = json.loads(payload.data)
    return body


def register_handlers(worker: Worker, rng: random.Random) -> None:
    """The demo's handlers: short simulated work, some failures, one dead-letterer."""

    async def work(upto: float) -> None:
        await asyncio.sleep(rng.uniform(0, upto))

    @worker.handler("order.charge")
    async def charge(payload: Optional[Payload], ctx: JobCtx) -> None:
        await work(0.002)
        if _body(payload).get("flaky") and ctx.attempt == 1:
            raise HandlerError.retry_after("card processor timed out", 0.05)

    @worker.handler("order.ship")
    async def ship(payload: Optional[Payload], ctx: JobCtx) -> None:
        await work(0.002)

    @worker.handler("email.send")
    async def send_email(payload: Optional[Payload], ctx: JobCtx) -> None:
        body = _body(payload)
        await work(0.002)
        if body.get("bounce"):
            raise HandlerError.retry("mailbox unavailable (550)")  # until attempts run out
        if body.get("flaky") and ctx.attempt == 1:
            raise ConnectionResetError("SMTP connection reset by peer")

    @worker.handler("report.render")
    async def render_report(payload: Optional[Payload], ctx: JobCtx) -> None:
        await work(0.01)

    @worker.handler("webhook.deliver")
    async def deliver_webhook(payload: Optional[Payload], ctx: JobCtx) -> None:
        await work(0.002)
        raise HandlerError.permanent("endpoint answered 410 Gone")


# -- running --------------------------------------------------------------------------


@dataclass
class DemoResult:
    """The figures of one run, for the summary."""

    where: str
    queues: Sequence[str]
    planned: int
    tally: Tally
    wall: float
    completed: bool
    drained: Optional[collections.Counter[str]] = None
    rejections: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def dead_lettered(self) -> int:
        """Dead letters drained from the embedded server, else counted from nacks."""
        return self.tally.dead if self.drained is None else sum(self.drained.values())

    @property
    def adds_up(self) -> bool:
        """Every enqueued job was acked or dead-lettered, and the counts agree."""
        tally = self.tally
        return (
            self.completed
            and tally.acked + self.dead_lettered == tally.enqueued
            and self.dead_lettered == tally.dead
        )

    def latencies_ms(self) -> list[float]:
        """Enqueue-to-ack times of the acked jobs, in ms, sorted."""
        sent, acked = self.tally.enqueued_at, self.tally.acked_at
        return sorted((acked[i] - sent[i]) * 1000 for i in acked if i in sent)


def percentile(values: Sequence[float], share: float) -> Optional[float]:
    """The nearest-rank percentile of sorted ``values`` (``share`` from 0 to 100)."""
    if not values:
        return None
    rank = max(1, math.ceil(share / 100 * len(values)))
    return values[rank - 1]


async def _wait_for_room(tally: Tally, running: asyncio.Future[None]) -> None:
    while tally.backlog > _BACKLOG and not running.done():
        tally.progress.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(tally.progress.wait(), 0.5)


async def _produce(
    client: SeppClient,
    jobs: list[EnqueueRequest],
    batch: int,
    result: DemoResult,
    running: asyncio.Future[None],
) -> None:
    tally = result.tally
    for start in range(0, len(jobs), batch):
        await _wait_for_room(tally, running)
        sent = time.monotonic()
        answers = await client.enqueue_batch(jobs[start : start + batch])
        for answer in answers:
            if isinstance(answer, EnqueueAck):
                tally.enqueued += 1
                tally.enqueued_at[answer.job_id] = sent
            else:
                tally.rejected += 1
                result.rejections[_rejection_name(answer)] += 1
    tally.finish_producing()


def _rejection_name(rejection: JobRejection) -> str:
    return f"{type(rejection).__name__}: {rejection.message}"


def _progress_text(tally: Tally, total: int, elapsed: float) -> str:
    rate = tally.settled / elapsed if elapsed > 0 else 0.0
    return (
        f"{tally.settled:,}/{total:,} settled  acked {tally.acked:,}  "
        f"retried {tally.retried:,}  dead-lettered {tally.dead:,}  "
        f"{rate:,.0f} jobs/s  {elapsed:.1f} s"
    )


async def _show_progress(tally: Tally, total: int, line: StatusLine, started: float) -> None:
    while line.enabled:
        line.show(_progress_text(tally, total, time.monotonic() - started))
        await asyncio.sleep(0.1)


async def _settled_or_failed(tally: Tally, running: asyncio.Future[None]) -> bool:
    waiter: asyncio.Future[Any] = asyncio.ensure_future(tally.done.wait())
    try:
        await asyncio.wait(
            {waiter, running}, timeout=_DEADLINE_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    return tally.done.is_set()


async def _drain_count(client: SeppClient, queues: Sequence[str]) -> collections.Counter[str]:
    causes: collections.Counter[str] = collections.Counter()
    for queue in queues:
        while True:
            records = await client.drain_dead_letters(queue, 256)
            if not records:
                break
            causes.update(record.cause.value.replace("_", " ") for record in records)
    return causes


async def _process(
    client: _CountingClient, jobs: list[EnqueueRequest], result: DemoResult, seed: int
) -> None:
    """Enqueue ``jobs`` while a Worker processes them; stop once all are settled."""
    info = await client.get_server_info()
    client.tally = tally = result.tally
    worker = Worker(
        client,
        result.queues,
        _LEASE_S,
        max_in_flight=_MAX_IN_FLIGHT,
        max_jobs=_MAX_IN_FLIGHT,
        shutdown_timeout=5.0,
    )
    register_handlers(worker, random.Random(seed + 1))
    line = StatusLine(sys.stderr)
    started = time.monotonic()
    running = asyncio.ensure_future(worker.run())
    ticker = asyncio.ensure_future(_show_progress(tally, result.planned, line, started))
    try:
        batch = max(1, min(_PRODUCER_BATCH, info.max_enqueue_batch))
        await _produce(client, jobs, batch, result, running)
        result.completed = await _settled_or_failed(tally, running)
    finally:
        worker.shutdown_handle().shutdown()
        ticker.cancel()
        outcome = (await asyncio.gather(running, ticker, return_exceptions=True))[0]
        line.close(keep=False)
    result.wall = (tally.last_settled or time.monotonic()) - started
    if isinstance(outcome, Exception):
        raise outcome


@contextlib.asynccontextmanager
async def _server(addr: Optional[str]) -> AsyncIterator[tuple[str, bool]]:
    """``(address, embedded)``: the given server, or an embedded one for the run."""
    if addr is not None:
        yield addr, False
        return
    from sepp_lite.testing import SeppTestServer

    async with SeppTestServer(dead_letter_retention_ms=_RETENTION_MS) as server:
        yield server.addr, True


async def run_demo(args: argparse.Namespace) -> int:
    """Run the demo ``args`` describe, print the summary; 0 when the numbers add up."""
    rng = random.Random(args.seed)
    run_id = uuid.uuid4().hex[:6]
    async with _server(args.addr) as (addr, embedded):
        queues = (
            ("orders", "emails") if embedded else (f"demo-orders-{run_id}", f"demo-emails-{run_id}")
        )
        where = f"embedded sepp server at {addr}" if embedded else f"sepp server at {addr}"
        jobs = build_workload(args.jobs, rng, queues, run_id, datetime.now(timezone.utc))
        result = DemoResult(where, queues, len(jobs), Tally(), 0.0, False)
        connected = await connect(args, addr=addr, client_class=_CountingClient)
        client = cast(_CountingClient, connected)
        try:
            await _process(client, jobs, result, args.seed)
            if embedded:
                result.drained = await _drain_count(client, queues)
        finally:
            await client.close()
    print("\n".join(render_summary(result)))
    if not result.adds_up:
        print(f"error: {_shortfall(result)}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


def _shortfall(result: DemoResult) -> str:
    tally = result.tally
    if not result.completed:
        return (
            f"only {tally.settled:,} of {tally.enqueued:,} jobs were settled "
            f"within {_DEADLINE_S:g} s"
        )
    return (
        f"the counts do not add up: {tally.acked:,} acked + {result.dead_lettered:,} "
        f"dead-lettered != {tally.enqueued:,} enqueued (nacks reported {tally.dead:,})"
    )


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def _dead_note(result: DemoResult) -> str:
    if result.drained is None:
        return "counted from the worker's nacks"
    return ", ".join(f"{n} {cause}" for cause, n in sorted(result.drained.items()))


def render_summary(result: DemoResult) -> list[str]:
    """The summary table, one string per line (ASCII only)."""
    tally = result.tally
    latencies = result.latencies_ms()
    rows = [("enqueued", f"{tally.enqueued:,}", "")]
    if tally.rejected:
        rows.append(("rejected", f"{tally.rejected:,}", "refused by the server"))
    rows += [
        ("acked", f"{tally.acked:,}", ""),
        ("retried", f"{tally.retried:,}", "nacks that put a job back"),
        ("dead-lettered", f"{result.dead_lettered:,}", _dead_note(result)),
        ("wall time", f"{result.wall:.2f} s", ""),
        ("jobs per second", f"{tally.settled / max(result.wall, 1e-9):,.0f}", ""),
        ("enqueue->ack p50", _ms(percentile(latencies, 50)), ""),
        ("enqueue->ack p99", _ms(percentile(latencies, 99)), ""),
    ]
    label_width = max(len(label) for label, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = [
        f"sepp-lite demo: {result.planned:,} jobs on queues {', '.join(result.queues)}",
        f"({result.where}; at most {_BACKLOG} jobs waiting at a time)",
        "",
    ]
    for label, value, note in rows:
        line = f"  {label:<{label_width}}  {value:>{value_width}}"
        lines.append(f"{line}   {note}" if note else line)
    lines += [f"  rejected: {n} x {reason}" for reason, n in result.rejections.most_common(5)]
    return lines
