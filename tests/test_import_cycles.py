"""No two sepp_lite modules import each other, directly or through others.

The graph is read from the source with ``ast``, so it holds every import a module can
run: at module level, inside functions (where a cycle hides from ``python -c 'import
...'``), under ``TYPE_CHECKING`` and in ``try`` blocks, plus ``importlib.import_module``
with a literal name. A module's parent packages are not edges: importing
``sepp_lite.cli.common`` runs ``sepp_lite/cli/__init__.py`` first, but a package that
imports its own modules is how a package is built, and counting it would make every
module part of a cycle with its package.

Nor does a module set another's globals, the cycle an import graph cannot see: a lower
module that is handed what it may not import (``low.use(HighClass)``, a function of
``low`` rebinding its globals with ``global``, or ``low.NAME = value``) depends on the
higher one all the same.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import sepp_lite

Graph = dict[str, dict[str, str]]  # module -> {imported module: "path:line" of the import}


def modules_of(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in ``package_dir``, by dotted name."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, node: ast.AST, modules: set[str]) -> Iterator[str]:
    """The modules of ``modules`` that the import ``node`` in ``module`` loads."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in modules)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if path.name != "__init__.py":
                package.pop()
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        for alias in node.names:
            # `from package import module` loads that module; any other name is the
            # package's own (its __init__ defines or re-exports it).
            submodule = f"{base}.{alias.name}"
            yield submodule if submodule in modules else base
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in modules
    ):
        yield node.args[0].value


