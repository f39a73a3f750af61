"""OpenTelemetry installed but not configured (issue 38): the usual state of a service
whose dependencies pull the API in. A job and a call then do no OpenTelemetry work (no
span started, no context attached, nothing injected), the wire carries what it carried
before, and a provider set later, after the client and the worker exist, gets every
span, link and metric as a provider set first does.

The global providers can be set once per process and the test process sets them
(tests/otel_helpers.py), so each scenario runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the test-otel extra)")

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# The parts of the OpenTelemetry API that only making or propagating a span reaches.
_SPAN_WORK = ("/trace/", "/propagators/")
_CONTEXT_WORK = (":attach", ":detach", ":set_value")

_COMMON = """
import asyncio, collections, json, sys

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer

JOBS = 40
calls = collections.Counter()


def profile(frame, event, arg):
    # Every Python function of the opentelemetry packages that runs, by file and name.
    if event == "call" and "/opentelemetry/" in frame.f_code.co_filename:
        where = frame.f_code.co_filename.rsplit("/opentelemetry/", 1)[1]
        calls[f"{where}:{frame.f_code.co_name}"] += 1


async def produce(client, queue, count, **options):
    for _ in range(count):
        await client.enqueue(sepp.EnqueueRequest(queue, "t", **options))


async def consume(client, queue, worker=None):
    worker = worker or sepp.Worker(client, [queue], 30)
    seen = []

    async def handler(payload, ctx):
        seen.append(ctx.trace_context and ctx.trace_context.traceparent)

    worker.handle("t", handler)
    await worker.run(until_idle=True)
    return seen
"""

_UNUSED = """
async def main():
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            await produce(client, "warm", 5)
            await consume(client, "warm")  # first calls, imports, lazy set-up
            worker = sepp.Worker(client, ["q"], 30)
            sys.setprofile(profile)
            await produce(client, "q", JOBS)
            await client.get_server_info()
            seen = await consume(client, "q", worker)
            sys.setprofile(None)
            with sepp.TraceContext("%(traceparent)s").attach_to_otel():
                await produce(client, "passed-on", 1)
            passed_on = await consume(client, "passed-on")
    return {"calls": dict(calls), "seen": seen, "passed_on": passed_on}


print(json.dumps(asyncio.run(main())))
"""

_LATER = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def configure():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return exporter, reader


def sums(reader):
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            if scope.scope.name == "sepp":
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        name = metric.name + json.dumps(dict(point.attributes), sort_keys=True)
                        found[name] = point.value
    return found


def describe(span):
    parent = span.parent.span_id if span.parent else None
    links = [[link.context.trace_id, link.context.span_id] for link in span.links]
    context = span.get_span_context()
    return [span.name, context.trace_id, context.span_id, parent, links, context.trace_flags]


async def main():
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            worker = sepp.Worker(client, ["q"], 30)
            await produce(client, "before", 1)
            exporter, reader = configure()  # after the client and the worker exist
            with trace.get_tracer("app").start_as_current_span("app"):
                await produce(client, "q", 3)
            seen = await consume(client, "q", worker)
            before = await consume(client, "before")
    spans = [describe(span) for span in exporter.get_finished_spans()]
    return {"spans": spans, "metrics": sums(reader), "seen": seen, "before": before}


print(json.dumps(asyncio.run(main())))
"""


def _run(body: str) -> dict[str, Any]:
    script = textwrap.dedent(_COMMON) + textwrap.dedent(body) % {"traceparent": TRACEPARENT}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def test_telemetry_nobody_collects_does_no_opentelemetry_work() -> None:
    found = _run(_UNUSED)
    spans = {
        name: count
        for name, count in found["calls"].items()
        if any(part in name for part in _SPAN_WORK) or name.endswith(_CONTEXT_WORK)
    }
    # 40 enqueues, a small call and a Worker over 40 jobs: no span made, none made
    # current, nothing injected (before issue 38: some 400 such calls).
    assert spans == {}, found["calls"]
    assert found["seen"] == [None] * 40  # no trace context went out
    # A context the application attached (a remote parent, no provider) still goes
    # out with the job, as the API's no-op spans passed it on.
    assert found["passed_on"] == [TRACEPARENT]


def test_a_provider_set_after_the_client_and_the_worker_gets_everything() -> None:
    found = _run(_LATER)
    spans = found["spans"]
    by_id = {span[2]: span for span in spans}
    named: dict[str, list[Any]] = {}
    for span in spans:
        named.setdefault(span[0], []).append(span)
    assert sorted(named) == ["app", "sepp.ack", "sepp.enqueue", "sepp.get_server_info",
                             "sepp.process", "sepp.reserve"]  # fmt: skip
    [app], enqueues = named["app"], named["sepp.enqueue"]
    assert [enqueue[3] for enqueue in enqueues] == [app[2]] * 3
    # Each job carries its enqueue span's context, and its process span links to it; the
    # job enqueued before the provider was set carries none and links nowhere.
    assert found["seen"] == [f"00-{span[1]:032x}-{span[2]:016x}-{span[5]:02x}" for span in enqueues]
    assert found["before"] == [None]
    links = sorted(tuple(link) for span in named["sepp.process"] for link in span[4])
    assert links == sorted((span[1], span[2]) for span in enqueues)
    assert len(named["sepp.process"]) == 4
    assert [by_id[ack[3]][0] for ack in named["sepp.ack"]] == ["sepp.process"] * 4
    metrics = found["metrics"]
    assert metrics["sepp.jobs.processed{}"] == 4
    assert metrics["sepp.jobs.in_flight{}"] == 0
    assert metrics['sepp.reserves.completed{"jobs": "some"}'] >= 2
