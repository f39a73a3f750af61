"""sepp_lite.tasks end to end on the in-process server over real sockets: what a typed
producer puts on the wire, what a tasks worker does with each kind of job (fitting,
unfitting, slow, failing, unknown), the per-task options, the sync producer, the
lifecycle hooks and middleware, OpenTelemetry and the Worker's metrics under tasks."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Optional, TypedDict

import pytest

import sepp_lite as sepp
from sepp_lite import DeadLetterCause, EnqueueAck, JobCtx, Payload, ReserveOptions
from sepp_lite.errors import PayloadTooLarge
from sepp_lite.sync import SeppClient as SyncSeppClient
from sepp_lite.tasks import Backoff, BytesCodec, InputError, Tasks, TaskWorker
from sepp_lite.testing import ManualClock, SeppServerThread, SeppTestServer, run_until_drained
from tests.client_helpers import unique_queue, worker_running

pytestmark = pytest.mark.timeout(60)


class Plan(enum.Enum):
    FREE = "free"
    PRO = "pro"


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class Order:
    id: uuid.UUID
    items: list[Item]
    placed: datetime
    ship_on: date
    total: Decimal
    plan: Plan = Plan.FREE
    note: Optional[str] = None
    tags: dict[str, int] = field(default_factory=dict)


@dataclass
class Welcome:
    to: str
    name: str = ""


class Invoice(TypedDict):
    number: int
    lines: list[str]


def an_order() -> Order:
    return Order(
        id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        items=[Item("a", 1), Item("b", 2)],
        placed=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        ship_on=date(2030, 1, 3),
        total=Decimal("12.50"),
        plan=Plan.PRO,
        tags={"x": 1},
    )


async def reserve_one(client: sepp.SeppClient, queue: str) -> sepp.Job:
    jobs = await client.reserve(ReserveOptions([queue], timedelta(seconds=30), timedelta(0)))
    assert jobs is not None and len(jobs) == 1
    return jobs[0]


async def dead_letters(client: sepp.SeppClient, queue: str) -> list[sepp.DeadLetterRecord]:
    return await client.drain_dead_letters(queue, 100)


@pytest.fixture
async def clocked() -> AsyncIterator[SeppTestServer]:
    """A server on a manual clock: retry delays pass as run_until_drained jumps."""
    async with SeppTestServer(clock=ManualClock(), dead_letter_retention_ms=600_000) as srv:
        yield srv


# -- the input on the wire -----------------------------------------------------------


async def test_each_input_type_has_its_codec_on_the_wire(client: sepp.SeppClient) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def raw(data: bytes) -> None: ...

    @tasks.task
    async def text(line: str) -> None: ...

    @tasks.task
    async def order(o: Order) -> None: ...

    @tasks.task
    async def invoice(i: Invoice) -> None: ...

    @tasks.task
    async def count(n: int) -> None: ...

    await raw.enqueue(client, b"\x00\xff")
    await text.enqueue(client, "h\u00e9")
    await order.enqueue(client, an_order())
    await invoice.enqueue(client, {"number": 7, "lines": ["a"]})
    await count.enqueue(client, 3)
    jobs = [await reserve_one(client, queue) for _ in range(5)]
    got = {job.ctx.job_type: job.payload for job in jobs}
    assert [got[name] for name in ("raw", "text", "order", "invoice", "count")] == [
        Payload(b"\x00\xff", "application/octet-stream"),
        Payload("h\u00e9".encode(), "text/plain"),
        Payload(
            b'{"id":"12345678-1234-5678-1234-567812345678","items":[{"sku":"a","qty":1},'
            b'{"sku":"b","qty":2}],"placed":"2030-01-02T03:04:05+00:00","ship_on":"2030-01-03",'
            b'"total":"12.50","plan":"pro","note":null,"tags":{"x":1}}',
            "application/json",
        ),
        Payload(b'{"number":7,"lines":["a"]}', "application/json"),
        Payload(b"3", "application/json"),
    ]


async def test_every_kind_of_input_arrives_as_the_value_that_was_sent(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    seen: dict[str, Any] = {}

    @tasks.task
    async def raw(data: bytes) -> None:
        seen["raw"] = data

    @tasks.task
    async def empty(data: bytes) -> None:
        seen["empty"] = data

    @tasks.task
    async def text(line: str, ctx: JobCtx) -> None:
        seen["text"] = (line, ctx.job_type)

    @tasks.task
    async def order(o: Order) -> None:
        seen["order"] = o

    @tasks.task
    async def invoice(i: Invoice) -> None:
        seen["invoice"] = i

    @tasks.task
    async def maybe(n: Optional[int]) -> None:
        seen["maybe"] = n

    await raw.enqueue(client, b"\x01")
    await empty.enqueue(client, b"")  # no payload on the wire: the server wants data
    await text.enqueue(client, "hi")
    await order.enqueue(client, an_order())
    await invoice.enqueue(client, {"number": 7, "lines": ["a"]})
    await maybe.enqueue(client, None)
    await run_until_drained(tasks.worker(client), server)
    assert seen == {
        "raw": b"\x01",
        "empty": b"",
        "text": ("hi", "text"),
        "order": an_order(),
        "invoice": {"number": 7, "lines": ["a"]},
        "maybe": None,
    }


# -- an input that does not fit --------------------------------------------------------


async def test_a_payload_that_does_not_fit_is_dead_lettered_at_once_naming_the_field(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, max_attempts=5)
    ran: list[Order] = []

    @tasks.task
    async def ship(order: Order, ctx: JobCtx) -> None:
        ran.append(order)

    bad = json.loads(ship.codec.encode(an_order()))
    bad["items"][1]["qty"] = "2"
    await client.enqueue(
        sepp.EnqueueRequest(
            queue, "ship", Payload(json.dumps(bad).encode(), "application/json"), max_attempts=5
        )
    )
    await client.enqueue(
        sepp.EnqueueRequest(queue, "ship", Payload(b"{oops", "text/plain"), max_attempts=5)
    )
    await run_until_drained(tasks.worker(client), server)
    assert ran == []
    records = await dead_letters(client, queue)
    assert [(r.final_attempt, r.cause) for r in records] == [(1, DeadLetterCause.REJECTED)] * 2
    assert sorted(r.last_reason or "" for r in records) == [
        "payload does not fit Order: order.items[1].qty: expected int, got str",
        "payload does not fit Order: order: not valid JSON: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1) (payload encoding 'text/plain', "
        "expected 'application/json')",
    ]


async def test_a_producer_cannot_send_an_input_that_does_not_fit(client: sepp.SeppClient) -> None:
    tasks = Tasks(queue=unique_queue())

    @tasks.task
    async def ship(order: Order) -> None: ...

    broken = an_order()
    broken.items[1].qty = "2"  # type: ignore[assignment]
    with pytest.raises(InputError, match=r"^ship: order\.items\[1\]\.qty: expected int, got str$"):
        await ship.enqueue(client, broken)
    with pytest.raises(InputError, match=r"^ship: order: expected Order, got str$"):
        await ship.enqueue(client, "oops")  # type: ignore[arg-type]


# -- per-task options -------------------------------------------------------------------


async def test_options_come_from_the_task_then_the_registry(client: sepp.SeppClient) -> None:
    emails, urgent = unique_queue(), unique_queue()
    tasks = Tasks(queue=emails, priority=2, max_attempts=4)

    @tasks.task
    async def send_welcome(msg: Welcome) -> None: ...

    @tasks.task(job_type="page", queue=urgent, priority=9, max_attempts=7)
    async def send_page(msg: Welcome) -> None: ...

    assert tasks.job_types == ["send_welcome", "page"] and tasks.queues == [emails, urgent]
    await send_welcome.enqueue(client, Welcome("a@x"))
    await send_page.enqueue(client, Welcome("b@x"))
    await send_page.enqueue(client, Welcome("c@x"), priority=3, max_attempts=1)
    first = (await reserve_one(client, emails)).ctx
    assert (first.job_type, first.priority.value, first.max_attempts) == ("send_welcome", 2, 4)
    second, third = (await reserve_one(client, urgent)).ctx, (await reserve_one(client, urgent)).ctx
    assert (second.job_type, second.priority.value, second.max_attempts) == ("page", 9, 7)
    assert (third.priority.value, third.max_attempts) == (3, 1)


async def test_the_idempotency_key_function_deduplicates(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    tasks = Tasks(queue=unique_queue())

    @tasks.task(idempotency_key=lambda msg: f"welcome:{msg.to}")
    async def send_welcome(msg: Welcome) -> None: ...

    first = await send_welcome.enqueue(client, Welcome("ada@example.com"))
    again = await send_welcome.enqueue(client, Welcome("ada@example.com", name="Ada"))
    other = await send_welcome.enqueue(client, Welcome("bob@example.com"))
    assert (first.deduplicated, again.deduplicated, other.deduplicated) == (False, True, False)
    assert again.job_id == first.job_id != other.job_id
    explicit = await send_welcome.enqueue(client, Welcome("ada@example.com"), idempotency_key="k")
    assert not explicit.deduplicated


@pytest.mark.parametrize("delay", [90, 90.0, timedelta(seconds=90)])
async def test_delay_and_scheduled_at(
    server: SeppTestServer, client: sepp.SeppClient, delay: Any
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def later(msg: Welcome) -> None: ...

    before = datetime.now(timezone.utc)
    ack = await later.enqueue(client, Welcome("a"), delay=delay)
    at = datetime(2031, 1, 1, tzinfo=timezone.utc)
    fixed = await later.enqueue(client, Welcome("b"), scheduled_at=before + timedelta(days=1))
    assert server.counts(queue).scheduled == 2 and server.counts(queue).ready == 0
    due = server.state.job(ack.job_id).due_ms  # type: ignore[union-attr]
    assert due is not None
    expected = (before + timedelta(seconds=90)).timestamp() * 1000
    assert expected - 1 <= due <= expected + 5000
    due_fixed = server.state.job(fixed.job_id).due_ms  # type: ignore[union-attr]
    assert due_fixed == int((before + timedelta(days=1)).timestamp() * 1000)
    with pytest.raises(ValueError, match="delay or scheduled_at"):
        later.request(Welcome("c"), delay=1, scheduled_at=at)


async def test_a_timed_out_handler_is_cancelled_retried_then_dead_lettered(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    attempts: list[int] = []
    cancelled: list[int] = []

    @tasks.task(timeout=0.05, max_attempts=2)
    async def stuck(msg: Welcome, ctx: JobCtx) -> None:
        attempts.append(ctx.attempt)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise

    await stuck.enqueue(client, Welcome("a"))
    await run_until_drained(tasks.worker(client), server)
    assert attempts == cancelled == [1, 2]
    [record] = await dead_letters(client, queue)
    assert record.cause == DeadLetterCause.ATTEMPTS_EXHAUSTED and record.final_attempt == 2
    assert record.last_reason == "timed out after 0.05 s on its last attempt (2)"


async def test_a_handler_that_swallows_the_cancellation_still_times_out(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task(timeout=0.05, max_attempts=1)
    async def stubborn(msg: Welcome) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # carries on regardless: the attempt is still over its limit

    ack = await stubborn.enqueue(client, Welcome("a"))
    await run_until_drained(tasks.worker(client), server)
    [record] = await dead_letters(client, queue)
    assert record.job_id == ack.job_id
    assert record.last_reason == "timed out after 0.05 s on its last attempt (1)"


async def test_a_fast_handler_under_a_time_limit_is_acked(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, timeout=timedelta(seconds=0.2))
    done: list[str] = []

    @tasks.task
    async def quick(msg: Welcome) -> None:
        done.append(msg.to)

    await quick.enqueue_many(client, [Welcome(str(i)) for i in range(20)])
    await run_until_drained(tasks.worker(client), server)
    await asyncio.sleep(0.3)  # past the limit: a timer left behind would cancel something
    assert sorted(done, key=int) == [str(i) for i in range(20)]
    assert server.counts(queue).ready == 0 and await dead_letters(client, queue) == []


async def test_retry_backoff_sets_the_nack_delay_from_the_attempt(clocked: SeppTestServer) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, max_attempts=3)
    times: list[int] = []

    @tasks.task(retry=Backoff(initial=100, multiplier=3, max=250))
    async def flaky(msg: Welcome, ctx: JobCtx) -> None:
        times.append(clocked.clock.now_ms())
        raise RuntimeError("provider down")

    async with await sepp.SeppClient.connect(clocked.addr) as client:
        await flaky.enqueue(client, Welcome("a"))
        await run_until_drained(tasks.worker(client), clocked)
        [record] = await dead_letters(client, queue)
    first, second = times[1] - times[0], times[2] - times[1]
    assert 50_000 <= first <= 100_000  # 100 s with jitter in [0.5, 1)
    assert 125_000 <= second <= 250_000  # 300 s capped at 250, with jitter
    assert record.final_attempt == 3
    assert record.last_reason == "handler raised RuntimeError: provider down"


async def test_retry_as_a_function_of_the_attempt(clocked: SeppTestServer) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, retry=lambda attempt: timedelta(seconds=7 * attempt))
    times: list[int] = []

    @tasks.task(max_attempts=3)
    async def flaky(msg: Welcome) -> None:
        times.append(clocked.clock.now_ms())
        if len(times) < 3:
            raise RuntimeError("not yet")

    async with await sepp.SeppClient.connect(clocked.addr) as client:
        await flaky.enqueue(client, Welcome("a"))
        await run_until_drained(tasks.worker(client), clocked)
    assert [later - earlier for earlier, later in zip(times, times[1:])] == [7000, 14000]


async def test_handler_errors_pass_through_unchanged(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, retry=Backoff(initial=3600), timeout=10)

    @tasks.task(max_attempts=5)
    async def refuse(msg: Welcome) -> None:
        raise sepp.HandlerError.permanent(f"no such address: {msg.to}")

    await refuse.enqueue(client, Welcome("nobody"))
    await run_until_drained(tasks.worker(client), server)
    [record] = await dead_letters(client, queue)
    assert (record.final_attempt, record.last_reason) == (1, "no such address: nobody")


def test_registration_refuses_what_cannot_be_a_task() -> None:
    tasks = Tasks(queue="q")

    def generator(msg: Welcome) -> Iterator[None]:
        yield

    def blocking(msg: Welcome) -> None: ...

    async def unannotated(msg) -> None:  # type: ignore[no-untyped-def]
        ...

    async def three(a: int, b: JobCtx, c: int) -> None: ...

    async def opaque(o: Opaque) -> None: ...

    with pytest.raises(TypeError, match="not a generator"):
        tasks.task(generator)
    with pytest.raises(TypeError, match="timeout= needs an async def"):
        tasks.task(timeout=5)(blocking)
    with pytest.raises(TypeError, match="annotate the input 'msg'"):
        tasks.task(unannotated)
    with pytest.raises(TypeError, match="parameter .c. is a third parameter"):
        tasks.task(three)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="Opaque cannot be carried as JSON"):
        tasks.task(opaque)
    with pytest.raises(TypeError, match="no queue"):
        Tasks().task(unannotated_ok)
    with pytest.raises(ValueError, match="timeout"):
        tasks.task(timeout=-1)(unannotated_ok)
    with pytest.raises(ValueError, match="multiplier"):
        Backoff(multiplier=0.5)
    tasks.task(unannotated_ok)
    with pytest.raises(sepp.DuplicateHandlerError):
        tasks.task(unannotated_ok)
    with pytest.raises(ValueError, match="no task uses queue"):
        tasks.worker(None, queues=["elsewhere"])  # type: ignore[arg-type]


async def unannotated_ok(msg: int) -> None: ...


class Opaque: ...


# -- producers ---------------------------------------------------------------------------


def test_the_sync_client_enqueues_one_and_many() -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def send_welcome(msg: Welcome) -> None: ...

    with SeppServerThread() as server, SyncSeppClient.connect(server.addr) as client:
        ack = send_welcome.enqueue(client, Welcome("ada@example.com"))
        assert isinstance(ack, EnqueueAck)
        results = send_welcome.enqueue_many(client, [Welcome("a"), Welcome("b")])
        assert [type(r) for r in results] == [EnqueueAck, EnqueueAck]
        assert server.counts(queue).ready == 3


async def test_enqueue_many_is_one_batch_whose_rejections_are_values() -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def blob(data: bytes) -> None: ...

    async with SeppTestServer(max_payload_bytes=100) as server:
        calls: list[str] = []

        async def count() -> None:
            calls.append("EnqueueBatch")

        server.before_call("EnqueueBatch", count)
        async with await sepp.SeppClient.connect(server.addr) as client:
            results = await blob.enqueue_many(client, [b"small", b"x" * 500, b"fine"])
    assert calls == ["EnqueueBatch"]
    assert isinstance(results[0], EnqueueAck) and isinstance(results[2], EnqueueAck)
    assert isinstance(results[1], PayloadTooLarge)


# -- lifecycle and middleware -------------------------------------------------------------


async def test_hooks_lifespan_and_middleware_around_every_call(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    events: list[str] = []

    @tasks.on_startup
    async def open_pool(state: Any) -> None:
        events.append("startup")
        state.pool = ["conn"]

    @tasks.on_shutdown
    async def close_pool(state: Any) -> None:
        events.append(f"shutdown {state.pool}")

    @tasks.lifespan
    @asynccontextmanager
    async def lifespan(state: Any) -> AsyncIterator[None]:
        events.append("enter")
        state.cache = {}
        yield
        events.append("exit")

    @tasks.middleware
    async def outer(call_next: Any, value: Any, ctx: JobCtx) -> Any:
        events.append(f"outer {ctx.job_type} {value.to}")
        try:
            return await call_next(value, ctx)
        finally:
            events.append("outer done")

    @tasks.middleware
    async def inner(call_next: Any, value: Any, ctx: JobCtx) -> Any:
        events.append("inner")
        return await call_next(Welcome(value.to.upper()), ctx)  # may change the input

    @tasks.task
    async def send_welcome(msg: Welcome) -> None:
        events.append(f"task {msg.to} {tasks.state.pool} {tasks.state.cache}")

    await send_welcome.enqueue(client, Welcome("ada"))
    await run_until_drained(tasks.worker(client), server)
    assert events == [
        "startup",
        "enter",
        "outer send_welcome ada",
        "inner",
        "task ADA ['conn'] {}",
        "outer done",
        "exit",
        "shutdown ['conn']",
    ]


async def test_a_failing_startup_hook_stops_the_worker_before_it_reserves(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    closed: list[str] = []

    @tasks.on_shutdown
    async def close(state: Any) -> None:
        closed.append("closed")

    @tasks.on_startup
    async def broken(state: Any) -> None:
        raise ConnectionError("database unreachable")

    @tasks.task
    async def work(msg: Welcome) -> None: ...

    await work.enqueue(client, Welcome("a"))
    with pytest.raises(ConnectionError):
        await tasks.worker(client).run()
    assert closed == ["closed"] and server.counts(queue).ready == 1


# -- what a tasks worker is --------------------------------------------------------------


async def test_unknown_job_types_are_handed_back_to_wait_and_the_start_line_lists_types(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def known(msg: Welcome) -> None: ...

    stranger = await client.enqueue(sepp.EnqueueRequest(queue, "stranger"))
    await known.enqueue(client, Welcome("a"))
    worker = tasks.worker(client, unknown_type_delay=120)  # a Worker option
    assert isinstance(worker, sepp.Worker) and isinstance(worker, TaskWorker)
    with caplog.at_level(logging.INFO, logger="sepp_lite"):
        await worker.run(until_idle=True)
    view = server.state.job(stranger.job_id)
    assert view is not None and view.state == "scheduled" and view.attempt == 2
    assert view.due_ms is not None and 100_000 < view.due_ms - server.clock.now_ms() <= 120_000
    assert server.counts(queue).ready == 0
    messages = [record.getMessage() for record in caplog.records]
    start = f"worker {worker.worker_id} started: queues={queue} job types=known max_in_flight=16 "
    [line] = [m for m in messages if "job types" in m]  # one start line, the Worker's
    assert line.startswith(start)
    assert any(
        m.startswith(
            f"no handler for job type 'stranger' on queue {queue!r} (this worker handles: known)"
        )
        and "goes back to wait 120 s" in m
        for m in messages
    )


async def test_the_worker_metrics_count_tasks_and_unknown_types(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    pytest.importorskip("prometheus_client")
    from sepp_lite.monitor import serve_endpoints
    from tests.http_helpers import get

    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def counted(msg: Welcome) -> None: ...

    await counted.enqueue_many(client, [Welcome("a"), Welcome("b")])
    await client.enqueue(sepp.EnqueueRequest(queue, "nobody_handles_me"))
    worker = tasks.worker(client)
    async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
        await worker.run(until_idle=True)
        body = (await get(endpoints.url + "/metrics")).body
    started = f'sepp_jobs_started_total{{job_type="nobody_handles_me",queue="{queue}"}} 1.0'
    processed = f'sepp_jobs_processed_total{{job_type="counted",queue="{queue}"}} 2.0'
    assert started in body and processed in body


async def test_custom_codecs_per_task_and_per_registry(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()

    class Upper:
        encoding = "text/x-upper"

        def encode(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def decode(self, data: bytes) -> str:
            if not data.isupper():
                raise ValueError("not upper case")
            return data.decode().lower()

    def by_type(tp: Any) -> Any:
        return Upper() if tp is str else None  # None: the built-in choice

    tasks = Tasks(queue=queue, codec=by_type)
    seen: list[Any] = []

    @tasks.task
    async def shout(word: str) -> None:
        seen.append(word)

    @tasks.task
    async def number(n: int) -> None:
        seen.append(n)

    @tasks.task(codec=BytesCodec())
    async def raw(data: Any) -> None:
        seen.append(data)

    await shout.enqueue(client, "hey")
    await number.enqueue(client, 5)
    await raw.enqueue(client, b"\x00")
    await client.enqueue(sepp.EnqueueRequest(queue, "shout", Payload(b"quiet", "text/x-upper")))
    assert shout.codec.encoding == "text/x-upper" and number.codec.encoding == "application/json"
    await run_until_drained(tasks.worker(client), server)
    assert sorted(map(repr, seen)) == ["'hey'", "5", "b'\\x00'"]
    [record] = await dead_letters(client, queue)
    assert record.last_reason == "payload does not fit str: word: not upper case"


async def test_calling_a_task_calls_its_function() -> None:
    tasks = Tasks(queue="q")
    seen: list[Any] = []

    @tasks.task
    async def with_ctx(msg: Welcome, ctx: Optional[JobCtx]) -> str:
        seen.append((msg, ctx))
        return "result"

    @tasks.task
    async def without(msg: Welcome) -> None:
        seen.append(msg)

    assert await with_ctx(Welcome("a")) == "result"
    await without(Welcome("b"))
    assert seen == [(Welcome("a"), None), Welcome("b")]
    assert with_ctx.__name__ == "with_ctx" and "with_ctx" in repr(with_ctx)


@pytest.mark.otel
async def test_opentelemetry_spans_under_tasks(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from tests.otel_helpers import telemetry

    queue = unique_queue()
    tasks = Tasks(queue=queue)

    @tasks.task
    async def traced(msg: Welcome) -> None: ...

    with telemetry().capture() as otel:
        await traced.enqueue(client, Welcome("a"))
        await run_until_drained(tasks.worker(client), server)
        process = otel.span("sepp.process")
        enqueue = otel.span("sepp.enqueue")
    assert process.links and process.links[0].context.trace_id == enqueue.context.trace_id


async def test_the_workers_own_cancellations_are_not_taken_for_timeouts(
    server: SeppTestServer, client: sepp.SeppClient, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue, timeout=60)
    started = asyncio.Event()
    cancelled: list[str] = []

    @tasks.task
    async def slow(msg: Welcome) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(msg.to)
            raise

    # A bounded shutdown gives up on the handler: its job is handed back (ready again),
    # not nacked for a timeout.
    first = await slow.enqueue(client, Welcome("drained"))
    worker = tasks.worker(client, shutdown_timeout=0.05)
    async with worker_running(worker, 10):
        await asyncio.wait_for(started.wait(), 10)
    options = sepp.ReserveOptions([queue], 30, wait_timeout=1)
    [again] = await client.reserve(options) or []
    assert (again.ctx.id, again.ctx.attempt) == (first.job_id, 2)
    await client.ack(again.ctx)

    # A hard stop (run() cancelled) propagates the cancellation and hands the job back.
    started.clear()
    second = await slow.enqueue(client, Welcome("stopped"))
    run = asyncio.ensure_future(tasks.worker(client).run())
    await asyncio.wait_for(started.wait(), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    view = server.state.job(second.job_id)
    assert view is not None and view.state == "ready" and view.attempt == 2
    assert cancelled == ["drained", "stopped"]
    assert await dead_letters(client, queue) == []
    assert not [r for r in caplog.records if "timed out after" in r.getMessage()]


def test_a_timeout_longer_than_the_lease_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    tasks = Tasks(queue="q")

    @tasks.task(timeout=120)
    async def long(msg: Welcome) -> None: ...

    with caplog.at_level(logging.WARNING, logger="sepp_lite"):
        tasks.worker(None, lease_duration=30)  # type: ignore[arg-type]
        tasks.worker(None, lease_duration=30, auto_extend=True)  # type: ignore[arg-type]
        tasks.worker(None, lease_duration=180)  # type: ignore[arg-type]
    assert [record.getMessage() for record in caplog.records] == [
        "task long: its timeout (120 s) is longer than the lease (30 s) and auto_extend is "
        "off: a job still running when its lease expires is delivered again"
    ]


def test_import_sepp_lite_loads_tasks_only_on_first_use() -> None:
    import subprocess
    import sys

    script = (
        "import sys, sepp_lite\n"
        "assert 'sepp_lite.tasks' not in sys.modules\n"
        "assert sepp_lite.Tasks.__module__ == 'sepp_lite.tasks._registry'\n"
        "assert sepp_lite.Task.__module__ == 'sepp_lite.tasks._task'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
