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
# hpack messages whose first argument is a whole header block: once the other headers
# are indexed, a block is little more than the (Huffman-coded) authorization value, so
# a block of any size may hold a credential.
_BLOCK_MESSAGES = frozenset({"Encoded header block to %s", "Decoding %s"})
_BYTES = (bytes, bytearray, memoryview)


def _redacted(value: object) -> object:
    if isinstance(value, tuple) and len(value) == 2 and value[0] in _SECRET_NAMES:
        return (value[0], "<redacted>")
    if isinstance(value, _BYTES) and len(value) > 32:
        return f"<{len(value)}-byte header block, not logged>"
    return value


class RedactHeaders(logging.Filter):
    """Rewrites hpack's DEBUG records: secret headers and raw header blocks are hidden."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or not args:
            return True
        if record.msg in _BLOCK_MESSAGES and isinstance(args[0], _BYTES):
            args = (f"<{len(args[0])}-byte header block, not logged>", *args[1:])
        elif len(args) >= 2 and isinstance(args[0], (bytes, str)) and args[0] in _SECRET_NAMES:
            # "Adding %s=%s ...": hpack 4.1 shows a never-indexed value in clear.
            args = (args[0], "<redacted>", *args[2:])
        record.args = tuple(_redacted(arg) for arg in args)
        return True


_FILTER = RedactHeaders()


def protect_credentials_in_logs() -> None:
    """Install the filter on hpack's loggers (idempotent); called wherever an API key
    is in play, by the client and by the in-process server."""
    for name in _HPACK_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
