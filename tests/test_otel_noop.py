"""sepp_lite without OpenTelemetry: every hook is a cheap no-op and nothing breaks.

These tests run in both venvs. Where opentelemetry is installed they switch it off by
patching ``_otel.AVAILABLE`` (as sepp-py's tests do) while an SDK provider and a live
application span are active, so "no-op" is checked against real telemetry; where it is
not installed (the `.[test]` CI run) they check the real absence. A fresh interpreter
that cannot import opentelemetry covers the import-time fallback in both venvs.
Also here: TraceContext validation, which must refuse exactly what sepp-py refuses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any, Callable

import pytest

from sepp_lite import (
    EnqueueRequest,
    HandlerError,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    TraceContext,
    TraceContextError,
    Worker,
    _otel,
    _otel_metrics,
)
from sepp_lite._codec.enqueue import decode_enqueue_batch_request
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import ScriptedServer, connected, hand_ctx, unique_queue

pytestmark = pytest.mark.timeout(60)

OTEL_INSTALLED = importlib.util.find_spec("opentelemetry") is not None
SDK_INSTALLED = OTEL_INSTALLED and importlib.util.find_spec("opentelemetry.sdk") is not None
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def no_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry off: really absent, or switched off where it is installed."""
    if OTEL_INSTALLED:
        monkeypatch.setattr(_otel, "AVAILABLE", False)
    else:
        assert _otel.AVAILABLE is False


@contextlib.contextmanager
def live_telemetry() -> Iterator[Callable[[], list[str]]]:
    """Where the SDK is installed: the shared providers capturing, inside a recording
    application span; yields a function naming every span that ended and every sepp
    metric that changed since. Without the SDK there is nothing to watch."""
    if not SDK_INSTALLED:
        yield list
        return
    from tests.otel_helpers import delta, telemetry

    state = telemetry()
    before = state.metrics()
    with state.capture(), state.tracer.start_as_current_span("app") as span:
        assert span.get_span_context().is_valid

        def emitted() -> list[str]:
            spans = [s.name for s in state.spans()]
            return spans + sorted(name for name, _ in delta(before, state.metrics()))

        yield emitted


def test_every_hook_is_a_shared_noop(no_otel: None) -> None:
    span = _otel.client_span("sepp.enqueue", {"sepp.batch_size": 1})
    # One preallocated object for every call: no generator, no allocation.
    assert span is _otel.client_span("sepp.ack") is _otel.consumer_span("id", "t", 1, None)
    with span as value:
        assert value is None
    with _otel.consumer_span("id", "t", 1, TraceContext(TRACEPARENT)) as value:
        assert value is None
    _otel.mark_error(None, ValueError("x"))
    _otel.mark_error(None, "reason")
    with live_telemetry() as emitted:
        assert _otel.current_headers() is None
        assert _otel.call_metadata() == ()
        assert TraceContext.from_current_otel() is None
        # A Worker without OpenTelemetry has no instruments to report to at all.
        assert _otel_metrics.default_observers() == []
        assert emitted() == []


def test_trace_context_helpers_are_noops(no_otel: None) -> None:
    tc = TraceContext(TRACEPARENT, "a=1")
    with live_telemetry() as emitted:
        current = _current_span()
        assert TraceContext.from_current_otel() is None
        with tc.attach_to_otel() as value:
            assert value is None
            assert _current_span() is current  # nothing was attached
        assert tc.otel_span_context() is None
        assert emitted() == []


def _current_span() -> Any:
    if not OTEL_INSTALLED:
        return None
    from opentelemetry import trace

    return trace.get_current_span()


async def test_the_client_sends_no_trace_context(no_otel: None) -> None:
    own = TraceContext(TRACEPARENT, "a=1")
    async with ScriptedServer() as server:
        async with connected(server.addr) as client:
            ctx = hand_ctx()
            with live_telemetry() as emitted:
                await client.get_server_info()
                await client.enqueue_batch(
                    [EnqueueRequest("q", "t"), EnqueueRequest("q", "t", trace_context=own)]
                )
                await client.enqueue_atomic([EnqueueRequest("q", "t")])
                await client.reserve(ReserveOptions(["q"], 30, 0, "w"))
                await client.extend(ctx, 30)
                await client.ack(ctx)
                await client.nack(ctx, RetryDirective.dead_letter())
                await client.drain_dead_letters()
                assert emitted() == []
    assert len(server.calls) == 8
    for call in server.calls:
        assert call.header("traceparent") == [] and call.header("tracestate") == []
    batch, atomic = (
        decode_enqueue_batch_request(server.calls_to(m)[0].request)
        for m in ("EnqueueBatch", "EnqueueAtomic")
    )
    # Nothing injected; a job's own context still goes out verbatim.
    assert [job.trace for job in batch + atomic] == [None, (TRACEPARENT, "a=1"), None]


async def test_a_worker_runs_end_to_end(
    no_otel: None, server: SeppTestServer, client: SeppClient
) -> None:
    queue = unique_queue()
    own = TraceContext(TRACEPARENT, "a=1")
    seen: dict[str, Any] = {}
    with live_telemetry() as emitted:
        await client.enqueue_batch(
            [
                EnqueueRequest(queue, "ok"),
                EnqueueRequest(queue, "ok", trace_context=own),
                EnqueueRequest(queue, "fail", max_attempts=1),
            ]
        )
        worker = Worker(client, [queue], 30)
        assert worker.observers == ()

        @worker.handler("ok")
        async def ok(payload: Any, ctx: Any) -> None:
            seen[ctx.id] = ctx.trace_context

        @worker.handler("fail")
        async def fail(payload: Any, ctx: Any) -> None:
            raise HandlerError.permanent("no")

        await worker.run(until_idle=True)
        assert emitted() == []
    assert sorted(seen.values(), key=repr) == sorted([None, own], key=repr)
    assert tuple(server.counts(queue)) == (0, 0, 0, 1)  # ready, scheduled, in flight, dead
    [record] = await client.drain_dead_letters(queue, 5)
    assert record.job_type == "fail" and record.trace_context is None


