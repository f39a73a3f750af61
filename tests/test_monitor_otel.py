"""The Prometheus names of ``/metrics`` are the OpenTelemetry instruments' names, by
the usual OpenTelemetry -> Prometheus rules (dots to underscores, ``_total`` on
monotonic sums), so one dashboard reads either."""

from __future__ import annotations

from typing import Optional

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the test-otel extra)")

from opentelemetry.sdk.metrics.export import Sum

import sepp_lite as sepp
from sepp_lite.monitor import serve_endpoints
from sepp_lite.testing import QueueConfig, SeppTestServer
from tests.client_helpers import until
from tests.fault_helpers import running
from tests.http_helpers import get, sample_names
from tests.otel_helpers import telemetry

pytestmark = [pytest.mark.otel, pytest.mark.timeout(60)]

OTEL_NAMES = {
    "sepp.jobs.processed",
    "sepp.jobs.nacked",
    "sepp.jobs.in_flight",
    "sepp.reserves.completed",
    "sepp.reserves.failed",
    "sepp.jobs.unhandled",
}


def prometheus_name(name: str, data: object) -> str:
    monotonic = isinstance(data, Sum) and data.is_monotonic
    return name.replace(".", "_") + ("_total" if monotonic else "")


async def test_metric_names_match_the_otel_instruments() -> None:
    otel = telemetry()
    queues = [QueueConfig("declared")]
    async with SeppTestServer(strict_queues=True, queues=queues) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            await client.enqueue(sepp.EnqueueRequest("declared", "ok"))
            await client.enqueue(sepp.EnqueueRequest("declared", "bad"))
            await client.enqueue(sepp.EnqueueRequest("declared", "stray"))
            worker = sepp.Worker(client, ["declared"], lease_duration=30)
            failing = sepp.Worker(client, ["undeclared"], lease_duration=30, wait_timeout=1)

            @worker.handler("ok")
            async def ok(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
                pass

            @worker.handler("bad")
            async def bad(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
                raise sepp.HandlerError.permanent("no")

            async with serve_endpoints(worker, "127.0.0.1:0") as endpoints:
                async with serve_endpoints(failing, "127.0.0.1:0"), running(failing.run()):
                    await worker.run(until_idle=True)
                    await until(lambda: "sepp.reserves.failed" in otel.instruments())
                exposed = sample_names((await get(endpoints.url + "/metrics")).body)
    instruments = otel.instruments()
    assert OTEL_NAMES <= set(instruments)
    for name in OTEL_NAMES:
        assert prometheus_name(name, instruments[name]) in exposed, name
