"""sepp_lite's logging: the stdlib ``sepp_lite`` logger, which also records each call
as an event on the current OpenTelemetry span when there is one (as sepp-py's logger
does); the job a record is emitted for (:data:`CURRENT_JOB`); and the formatters that
show it, :class:`JsonLogFormatter` (public) and the command line's text format.

Every module of the package that logs takes its logger from :func:`logger`; records
go to ``logging.getLogger("sepp_lite")`` whatever OpenTelemetry does.
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any, Optional, Protocol, Union

from sepp_lite import _otel

__all__ = [
    "CURRENT_JOB",
    "JobFields",
    "JsonLogFormatter",
    "SpanEventLogger",
    "TextLogFormatter",
    "WORKFLOW_ROOT_ENTRY",
    "logger",
]


class JobFields(Protocol):
    """What a log record shows of the job it is emitted for (a ``JobCtx`` is one;
    declared here because the value types are drawn above this module)."""

    @property
    def id(self) -> str: ...

    @property
    def job_type(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def trace_context(self) -> Optional[_otel.TraceHeaders]: ...


WORKFLOW_ROOT_ENTRY = "sepp.workflow.root"
"""The custom entry that names the workflow a job is a step of (``sepp_lite.tasks``
writes it; the JSON log lines show it as ``workflow_root``)."""

CURRENT_JOB: contextvars.ContextVar[Optional[JobFields]] = contextvars.ContextVar(
    "sepp_lite_job", default=None
)
"""The job whose handler runs in this context, or None. The Worker sets it first thing
in each job's task: a task runs in a context of its own, so nothing needs resetting, and
what the handler starts from there (its tasks, a plain ``def`` in the worker's threads)
inherits it with the context."""

# OpenTelemetry's severity numbers for the stdlib levels (as sepp-py records them).
_SEVERITY = {
    logging.DEBUG: 5,
    logging.INFO: 9,
    logging.WARNING: 13,
    logging.ERROR: 17,
    logging.CRITICAL: 21,
}


class SpanEventLogger:
    """The ``sepp_lite`` logger that also records each call as an event on the current
    recording span (name ``""``, attributes ``event.name="log"``, ``log.severity`` and
    ``log.message``), as sepp-py's logger does, whatever the logger's level. Only the
    calls sepp_lite makes are offered."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def isEnabledFor(self, level: int) -> bool:
        """Whether the wrapped logger passes ``level`` (a message that costs something
        to build is skipped when not: span events are not worth building it for)."""
        return self._logger.isEnabledFor(level)

    def debug(self, msg: str, *args: object, **kwargs: Any) -> None:
        self._log(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: str, *args: object, **kwargs: Any) -> None:
        self._log(logging.INFO, msg, args, kwargs)

    def warning(self, msg: str, *args: object, **kwargs: Any) -> None:
        self._log(logging.WARNING, msg, args, kwargs)

    def error(self, msg: str, *args: object, **kwargs: Any) -> None:
        self._log(logging.ERROR, msg, args, kwargs)

    def _log(self, level: int, msg: str, args: tuple[object, ...], kwargs: Any) -> None:
        # stacklevel 3: the record names sepp_lite's caller, not this wrapper.
        self._logger.log(level, msg, *args, stacklevel=3, **kwargs)
        span = _otel.recording_span()
        if span is None:
            return
        try:
            message = msg % args if args else msg
        except Exception:  # a bad argument must not break the caller (logging's own rule)
            message = msg
        attributes: dict[str, Any] = {
            "event.name": "log",
            "log.severity": _SEVERITY[level],
            "log.message": message,
        }
        span.add_event("", attributes)


def logger() -> Union[logging.Logger, SpanEventLogger]:
    """sepp_lite's logger: the plain ``sepp_lite`` logger without OpenTelemetry, else
    one that mirrors its records onto the current span."""
    plain = logging.getLogger("sepp_lite")
    return SpanEventLogger(plain) if _otel.AVAILABLE else plain


# -- formatters ----------------------------------------------------------------------

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A record of the application's own, emitted while a job runs: the job named as celery
# names its task (type[id]) between the logger and the message.
_TEXT_FORMAT_IN_JOB = "%(asctime)s %(levelname)s %(name)s %(sepp_job)s: %(message)s"


def _sepp_lites(record: logging.LogRecord) -> bool:
    """Whether sepp_lite logged ``record`` (its lines about a job name the job)."""
    name = record.name
    return name == "sepp_lite" or name.startswith("sepp_lite.")


class TextLogFormatter(logging.Formatter):
    """The command line's text format, ``TIME LEVEL LOGGER: MESSAGE``; a record that
    the application's own code emits while a job runs also names the job, ``LOGGER
    TYPE[JOB_ID]: MESSAGE`` (sepp_lite's own lines about a job name it in their words).
    """

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        job = CURRENT_JOB.get()
        if job is None or _sepp_lites(record):
            return super().formatMessage(record)
        return _TEXT_FORMAT_IN_JOB % dict(vars(record), sepp_job=f"{job.job_type}[{job.id}]")


class JsonLogFormatter(logging.Formatter):
    """Formats a record as one line of JSON, for log pipelines: ``time`` (RFC 3339,
    UTC, milliseconds), ``level``, ``logger``, ``message`` (with its arguments),
    ``exception`` (the traceback, when the record has one) and ``stack`` (with
    ``stack_info``). A record emitted while a job runs (sepp_lite's and the
    handler's own, also from a plain ``def`` handler in the worker's threads) adds
    ``job_id``, ``job_type``, ``queue`` and ``attempt``, and ``workflow_root`` for a
    step of a workflow (its root id); ``trace_id`` is the current
    OpenTelemetry span's when there is one, else that of the trace context the job
    carries.

    Use it as any formatter (``handler.setFormatter(JsonLogFormatter())``, or
    ``"()": "sepp_lite.JsonLogFormatter"`` in a ``dictConfig``); its arguments are
    ``logging.Formatter``'s and change nothing. The job's fields are read when the
    record is formatted: give it to a handler that formats in the thread that logs
    (the standard handlers do; for a ``QueueHandler``, set it on the ``QueueHandler``).
    """

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": _utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        job = CURRENT_JOB.get()
        if job is not None:
            fields["job_id"] = job.id
            fields["job_type"] = job.job_type
            fields["queue"] = job.queue
            fields["attempt"] = job.attempt
            root = getattr(job, "custom", {}).get(WORKFLOW_ROOT_ENTRY)
            if root is not None:
                fields["workflow_root"] = root
        trace_id = _trace_id(job)
        if trace_id is not None:
            fields["trace_id"] = trace_id
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)  # cached, as logging does
        if record.exc_text:
            fields["exception"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        import json  # here: `import sepp_lite` does not need it

        return json.dumps(fields)


def _utc_time(created: float) -> str:
    """``2030-01-02T03:04:05.678Z`` (RFC 3339, UTC, milliseconds)."""
    seconds = int(created)
    millis = min(int((created - seconds) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _trace_id(job: Optional[JobFields]) -> Optional[str]:
    """The current span's trace id, else that of the job's trace context (a valid
    ``traceparent`` is ``version-trace_id-parent_id-flags``)."""
    trace_id = _otel.current_trace_id()
    if trace_id is None and job is not None and job.trace_context is not None:
        trace_id = job.trace_context.traceparent.split("-")[1]
    return trace_id