@pytest.mark.skipif(OTEL_INSTALLED, reason="opentelemetry is installed in this venv")
def test_opentelemetry_is_really_absent() -> None:
    import sepp_lite.client
    import sepp_lite.worker  # noqa: F401

    assert _otel.AVAILABLE is False
    assert not [name for name in sys.modules if name.split(".")[0] == "opentelemetry"]
    assert TraceContext.from_current_otel() is None
    assert TraceContext(TRACEPARENT).otel_span_context() is None


_FRESH_INTERPRETER = """
import asyncio
import sys


class BlockOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, BlockOpenTelemetry())

import sepp_lite as sepp
from sepp_lite import _otel
from sepp_lite.testing import SeppTestServer

assert _otel.AVAILABLE is False
tc = sepp.TraceContext("%(traceparent)s")
assert sepp.TraceContext.from_current_otel() is None
assert tc.otel_span_context() is None
with tc.attach_to_otel() as value:
    assert value is None


async def main():
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            await client.enqueue_batch(
                [sepp.EnqueueRequest("q", "ok"), sepp.EnqueueRequest("q", "fail", max_attempts=1)]
            )
            worker = sepp.Worker(client, ["q"], 30)
            done = []

            async def ok(payload, ctx):
                done.append(ctx.trace_context)

            async def fail(payload, ctx):
                raise ValueError("boom")

            worker.handle("ok", ok).handle("fail", fail)
            await worker.run(until_idle=True)
            assert done == [None], done
            assert await client.reserve(sepp.ReserveOptions(["q"], 30, 0)) is None


asyncio.run(main())
assert not [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]
print("no-otel ok")
"""


def test_a_fresh_interpreter_that_cannot_import_opentelemetry() -> None:
    script = textwrap.dedent(_FRESH_INTERPRETER) % {"traceparent": TRACEPARENT}
    result = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no-otel ok"


# -- TraceContext validation: what sepp-py refuses, and only that ------------------------

_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
_SPAN = "00f067aa0ba902b7"
TRACEPARENTS = [
    # valid: the version value is not checked, uppercase is allowed
    (f"00-{_ID}-{_SPAN}-01", True),
    (f"00-{_ID}-{_SPAN}-00", True),
    (f"00-{_ID.upper()}-{_SPAN.upper()}-0A", True),
    (f"ff-{_ID}-{_SPAN}-ff", True),
    (f"7e-{_ID}-{_SPAN}-09", True),
    (f"00-{'0' * 31}1-{'0' * 15}1-01", True),
    # invalid
    ("", False),
    ("-".join(["00", _ID, _SPAN]), False),
    (f"00-{_ID}-{_SPAN}-01-extra", False),
    (f"00-{_ID}-{_SPAN}-01-", False),
    (f"0-{_ID}-{_SPAN}-01", False),
    (f"000-{_ID}-{_SPAN}-01", False),
    (f"00-{_ID[:-1]}-{_SPAN}-01", False),
    (f"00-{_ID}0-{_SPAN}-01", False),
    (f"00-{_ID}-{_SPAN[:-1]}-01", False),
    (f"00-{_ID}-{_SPAN}0-01", False),
    (f"00-{_ID}-{_SPAN}-1", False),
    (f"00-{_ID}-{_SPAN}-001", False),
    (f"00-{'0' * 32}-{_SPAN}-01", False),
    (f"00-{_ID}-{'0' * 16}-01", False),
    (f"00-{'0' * 32}-{'0' * 16}-01", False),
    (f"00-{_ID[:-1]}g-{_SPAN}-01", False),
    (f"00-{_ID}-{_SPAN[:-1]}z-01", False),
    (f"0x-{_ID}-{_SPAN}-01", False),
    (f"00-{_ID}-{_SPAN}-0-", False),
    (f" 00-{_ID}-{_SPAN}-01", False),
    (f"00-{_ID}-{_SPAN}-01\n", False),
    (f"00_{_ID}_{_SPAN}_01", False),
    (f"00-{_ID[:-1]}\u0661-{_SPAN}-01", False),  # a non-ASCII digit
]


@pytest.mark.parametrize(("traceparent", "valid"), TRACEPARENTS)
def test_traceparent_validation(traceparent: str, valid: bool) -> None:
    if valid:
        assert TraceContext(traceparent).traceparent == traceparent
    else:
        with pytest.raises(TraceContextError, match="invalid traceparent"):
            TraceContext(traceparent)
    assert issubclass(TraceContextError, ValueError)


@pytest.mark.parametrize(("traceparent", "valid"), TRACEPARENTS)
def test_traceparent_validation_matches_sepp_py(traceparent: str, valid: bool) -> None:
    official = pytest.importorskip("sepp.types", reason="sepp-py: no wheels for this interpreter")
    try:
        official.TraceContext(traceparent)
    except official.TraceContextError:
        official_valid = False
    else:
        official_valid = True
    assert official_valid is valid
