"""Optional OpenTelemetry support. Every entry point degrades to a cheap no-op when
``opentelemetry-api`` (the ``otel`` extra) is not installed; the application owns the
tracer/meter providers and exporters.

Trace context travels in W3C format through an explicit TraceContext propagator (not the
global one), as the official clients do, so mixed fleets link up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sepp_lite.types import TraceContext

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    AVAILABLE = False
else:
    AVAILABLE = True
    _PROPAGATOR = TraceContextTextMapPropagator()


def current_headers() -> tuple[str, str | None] | None:
    """``(traceparent, tracestate)`` of the current context, or ``None`` when there is
    no valid span (or no OpenTelemetry). ``tracestate`` is ``None`` when empty."""
    if not AVAILABLE:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    return traceparent, carrier.get("tracestate") or None


def trace_context_from_current() -> TraceContext | None:
    headers = current_headers()
    if headers is None:
        return None
    from sepp_lite.types import TraceContext, TraceContextError

    try:
        return TraceContext(*headers)
    except TraceContextError:
        return None


def _extract(tc: TraceContext) -> Any:
    carrier = {"traceparent": tc.traceparent}
    if tc.tracestate is not None:
        carrier["tracestate"] = tc.tracestate
    return _PROPAGATOR.extract(carrier)


@contextlib.contextmanager
def attach_trace_context(tc: TraceContext) -> Iterator[None]:
    """Make ``tc`` the current OpenTelemetry context inside the ``with`` block."""
    if not AVAILABLE:
        yield
        return
    token = otel_context.attach(_extract(tc))
    try:
        yield
    finally:
        otel_context.detach(token)


def span_context_of(tc: TraceContext) -> Any:
    """``tc`` as a valid OpenTelemetry ``SpanContext``, else ``None``."""
    if not AVAILABLE:
        return None
    span_context = otel_trace.get_current_span(_extract(tc)).get_span_context()
    return span_context if span_context.is_valid else None
