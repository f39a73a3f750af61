"""Trace context across clients: sepp_lite and the official sepp-py 0.1.0 (installed as
``sepp`` in the test venv) share one W3C format, so a job enqueued by either links the
other's ``sepp.process`` span back to its producer. Both talk to the in-process server
over real sockets; both emit into the same SDK providers (tests/otel_helpers.py).

Skipped as a whole without opentelemetry-sdk or without sepp-py (CPython 3.10+ only).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tests.client_helpers import NO_SEPP_PY

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the test-otel extra)")
pytest.importorskip("sepp", reason=NO_SEPP_PY)

import sepp as seppy
import sepp.types as seppy_types
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sepp_lite import EnqueueRequest, ReserveOptions, TraceContext, Worker, _otel
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import connected, unique_queue, worker_running
from tests.otel_helpers import Telemetry, ids, link_targets, telemetry, traceparent_of

pytestmark = pytest.mark.timeout(30)

# The W3C Trace Context rules for a version-00 traceparent, as a writer must produce it:
# lowercase hex, 32-hex trace id and 16-hex parent id not all zeros, 2-hex flags.
W3C_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    assert _otel.AVAILABLE and seppy._otel.OTEL_AVAILABLE
    with telemetry().capture() as state:
        yield state


async def official_client(addr: str) -> Any:
    return await seppy.SeppClient.connect(addr)


async def test_a_sepp_py_producer_links_in_a_sepp_lite_worker(
    otel: Telemetry, server: SeppTestServer
) -> None:
    queue = unique_queue()
    official = await official_client(server.addr)
    try:
        with otel.tracer.start_as_current_span("app.produce"):
            await official.enqueue(seppy.EnqueueRequest(queue, "t"))
    finally:
        await official.close()
    producer = otel.span("sepp.enqueue", scope="sepp")  # sepp-py's own span
    seen: list[Any] = []
    async with connected(server.addr) as client:
        worker = Worker(client, [queue], 30)

        @worker.handler("t")
        async def handle(payload: Any, ctx: Any) -> None:
            seen.append(ctx.trace_context)

        await asyncio.wait_for(worker.run(until_idle=True), 15)
    process = otel.span("sepp.process")
    assert link_targets(process) == [ids(producer)]
    assert seen == [TraceContext(traceparent_of(producer.get_span_context()))]


async def test_a_sepp_lite_producer_decodes_and_links_in_sepp_py(
    otel: Telemetry, server: SeppTestServer
) -> None:
    peek, queue = unique_queue(), unique_queue()
    async with connected(server.addr) as client:
        with otel.tracer.start_as_current_span("app.produce"):
            await client.enqueue_batch([EnqueueRequest(peek, "t"), EnqueueRequest(queue, "t")])
    producer = otel.span("sepp.enqueue")  # ours
    official = await official_client(server.addr)
    try:
        # sepp-py's reserve builds its own TraceContext from ours (validating it), and
        # its helper decodes it to our span.
        opts = seppy.ReserveOptions([peek], timedelta(seconds=30), timedelta(0))
        [job] = await official.reserve(opts)
        theirs = job.ctx.trace_context
        assert isinstance(theirs, seppy_types.TraceContext)
        assert theirs.traceparent == traceparent_of(producer.get_span_context())
        decoded = theirs.otel_span_context()
        assert (decoded.trace_id, decoded.span_id) == ids(producer)
        await official.ack(job.ctx)
        # sepp-py's worker links its process span to our enqueue span.
        worker = seppy.Worker(official, [queue], timedelta(seconds=30))
        done = asyncio.Event()

        async def handle(payload: Any, ctx: Any) -> None:
            done.set()

        worker.handle("t", handle)
        async with worker_running(worker, 10):  # sepp-py's Worker has the same run/stop
            await asyncio.wait_for(done.wait(), 10)
    finally:
        await official.close()
    process = otel.span("sepp.process", scope="sepp")
    assert link_targets(process) == [ids(producer)]


async def test_traceparents_written_by_sepp_lite_follow_the_w3c_rules(
    otel: Telemetry, server: SeppTestServer
) -> None:
    queue = unique_queue()
    unsampled_parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    async with connected(server.addr) as client:
        await client.enqueue(EnqueueRequest(queue, "root"))
        with otel.tracer.start_as_current_span("app"):
            await client.enqueue(EnqueueRequest(queue, "child"))
        with TraceContext(unsampled_parent, "k=v").attach_to_otel():
            await client.enqueue(EnqueueRequest(queue, "unsampled"))
        jobs = await client.reserve(ReserveOptions([queue], 30, 0, max_jobs=3)) or []
    written = {job.ctx.job_type: job.ctx.trace_context for job in jobs}
    assert set(written) == {"root", "child", "unsampled"}
    propagator = TraceContextTextMapPropagator()
    for job_type, context in written.items():
        assert context is not None
        assert W3C_TRACEPARENT.fullmatch(context.traceparent), (job_type, context)
        # sepp-py's validation accepts it, and both decoders read the same span.
        official = seppy_types.TraceContext(context.traceparent, context.tracestate)
        assert official.otel_span_context() == context.otel_span_context()
        carrier = {"traceparent": context.traceparent}
        if context.tracestate is not None:
            carrier["tracestate"] = context.tracestate
        extracted = trace.get_current_span(propagator.extract(carrier)).get_span_context()
        assert extracted.is_valid
    # A parent that was not sampled: the flags say so, the tracestate is carried.
    assert written["unsampled"].traceparent.endswith("-00")
    assert written["unsampled"].tracestate == "k=v"
    assert written["root"].tracestate is None


@pytest.mark.parametrize(
    ("traceparent", "tracestate"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "a=1,b=2"),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", None),  # not W3C
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),  # not W3C
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09", "x=y"),
    ],
)
def test_both_clients_decode_a_trace_context_alike(
    traceparent: str, tracestate: str | None
) -> None:
    ours = TraceContext(traceparent, tracestate).otel_span_context()
    theirs = seppy_types.TraceContext(traceparent, tracestate).otel_span_context()
    assert ours == theirs
    if ours is not None:
        assert dict(ours.trace_state) == dict(theirs.trace_state)
