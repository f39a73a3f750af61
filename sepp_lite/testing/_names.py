"""Queue-name rules and Rust ``{:?}`` string quoting, shared by the config and the
state machine so that declared names and request names follow one rule."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable
from typing import Optional

__all__ = ["queue_name_error", "rust_debug", "rust_debug_list"]

_SIMPLE_ESCAPES = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"'}


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


def _escape(char: str) -> str:
    simple = _SIMPLE_ESCAPES.get(char)
    if simple is not None:
        return simple
    if " " <= char <= "~":
        return char
    # Rust escapes grapheme extenders and non-printable chars as \u{hex}.
    if not char.isprintable() or unicodedata.category(char) in ("Mn", "Me"):
        return f"\\u{{{ord(char):x}}}"
    return char


def rust_debug(text: str) -> str:
    """``text`` quoted the way Rust's ``{:?}`` prints a string."""
    return '"' + "".join(_escape(c) for c in text) + '"'


def rust_debug_list(items: Iterable[str]) -> str:
    """A list of strings as Rust's ``{:?}`` prints a ``Vec<&str>``: ``["a", "b"]``."""
    return "[" + ", ".join(rust_debug(item) for item in items) + "]"
