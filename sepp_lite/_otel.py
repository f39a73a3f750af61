"""Optional OpenTelemetry tracing: the client's and the worker's spans and the W3C trace
context. Every entry point degrades to a cheap no-op when ``opentelemetry-api`` (the
``otel`` extra) is not installed; the application owns the tracer/meter providers and
exporters. The worker's metrics are an observer of their own (``_otel_metrics.py``), and
the logger that mirrors records onto spans is ``_log.py``.

Trace context travels in W3C format through an explicit TraceContext propagator (not the
global one), as the official clients do, so mixed fleets link up.

OpenTelemetry installed but not in use (no tracer provider set, nothing in the current
context: the usual state when a dependency pulls the API in) costs each hook one test,
:func:`unused`, and then the same no-op path as without it. What the API would have
done there (no-op spans, nothing to inject) is observably the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    AVAILABLE = False
else:
    AVAILABLE = True
    _PROPAGATOR = TraceContextTextMapPropagator()


if not AVAILABLE:

    def unused() -> bool:
        """Whether OpenTelemetry does nothing here (see below): without it, always."""
        return True

elif hasattr(otel_trace, "_TRACER_PROVIDER"):

    def unused() -> bool:
        """Whether OpenTelemetry does nothing here: no tracer provider is set and the
        current OpenTelemetry context is empty (no span, local or remote, that a call
        must parent on and propagate). A span would then be the API's no-op with
        nothing to inject, so the hooks make none: telemetry nobody collects costs
        this test per call, not a span (issue 38)."""
        # The API's own test: its proxy tracer (ours, unless a provider was set before
        # this module was imported) delegates to a real tracer once this global is set,
        # and to its no-op tracer until then. The public get_tracer_provider() would
        # tell too, at fifty times the cost (an os.environ miss, a KeyError, each call).
        return otel_trace._TRACER_PROVIDER is None and not otel_context.get_current()

else:

    def unused() -> bool:
        """Whether OpenTelemetry does nothing here: never said for an API without the
        global read above (the full path always: correct, only not free)."""
        return False


def current_headers() -> tuple[str, str | None] | None:
    """``(traceparent, tracestate)`` of the current context, or ``None`` when there is
    no valid span (or no OpenTelemetry). ``tracestate`` is ``None`` when empty."""
    if not AVAILABLE or unused():
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    return traceparent, carrier.get("tracestate") or None


class TraceHeaders(Protocol):
    """The W3C headers of a trace context, as the helpers below read them. Declared here
    rather than imported: :class:`sepp_lite.types.TraceContext` (which is one) calls this
    module, so this module must not need the value types."""

    @property
    def traceparent(self) -> str: ...

    @property
    def tracestate(self) -> str | None: ...


def _extract(tc: TraceHeaders) -> Any:
    carrier = {"traceparent": tc.traceparent}
    if tc.tracestate is not None:
        carrier["tracestate"] = tc.tracestate
    return _PROPAGATOR.extract(carrier)


@contextlib.contextmanager
def attach_trace_context(tc: TraceHeaders) -> Iterator[None]:
    """Make ``tc`` the current OpenTelemetry context inside the ``with`` block."""
    if not AVAILABLE:
        yield
        return
    token = otel_context.attach(_extract(tc))
    try:
        yield
    finally:
        otel_context.detach(token)


def span_context_of(tc: TraceHeaders) -> Any:
    """``tc`` as a valid OpenTelemetry ``SpanContext``, else ``None``."""
    if not AVAILABLE:
        return None
    span_context = otel_trace.get_current_span(_extract(tc)).get_span_context()
    return span_context if span_context.is_valid else None


if AVAILABLE:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from sepp_lite._version import __version__

    _TRACER = otel_trace.get_tracer("sepp_lite", __version__)


class _NoSpan:
    """What the span helpers return when OpenTelemetry is :func:`unused`: a shared,
    allocation-free context manager that yields ``None`` (cheaper than a generator-based
    one)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


@contextlib.contextmanager
def _span(name: str, kind: Any, attributes: dict[str, Any] | None, links: Any) -> Iterator[Any]:
    # The SDK's own exception handling is off: depending on the API version it also
    # flags BaseExceptions, and a cancelled call (a reserve cut short by shutdown) is
    # not a failure. Exceptions are recorded here instead.
    with _TRACER.start_as_current_span(
        name,
        kind=kind,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as error:
            mark_error(span, error)
            raise


def client_span(
    name: str, attributes: dict[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A CLIENT span around one logical call (all its retries); yields the span (or
    ``None`` when OpenTelemetry is :func:`unused`) so the caller can add
    attributes. An exception escaping the block (not a cancellation) marks the span as
    an error."""
    if not AVAILABLE or unused():  # AVAILABLE first: without it, not even a call
        return _NO_SPAN
    return _span(name, SpanKind.CLIENT, attributes, None)


def call_metadata() -> tuple[tuple[str, str], ...]:
    """``traceparent`` (and ``tracestate``) of the current context, for RPC metadata."""
    headers = current_headers()
    if headers is None:
        return ()
    traceparent, tracestate = headers
    if tracestate:
        return (("traceparent", traceparent), ("tracestate", tracestate))
    return (("traceparent", traceparent),)


def mark_error(span: Any, error: BaseException | str) -> None:
    """Set ERROR status on ``span`` (a no-op for ``None``): for an exception, also
    record it as an event; a str is the status description."""
    if span is None:
        return
    if isinstance(error, str):
        span.set_status(Status(StatusCode.ERROR, error))
        return
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def consumer_span(
    job_id: str, job_type: str, attempt: int, producer: TraceHeaders | None
) -> contextlib.AbstractContextManager[Any]:
    """The CONSUMER span ``sepp.process`` around one job's handler and its ack/nack,
    linked (not parented) to the producer's span when the job carries a valid trace
    context. Yields the span, or ``None`` when OpenTelemetry is :func:`unused`."""
    if not AVAILABLE or unused():
        return _NO_SPAN
    links = []
    if producer is not None:
        span_context = span_context_of(producer)
        if span_context is not None:
            links.append(otel_trace.Link(span_context))
    attributes: dict[str, Any] = {
        "sepp.job_id": job_id,
        "sepp.job_type": job_type,
        "sepp.attempt": attempt,
    }
    return _span("sepp.process", SpanKind.CONSUMER, attributes, links)


def current_trace_id() -> str | None:
    """The trace id (32 hex digits) of the current span when it is valid, else ``None``
    (always ``None`` without OpenTelemetry): for structured log records."""
    if not AVAILABLE or unused():
        return None
    span_context = otel_trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def recording_span() -> Any:
    """The current span when it is recording, else ``None`` (always ``None`` without
    OpenTelemetry): where a log record becomes an event (``sepp_lite._log``)."""
    if not AVAILABLE or unused():
        return None
    span = otel_trace.get_current_span()
    return span if span.is_recording() else None
