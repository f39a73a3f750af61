"""One OpenTelemetry SDK setup shared by every OTel test in the process.

The global TracerProvider and MeterProvider can be set only once per process, so the
first :func:`telemetry` call installs an SDK ``TracerProvider`` (exporting to an
``InMemorySpanExporter``) and a ``MeterProvider`` (read by an ``InMemoryMetricReader``),
and every later call returns the same pair. ``sepp_lite._otel`` gets its tracer at
import through ``get_tracer`` (a proxy that follows the global provider once it is
set) and ``WorkerMetrics`` gets its meter when a Worker is built, so both see them.

Spans reach the exporter only while a test is capturing (:meth:`Telemetry.capture`),
so tests of other modules that run after the provider is installed leave nothing
behind. Metrics are cumulative: tests compare snapshots (:meth:`Telemetry.metrics`).

Imports the SDK: import this module only where ``opentelemetry.sdk`` is installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, format_span_id, format_trace_id

import sepp_lite

MetricKey = tuple[str, frozenset[tuple[str, Any]]]


class _GatedExport(SpanProcessor):
    """Exports each finished span to ``exporter`` synchronously, while ``on``."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.exporter.export((span,))


class Telemetry:
    """The process-wide SDK providers and what they collected."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self._gate = _GatedExport(self.exporter)
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(self._gate)
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        # The test's own spans ("the application"), in a scope of their own.
        self.tracer = self.tracer_provider.get_tracer("tests.app")

    @contextlib.contextmanager
    def capture(self) -> Iterator[Telemetry]:
        """Collect the spans that end inside the block (starting from none)."""
        self.exporter.clear()
        self._gate.on = True
        try:
            yield self
        finally:
            self._gate.on = False
            self.exporter.clear()

    # -- spans ------------------------------------------------------------------------

    def spans(self, name: Optional[str] = None, scope: Optional[str] = None) -> list[ReadableSpan]:
        """Finished spans in the order they ended, optionally by name and scope."""
        found = []
        for span in self.exporter.get_finished_spans():
            if name is not None and span.name != name:
                continue
            if scope is not None and (
                span.instrumentation_scope is None or span.instrumentation_scope.name != scope
            ):
                continue
            found.append(span)
        return found

    def span(self, name: str, scope: Optional[str] = "sepp_lite") -> ReadableSpan:
        """The one finished span called ``name`` (in sepp_lite's scope by default)."""
        found = self.spans(name, scope)
        assert len(found) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return found[0]

    def names(self) -> list[str]:
        return [span.name for span in self.exporter.get_finished_spans()]

    # -- metrics ----------------------------------------------------------------------

    def metrics(self, scope: str = "sepp", version: Optional[str] = None) -> dict[MetricKey, Any]:
        """``{(name, attributes): value}`` of sepp_lite's worker instruments (meter
        ``sepp`` at sepp_lite's version, so sepp-py's meter of the same name is apart),
        cumulative since the provider was installed."""
        version = sepp_lite.__version__ if version is None else version
        values: dict[MetricKey, Any] = {}
        for name, _, point in self._points(scope, version):
            values[(name, frozenset(point.attributes.items()))] = point.value
        return values

    def instruments(self, scope: str = "sepp") -> dict[str, Any]:
        """``{name: data}`` (the SDK's ``Sum``/``Gauge``/... of each instrument)."""
        found: dict[str, Any] = {}
        for name, data, _ in self._points(scope, sepp_lite.__version__):
            found[name] = data
        return found

    def _points(self, scope: str, version: str) -> Iterator[tuple[str, Any, Any]]:
        data = self.reader.get_metrics_data()
        if data is None:
            return
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                if (scope_metrics.scope.name, scope_metrics.scope.version) != (scope, version):
                    continue
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        yield metric.name, metric.data, point


_TELEMETRY: Optional[Telemetry] = None


def telemetry() -> Telemetry:
    """The process-wide :class:`Telemetry`, installed as the global providers on first
    use. Fails loudly if someone else installed global providers first."""
    global _TELEMETRY
    if _TELEMETRY is None:
        state = Telemetry()
        trace.set_tracer_provider(state.tracer_provider)
        metrics.set_meter_provider(state.meter_provider)
        if trace.get_tracer_provider() is not state.tracer_provider:
            raise RuntimeError("another global TracerProvider was installed before the tests'")
        if metrics.get_meter_provider() is not state.meter_provider:
            raise RuntimeError("another global MeterProvider was installed before the tests'")
        _TELEMETRY = state
    return _TELEMETRY


def delta(before: dict[MetricKey, Any], after: dict[MetricKey, Any]) -> dict[MetricKey, Any]:
    """What changed between two :meth:`Telemetry.metrics` snapshots (zero changes out)."""
    changes = {}
    for key in set(before) | set(after):
        change = after.get(key, 0) - before.get(key, 0)
        if change:
            changes[key] = change
    return changes


def key(name: str, **attributes: Any) -> MetricKey:
    return (name, frozenset(attributes.items()))


def traceparent_of(context: SpanContext) -> str:
    """The W3C traceparent a span context serialises to."""
    flags = f"{int(context.trace_flags):02x}"
    return f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}-{flags}"


def link_targets(span: ReadableSpan) -> list[tuple[int, int]]:
    """``(trace_id, span_id)`` of every link of ``span``."""
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def parent_id(span: ReadableSpan) -> Optional[int]:
    return None if span.parent is None else span.parent.span_id


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[str]:
    """Names of the spans in ``spans`` whose parent is ``parent``."""
    assert parent.context is not None
    return [span.name for span in spans if parent_id(span) == parent.context.span_id]
