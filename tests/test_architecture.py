"""ARCHITECTURE.md names files, modules, functions and call signatures: each one must
be there, as written, in this repository (a renamed function or a moved file fails
here, and so does a path outside the repository)."""

from __future__ import annotations

import ast
import importlib
import inspect
import operator
import re
from functools import cache
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import sepp_lite
from sepp_lite._wire import transport
from sepp_lite.testing import SeppTestServer
from tests.repo_files import repo_files
from tests.test_import_cycles import drawn_rooms, import_graph, modules_of, room_of

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
    "Transport.unary": transport.Transport.unary,
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
    in (``_frames.py`` in ``_wire/http2/``), so it must end a tracked path."""
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


# -- no module reads another module's private names --------------------------------------

PACKAGE = ROOT / "sepp_lite"
# NamedTuple's own API: the underscore only keeps it clear of field names.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# The private names sepp_lite reads of code that is not its own, each with its reason:
# (file, the expression as ast.unparse writes it) -> why.
GRPCLIB = "grpclib internals, documented where they are used"
TEST_SERVER = GRPCLIB + " (the test server: "
# from_channel: what a grpclib Channel was given, and its socket.
FROM_CHANNEL = "_wire/grpclib_transport.py"
ALLOWED_PRIVATE = {
    ("_caller_loop.py", "asyncio._get_running_loop"): "in asyncio.events.__all__: the "
    "check for a running loop that returns None instead of raising",
    ("sync.py", "asyncio._get_running_loop"): "as in _caller_loop.py",
    ("tasks/_convert.py", "getattr(typing.get_origin(hint), '_name')"): "typing's "
    "Required/NotRequired name themselves only there (Python 3.9 to 3.13)",
    (FROM_CHANNEL, "channel._ssl"): GRPCLIB + " (TLS or not)",
    (FROM_CHANNEL, "channel._authority"): GRPCLIB + " (the :authority header)",
    (FROM_CHANNEL, "getattr(channel, '_path')"): GRPCLIB + " (a label for errors)",
    (FROM_CHANNEL, "getattr(channel, '_host')"): GRPCLIB + " (the same)",
    (FROM_CHANNEL, "getattr(channel, '_port')"): GRPCLIB + " (the same)",
    (FROM_CHANNEL, "self.channel._protocol"): GRPCLIB + " (close: the socket)",
    (FROM_CHANNEL, "getattr(getattr(protocol, 'connection', None), '_transport')"): (
        GRPCLIB + " (the same)"
    ),
    (FROM_CHANNEL, "getattr(processor.connection, '_transport')"): GRPCLIB
    + " (corking the socket)",
    (FROM_CHANNEL, "getattr(connection, '_connection')"): GRPCLIB + " (h2's closed-stream memory)",
    (FROM_CHANNEL, "getattr(h2_connection, '_closed_streams')"): "h2's, the same",
    (FROM_CHANNEL, "getattr(closed, '_size_limit')"): "h2's, the same",
    (FROM_CHANNEL, "closed._size_limit"): "h2's, the same",
    ("testing/_service.py", "getattr(stream, '_stream')"): TEST_SERVER + "a reply written "
    "straight to the HTTP/2 stream)",
    ("testing/_service.py", "stream._send_initial_metadata_done"): TEST_SERVER + "the same)",
    ("testing/_service.py", "stream._send_message_done"): TEST_SERVER + "the same)",
    ("testing/_service.py", "stream._send_trailing_metadata_done"): TEST_SERVER + "the same)",
    ("testing/_service.py", "getattr(stream, '_method_name')"): TEST_SERVER + "the path of "
    "a held call)",
    ("testing/_service.py", "getattr(getattr(stream, 'peer', None), '_transport')"): (
        TEST_SERVER + "corking the socket)"
    ),
    ("_otel.py", "otel_trace._TRACER_PROVIDER"): "opentelemetry-api's global tracer "
    "provider, None until one is set: what its own proxy tracer reads to choose between "
    "the real and the no-op tracer (get_tracer_provider() costs fifty times as much)",
    ("_otel.py", "getattr(otel_trace, '_TRACER_PROVIDER')"): "the same (an API without "
    "it takes the full path)",
}
# Private methods a class overrides in a base class of another module: (file, class,
# method) -> why.
ALLOWED_OVERRIDES = {
    ("testing/_server.py", "_GrpcServer", "_protocol_factory"): TEST_SERVER + "it keeps "
    "its connections, to close them)",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_names(tree: ast.AST) -> set[str]:
    """The private names a module defines itself: its functions, classes, module and
    class attributes, what it imports, the attributes it sets on ``self``/``cls``, and
    the names in its ``__slots__``. Reading one of these on another object stays in the room."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.alias):
            own.add((node.asname or node.name).split(".")[0])
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            own.update(
                c.value
                for c in ast.walk(node.value)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
    return own


def _on_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_reads(source: str) -> list[str]:
    """``x._name`` and ``getattr(x, "_name")`` (also setattr, hasattr) in ``source``
    where ``x`` is not ``self``/``cls`` and the module does not define ``_name`` itself,
    and ``from sepp_lite.x import _name`` of a name that is not a module. A heuristic
    (it cannot know whose ``_name`` a same-named attribute is), strict on purpose."""
    tree = ast.parse(source)
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if not _on_self(node.value) and node.attr not in own | NAMEDTUPLE_API:
                found.append(ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and not _on_self(node.args[0])
        ):
            found.append(f"getattr({ast.unparse(node.args[0])}, {node.args[1].value!r})")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sepp_lite"):
            folder = ROOT.joinpath(*(node.module or "").split("."))
            for alias in node.names:
                is_module = (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir()
                if _is_private(alias.name) and not is_module:
                    found.append(f"from {node.module} import {alias.name}")
    return found


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts)


def test_no_module_reads_another_modules_private_names() -> None:
    seen: set[tuple[str, str]] = set()
    unexpected = []
    for path in package_files():
        name = path.relative_to(PACKAGE).as_posix()
        for expression in private_reads(path.read_text()):
            seen.add((name, expression))
            if (name, expression) not in ALLOWED_PRIVATE:
                unexpected.append(f"{name}: {expression}")
    assert unexpected == []
    # Every allowance is still needed (a fixed one is taken off the list).
    assert set(ALLOWED_PRIVATE) - seen == set()


def test_the_private_name_check_finds_what_it_should() -> None:
    """The Worker's event hook as monitor.py once reached it, a private function
    imported across rooms, a getattr by name; and not what a room does with its own."""
    assert private_reads("self._worker._observe(self)") == ["self._worker._observe"]
    assert private_reads("from sepp_lite.worker import _failure") == [
        "from sepp_lite.worker import _failure"
    ]
    assert private_reads("from sepp_lite import _otel") == []  # a private module is fine
    assert private_reads("getattr(stream, '_stream', None)") == ["getattr(stream, '_stream')"]
    own = "class A:\n    def __init__(self):\n        self._x = 1\ndef f(a):\n    return a._x\n"
    assert private_reads(own) == []
    assert private_reads("p._replace(a=1)") == []


def private_overrides() -> set[tuple[str, str, str]]:
    """(file, class, method): a ``def _name`` in a class body that overrides a method
    of a base class defined in another module."""
    found = set()
    for path in package_files():
        if path.name == "__main__.py":
            continue  # running it is the command line
        name = path.relative_to(PACKAGE).as_posix()
        module_name = ".".join(("sepp_lite", *path.relative_to(PACKAGE).with_suffix("").parts))
        module = importlib.import_module(module_name.removesuffix(".__init__"))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(module, node.name, None)
            if not inspect.isclass(cls):
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(
                    item.name
                ):
                    bases = [b for b in cls.__mro__[1:] if item.name in vars(b)]
                    if any(b.__module__ != cls.__module__ for b in bases):
                        found.add((name, node.name, item.name))
    return found


def test_no_class_overrides_a_private_method_of_another_module() -> None:
    """A subclass in another room hooks in through a named seam (``_supervisor.py``
    once overrode ``WorkerMonitor._beat``; it now passes ``on_beat``)."""
    assert private_overrides() == set(ALLOWED_OVERRIDES)


# -- HPACK stays inside _wire/http2 ----------------------------------------------------

_HEADER_NAME = re.compile(rb"^:?[a-z0-9][a-z0-9-]*$")


def hpack_literal(data: bytes) -> bool:
    """Whether ``data`` starts like an HPACK literal field with a new name (RFC 7541
    §6.2: 0x00 without indexing, 0x10 never indexed, 0x40 incremental), its 7-bit
    length and that many bytes of a header name: ``b"\\x00\\x0cgrpc-timeout"``."""
    if len(data) < 3 or data[0] not in (0x00, 0x10, 0x40):
        return False
    length = data[1]
    return 0 < length < 127 and _HEADER_NAME.match(data[2 : 2 + length]) is not None


def test_the_hpack_detector_finds_a_hand_made_literal() -> None:
    assert hpack_literal(b"\x00\x0cgrpc-timeout\x02" + b"1S")
    assert hpack_literal(b"\x10\x0dauthorization")
    assert not hpack_literal(b"\x00")  # gRPC's message prefix starts with it
    assert not hpack_literal(b"\x00\x00\x00\x00\x05")


def test_no_hpack_bytes_are_composed_outside_http2() -> None:
    """Header blocks are ``_wire/http2/_headers.py``'s: elsewhere, no bytes constant is an
    HPACK literal and no field size (``len(...) + 32``) is computed by hand."""
    package = ROOT / "sepp_lite"
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("sepp_lite/_wire/http2/", "sepp_lite/_proto/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
                if hpack_literal(node.value):
                    found.append(f"{relative}:{node.lineno}: {node.value!r}")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                sides = (node.left, node.right)
                if any(isinstance(s, ast.Constant) and s.value == 32 for s in sides) and any(
                    isinstance(c, ast.Call) and getattr(c.func, "id", None) == "len"
                    for s in sides
                    for c in ast.walk(s)
                ):
                    found.append(f"{relative}:{node.lineno}: a field size by hand")
    assert not found, "HPACK composed outside _wire/http2:\n" + "\n".join(found)


# -- one name, one thing ------------------------------------------------------------------

# Modules whose names are the same, once a leading underscore and a plural "s" are
# set aside, and which are let be, each with its reason. The modules of cli/ are
# left out: each is named after its command (cli/worker.py runs `sepp-lite worker`).
ALLOWED_SAME_STEM = {
    frozenset({"__main__.py", "testing/__main__.py"}): "Python's name for `python -m`",
    frozenset({"cli/__init__.py", "testing/_cli.py"}): "a command line each: sepp-lite's "
    "and `python -m sepp_lite.testing`'s",
    frozenset({"_codec/lease.py", "_lease.py"}): "the wire form of Ack, Nack and Extend "
    "(in the codec's folder, named by message family) and the lease they act on",
    frozenset({"_wire/http2/_config.py", "testing/_config.py"}): "each package's own "
    "settings: the HTTP/2 knobs, the test server's options",
    frozenset({"_codec/__init__.py", "tasks/_codecs.py"}): "the protobuf codec, and a "
    "task's payload codecs (the public word: `codec=`, `tasks.JsonCodec`)",
    frozenset({"tasks/__init__.py", "tasks/_task.py"}): "the package and its `Task`",
    frozenset({"_clock.py", "testing/_clock.py"}): "one thing: the clock protocol and the "
    "wall clock, and the test server's clocks of that shape (ManualClock, RealClock)",
}
# Top-level classes and functions that share a name on purpose.
ALLOWED_SAME_CLASS = {
    "SeppClient": "the blocking client (sync.py) has the async one's name, as sepp-py's",
}
ALLOWED_SAME_FUNCTION = {
    "__getattr__": "a module's lazy names",
    "__dir__": "the same",
    "add_parser": "each command of cli/ adds its own",
    "main": "a command line's entry point",
    "_retrieve": "the same three lines, a future's exception marked retrieved: _wire/http2 "
    "imports nothing of sepp_lite, so it keeps its own",
}


def _stem(path: Path) -> str:
    name = path.parent.name if path.name == "__init__.py" else path.stem
    return name.lstrip("_").removesuffix("s")


def same_named_modules() -> dict[frozenset[str], str]:
    """Groups of modules of sepp_lite whose names say the same thing, with their stem."""
    groups: dict[str, set[str]] = {}
    for path in package_files():
        name = path.relative_to(PACKAGE).as_posix()
        if not name.startswith("cli/") or name == "cli/__init__.py":
            groups.setdefault(_stem(path), set()).add(name)
    return {frozenset(names): stem for stem, names in groups.items() if len(names) > 1}


def test_no_two_modules_have_the_same_name_for_different_things() -> None:
    """``_tasks.py`` (TaskSet) stood beside ``tasks/``, ``_periodic.py`` beside
    ``tasks/_periodic.py``, ``_rejections.py`` beside ``_codec/rejections.py`` and
    ``_codec/_wire.py`` beside ``_wire/``."""
    assert same_named_modules().keys() == ALLOWED_SAME_STEM.keys()
    assert _stem(Path("_tasks.py")) == _stem(Path("tasks/__init__.py"))  # the check sees it


def top_level_names(kind: type[ast.AST]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in package_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, kind) or (
                kind is ast.FunctionDef and isinstance(node, ast.AsyncFunctionDef)
            ):
                name = node.name  # type: ignore[attr-defined]
                found.setdefault(name, []).append(path.relative_to(PACKAGE).as_posix())
    return {name: paths for name, paths in found.items() if len(paths) > 1}


def test_no_two_classes_or_functions_have_the_same_name() -> None:
    """Two ``Backoff``s (reconnecting, and a task's retry), two ``Response``s (the
    health endpoints', HTTP/2's decoded headers), ``not_processed``/``lost`` in both
    ``_wire/grpc.py`` and ``_wire/http2/_stream.py``, two ``_retry_delay``s: a name
    found twice meant two things, and a reader had to find out which."""
    assert set(top_level_names(ast.ClassDef)) == set(ALLOWED_SAME_CLASS)
    assert set(top_level_names(ast.FunctionDef)) == set(ALLOWED_SAME_FUNCTION)


# -- nothing dead -------------------------------------------------------------------------

# Functions of sepp_lite whose name appears nowhere but in their own definition, and
# which are called all the same, each with its reason.
CALLED_UNNAMED = {
    "get_buffer": "asyncio calls it (BufferedProtocol, _wire/http2/_connection.py)",
    "buffer_updated": "the same",
    "render_report": "the demo's handler, registered by its decorator",
    "deliver_webhook": "the same",
}


def unnamed_functions() -> list[str]:
    """The functions and methods of sepp_lite whose name no Python file of the
    repository (this one aside) uses, but for their definitions: nothing calls them."""
    own = Path(__file__).resolve().relative_to(ROOT).as_posix()
    sources = {f: (ROOT / f).read_text() for f in tracked_files() if f.endswith(".py")}
    used: dict[str, int] = {}
    for name, text in sources.items():
        if name != own and "/_proto/" not in name:
            for word in re.findall(r"\w+", text):
                used[word] = used.get(word, 0) + 1
    defined: dict[str, list[str]] = {}
    for name, text in sources.items():
        if name.startswith("sepp_lite/") and "/_proto/" not in name:
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    defined.setdefault(node.name, []).append(f"{name}:{node.lineno}")
    return sorted(
        f"{where} {function}"
        for function, places in defined.items()
        if not function.startswith("__") and used.get(function, 0) <= len(places)
        for where in places
    )


def test_every_function_of_sepp_lite_is_called_somewhere() -> None:
    """``_codec/_wire.read_str``, ``_time.timedelta_to_ms``,
    ``Connection.active_streams`` and ``QueueState.is_declared`` had no caller, the
    tests included; a name written only where it is defined is one more of them."""
    dead = unnamed_functions()
    assert sorted(entry.rsplit(" ", 1)[1] for entry in dead) == sorted(CALLED_UNNAMED), dead


# -- docs/development.md's Layout table ---------------------------------------------------


def layout_rooms() -> list[str]:
    """The rooms of sepp_lite in the Layout table of docs/development.md, in its order
    (``sepp_lite/_wire/grpc.py`` is the room ``_wire/grpc``)."""
    page = (ROOT / "docs" / "development.md").read_text()
    table = page.split("## Layout", 1)[1]
    rooms = []
    for path in re.findall(r"^\| `sepp_lite/([^`]+)` \|", table, flags=re.M):
        assert in_repository(f"sepp_lite/{path}"), path
        dotted = "sepp_lite." + path.removesuffix("/").removesuffix(".py").replace("/", ".")
        rooms.append(room_of(dotted.removesuffix(".__init__")))
    return rooms


def test_the_layout_table_lists_every_room_from_the_bottom_band_up() -> None:
    rooms = layout_rooms()
    every = {room_of(module) for module in modules_of(PACKAGE)} - {"_wire"}
    assert set(rooms) == every, set(rooms) ^ every
    rank = drawn_rooms(TEXT)
    ranks = [rank[room] for room in rooms if room in rank]
    assert ranks == sorted(ranks, reverse=True), [r for r in rooms if r in rank]


# -- one home per question: what the server takes ------------------------------------------

SERVER_LIMITS = "_sending.py"
# Names a default of the jobs in one EnqueueBatch call would go by.
_BATCH_NAME = re.compile(r"enqueue|batch_jobs|^_?batch$", re.I)
_ARITHMETIC: dict[type[ast.operator], Callable[[int, int], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
}


def _folded(node: Optional[ast.expr]) -> Optional[int]:
    """The int an expression of int constants and arithmetic comes to, else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp):
        left, right = _folded(node.left), _folded(node.right)
        apply = _ARITHMETIC.get(type(node.op))
        if left is not None and right is not None and apply is not None:
            return int(apply(left, right))
    return None


def _bound_ints(source: str) -> list[tuple[int, str, int]]:
    """``(line, name, value)`` of every int a name is given in ``source``: assignments,
    annotated ones and parameter defaults."""
    found = []
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[ast.expr, Optional[ast.expr]]] = []
        if isinstance(node, ast.Assign):
            pairs = [(target, node.value) for target in node.targets]
        elif isinstance(node, ast.AnnAssign):
            pairs = [(node.target, node.value)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            positional = [*arguments.posonlyargs, *arguments.args]
            named = positional[len(positional) - len(arguments.defaults) :]
            for argument, default in [
                *zip(named, arguments.defaults),
                *zip(arguments.kwonlyargs, arguments.kw_defaults),
            ]:
                value = _folded(default)
                if value is not None:
                    found.append((argument.lineno, argument.arg, value))
        for target, expr in pairs:
            value = _folded(expr)
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if value is not None:
                found.append((target.lineno, name, value))
    return found


def server_limit_copies() -> list[str]:
    """Where a module other than ``_sending.py`` writes the server's 16 MiB message limit
    (under any name, in any spelling of arithmetic), or the default of 256 jobs in one
    EnqueueBatch call."""
    copies = []
    for path in package_files():
        if path.name == SERVER_LIMITS and path.parent == PACKAGE:
            continue
        where = path.relative_to(ROOT)
        for line, name, value in _bound_ints(path.read_text()):
            if value == 16 * 1024 * 1024 or (value == 256 and _BATCH_NAME.search(name)):
                copies.append(f"{where}:{line} {name} = {value}")
    return copies


def test_the_servers_limits_are_written_in_one_module() -> None:
    """The 16 MiB message limit and the default of 256 jobs a call are ``_sending``'s
    (issue 39: they were written in six modules, the 256 in two)."""
    assert server_limit_copies() == []


def test_the_limit_finder_sees_each_spelling() -> None:
    source = (
        "A = 16 * 1024 * 1024\nB: int = 1 << 24\ndef f(size=16_777_216): ...\n"
        "class C:\n    def __init__(self):\n        self._batch = 256\n"
        "max_enqueue_batch: int = 256\nmax_reserve_batch = 256\nFILE_BATCH = 256\n"
    )
    found = [(name, value) for _, name, value in _bound_ints(source)]
    assert ("A", 16 * 1024 * 1024) in found and ("B", 1 << 24) in found
    assert ("size", 16 * 1024 * 1024) in found and ("_batch", 256) in found
    batch_names = [name for name, value in found if value == 256 and _BATCH_NAME.search(name)]
    assert sorted(batch_names) == ["_batch", "max_enqueue_batch"]


# -- one home per question: waiting for a server -------------------------------------------

WAITING_LINES = ("waiting for the sepp server (attempt", "gave up waiting for the sepp server")


def _strings(source: str) -> list[str]:
    """The string constants of ``source``'s code (f-strings' parts too), docstrings left
    out."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docstrings.add(id(body[0].value))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def modules_saying(words: str) -> list[str]:
    """The modules of sepp_lite whose code (not their docstrings) says ``words``."""
    return [
        str(path.relative_to(PACKAGE))
        for path in package_files()
        if any(words in text for text in _strings(path.read_text()))
    ]


@pytest.mark.parametrize("line", WAITING_LINES)
def test_waiting_for_a_server_is_written_in_one_module(line: str) -> None:
    """The Worker's start, ``sepp-lite worker`` and the periodic scheduler wait for their
    server through ``_reach.py`` (issue 39: three loops, two of them with this line)."""
    assert modules_saying(line) == ["_reach.py"]


def test_the_string_finder_skips_docstrings() -> None:
    source = (
        '"""waiting for x"""\ndef f():\n    """waiting for y"""\n    return f"waiting for {1}"\n'
    )
    assert _strings(source) == ["waiting for "]


# -- one call path: the coalescer sends through the client ---------------------------------

# What only the client's one call path may do: call a transport, map its failures, and
# run the retry loop.
CALL_PATH = {"sepp_lite._wire", "sepp_lite._status", "map_failure", "call_with_retry", "unary"}


def call_path_uses(module: str, package: Path = PACKAGE) -> list[str]:
    """What ``module`` imports or calls of the client's one call path."""
    imports = import_graph(package)[module]
    found = [f"imports {name}" for name in imports if name.startswith(tuple(CALL_PATH))]
    path = modules_of(package)[module]
    for node in ast.walk(ast.parse(path.read_text())):
        name = getattr(node, "attr", None) or getattr(node, "id", None)
        if name in CALL_PATH:
            found.append(f"uses {name} (line {node.lineno})")  # type: ignore[attr-defined]
    return found


def test_the_coalescer_sends_through_the_clients_one_call_path() -> None:
    """No transport, no failure mapping, no retry loop of its own (issue 39: it repeated
    the client's)."""
    assert call_path_uses("sepp_lite._coalesce") == []
    assert "uses map_failure" in " ".join(call_path_uses("sepp_lite.client"))


def callbacks_handed_to(receiver: str, source: str) -> list[str]:
    """The lambdas and nested functions ``source`` passes to a method of ``receiver``
    (an attribute or a name): code of the caller's that would run inside the callee."""
    tree = ast.parse(source)
    nested = {
        inner.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(node)
        if inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = node.func.value
        if getattr(target, "attr", None) != receiver and getattr(target, "id", None) != receiver:
            continue
        for argument in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(argument, ast.Lambda) or (
                isinstance(argument, ast.Name) and argument.id in nested
            ):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


def test_the_enqueue_path_reads_top_to_bottom() -> None:
    """The client takes a slot, encodes its job and hands the coalescer its bytes; it
    hands it no closure to call back (issue 39: an enqueue went client, coalescer,
    client's encode closure, coalescer)."""
    source = (PACKAGE / "client.py").read_text()
    assert callbacks_handed_to("coalescer", source) == []
    assert callbacks_handed_to("coalescer", "c.coalescer.enqueue(lambda: b'', True, 1.0)")
    nested = "def f(coalescer):\n    def g(): ...\n    coalescer.enqueue(g)\n"
    assert callbacks_handed_to("coalescer", nested) == ["line 3: coalescer.enqueue"]


# -- worker.py: the lease keeper reaches the Worker through a seam ---------------------------


def worker_names_read_by(class_name: str, source: str) -> list[str]:
    """The private names of ``Worker`` (its methods and ``self._x`` attributes) that
    the class ``class_name`` reads off anything but itself."""
    tree = ast.parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    owned = set()
    for node in ast.walk(classes["Worker"]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name):
            owned.add(node.name)
        if isinstance(node, ast.Attribute) and _on_self(node.value) and _is_private(node.attr):
            owned.add(node.attr)
    return sorted(
        {
            node.attr
            for node in ast.walk(classes[class_name])
            if isinstance(node, ast.Attribute) and node.attr in owned and not _on_self(node.value)
        }
    )


def test_the_lease_keeper_reads_no_private_name_of_the_worker() -> None:
    """It is handed ``_Keeping`` (issue 39: it read four of the Worker's names)."""
    source = (PACKAGE / "worker.py").read_text()
    assert worker_names_read_by("_LeaseKeeper", source) == []


# -- worker.py: no regex over another room's messages ------------------------------------

# The modules that act on what the client raises while a worker runs or waits for its
# server: they read an error's attributes (``ClientError.retry_after``,
# ``CallFailure.backing_off``), never its wording, which belongs to the room that
# raised it (issue 39: worker.py, then _reach.py, stripped the transport's "next attempt
# in" hint with a regex).
READ_BY_ATTRIBUTE = ("worker.py", "_reach.py", "_handlers.py")


def imports_re(source: str) -> bool:
    """Whether ``source`` imports the ``re`` module, or anything from it."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name == "re" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "re":
            return True
    return False


def test_the_worker_parses_no_message_with_a_regex() -> None:
    assert [name for name in READ_BY_ATTRIBUTE if imports_re((PACKAGE / name).read_text())] == []


def test_the_re_finder_sees_each_spelling() -> None:
    assert imports_re("import re\n") and imports_re("import os, re as regex\n")
    assert imports_re("def f():\n    from re import sub\n")
    assert not imports_re("import reprlib\nfrom sepp_lite import re_x\n")


# -- tests: one way to run a worker -------------------------------------------------------

# The tests that start a worker's run() as a task of their own, rather than through
# tests/client_helpers.worker_running (which stops it gracefully, also when the block
# fails): each tests what it must see happen to that task. (file, test) -> why.
CANCELS_RUN = "cancels run() and checks what the cancellation does"
OWN_WORKER_RUNS = {
    (
        "test_faults_handlers.py",
        "test_cancelling_run_hands_the_job_back_even_if_its_handler_swallows_the_cancel",
    ): CANCELS_RUN,
    (
        "test_faults_handlers.py",
        "test_cancelling_run_gives_up_on_a_handler_that_keeps_ignoring_it",
    ): CANCELS_RUN,
    ("test_monitor.py", "test_readyz_503_after_run_was_cancelled"): CANCELS_RUN,
    (
        "test_typed_tasks.py",
        "test_the_workers_own_cancellations_are_not_taken_for_timeouts",
    ): CANCELS_RUN,
    (
        "test_typed_tasks_lifecycle.py",
        "test_a_worker_cancelled_while_starting_leaves_the_start_to_the_next",
    ): CANCELS_RUN,
    ("test_worker.py", "test_cancelling_run_leaves_no_task_behind"): CANCELS_RUN,
    (
        "test_worker_hand_back.py",
        "test_cancelled_handlers_hand_their_jobs_back_but_not_on_the_last_attempt",
    ): CANCELS_RUN + " (one of its two cases)",
    ("test_monitor_otel.py", "test_metric_names_match_the_otel_instruments"): "a worker "
    "whose run() fails (an undeclared queue), for the failure's instruments",
    (
        "test_worker_fail_fast.py",
        "test_the_jobs_in_flight_finish_and_are_acked_before_it_raises",
    ): "awaits the error run() raises",
    (
        "test_periodic.py",
        "test_a_slot_within_the_grace_is_caught_up_once_an_older_one_not",
    ): "two PeriodicSchedulers (first, again), not workers",
}
_STARTS_A_TASK = ("ensure_future", "create_task", "running")


def runs_started_by_hand(source: str) -> list[tuple[str, str]]:
    """``(test, receiver)`` for each ``ensure_future(x.run(...))`` (or ``create_task``,
    or ``fault_helpers.running``) in a top-level test of ``source`` whose ``x`` is not a
    scheduler."""
    found = []
    for function in ast.parse(source).body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            run = node.args[0]
            if (
                name in _STARTS_A_TASK
                and isinstance(run, ast.Call)
                and isinstance(run.func, ast.Attribute)
                and run.func.attr == "run"
            ):
                receiver = ast.unparse(run.func.value)
                if "scheduler" not in receiver:
                    found.append((function.name, receiver))
    return found


def test_the_tests_run_workers_through_one_helper() -> None:
    """The start/shutdown sequence was written 32 times in 17 files, twice without
    ``try/finally`` (issue 39): ``worker_running`` is the one way, but where a test
    checks what happens to run()'s own task."""
    found = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for test, _ in runs_started_by_hand(path.read_text()):
            found.add((path.name, test))
    assert found == set(OWN_WORKER_RUNS), found ^ set(OWN_WORKER_RUNS)


def test_the_run_finder_sees_each_spelling() -> None:
    source = (
        "async def test_a():\n    t = asyncio.ensure_future(worker.run())\n"
        "async def test_b():\n    async with running(w.run(until_idle=True)):\n        pass\n"
        "async def test_c():\n    asyncio.create_task(tasks.worker(c).run())\n"
        "async def test_d():\n    asyncio.ensure_future(scheduler.run())\n"
        "async def test_e():\n    async with worker_running(worker): pass\n"
    )
    assert runs_started_by_hand(source) == [
        ("test_a", "worker"),
        ("test_b", "w"),
        ("test_c", "tasks.worker(c)"),
    ]


# -- one home per question: the clock ------------------------------------------------------


def clock_shapes(source: str) -> list[str]:
    """The classes of ``source`` that declare a shape of clock: a ``Protocol`` (or an
    ABC) with a ``now_ms``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
        methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        if bases & {"Protocol", "ABC"} and "now_ms" in methods:
            found.append(node.name)
    return found


def test_one_clock_protocol_for_the_scheduler_the_test_server_and_the_lease_keeper() -> None:
    """``_periodic``'s ``SchedulerClock`` had the shape of ``testing._clock.Clock``
    (issue 39); the Worker's lease keeper, the scheduler and the test server now take
    ``_clock.Clock``, and every clock is of that one shape."""
    shapes = {
        f"{path.relative_to(PACKAGE).as_posix()}:{name}"
        for path in package_files()
        for name in clock_shapes(path.read_text())
    }
    assert shapes == {"_clock.py:Clock"}
    assert clock_shapes(
        "class SchedulerClock(typing.Protocol):\n    def now_ms(self) -> int: ...\n"
    ) == ["SchedulerClock"]
