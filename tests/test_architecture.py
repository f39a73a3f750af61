"""ARCHITECTURE.md names files, modules, functions and call signatures: each one must
be there, as written, in this repository (a renamed function or a moved file fails
here, and so does a path outside the repository)."""

from __future__ import annotations

import importlib
import inspect
import re
from functools import cache
from pathlib import Path
from typing import Any, Optional

import pytest

import sepp_lite
from sepp_lite import _transport
from sepp_lite.testing import SeppTestServer
from tests.repo_files import repo_files

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "ARCHITECTURE.md").read_text()
# Inline code spans and the lines of the fenced blocks' drawings are both "mentions".
SPANS = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", TEXT, flags=re.S))
# A file or a folder (``sepp_lite.proto``, the module, is a dotted name, not a file).
FILE = re.compile(r"^[\w./-]+(\.py|\.txt|\.md|/)$|^[\w.-]*/[\w./-]+\.proto$")
CALL = re.compile(r"^(?:await )?([\w.]+)\(([\w, .]*)\)(?:\.\w+\(\))?$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
SNAKE = re.compile(r"^_?[a-z]+(_[a-z0-9]+)+$")

# The instances the page calls methods on, by their usual variable names.
INSTANCES = {"client": "SeppClient", "tasks": "Tasks", "worker": "Worker"}
# What a bare name in a call stands for.
CALLABLES: dict[str, Any] = {
    "Worker": sepp_lite.Worker,
    "client.enqueue_batch": sepp_lite.SeppClient.enqueue_batch,
    "Transport.unary": _transport.Transport.unary,
    "before_call": SeppTestServer.before_call,
}


@cache
def tracked_files() -> tuple[str, ...]:
    return repo_files()


@cache
def python_source() -> str:
    return "\n".join((ROOT / f).read_text() for f in tracked_files() if f.endswith(".py"))


def in_repository(mention: str) -> bool:
    """A path as the page writes it: from the root, or relative to the room it is
    in (``_frames.py`` in ``_http2/``), so it must end a tracked path."""
    if mention.endswith("/"):
        return any(f.startswith(mention) or f"/{mention}" in f for f in tracked_files())
    return any(f == mention or f.endswith(f"/{mention}") for f in tracked_files())


def resolve(dotted: str) -> Optional[object]:
    """``errors.map_failure``, ``_observe.WorkerObserver``, ``SeppClient.reserve``,
    ``sepp_lite.proto``: a module of sepp_lite or a public name, then attributes."""
    head, *rest = dotted.split(".")
    start: object
    if head == "sepp_lite":
        start = sepp_lite
    elif hasattr(sepp_lite, head):
        start = getattr(sepp_lite, head)
    else:
        try:
            start = importlib.import_module(f"sepp_lite.{head}")
        except ImportError:
            return None
    for name in rest:
        if inspect.ismodule(start) and not hasattr(start, name):
            try:
                start = importlib.import_module(f"{start.__name__}.{name}")
                continue
            except ImportError:
                return None
        if not hasattr(start, name):
            return None
        start = getattr(start, name)
    return start


def test_every_path_it_names_is_in_the_repository() -> None:
    paths = [span for span in SPANS if FILE.match(span)]
    assert "proto/sepp/v1/queue.proto" in paths and "tests/test_import_cycles.py" in paths
    assert [path for path in paths if not in_repository(path)] == []
    # The check does fail on a path outside the repository.
    assert not in_repository("shared/spec/server-semantics.md")


def test_every_dotted_name_it_names_exists() -> None:
    dotted = [s for s in SPANS if DOTTED.match(s) and not FILE.match(s) and "/" not in s]
    dotted = [s for s in dotted if s.split(".")[-1] not in ("py", "md", "txt", "proto")]
    assert "errors.map_failure" in dotted and "SeppClient.extend_lease" in dotted
    assert [name for name in dotted if resolve(name) is None] == []
    assert resolve("errors.no_such_function") is None


def test_every_snake_case_name_it_names_is_in_the_source() -> None:
    names = sorted({s for s in SPANS if SNAKE.match(s)})
    assert "encode_nack_request" in names and "is_permanent" in names
    source = python_source()
    missing = [name for name in names if not re.search(rf"\b{name}\b", source)]
    assert missing == []


def call_mentions() -> list[tuple[str, list[str]]]:
    found = []
    for span in SPANS:
        match = CALL.match(span)
        if match:
            args = [a.strip() for a in match.group(2).split(",") if a.strip()]
            found.append((match.group(1), args))
    return found


def test_every_function_it_names_with_empty_parentheses_exists() -> None:
    """``tasks.worker()``, ``run()``, ``dataclass()``: a name, not a signature."""
    names = [name for name, args in call_mentions() if not args]
    assert "dataclass" in names
    source = python_source()

    def found(name: str) -> bool:
        head, _, rest = name.partition(".")
        if rest and head in INSTANCES:
            return resolve(f"{INSTANCES[head]}.{rest}") is not None
        return resolve(name) is not None or bool(re.search(rf"\b(def|import) {name}\b", source))

    missing = [name for name in names if not found(name)]
    assert not found("tasks.no_such_method")
    assert missing == []


@pytest.mark.parametrize(("name", "args"), [(n, a) for n, a in call_mentions() if a])
def test_every_signature_it_shows_matches_the_code(name: str, args: list[str]) -> None:
    """``Worker(client, queues, lease_duration, ...)``: the parameters it lists are the
    first ones of the code's, in that order (``...`` stands for the rest)."""
    assert name in CALLABLES, f"{name}(...) is shown: add what it stands for to CALLABLES"
    target = CALLABLES[name]
    parameters = [
        p.name
        for p in inspect.signature(target).parameters.values()
        if p.name != "self" and p.kind is not p.VAR_KEYWORD
    ]
    listed = [a for a in args if a != "..."]
    assert listed == parameters[: len(listed)], f"{name}({', '.join(args)}) vs {parameters}"
    if "..." not in args:
        required = [
            p.name
            for p in inspect.signature(target).parameters.values()
            if p.name != "self" and p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        assert set(required) <= set(listed), f"{name} also needs {required}"


def test_the_page_shows_the_worker_as_it_is_constructed() -> None:
    """It showed ``Worker(client, handlers, ...)``; the handlers are registered after."""
    worker = [p for p in inspect.signature(sepp_lite.Worker).parameters]
    assert worker[:3] == ["client", "queues", "lease_duration"]
    assert ("Worker", ["client", "queues", "lease_duration", "..."]) in call_mentions()
