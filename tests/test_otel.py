"""OpenTelemetry with the SDK installed: client spans (one per logical call, over all
retries), trace context injected into jobs and sent as RPC metadata, the worker's
``sepp.process`` consumer span and its link to the producer, worker metrics, and the
TraceContext helpers. Real sockets to the in-process server or the scripted server.

The whole module is skipped where opentelemetry-sdk is not installed (the `.[test]`
CI run); tests/test_otel_noop.py covers that case.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Optional

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the test-otel extra)")

from grpclib.exceptions import GRPCError
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import Sum
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode, TraceFlags

from sepp_lite import (
    EnqueueAck,
    EnqueueRequest,
    HandlerError,
    JsonLogFormatter,
    Payload,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    SeppClient,
    SeppError,
    TraceContext,
    Worker,
    _log,
    _otel,
)
from sepp_lite._codec.enqueue import decode_enqueue_batch_request
from sepp_lite.errors import Status
from tests.client_helpers import (
    ScriptedServer,
    connected,
    hand_ctx,
    job_record,
    reserve_reply,
    status_errors,
    unique_queue,
)
from tests.otel_helpers import (
    Telemetry,
    children,
    delta,
    ids,
    key,
    link_targets,
    parent_id,
    telemetry,
    traceparent_of,
)

pytestmark = pytest.mark.timeout(30)

REMOTE_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
REMOTE_SPAN = "00f067aa0ba902b7"
REMOTE = f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01"
OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)
API_KEY = "sk-otel-secret-7f3a9c"


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    """The process-wide SDK providers, capturing this test's spans."""
    assert _otel.AVAILABLE
    with telemetry().capture() as state:
        yield state


def reserve_opts(queue: str, *, max_jobs: int = 10, worker_id: str = "w-otel") -> ReserveOptions:
    return ReserveOptions([queue], timedelta(seconds=30), timedelta(0), worker_id, max_jobs)


def status(span: ReadableSpan) -> tuple[StatusCode, Optional[str]]:
    return span.status.status_code, span.status.description


