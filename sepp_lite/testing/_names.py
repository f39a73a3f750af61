"""Queue-name rules and Rust ``{:?}`` string quoting, shared by the config and the
state machine so that declared names and request names follow one rule (the client's
own, from ``sepp_lite._validate``)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from sepp_lite._validate import queue_name_error

__all__ = ["queue_name_error", "rust_debug", "rust_debug_list"]

_SIMPLE_ESCAPES = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"'}


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
