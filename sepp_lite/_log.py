"""sepp_lite's logger: the stdlib ``sepp_lite`` logger, which also records each call as
an event on the current OpenTelemetry span when there is one (as sepp-py's logger does).

Every module of the package that logs takes its logger from :func:`logger`; records
go to ``logging.getLogger("sepp_lite")`` whatever OpenTelemetry does.
"""

from __future__ import annotations

import logging
from typing import Any, Union

from sepp_lite import _otel

__all__ = ["SpanEventLogger", "logger"]

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
