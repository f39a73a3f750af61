"""Keep credentials out of third-party debug logs.

hpack logs every header it encodes or decodes at DEBUG: hpack 4.1 (what Python 3.9 and
PyPy 3.9 get) prints never-indexed values in clear, and every version prints raw header
blocks. A filter on hpack's loggers rewrites those records' arguments, so an
``authorization`` value, or a header block that may hold one, never reaches a handler.
"""

from __future__ import annotations

import logging

_SECRET_NAMES = frozenset({b"authorization", "authorization"})
_HPACK_LOGGERS = ("hpack.hpack", "hpack.table")


def _redacted(value: object) -> object:
    if isinstance(value, tuple) and len(value) == 2 and value[0] in _SECRET_NAMES:
        return (value[0], "<redacted>")
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) > 32:
        return f"<{len(value)}-byte header block, not logged>"
    return value


class RedactHeaders(logging.Filter):
    """Rewrites hpack's DEBUG records: secret headers and raw header blocks are hidden."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(arg) for arg in record.args)
        return True


_FILTER = RedactHeaders()


def protect_credentials_in_logs() -> None:
    """Install the filter on hpack's loggers (idempotent); called wherever an API key
    is in play, by the client and by the in-process server."""
    for name in _HPACK_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