def import_graph(package_dir: Path) -> Graph:
    """Who imports whom among the modules of the package in ``package_dir``."""
    modules = modules_of(package_dir)
    graph: Graph = {name: {} for name in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            for name in _imported(module, path, node, set(modules)):
                if name in modules and name != module:
                    where = f"{path.relative_to(package_dir.parent)}:{node.lineno}"
                    graph[module].setdefault(name, where)
    return graph


def _reachable(graph: Graph, start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each group of modules that import each
    other (each strongly connected component of ``graph``)."""
    reach = {node: _reachable(graph, node) for node in graph}
    cycles: list[list[str]] = []
    covered: set[str] = set()
    for node in sorted(graph):
        if node in reach[node] and node not in covered:
            component = {other for other in reach[node] if node in reach[other]}
            covered |= component
            cycles.append(_cycle_in(graph, component))
    return cycles


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target == start:
                    return paths[node] + [start]
                if target in component and target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle in the component {component}")  # pragma: no cover


def describe(graph: Graph, cycle: list[str]) -> str:
    steps = [f"  {a} -> {b}   ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return "\n".join([" -> ".join(cycle), *steps])


def test_sepp_lite_has_no_import_cycles() -> None:
    package_dir = Path(sepp_lite.__file__).parent
    graph = import_graph(package_dir)
    # The reader sees the package: the CLI and the value types are in the graph with
    # the imports that once closed cycles through them.
    assert "sepp_lite._otel" in graph["sepp_lite.types"]
    assert "sepp_lite.cli.demo" in graph["sepp_lite.cli"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n\n".join(describe(graph, c) for c in cycles)


def script_graph(folder: Path) -> Graph:
    """Who imports whom among the scripts of ``folder`` (bench/: each runs as
    ``python bench/x.py``, so its siblings are imported by their bare names)."""
    scripts = {path.stem: path for path in sorted(folder.glob("*.py"))}
    graph: Graph = {name: {} for name in scripts}
    for name, path in scripts.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for target in names:
                if target in scripts and target != name:
                    graph[name].setdefault(target, f"{folder.name}/{path.name}:{node.lineno}")
    return graph


def test_the_benchmarks_have_no_import_cycles() -> None:
    """bench/against.py imported run.py, whose --against imported against.py."""
    graph = script_graph(Path(sepp_lite.__file__).parent.parent / "bench")
    assert "run" in graph["against"]  # the reader sees bare-name imports
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n\n".join(describe(graph, c) for c in cycles)


def test_the_http2_package_imports_nothing_else_of_sepp_lite() -> None:
    # _wire.http2 is a plain HTTP/2 client: gRPC's rules are _wire.grpc's, errors the client's.
    graph = import_graph(Path(sepp_lite.__file__).parent)
    inside = "sepp_lite._wire.http2"
    modules = [name for name in graph if name == inside or name.startswith(inside + ".")]
    assert len(modules) >= 5, modules  # the package and its modules are in the graph
    assert "sepp_lite._wire.http2._headers" in graph["sepp_lite._wire.http2._connection"]
    outside = {
        f"{module} -> {target} ({where})"
        for module in modules
        for target, where in graph[module].items()
        if target != inside and not target.startswith(inside + ".")
    }
    assert not outside, "_wire.http2 imports other modules:\n" + "\n".join(sorted(outside))


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_cycle_finder_sees_imports_hidden_in_functions_and_type_checking(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from pkg import b\nA = 1\n",
            "pkg/b.py": "def f():\n    from .sub import c\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "import importlib\n\ndef g():\n    importlib.import_module('pkg.a')\n",
            "pkg/d.py": "import typing\nif typing.TYPE_CHECKING:\n    from . import e\n",
            "pkg/e.py": "try:\n    import pkg.d\nexcept ImportError:\n    pass\n",
            "pkg/f.py": "from pkg import A\n",  # a name of the package: an edge to it
            "pkg/leaf.py": "import os\nfrom pkg.sub import c\n",
        },
    )
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg"] == {"pkg.a": "pkg/__init__.py:1"}
    assert graph["pkg.b"] == {"pkg.sub.c": "pkg/b.py:2"}
    assert graph["pkg.f"] == {"pkg": "pkg/f.py:1"}
    assert graph["pkg.leaf"] == {"pkg.sub.c": "pkg/leaf.py:2"}
    cycles = sorted(find_cycles(graph))
    assert cycles == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"], ["pkg.d", "pkg.e", "pkg.d"]]
    assert "  pkg.sub.c -> pkg.a   (pkg/sub/c.py:4)" in describe(graph, cycles[0]).splitlines()


# ---------------------------------------------------------------------------------------
# Globals set from another module


def _setters(tree: ast.Module) -> set[str]:
    """The functions of a module that rebind its globals (a ``global`` statement)."""
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(isinstance(inner, ast.Global) for inner in ast.walk(node))
    }


def _bound_names(module: str, path: Path, tree: ast.Module, modules: set[str]) -> dict[str, str]:
    """The names an import binds in ``module`` to another module of ``modules``
    (``name -> module``) or to a name of one (``name -> module:name``)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias, target in zip(node.names, _from_targets(module, path, node, modules)):
                if target.partition(":")[0] in modules:
                    bound[alias.asname or alias.name] = target
    return bound


def _from_targets(
    module: str, path: Path, node: ast.ImportFrom, modules: set[str]
) -> Iterator[str]:
    # What the module part resolves to: the package a name that is no module comes from.
    nothing = ast.alias(name="")
    base = next(_imported(module, path, ast.ImportFrom(node.module, [nothing], node.level), set()))
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in modules else f"{base}:{alias.name}"


def _module_named(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The module ``node`` names, when it is a name an import bound to a module."""
    if isinstance(node, ast.Name) and ":" not in bound.get(node.id, ":"):
        return bound[node.id]
    return None


def _written(node: ast.AST, bound: dict[str, str]) -> Iterator[tuple[str, str]]:
    """``(module, name)`` for a global of another module that ``node`` may set: by
    assigning it (``other.NAME = ...``, ``setattr(other, ...)``), or by calling one of
    that module's functions (``other.f()``, or ``f()`` imported from it)."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    for target in targets:
        if isinstance(target, ast.Attribute):
            owner = _module_named(target.value, bound)
            if owner is not None:
                yield owner, target.attr
    if isinstance(node, ast.Call):
        yield from _called(node, bound)


def _called(node: ast.Call, bound: dict[str, str]) -> Iterator[tuple[str, str]]:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "setattr" and node.args:
        owner = _module_named(node.args[0], bound)
        if owner is not None:
            yield owner, "<setattr>"
    elif isinstance(func, ast.Attribute):
        owner = _module_named(func.value, bound)
        if owner is not None:
            yield owner, f"{func.attr}()"
    elif isinstance(func, ast.Name) and ":" in bound.get(func.id, ""):
        owner, name = bound[func.id].split(":")
        yield owner, f"{name}()"


def foreign_global_writes(package_dir: Path) -> list[str]:
    """Every place where a module of the package sets another one's globals, as
    ``path:line: module sets other.NAME`` (or ``other.setter()``, a call of a function
    of ``other`` that rebinds its globals), in file and line order."""
    modules = modules_of(package_dir)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}
    setters = {name: _setters(tree) for name, tree in trees.items()}
    found = []
    for module, tree in trees.items():
        bound = _bound_names(module, modules[module], tree, set(modules))
        where = modules[module].relative_to(package_dir.parent)
        for node in ast.walk(tree):
            for owner, name in _written(node, bound):
                if owner == module or (name.endswith("()") and name[:-2] not in setters[owner]):
                    continue
                line = getattr(node, "lineno", 0)
                found.append((str(where), line, f"{module} sets {owner}.{name}"))
    return [f"{path}:{line}: {text}" for path, line, text in sorted(found)]


def test_no_module_sets_another_modules_globals() -> None:
    package_dir = Path(sepp_lite.__file__).parent
    assert foreign_global_writes(package_dir) == []


def test_the_finder_sees_globals_handed_down_or_set_from_above(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": (
                "_Kind = None\n\ndef use(kind):\n    global _Kind\n    _Kind = kind\n\n"
                "def plain(value):\n    return value\n"
            ),
            "pkg/high.py": (
                "from pkg import low\nfrom pkg.low import use as adopt\n\nclass Kind:\n    pass\n\n"
                "low.use(Kind)\nadopt(Kind)\nlow.plain(Kind)\nlow.LIMIT = 3\n"
                "setattr(low, 'OTHER', 4)\n"
            ),
            "pkg/alone.py": (
                "import os\n_lock = None\n\ndef fresh():\n    global _lock\n    _lock = 1\n\n"
                "os.register_at_fork(after_in_child=fresh)\nos.environ = {}\n"
            ),
        },
    )
    assert foreign_global_writes(tmp_path / "pkg") == [
        "pkg/high.py:7: pkg.high sets pkg.low.use()",
        "pkg/high.py:8: pkg.high sets pkg.low.use()",
        "pkg/high.py:10: pkg.high sets pkg.low.LIMIT",
        "pkg/high.py:11: pkg.high sets pkg.low.<setattr>",
    ]


