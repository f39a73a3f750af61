"""What a workflow shows to observability tools: each step's ``sepp.process`` span links
to the hand-off that enqueued it (a ``sepp.enqueue`` span inside the previous step's
``sepp.process`` span), and the JSON log lines of a step carry ``workflow_root``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the test-otel extra)")

from sepp_lite import JobCtx, JsonLogFormatter, SeppClient, _otel
from sepp_lite.tasks import Tasks
from tests.client_helpers import unique_queue
from tests.otel_helpers import Telemetry, ids, link_targets, parent_id, telemetry

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    assert _otel.AVAILABLE
    with telemetry().capture() as state:
        yield state


async def test_each_steps_span_links_to_the_previous_steps_hand_off(
    otel: Telemetry, client: SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    lines: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(JsonLogFormatter().format(record)))

    log = logging.getLogger("workflow-steps")
    log.addHandler(Collect())
    log.setLevel(logging.INFO)

    @tasks.task
    async def one(n: int, ctx: JobCtx) -> int:
        log.info("one")
        return n + 1

    @tasks.task
    async def two(n: int) -> int:
        log.info("two")
        return n + 1

    @tasks.task
    async def three(n: int) -> None:
        log.info("three")

    ack = await one.then(two).then(three).enqueue(client, 1, root="root-1")
    await asyncio.wait_for(tasks.worker(client).run(until_idle=True), 15)
    process = {
        dict(span.attributes or {})["sepp.job_type"]: span for span in otel.spans("sepp.process")
    }
    assert dict(process["one"].attributes or {})["sepp.job_id"] == ack.job_id
    enqueues = otel.spans("sepp.enqueue")
    for before, after in (("one", "two"), ("two", "three")):
        [hand_off] = [s for s in enqueues if parent_id(s) == ids(process[before])[1]]
        assert link_targets(process[after]) == [ids(hand_off)]
    assert [(line["message"], line["workflow_root"]) for line in lines] == [
        ("one", "root-1"),
        ("two", "root-1"),
        ("three", "root-1"),
    ]