def events(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    return [(event.name, dict(event.attributes or {})) for event in span.events]


async def run_idle(worker: Worker) -> None:
    await asyncio.wait_for(worker.run(until_idle=True), 15)


# -- client spans -----------------------------------------------------------------------


async def test_every_call_has_one_client_span(otel: Telemetry, client: SeppClient) -> None:
    queue = unique_queue()
    await client.get_server_info()
    await client.enqueue(EnqueueRequest(queue, "t"))
    await client.enqueue_batch([EnqueueRequest(queue, "t"), EnqueueRequest(queue, "t")])
    await client.enqueue_atomic([EnqueueRequest(queue, "t") for _ in range(2)])
    jobs = await client.reserve(reserve_opts(queue, max_jobs=3))
    assert jobs is not None and len(jobs) == 3
    first, second, _ = (job.ctx for job in jobs)
    await client.extend(first, 60)
    await first.extend(60)  # through the lease: the same span
    await client.ack(first)
    await client.nack(second, RetryDirective.dead_letter(), "bad")
    assert len(await client.drain_dead_letters(queue, 10)) == 1

    spans = otel.spans(scope="sepp_lite")
    assert [span.name for span in spans] == [
        "sepp.get_server_info",
        "sepp.enqueue",
        "sepp.enqueue",
        "sepp.enqueue_atomic",
        "sepp.reserve",
        "sepp.extend",
        "sepp.extend",
        "sepp.ack",
        "sepp.nack",
        "sepp.drain_dead_letters",
    ]
    assert spans == otel.spans()  # nothing else was traced
    for span in spans:
        assert span.kind is SpanKind.CLIENT
        assert status(span) == (StatusCode.UNSET, None)
        assert span.parent is None  # no surrounding span: each call is a root
        assert span.events == ()
    lease = {"sepp.job_id": first.id, "sepp.attempt": 1, "sepp.worker_id": "w-otel"}
    assert [dict(span.attributes or {}) for span in spans] == [
        {},
        {"sepp.batch_size": 1},
        {"sepp.batch_size": 2},
        {"sepp.batch_size": 2},
        {"sepp.worker_id": "w-otel", "sepp.jobs": 3},
        lease,
        lease,
        lease,
        {**lease, "sepp.job_id": second.id},
        {"sepp.queue": queue, "sepp.drained": 1},
    ]


async def test_client_spans_nest_in_the_callers_span(otel: Telemetry, client: SeppClient) -> None:
    queue = unique_queue()
    with otel.tracer.start_as_current_span("app.request") as app:
        await client.enqueue(EnqueueRequest(queue, "t"))
        await client.reserve(reserve_opts(queue))
    parent = otel.span("app.request", scope="tests.app")
    assert children(otel.spans(), parent) == ["sepp.enqueue", "sepp.reserve"]
    for span in otel.spans(scope="sepp_lite"):
        assert ids(span)[0] == app.get_span_context().trace_id
    # The untraced defaults: a reserve without a worker id, a drain of every queue.
    await client.reserve(ReserveOptions([queue], timedelta(seconds=30), timedelta(0)))
    await client.drain_dead_letters()
    assert dict(otel.spans("sepp.reserve")[-1].attributes or {}) == {
        "sepp.worker_id": "<none>",
        "sepp.jobs": 0,
    }
    assert dict(otel.span("sepp.drain_dead_letters").attributes or {}) == {
        "sepp.queue": "<all>",
        "sepp.drained": 0,
    }


async def test_one_span_wraps_every_retry(otel: Telemetry) -> None:
    async with ScriptedServer() as server:
        server.script("EnqueueBatch", *status_errors([Status.UNAVAILABLE] * 2))
        async with connected(server.addr, retry_policy=FAST_RETRY) as client:
            await client.enqueue(EnqueueRequest("q", "t", idempotency_key="k"))
    span = otel.span("sepp.enqueue")
    assert status(span) == (StatusCode.UNSET, None)
    traceparent = traceparent_of(span.get_span_context())
    calls = server.calls_to("EnqueueBatch")
    assert len(calls) == 3
    for call in calls:
        # Every attempt: the same span in the metadata and in the job.
        assert call.header("traceparent") == [traceparent]
        assert call.header("tracestate") == []
        [sent] = decode_enqueue_batch_request(call.request)
        assert sent.trace == (traceparent, None)
    assert otel.names() == ["sepp.enqueue"]


async def test_a_call_that_finally_fails_ends_its_span_in_error(otel: Telemetry) -> None:
    async with ScriptedServer() as server:
        server.script("GetServerInfo", *status_errors([Status.UNAVAILABLE] * 3))
        async with connected(server.addr, retry_policy=FAST_RETRY) as client:
            with pytest.raises(SeppError) as info:
                await client.get_server_info()
    assert len(server.calls_to("GetServerInfo")) == 3
    span = otel.span("sepp.get_server_info")
    error = info.value
    assert status(span) == (StatusCode.ERROR, f"{type(error).__name__}: {error}")
    # The two retry warnings went onto the span as log events (as sepp-py's logger
    # does), then the failure itself.
    *logs, (name, attributes) = events(span)
    assert [(log[0], log[1]["event.name"], log[1]["log.severity"]) for log in logs] == [
        ("", "log", 13),
        ("", "log", 13),
    ]
    assert logs[0][1]["log.message"].startswith("retrying GetServerInfo after attempt 1 ")
    assert name == "exception"
    assert attributes["exception.type"] == f"sepp_lite.errors.{type(error).__qualname__}"
    assert attributes["exception.message"] == str(error)
    assert {call.header("traceparent")[0] for call in server.calls} == {
        traceparent_of(span.get_span_context())
    }


async def test_a_cancelled_call_is_not_an_error(otel: Telemetry, client: SeppClient) -> None:
    # A reserve long poll cut short (as at worker shutdown) ends its span, unflagged.
    opts = ReserveOptions([unique_queue()], timedelta(seconds=30), timedelta(seconds=10))
    task = asyncio.ensure_future(client.reserve(opts))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    span = otel.span("sepp.reserve")
    assert status(span) == (StatusCode.UNSET, None)
    assert span.events == ()


async def test_trace_headers_go_with_every_rpc(otel: Telemetry) -> None:
    async with ScriptedServer() as server:
        async with connected(server.addr) as client:
            ctx = hand_ctx()
            with TraceContext(REMOTE, "congo=t61rcWkgMzE").attach_to_otel():
                await client.get_server_info()
                await client.enqueue(EnqueueRequest("q", "t"))
                await client.enqueue_atomic([EnqueueRequest("q", "t")])
                await client.reserve(reserve_opts("q"))
                await client.extend(ctx, 30)
                await client.ack(ctx)
                await client.nack(ctx)
                await client.drain_dead_letters("q", 5)
            await client.get_server_info()  # outside: the span alone, no tracestate
    spans = otel.spans()
    assert [call.method for call in server.calls] == [
        "GetServerInfo",
        "EnqueueBatch",
        "EnqueueAtomic",
        "Reserve",
        "Extend",
        "Ack",
        "Nack",
        "DrainDeadLetters",
        "GetServerInfo",
    ]
    assert len(spans) == len(server.calls)
    for call, span in zip(server.calls, spans):
        assert call.header("traceparent") == [traceparent_of(span.get_span_context())]
    for call, span in zip(server.calls[:-1], spans[:-1]):
        assert call.header("tracestate") == ["congo=t61rcWkgMzE"]
        assert ids(span)[0] == int(REMOTE_TRACE, 16)
        assert parent_id(span) == int(REMOTE_SPAN, 16)
    assert server.calls[-1].header("tracestate") == []
    assert ids(spans[-1])[0] != int(REMOTE_TRACE, 16)


async def test_the_api_key_never_reaches_a_span(otel: Telemetry) -> None:
    async with ScriptedServer() as server:
        server.script("GetServerInfo", GRPCError(Status.UNAUTHENTICATED, "bad key"))
        server.script("Ack", GRPCError(Status.NOT_FOUND, "gone"))
        async with connected(server.addr, api_key=API_KEY) as client:
            with pytest.raises(SeppError):
                await client.get_server_info()
            await client.enqueue(EnqueueRequest("q", "t"))
            await client.reserve(reserve_opts("q"))
            with pytest.raises(SeppError):
                await client.ack(hand_ctx())
    assert all(call.header("authorization") == [f"Bearer {API_KEY}"] for call in server.calls)
    spans = otel.spans()
    assert len(spans) == 4
    assert [span.status.status_code for span in spans] == [
        StatusCode.ERROR,
        StatusCode.UNSET,
        StatusCode.UNSET,
        StatusCode.ERROR,
    ]
    for span in spans:
        assert API_KEY not in span.to_json()


# -- trace context on enqueue -------------------------------------------------------------


async def test_enqueue_writes_its_span_into_jobs_without_a_trace_context(
    otel: Telemetry, client: SeppClient
) -> None:
    queue = unique_queue()
    own = TraceContext(OWN, "mine=1")
    with otel.tracer.start_as_current_span("app.produce") as app:
        await client.enqueue_batch(
            [
                EnqueueRequest(queue, "a"),
                EnqueueRequest(queue, "b", trace_context=own),
                EnqueueRequest(queue, "c", payload=Payload(b"x", "text/plain")),
            ]
        )
    jobs = await client.reserve(reserve_opts(queue))
    assert jobs is not None
    enqueue = otel.span("sepp.enqueue")
    # The parent id is the enqueue span, in the caller's trace; a job's own context
    # is kept as it was.
    assert parent_id(enqueue) == app.get_span_context().span_id
    assert ids(enqueue)[0] == app.get_span_context().trace_id
    expected = TraceContext(traceparent_of(enqueue.get_span_context()))
    assert int(expected.traceparent[-2:], 16) & 1  # sampled
    assert {job.ctx.job_type: job.ctx.trace_context for job in jobs} == {
        "a": expected,
        "b": own,
        "c": expected,
    }


async def test_coalesced_enqueues_keep_their_own_spans_and_trace_contexts(
    otel: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEPP_LITE_COALESCE", "1")

    async def produce(client: SeppClient, index: int) -> None:
        with otel.tracer.start_as_current_span(f"app.{index}"):
            await client.enqueue(EnqueueRequest("q", f"t{index}"))

    async with ScriptedServer() as server:
        async with connected(server.addr) as client:
            await asyncio.gather(*[produce(client, index) for index in range(6)])
    first, shared = server.calls_to("EnqueueBatch")  # t0 alone, then the other five
    sent = {
        job.job_type: job.trace
        for call in (first, shared)
        for job in decode_enqueue_batch_request(call.request)
    }
    enqueue_spans = otel.spans("sepp.enqueue")
    assert len(enqueue_spans) == 6
    for index in range(6):
        app = otel.span(f"app.{index}", scope="tests.app")
        [span] = [span for span in enqueue_spans if parent_id(span) == ids(app)[1]]
        assert dict(span.attributes or {}) == {"sepp.batch_size": 1}
        assert sent[f"t{index}"] == (traceparent_of(span.get_span_context()), None)
    # The shared call's metadata carries its first member's span.
    assert shared.header("traceparent") == [sent["t1"][0]]


async def test_enqueue_atomic_injects_too_with_the_tracestate(
    otel: Telemetry, client: SeppClient
) -> None:
    queue = unique_queue()
    with TraceContext(REMOTE, "congo=t61rcWkgMzE").attach_to_otel():
        await client.enqueue_atomic([EnqueueRequest(queue, "t")])
    [job] = await client.reserve(reserve_opts(queue)) or []
    span = otel.span("sepp.enqueue_atomic")
    assert span.parent is not None and span.parent.is_remote
    assert parent_id(span) == int(REMOTE_SPAN, 16)
    assert job.ctx.trace_context == TraceContext(
        f"00-{REMOTE_TRACE}-{span.get_span_context().span_id:016x}-01", "congo=t61rcWkgMzE"
    )


async def test_no_span_no_injection(
    otel: Telemetry, client: SeppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tracer that records nothing (the application's choice): no context to inject.
    monkeypatch.setattr(_otel, "_TRACER", trace.NoOpTracer())
    queue = unique_queue()
    await client.enqueue(EnqueueRequest(queue, "t"))
    [job] = await client.reserve(reserve_opts(queue)) or []
    assert job.ctx.trace_context is None
    assert otel.spans() == []


# -- the consumer span ----------------------------------------------------------------------


async def test_process_span_links_to_the_producer(otel: Telemetry, client: SeppClient) -> None:
    queue = unique_queue()
    with otel.tracer.start_as_current_span("app.produce"):
        ack = await client.enqueue(EnqueueRequest(queue, "t"))
    seen: list[tuple[Any, Any]] = []
    worker = Worker(client, [queue], 30)

    @worker.handler("t")
    async def handle(payload: Any, ctx: Any) -> None:
        seen.append((ctx.trace_context, trace.get_current_span().get_span_context()))

    await run_idle(worker)
    enqueue = otel.span("sepp.enqueue")
    process = otel.span("sepp.process")
    assert process.kind is SpanKind.CONSUMER
    assert dict(process.attributes or {}) == {
        "sepp.job_id": ack.job_id,
        "sepp.job_type": "t",
        "sepp.attempt": 1,
    }
    assert status(process) == (StatusCode.UNSET, None)
    # A link to the producer's span, not a parent: the process span starts its own trace.
    assert link_targets(process) == [ids(enqueue)]
    assert process.links[0].context.is_remote
    assert process.parent is None
    assert ids(process)[0] != ids(enqueue)[0]
    # The handler runs inside it, and the ack is its child.
    [(trace_context, current)] = seen
    assert trace_context == TraceContext(traceparent_of(enqueue.get_span_context()))
    assert (current.trace_id, current.span_id) == ids(process)
    assert children(otel.spans(), process) == ["sepp.ack"]


async def test_process_spans_of_failed_and_unhandled_jobs(
    otel: Telemetry, client: SeppClient
) -> None:
    queue = unique_queue()
    acks = await client.enqueue_batch(
        [
            EnqueueRequest(queue, "ok"),
            EnqueueRequest(queue, "crash", max_attempts=1),
            EnqueueRequest(queue, "give_up"),
            EnqueueRequest(queue, "orphan"),
        ]
    )
    crash_ack = acks[1]
    assert isinstance(crash_ack, EnqueueAck)
    worker = Worker(client, [queue], 30)

    async def ok(payload: Any, ctx: Any) -> None:
        pass

    async def crash(payload: Any, ctx: Any) -> None:
        raise ValueError("boom")

    async def give_up(payload: Any, ctx: Any) -> None:
        raise HandlerError.permanent("not today")

    worker.handle("ok", ok).handle("crash", crash).handle("give_up", give_up)
    await run_idle(worker)
    spans = otel.spans()
    process = {
        (span.attributes or {})["sepp.job_type"]: span for span in otel.spans("sepp.process")
    }
    assert sorted(process) == ["crash", "give_up", "ok", "orphan"]
    assert status(process["ok"]) == (StatusCode.UNSET, None)
    assert status(process["orphan"]) == (StatusCode.UNSET, None)  # handed back for later
    assert status(process["crash"]) == (StatusCode.ERROR, "ValueError: boom")
    assert status(process["give_up"]) == (StatusCode.ERROR, "HandlerError: not today")
    [(name, attributes), log] = events(process["crash"])
    assert (name, attributes["exception.type"]) == ("exception", "ValueError")
    # Its one attempt used up: the nack dead-lettered it, one ERROR saying so and why.
    assert log == (
        "",
        {
            "event.name": "log",
            "log.severity": 17,
            "log.message": f"job {crash_ack.job_id} dead-lettered: type 'crash', queue "
            f"{queue!r}, attempt 1/1; its attempts are used up; cause: handler raised "
            "ValueError: boom",
        },
    )
    [(_, unhandled)] = events(process["orphan"])
    assert unhandled["log.severity"] == 17
    assert f"no handler for job type 'orphan' on queue {queue!r}" in unhandled["log.message"]
    assert children(spans, process["ok"]) == ["sepp.ack"]
    for job_type in ("crash", "give_up", "orphan"):
        assert children(spans, process[job_type]) == ["sepp.nack"]
    for span in process.values():
        assert span.kind is SpanKind.CONSUMER
        assert span.links[0].context.span_id == ids(otel.span("sepp.enqueue"))[1]


async def test_a_job_without_trace_context_gets_no_link(
    otel: Telemetry, client: SeppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = unique_queue()
    with monkeypatch.context() as patch:
        patch.setattr(_otel, "AVAILABLE", False)
        await client.enqueue(EnqueueRequest(queue, "t"))
    worker = Worker(client, [queue], 30)
    worker.catch_all(lambda payload, ctx: asyncio.sleep(0))
    with otel.tracer.start_as_current_span("app.worker"):
        await run_idle(worker)
    process = otel.span("sepp.process")
    assert process.links == ()
    # Process spans belong to the context run() was started in (as in sepp-py).
    assert parent_id(process) == ids(otel.span("app.worker", scope="tests.app"))[1]


async def test_a_lost_lease_marks_the_process_span(otel: Telemetry) -> None:
    async with ScriptedServer() as server:
        server.script("Reserve", reserve_reply(job_record(job_type="slow")))
        server.script("Extend", GRPCError(Status.NOT_FOUND, "gone"))
        async with connected(server.addr) as client:
            worker = Worker(client, ["q"], 30, auto_extend_interval=0.05)

            @worker.handler("slow")
            async def slow(payload: Any, ctx: Any) -> None:
                await asyncio.sleep(30)

            await run_idle(worker)
    process = otel.span("sepp.process")
    assert status(process) == (StatusCode.ERROR, "not settled: its lease was lost")
    assert children(otel.spans(), process) == ["sepp.extend"]
    assert otel.span("sepp.extend").status.status_code is StatusCode.ERROR
    assert not server.calls_to("Ack") and not server.calls_to("Nack")


async def test_json_log_records_of_a_job_carry_its_span_s_trace_id(
    otel: Telemetry, client: SeppClient
) -> None:
    queue = unique_queue()
    await client.enqueue(EnqueueRequest(queue, "t", trace_context=TraceContext(REMOTE)))
    worker = Worker(client, [queue], 30)
    lines: list[str] = []
    worker.catch_all(
        lambda payload, ctx: lines.append(
            JsonLogFormatter().format(logging.LogRecord("app", 20, "", 0, "in", None, None))
        )
    )
    await run_idle(worker)
    process = otel.span("sepp.process")  # linked to the producer's, in a trace of its own
    [line] = lines
    assert json.loads(line)["trace_id"] == format(process.context.trace_id, "032x")
    assert REMOTE_TRACE not in line


# -- metrics --------------------------------------------------------------------------------

PROCESSED = key("sepp.jobs.processed")
IN_FLIGHT = key("sepp.jobs.in_flight")
RETRY = key("sepp.jobs.nacked", outcome="retry")
DEAD = key("sepp.jobs.nacked", outcome="dead_letter")
SOME = key("sepp.reserves.completed", jobs="some")
EMPTY = key("sepp.reserves.completed", jobs="empty")
FAILED = key("sepp.reserves.failed")


async def test_worker_metrics(otel: Telemetry, client: SeppClient) -> None:
    queue = unique_queue()
    await client.enqueue_batch(
        [EnqueueRequest(queue, "ok"), EnqueueRequest(queue, "ok")]
        + [EnqueueRequest(queue, "later"), EnqueueRequest(queue, "give_up")]
        + [EnqueueRequest(queue, "crash", max_attempts=1), EnqueueRequest(queue, "orphan")]
    )
    worker = Worker(client, [queue], 30, max_in_flight=2)
    before = otel.metrics()
    observed: list[int] = []
    gate = asyncio.Event()

    async def ok(payload: Any, ctx: Any) -> None:
        if len(observed) == 0:
            observed.append(-1)  # the first "ok" waits for the second
            await gate.wait()
        else:
            observed[0] = otel.metrics().get(IN_FLIGHT, 0) - before.get(IN_FLIGHT, 0)
            gate.set()

    async def later(payload: Any, ctx: Any) -> None:
        raise HandlerError.retry_after("later", 60)

    async def give_up(payload: Any, ctx: Any) -> None:
        raise HandlerError.permanent("no")

    async def crash(payload: Any, ctx: Any) -> None:
        raise RuntimeError("boom")  # the last attempt: dead-lettered

    for job_type, handler in [("ok", ok), ("later", later), ("give_up", give_up)]:
        worker.handle(job_type, handler)
    worker.handle("crash", crash)
    await run_idle(worker)
    change = delta(before, otel.metrics())
    assert observed == [2]  # both "ok" handlers running at once
    assert change.pop(SOME) >= 1
    assert change.pop(EMPTY) >= 1
    # The unhandled job's nack is not counted as nacked, as in sepp-py, but as
    # unhandled (sepp_lite's own instrument); in_flight is back to 0.
    unhandled = key("sepp.jobs.unhandled", queue=queue, job_type="orphan")
    assert change == {PROCESSED: 2, RETRY: 1, DEAD: 2, unhandled: 1}
    assert otel.metrics()[IN_FLIGHT] == before.get(IN_FLIGHT, 0)


async def test_reserve_failures_are_counted_and_the_instruments_are_sepp_pys_and_one_more(
    otel: Telemetry,
) -> None:
    async with ScriptedServer() as server:
        server.script(
            "Reserve",
            GRPCError(Status.UNAVAILABLE, "down"),
            reserve_reply(
                job_record("11111111-1111-4111-8111-111111111111", job_type="ok"),
                job_record("22222222-2222-4222-8222-222222222222", job_type="bad"),
            ),
        )
        async with connected(server.addr) as client:
            worker = Worker(client, ["q"], 30, reserve_error_backoff=0.01)
            worker.handle("ok", lambda payload, ctx: asyncio.sleep(0))

            @worker.handler("bad")
            async def bad(payload: Any, ctx: Any) -> None:
                raise HandlerError.retry("again")

            before = otel.metrics()
            await run_idle(worker)
    change = delta(before, otel.metrics())
    assert change.pop(EMPTY) >= 1
    assert change == {FAILED: 1, SOME: 1, PROCESSED: 1, RETRY: 1}
    reserves = otel.spans("sepp.reserve")
    assert reserves[0].status.status_code is StatusCode.ERROR
    assert all(span.status.status_code is StatusCode.UNSET for span in reserves[1:])
    # The instruments: names, kinds (monotonic counters, one up-down counter), meter.
    # sepp-py's five, and sepp_lite's count of jobs of a type without a handler (shown
    # once an earlier test has counted one).
    instruments = otel.instruments()
    assert set(instruments) - {"sepp.jobs.unhandled"} == {
        "sepp.jobs.processed",
        "sepp.jobs.nacked",
        "sepp.jobs.in_flight",
        "sepp.reserves.completed",
        "sepp.reserves.failed",
    }
    for name, data in instruments.items():
        assert isinstance(data, Sum)
        assert data.is_monotonic is (name != "sepp.jobs.in_flight")


# -- TraceContext helpers -------------------------------------------------------------------


# -- log records as span events ----------------------------------------------------------


def test_log_calls_become_events_of_the_recording_span(
    otel: Telemetry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log.logger()
    caplog.set_level(logging.INFO, logger="sepp_lite")
    log.debug("not for %s", "the log")  # below the logger's level: still an event
    with otel.tracer.start_as_current_span("app.outer") as outer:
        log.debug("debug %d", 1)
        log.info("info %s", "two")
        log.warning("warning")
        log.error("error %r", "four", exc_info=ValueError("x"))
        with monkeypatch.context() as patch:
            patch.setattr(_otel, "AVAILABLE", False)
            log.info("opentelemetry off")
    span = otel.span("app.outer", scope="tests.app")
    assert span.get_span_context() == outer.get_span_context()
    assert events(span) == [
        ("", {"event.name": "log", "log.severity": severity, "log.message": message})
        for severity, message in [
            (5, "debug 1"),
            (9, "info two"),
            (13, "warning"),
            (17, "error 'four'"),
        ]
    ]
    # The records themselves are untouched and name sepp_lite's caller, not the wrapper.
    records = [r for r in caplog.records if r.name == "sepp_lite"]
    assert [r.getMessage() for r in records] == [
        "info two",
        "warning",
        "error 'four'",
        "opentelemetry off",
    ]
    assert {r.funcName for r in records} == {"test_log_calls_become_events_of_the_recording_span"}
    assert records[2].exc_info is not None


def test_from_current_otel(otel: Telemetry) -> None:
    assert TraceContext.from_current_otel() is None
    with otel.tracer.start_as_current_span("app") as span:
        assert TraceContext.from_current_otel() == TraceContext(
            traceparent_of(span.get_span_context())
        )
    with TraceContext(REMOTE, "congo=t61rcWkgMzE").attach_to_otel():
        # The remote context itself (no local span), with its tracestate.
        assert TraceContext.from_current_otel() == TraceContext(REMOTE, "congo=t61rcWkgMzE")
        with otel.tracer.start_as_current_span("child") as child:
            captured = TraceContext.from_current_otel()
    assert captured == TraceContext(
        f"00-{REMOTE_TRACE}-{child.get_span_context().span_id:016x}-01", "congo=t61rcWkgMzE"
    )
    assert TraceContext.from_current_otel() is None


def test_attach_to_otel(otel: Telemetry) -> None:
    before = trace.get_current_span().get_span_context()
    assert not before.is_valid
    with TraceContext(REMOTE, "a=1").attach_to_otel() as value:
        assert value is None
        current = trace.get_current_span().get_span_context()
        with otel.tracer.start_as_current_span("child"):
            pass
    assert (current.trace_id, current.span_id) == (int(REMOTE_TRACE, 16), int(REMOTE_SPAN, 16))
    assert current.is_remote and current.trace_state.get("a") == "1"
    assert trace.get_current_span().get_span_context() == before
    child = otel.span("child", scope="tests.app")
    assert parent_id(child) == int(REMOTE_SPAN, 16)


def test_otel_span_context() -> None:
    context = TraceContext(REMOTE, "a=1,b=2").otel_span_context()
    assert context is not None and context.is_valid and context.is_remote
    assert (context.trace_id, context.span_id) == (int(REMOTE_TRACE, 16), int(REMOTE_SPAN, 16))
    assert context.trace_flags == TraceFlags.SAMPLED
    assert dict(context.trace_state) == {"a": "1", "b": "2"}
    unsampled = TraceContext(REMOTE[:-2] + "00").otel_span_context()
    assert unsampled is not None and unsampled.trace_flags == TraceFlags.DEFAULT
    # Valid for TraceContext (as in sepp-py) but not for the W3C propagator: no context.
    assert TraceContext(REMOTE.upper()).otel_span_context() is None
    assert TraceContext("ff" + REMOTE[2:]).otel_span_context() is None