if __name__ == "__main__":  # pragma: no cover - a quick look at the graph
    found = import_graph(Path(sepp_lite.__file__).parent)
    for module in sorted(found):
        print(module, "->", ", ".join(sorted(found[module])) or "-", file=sys.stdout)


# -- ARCHITECTURE.md's list of rooms, checked against the imports -------------------------

_ROOM = re.compile(r"(?<![\w./])(_?[a-z][a-z0-9_]*(?:/_?[a-z][a-z0-9_]*)*)(\.py\b|/)")
# Folders whose modules are rooms of their own, drawn as ``_wire/transport.py``: a band
# of the house on disk, one folder standing on the bottom band only.
BANDS = ("_wire",)
BOTTOM_BAND = "bottom band"  # the separator above the rooms everything may import


def drawn_rooms(page: str) -> dict[str, int]:
    """The rooms of ARCHITECTURE.md's list and their line in it, top first: a room is
    named (``worker.py``, ``tasks/``, ``_wire/grpc.py``) at the start of a line, before
    any ``->``."""
    block = page.split("```", 2)[1]
    rank: dict[str, int] = {}
    for number, line in enumerate(block.splitlines()):
        if not line.startswith(" ") or line.startswith("  ") or line.lstrip().startswith("-"):
            continue  # a continuation, a separator or the heading
        named = re.sub(r"\(-> [^)]*\)", "", line)  # "(-> _time)": what it imports
        named = named.split("->", 1)[0]
        for match in _ROOM.finditer(named):
            rank.setdefault(match.group(1), number)
    return rank


def bottom_band_line(page: str) -> int:
    """The line of the separator above the bottom band, counted as drawn_rooms does."""
    block = page.split("```", 2)[1].splitlines()
    return next(
        n
        for n, line in enumerate(block)
        if line.lstrip().startswith("-") and (line.rstrip().endswith(BOTTOM_BAND))
    )


def room_of(module: str) -> str:
    parts = module.split(".")[1:]  # without "sepp_lite"
    if not parts:
        return "__init__"
    if parts[0] in BANDS:
        return "/".join(parts[:2])  # "_wire" itself, its package, imports nothing
    return "proto" if parts[0] == "_proto" else parts[0]  # drawn as "proto.py -> _proto/"


def _page() -> str:
    return (Path(sepp_lite.__file__).parent.parent / "ARCHITECTURE.md").read_text()


def test_architecture_md_draws_each_room_above_every_room_it_imports() -> None:
    package_dir = Path(sepp_lite.__file__).parent
    rank = drawn_rooms(_page())
    rooms = {room_of(module) for module in modules_of(package_dir)} - {"__init__", "__main__"}
    rooms -= set(BANDS)
    assert not rooms - set(rank), f"rooms missing from ARCHITECTURE.md: {rooms - set(rank)}"
    assert not set(rank) - rooms, f"rooms drawn that are not there: {set(rank) - rooms}"
    upward = []
    for module, imports in import_graph(package_dir).items():
        here = room_of(module)
        if here in ("__init__", "__main__"):
            continue  # the package root loads rooms on first use; it stands above all
        for target, where in imports.items():
            there = room_of(target)
            if there not in (here, "__init__") and rank[there] < rank[here]:
                upward.append(f"{where}: {here} imports {there}, drawn above it")
    assert not upward, "\n".join(upward)


