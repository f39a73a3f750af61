"""The "Client-side checks" table of the site (docs/reference/checks.md), run row by row.

Each row's example is evaluated against a recording server behind a counting proxy:
it must raise exactly the error the row names, with the text it names, and neither a
call nor a connection may reach the server. The table must keep a row for every kind
of check (so deleting rows fails here too)."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import sepp_lite
from sepp_lite import EnqueueRequest, Payload, SeppClient
from tests.client_helpers import FreezableProxy, ScriptedServer, hand_ctx, server_info_bytes

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
CHECKS_PAGE = ROOT / "docs" / "reference" / "checks.md"
README = ROOT / "README.md"
SECTION = "## Client-side checks"
PAYLOAD_LIMIT = 64


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    check: str
    example: str
    raises: str
    message: str


def _cell(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] == "`" else text


def table_rows(text: str) -> list[Row]:
    """The rows of the first table in ``text`` (up to its next ``## `` heading)."""
    text = re.split(r"^## ", text, maxsplit=1, flags=re.MULTILINE)[0]
    rows = []
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue  # prose, the header and the separator
        cells = [_cell(cell) for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, line
        rows.append(Row(*cells))
    return rows


def read_table() -> list[Row]:
    return table_rows(CHECKS_PAGE.read_text(encoding="utf-8"))


ROWS = read_table()

# Every kind of check the client makes must keep at least one row.
REQUIRED = {
    "empty-batch",
    "empty-atomic-batch",
    "empty-queue",
    "empty-job-type",
    "priority-over-9",
    "priority-set-later",
    "custom-none",
    "custom-int-range",
    "custom-key-type",
    "payload-over-limit",
    "payload-over-limit-in-batch",
    "payload-over-message-limit",
    "batch-over-message-limit",
    "nack-over-message-limit",
    "traceparent-malformed",
    "reserve-no-queues",
    "reserve-queue-name-rule",
    "drain-queue-name-rule",
    "reserve-lease-zero",
    "reserve-wait-negative",
    "reserve-max-jobs-zero",
    "reserve-set-later",
    "extend-zero",
    "extend-negative",
    "nack-directive-type",
    "directive-negative-delay",
    "directive-unknown-kind",
    "policy-negative-initial-backoff",
    "drain-negative",
    "drain-empty-queue",
    "worker-no-queues",
    "worker-lease-zero",
    "worker-wait-zero",
    "worker-duplicate-handler",
    "worker-queues-str",
    "worker-handler-arity",
    "worker-handler-not-callable",
    "api-key-control-character",
    "api-key-empty",
    "connect-timeout-zero",
    "keepalive-time-zero",
    "address-bad-port",
}


def error_class(name: str) -> type[BaseException]:
    found = getattr(sepp_lite, name, None) or getattr(builtins, name, None)
    assert isinstance(found, type) and issubclass(found, BaseException), name
    return found


def test_the_table_is_complete_and_well_formed() -> None:
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids)), "duplicate ids"
    assert REQUIRED - set(ids) == set()
    assert len(ROWS) >= 60
    for row in ROWS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", row.id), row.id
        error_class(row.raises)
        assert row.check and row.message, row
        compile(f"async def _():\n    return {row.example}\n", row.id, "exec")


def mutated(obj: Any, **fields: Any) -> Any:
    """Set fields after construction (what code that edits a request does)."""
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


async def handler(payload: object, ctx: object) -> None:
    pass


@dataclasses.dataclass
class Recorder:
    server: ScriptedServer
    proxy: FreezableProxy
    namespace: dict[str, Any]

    def seen(self) -> tuple[int, int]:
        """(calls the server received, connections the proxy accepted)."""
        return len(self.server.calls), self.proxy.connections


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    async with ScriptedServer() as server, FreezableProxy("127.0.0.1", server.port) as proxy:
        server.script("GetServerInfo", server_info_bytes(max_payload_bytes=PAYLOAD_LIMIT))
        client = await SeppClient.connect(proxy.addr)
        informed = await SeppClient.connect(proxy.addr)
        try:
            assert (await informed.get_server_info()).max_payload_bytes == PAYLOAD_LIMIT
            namespace = {name: getattr(sepp_lite, name) for name in sepp_lite.__all__}
            namespace.update(
                client=client,
                informed=informed,
                ctx=hand_ctx(),
                addr=proxy.addr,
                handler=handler,
                mutated=mutated,
                timedelta=timedelta,
            )
            yield Recorder(server, proxy, namespace)
        finally:
            await client.close()
            await informed.close()


async def evaluate(example: str, namespace: dict[str, Any]) -> Any:
    exec(f"async def __row():\n    return {example}\n", namespace)
    return await namespace["__row"]()


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
async def test_client_side_check(row: Row, recorder: Recorder) -> None:
    expected = error_class(row.raises)
    before = recorder.seen()
    with pytest.raises(BaseException) as info:
        await evaluate(row.example, recorder.namespace)
    assert type(info.value) is expected, f"{row.id}: {info.value!r}"
    assert row.message in str(info.value), f"{row.id}: {info.value}"
    await asyncio.sleep(0.02)  # anything sent would have arrived by now
    assert recorder.seen() == before, f"{row.id} reached the server"


async def test_the_recorder_sees_calls_and_connections(recorder: Recorder) -> None:
    # Guards the "nothing reached the server" assertions: a call and a connection made
    # the ordinary way are counted, including the payload the limit check lets through
    # when it is turned off.
    calls, connections = recorder.seen()
    async with await SeppClient.connect(
        recorder.namespace["addr"], check_payload_limit=False
    ) as unchecked:
        await unchecked.get_server_info()
        big = EnqueueRequest("q", "t", payload=Payload(b"x" * (PAYLOAD_LIMIT + 1), "raw"))
        await unchecked.enqueue(big)
    assert recorder.seen() == (calls + 2, connections + 1)
    assert [c.method for c in recorder.server.calls[-2:]] == ["GetServerInfo", "EnqueueBatch"]
