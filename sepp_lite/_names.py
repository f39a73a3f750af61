"""The server's queue-name rule, one function for the client (reserve, drain) and the
in-process server (declared names and request names)."""

from __future__ import annotations

import functools
from typing import Optional

__all__ = ["is_control", "queue_name_error"]


def is_control(char: str) -> bool:
    """Unicode general category Cc, as Rust's ``char::is_control``."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F


# Producers repeat a handful of queue names; checking each once per name is enough.
@functools.lru_cache(maxsize=4096)
def queue_name_error(name: str) -> Optional[str]:
    """Why ``name`` is not a valid queue name (the message tail after the field name),
    or ``None`` when it is valid."""
    if not name:
        return "must not be empty"
    if name in (".", ".."):
        return 'must not be "." or ".."'
    if "/" in name:
        return "must not contain '/'"
    if any(is_control(c) for c in name):
        return "must not contain control characters"
    return None