def test_each_band_folder_is_drawn_as_one_band_on_the_bottom_band() -> None:
    """``_wire/`` is a band: its rooms are drawn together, nothing else between them,
    and what they import outside the folder is in the bottom band."""
    page = _page()
    rank, bottom = drawn_rooms(page), bottom_band_line(page)
    graph = import_graph(Path(sepp_lite.__file__).parent)
    for band in BANDS:
        lines = sorted({n for room, n in rank.items() if room.startswith(band + "/")})
        assert len(lines) >= 4, lines  # the band's rooms are in the drawing
        between = {r for r, n in rank.items() if lines[0] <= n <= lines[-1]}
        assert all(r.startswith(band + "/") for r in between), between
        package = f"sepp_lite.{band}"
        assert graph[package] == {}, f"{package} imports {graph[package]}"
        above = [
            f"{where}: {module} imports {target}"
            for module, imports in graph.items()
            if module.startswith(package + ".")
            for target, where in imports.items()
            if not target.startswith(package + ".") and rank[room_of(target)] < bottom
        ]
        assert not above, "the band imports above the bottom band:\n" + "\n".join(above)


def drawn_arrows(page: str) -> dict[str, set[str]]:
    """What the drawing says each room above the bottom band imports: the names after
    its ``->``, continuation lines included, without what is in parentheses (a band's
    own rooms are named without the folder: ``grpc`` on a ``_wire/`` line)."""
    block = page.split("```", 2)[1].splitlines()
    rank, bottom = drawn_rooms(page), bottom_band_line(page)
    arrows: dict[str, set[str]] = {}
    for number, line in enumerate(block[:bottom]):
        rooms = [room for room, n in rank.items() if n == number]
        if not rooms:
            continue
        column = line.index("->") + 2 if "->" in line else len(line)
        text = line[column:]
        for following in block[number + 1 : bottom]:
            if not following.startswith("  ") or following.lstrip().startswith("-"):
                break
            text += " " + following[column:]
        text = re.sub(r"\([^()]*\)", "", text)
        for room in rooms:
            band = room.split("/")[0] if "/" in room else None
            named = {m.group(1) for m in _ROOM.finditer(text + " ")} | set(
                re.findall(r"(?<![\w./])(_?[a-z][a-z0-9_]*)(?=[,\s]|$)", text)
            )
            arrows[room] = {f"{band}/{n}" if band and f"{band}/{n}" in rank else n for n in named}
    return arrows


def test_architecture_md_lists_what_each_room_imports() -> None:
    """The arrow after each room above the bottom band names what it imports, no
    more and no less (a band's rooms are one name, ``_wire/``, seen from outside it)."""
    page = _page()
    rank, bottom = drawn_rooms(page), bottom_band_line(page)
    for band in BANDS:
        rank[band] = min(n for room, n in rank.items() if room.startswith(band + "/"))
    actual: dict[str, set[str]] = {}
    for module, imports in import_graph(Path(sepp_lite.__file__).parent).items():
        here = room_of(module)
        for target in imports:
            there = room_of(target)
            if there.split("/")[0] in BANDS and here.split("/")[0] != there.split("/")[0]:
                there = there.split("/")[0]  # seen from outside, a band is one room
            if there not in (here, "__init__") and rank.get(there, bottom) < bottom:
                actual.setdefault(here, set()).add(there)
    drawn = drawn_arrows(page)
    wrong = {
        room: (sorted(listed), sorted(actual.get(room, set())))
        for room, listed in drawn.items()
        if listed != actual.get(room, set())
    }
    assert not wrong, "room: (drawn, imported)\n" + "\n".join(f"{r}: {w}" for r, w in wrong.items())
    assert drawn["cli"] >= {"testing", "_codec"} and "_wire" in drawn["client"]  # folders


def test_the_room_reader_reads_names_arrows_and_lines() -> None:
    page = (
        "x\n```\n room  imports\n a.py   ->  b, c/\n            d\n"
        " b.py, c/ (-> e)\n ---\n e.py\n```"
    )
    assert drawn_rooms(page) == {"a": 2, "b": 4, "c": 4, "e": 6}
    banded = "x\n```\n room\n _w/a.py  ->  b/\n _w/b/ nothing (x)\n ---- bottom band\n z.py\n```"
    assert drawn_rooms(banded) == {"_w/a": 2, "_w/b": 3, "z": 5}
    assert bottom_band_line(banded) == 4
    assert room_of("sepp_lite._wire.http2._frames") == "_wire/http2"
    assert room_of("sepp_lite._wire") == "_wire" and room_of("sepp_lite.cli.demo") == "cli"
    arrows = (
        "x\n```\n a.py   ->  b, _w/ (c),\n   (x     d (a\n            note)\n b.py, d/\n"
        " ---- bottom band\n```"
    )
    assert drawn_arrows(arrows) == {"a": {"b", "_w", "d"}, "b": set(), "d": set()}
