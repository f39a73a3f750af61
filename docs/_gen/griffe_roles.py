"""A griffe extension for the API reference: sepp_lite's docstrings cross-reference with
Sphinx roles (:class:`~sepp_lite.errors.SeppError`, :meth:`reserve`), which Markdown
would print as they are. Each becomes a code span of the name a reader sees: the last
part after a leading ``~``, the whole target otherwise. A paragraph ending in reST's
``::`` loses it (the indented block after it is Markdown code already). Double-backtick
literals are Markdown code spans already."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|exc|data|mod|obj|const):`([^`]+)`")


def plain(text: str) -> str:
    """The text with every role replaced by a code span."""

    def span(match: re.Match[str]) -> str:
        target = match.group(1)
        if target.startswith("~"):
            target = target[1:].rsplit(".", 1)[-1]
        return f"`{target}`"

    text = _ROLE.sub(span, text)
    # reST's literal-block marker: Markdown takes the indented block after it as code
    # already, so a line of "::" goes and a paragraph's closing "::" becomes ":".
    text = re.sub(r"^[ \t]*::[ \t]*$\n?", "", text, flags=re.MULTILINE)
    return re.sub(r"(\S)::$", r"\1:", text, flags=re.MULTILINE)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
