"""The documentation site (mkdocs.yml, docs/): every code block of every page runs, page
by page in the order of the site's navigation, against one pair of servers that
tests/doc_examples.py starts (its docstring has the conventions, the same as README's).
The pages share one working directory, so a file block of one page (``tasks.py``) serves
the commands of another; file names are unique across the site. Each section of each
page uses queues of its own (checked statically), so no page leans on another's
leftovers. The site holds what the README once held; the README is a newcomer's page
with one first job (tests/test_readme.py).

None of this needs MkDocs: `make docs` builds the site (strictly) in a venv of its own.
The benchmark chart's generator (docs/_gen/bench_chart.py, standard library only) is
tested here too, and so are the API reference's completeness (every public name has an
entry) and its signatures (as griffe reads them with the site's extensions).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.doc_examples import (
    ROOT,
    Block,
    Env,
    make_env,
    queue_owners,
    read_blocks,
    run_block,
    unrun_blocks,
)

pytestmark = pytest.mark.timeout(180)

DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"


def nav_pages() -> list[str]:
    """The pages of mkdocs.yml's nav, in order (``- Title: page.md`` lines)."""
    text = MKDOCS_YML.read_text(encoding="utf-8")
    nav = text[text.index("\nnav:\n") :]
    return re.findall(r"^\s+- [^:\n]+: (\S+\.md)$", nav, re.MULTILINE)


PAGES = nav_pages()
BLOCKS = {page: read_blocks(DOCS / page) for page in PAGES}
ALL_BLOCKS = [block for blocks in BLOCKS.values() for block in blocks]
RUN_PAGES = [page for page in PAGES if any(block.runs for block in BLOCKS[page])]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from make_env(tmp_path_factory, ALL_BLOCKS)


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_code_blocks_of_a_page_run(page: str, env: Env) -> None:
    for block in BLOCKS[page]:
        if block.runs:
            run_block(block, env)


# -- the site's shape --------------------------------------------------------------------


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    on_disk = {
        path.relative_to(DOCS).as_posix()
        for path in DOCS.rglob("*.md")
        if not path.relative_to(DOCS).parts[0].startswith("_")
    }
    assert sorted(PAGES) == sorted(on_disk)
    assert len(PAGES) == len(set(PAGES))


def test_the_pages_a_user_looks_for_are_there() -> None:
    """The pages issue 33 asks for, by their titles in the nav."""
    text = MKDOCS_YML.read_text(encoding="utf-8")
    titles = set(re.findall(r"^\s+- ([^:\n]+):", text[text.index("\nnav:\n") :], re.M))
    for wanted in (
        "Getting started",
        "Concepts",
        "Producing",
        "Consuming",
        "Testing",
        "The command line",
        "Running in production",
        "Connections, TLS and auth",
        "OpenTelemetry",
        "Migrating from sepp-py",
        "Troubleshooting",
        "PyPy and platforms",
        "API reference",
    ):
        assert wanted in titles, wanted


def test_every_block_runs_or_is_a_setup_command() -> None:
    """What does not run: setup commands (``pip install``, ``make ...``), data files the
    commands read, and Python files that a ``python NAME`` command runs."""
    assert unrun_blocks(ALL_BLOCKS) == []
    by_command = [b.file for b in ALL_BLOCKS if b.run_by_command]
    assert {"producer.py", "worker.py"} <= set(by_command)


def test_file_names_are_unique_across_the_site() -> None:
    names = [block.file for block in ALL_BLOCKS if block.file is not None]
    assert len(names) == len(set(names)), names


def test_each_section_uses_queues_of_its_own() -> None:
    owner = queue_owners([b for b in ALL_BLOCKS if b.runs or b.lang == "python"])
    assert {"emails", "billing", "reports", "payments", "newsletters", "nightly"} <= set(owner)


def test_getting_started_runs_the_files_it_asks_to_save() -> None:
    blocks = BLOCKS["getting-started.md"]
    commands = [c for block in blocks if block.lang == "console" for c in block.commands()]
    assert "python producer.py" in commands and "python worker.py" in commands
    saved = [block for block in blocks if block.file in ("producer.py", "worker.py")]
    assert [block.lang for block in saved] == ["python", "python"]
    assert all(not block.runs for block in saved)  # they run as the commands, once


def test_getting_started_leads_with_a_typed_task() -> None:
    """The first screen (the first 60 lines) has a task, its producer and its worker;
    the raw API (EnqueueRequest and Payload) comes after them, in a section of its own."""
    text = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    first_screen = "\n".join(lines[:60])
    assert "@tasks.task" in first_screen and ".enqueue(client, " in first_screen
    python = [block for block in BLOCKS["getting-started.md"] if block.lang == "python"]
    assert [block.file for block in python[:3]] == ["welcome.py", "producer.py", "worker.py"]
    assert "tasks.worker(client)" in python[2].text
    assert all("EnqueueRequest" not in block.text for block in python[:3])
    raw = [block for block in python if "EnqueueRequest(" in block.text]
    assert raw and {block.section for block in raw} == {
        "The raw API: bytes, and code written for sepp-py"
    }


def test_the_block_reader_marks_files_that_a_command_runs(tmp_path: Path) -> None:
    text = "<!-- file: a.py -->\n```python\nprint(1)\n```\n\n```console\n$ python a.py\n```\n"
    path = tmp_path / "page.md"
    path.write_text(text)
    python, console = read_blocks(path)
    assert python.run_by_command and not python.runs
    assert console.runs and console.commands() == ["python a.py"]
    assert not Block(1, "python", "print(1)\n", "b.py").run_by_command


def test_what_moved_from_the_readme_is_on_the_site() -> None:
    text = {page: (DOCS / page).read_text(encoding="utf-8") for page in PAGES}
    assert "pytest-asyncio" in text["testing.md"] and "run_until_drained" in text["testing.md"]
    assert "| 130 |" in text["cli.md"]  # the exit status of an interrupted command
    # No page names `pip install sepp-lite`: no index serves it yet.
    from_index = re.compile(r"pip install\s+['\"]?sepp-lite\b(?!\S*\s*@)")
    assert not [page for page in PAGES if from_index.search(text[page])]
    prose = " ".join(text["getting-started.md"].split())
    assert "sepp_lite is not published on PyPI yet" in prose
    assert prose.count("PyPI") == 1  # the Install section says it once
    # The life cycle has a picture and the same in words.
    assert "(img/lifecycle.svg)" in text["concepts.md"] and "dead-lettered" in text["concepts.md"]
    ET.parse(DOCS / "img" / "lifecycle.svg")


# The guides for users of other job queues (issue 42): the concepts each maps, as they
# spell them, and what every guide says behaves differently.
GUIDES = {
    "from-celery.md": (
        "delay",
        "apply_async",
        "countdown",
        "eta",
        "beat",
        "chain",
        "group",
        "chord",
        "acks_late",
        "time_limit",
        "autoretry_for",
        "retry_backoff",
        "rate_limit",
        "result backend",
    ),
    "from-dramatiq.md": (
        "@dramatiq.actor",
        "send",
        "send_with_options",
        "Middleware",
        "max_retries",
        "min_backoff",
        "time_limit",
        "Results",
        "pipeline",
        "group",
    ),
    "from-arq.md": (
        "enqueue_job",
        "_defer_by",
        "_job_id",
        "cron_jobs",
        "WorkerSettings",
        "ctx",
        "job.result()",
    ),
    "from-taskiq.md": (
        "broker",
        "kiq",
        "TaskiqMiddleware",
        "TaskiqScheduler",
        "labels",
        "result backend",
        "TaskiqDepends",
    ),
}
GUIDE_SAYS = (  # somewhere on the page
    "max_attempts",
    "Backoff",
    "idempotency_key",
    "dedup window",
    "@tasks.periodic",
    "dead letter",
    "timeout=",
    "priorit",
    "rate limit",
    "](workflows.md#what-runs-once-what-exists-once)",  # the guarantee, linked, not copied
)
GUIDE_DIFFERENCES = ("may run twice", "idempotent", "no result")  # in that section
# The section on chains (canvas, pipelines) of each guide, which runs a then/map example.
GUIDE_CHAINS = {
    "from-celery.md": "Canvas: chain, group, chord",
    "from-dramatiq.md": "Pipelines and groups",
    "from-arq.md": "Chains of jobs",
    "from-taskiq.md": "Pipelines",
}
# What the guides said before workflows were released.
GUIDE_STALE = ("once they are released", "once they land", "not released yet", "being built")


def test_the_guides_for_other_queues_map_their_concepts_and_run() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    start = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    for page, concepts in GUIDES.items():
        assert page in PAGES, page
        text = (DOCS / page).read_text(encoding="utf-8")
        assert [c for c in concepts if c not in text] == [], page
        lowered = text.lower()
        assert [s for s in GUIDE_SAYS if s.lower() not in lowered] == [], page
        differences = lowered[lowered.index("\n## what behaves differently\n") :]
        assert [s for s in GUIDE_DIFFERENCES if s not in differences] == [], page
        # Examples that tests/test_docs.py runs: scripts, and a test of the user's own.
        runs = [block for block in BLOCKS[page] if block.runs]
        assert len([block for block in runs if block.lang == "python"]) >= 2, page
        assert any((block.file or "").startswith("test_") for block in runs), page
        # Workflows are linked, not announced, and the chains section runs then and map.
        assert [s for s in GUIDE_STALE if s in " ".join(lowered.split())] == [], page
        chains = [b for b in runs if b.section == GUIDE_CHAINS[page] and b.lang == "python"]
        assert any(".then(" in b.text and ".map(" in b.text for b in chains), page
        assert any("sepp_drain" in b.text and "sepp_clock" in b.text for b in chains), page
        # Where a newcomer looks: the home page and getting started link each guide.
        assert f"]({page})" in index and f"]({page})" in start, page


def test_search_works_from_disk_without_a_network() -> None:
    """Material's offline plugin puts the search index in a script (a page opened as a
    file cannot fetch JSON) and runs the search worker through iframe-worker's shim,
    which mkdocs.yml takes from this repository, not from the plugin's default CDN; the
    home page says how to read the site."""
    text = MKDOCS_YML.read_text(encoding="utf-8")
    plugins = text[text.index("\nplugins:\n") :]
    assert re.search(r"^  - offline$", plugins, re.MULTILINE)
    listed = re.search(r"^extra:\n(?:  .*\n)*?  polyfills:\n((?:    - \S+\n)+)", text, re.M)
    assert listed is not None
    polyfills = re.findall(r"- (\S+)", listed.group(1))
    assert polyfills and all("iframe-worker" in path for path in polyfills)
    for path in polyfills:
        assert "://" not in path and (DOCS / path).is_file(), path
    index = " ".join((DOCS / "index.md").read_text(encoding="utf-8").split())
    assert "open `site/index.html` from disk" in index and "make docs-serve" in index


# -- the benchmark chart ---------------------------------------------------------------


def load_chart_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_chart", DOCS / "_gen" / "bench_chart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_chart", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chart() -> ModuleType:
    return load_chart_module()


@pytest.fixture(scope="module")
def results(chart: ModuleType) -> dict[str, Any]:
    data: dict[str, Any] = chart.load(ROOT / "bench" / "results" / "latest.json")
    return data


def bar_widths(svg: str) -> dict[str, float]:
    """Each bar's width, by its tooltip (``label: ratio×``)."""
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    return {
        rect.findtext(f"{ns}title", ""): float(rect.get("width", "0"))
        for rect in root.iter(f"{ns}rect")
        if rect.find(f"{ns}title") is not None
    }


def test_the_chart_has_a_bar_for_every_ratio_of_the_last_run(
    chart: ModuleType, results: dict[str, Any]
) -> None:
    bars = bar_widths(chart.svg(results))
    for workload in results["workloads"]:
        label = chart.LABELS[workload["workload"]]
        assert f"{label}: {workload['pair_ratio_median']:.2f}×" in bars
    for name, pypy in results["pypy"].items():
        label = chart.LABELS[name]
        assert f"{label}: {pypy['pypy_vs_sepp_pair_median']:.2f}×" in bars
    imports = results["footprint"]["import_ms"]
    assert f"cold import time: {imports['sepp_lite'] / imports['sepp']:.2f}×" in bars


def test_the_chart_follows_the_data(chart: ModuleType, results: dict[str, Any]) -> None:
    """A bar's length is its ratio: doubling a workload's ratio doubles its bar against
    the others, and a workload the bench did not run has none."""
    changed = dict(results, workloads=[dict(w) for w in results["workloads"]])
    first, second = changed["workloads"][:2]
    label = chart.LABELS[first["workload"]]
    other = f"{chart.LABELS[second['workload']]}: {second['pair_ratio_median']:.2f}×"
    bars = bar_widths(chart.svg(results))
    before = bars[f"{label}: {first['pair_ratio_median']:.2f}×"] / bars[other]
    first["pair_ratio_median"] *= 2
    bars = bar_widths(chart.svg(changed))
    after = bars[f"{label}: {first['pair_ratio_median']:.2f}×"] / bars[other]
    assert after == pytest.approx(2 * before, rel=0.01)
    fewer = dict(results, workloads=results["workloads"][1:], pypy={})
    assert not [t for t in bar_widths(chart.svg(fewer)) if t.startswith(label + ":")]


def test_the_table_says_what_the_chart_shows(chart: ModuleType, results: dict[str, Any]) -> None:
    table = chart.markdown_tables(results)
    for workload in results["workloads"]:
        row = next(
            line
            for line in table.splitlines()
            if line.startswith(f"| {chart.LABELS[workload['workload']]},")
        )
        assert f"| {workload['sepp_lite_cpu_us']:.1f} |" in row
        assert f"| {workload['pair_ratio_median']:.2f}× |" in row
    assert results["machine"]["date"] in table


def test_the_benchmarks_page_shows_the_last_run_without_a_build(
    chart: ModuleType, results: dict[str, Any]
) -> None:
    """The page reads the same in the repository as on the site: its chart is a
    committed file and its tables are in the Markdown, both as the generator makes
    them from bench/results/latest.json (`make bench` rewrites them)."""
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    assert "](img/bench.svg)" in page
    assert (DOCS / "img" / "bench.svg").read_text(encoding="utf-8") == chart.svg(results)
    assert chart.TABLE_START in page and chart.TABLE_END in page
    assert page == chart.with_tables(page, results)
    assert chart.markdown_tables(results) in page


def test_the_update_rewrites_the_chart_and_only_the_tables(
    chart: ModuleType, tmp_path: Path
) -> None:
    data = tmp_path / "latest.json"
    results = chart.load(ROOT / "bench" / "results" / "latest.json")
    results["workloads"][0]["pair_ratio_median"] = 0.123
    data.write_text(json.dumps(results), encoding="utf-8")
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# B\n\nabove\n\n{chart.TABLE_START}\nSTALE\n{chart.TABLE_END}\n\nbelow\n")
    svg = tmp_path / "bench.svg"
    chart.update(data, svg, page)
    assert svg.read_text(encoding="utf-8") == chart.svg(results)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# B\n\nabove\n\n") and text.endswith("\n\nbelow\n")
    assert "STALE" not in text and "| 0.12× |" in text
    chart.update(data, svg, page)
    assert page.read_text(encoding="utf-8") == text  # idempotent


def test_the_chart_script_writes_the_svg(chart: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "bench.svg"
    source = ROOT / "bench" / "results" / "latest.json"
    subprocess.run(
        [sys.executable, str(DOCS / "_gen" / "bench_chart.py"), str(source), str(out)], check=True
    )
    assert out.read_text(encoding="utf-8") == chart.svg(chart.load(source))


# -- the API reference -----------------------------------------------------------------
#
# docs/reference/*.md document names with mkdocstrings directives (``::: sepp_lite.Worker``
# and its indented options). Every name of a public module's ``__all__`` must have an entry
# there, once, under a heading no other entry has; and the signatures the site renders (as
# griffe reads them, with the extensions of mkdocs.yml) must name nothing private.

# The modules whose ``__all__`` is the public API; the reference documents every name.
REFERENCE_MODULES = (
    "sepp_lite",
    "sepp_lite.monitor",
    "sepp_lite.sync",
    "sepp_lite.tasks",
    "sepp_lite.testing",
)
# The other public modules, and why the reference has no entries of theirs. A new public
# module goes in one of the two lists: then its names are checked, or the choice is said.
NOT_IN_REFERENCE = {
    "sepp_lite.client": "home of sepp_lite.SeppClient, documented as that",
    "sepp_lite.errors": "home of sepp_lite's errors, documented as those",
    "sepp_lite.types": "home of sepp_lite's values, documented as those",
    "sepp_lite.worker": "home of sepp_lite.Worker and HandlerError, documented as those",
    "sepp_lite.shutdown": "home of sepp_lite.ShutdownHandle, documented as that",
    "sepp_lite.proto": "the generated raw layer: betterproto messages and grpclib's stub",
    "sepp_lite.cli": "the sepp-lite command, documented on docs/cli.md",
}
DIRECTIVE = re.compile(r"^::: (\S+)\n((?:    .*\n)*)", re.MULTILINE)


@dataclass(frozen=True)
class Entry:
    """One documented object: the directive's target, or a member a module directive lists."""

    page: str
    path: str  # sepp_lite.sync.SeppClient, sepp_lite.errors.SeppError
    obj: Any
    heading: str  # what its heading says
    toc_label: str  # what the page's table of contents says


def directive_options(body: str) -> dict[str, Any]:
    """The ``options:`` of a directive: scalars as str, ``members:`` as a list."""
    options: dict[str, Any] = {}
    key = ""
    for line in body.splitlines():
        item = re.fullmatch(r" {8}- (\S+)", line)
        option = re.fullmatch(r" {6}(\w+):\s*(.*)", line)
        if item:
            options.setdefault(key, []).append(item.group(1))
        elif option:
            key, value = option.groups()
            if value:
                options[key] = value.strip("\"'")
    return options


def resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def module_names(module: ModuleType) -> list[str]:
    """What a directive of a whole module shows: its ``__all__``, else what it defines."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    ]


def headings(path: str, options: dict[str, Any]) -> tuple[str, str]:
    """A directive's heading and table-of-contents line (mkdocstrings' ``heading`` and
    ``toc_label`` options; the full path shows in the heading only, never in the toc)."""
    name = path.rsplit(".", 1)[-1]
    full = path if options.get("show_root_full_path") == "true" else name
    return str(options.get("heading", full)), str(options.get("toc_label", name))


def reference_entries() -> list[Entry]:
    entries = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        for target, body in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            options = directive_options(body)
            obj = resolve(target)
            if not isinstance(obj, ModuleType):
                entries.append(Entry(page.name, target, obj, *headings(target, options)))
                continue
            for name in options.get("members") or module_names(obj):
                path = f"{target}.{name}"
                entries.append(Entry(page.name, path, getattr(obj, name), name, name))
    return entries


def public_modules() -> set[str]:
    """sepp_lite and its modules whose dotted names have no part starting with ``_``."""
    found = set()
    for path in (ROOT / "sepp_lite").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            found.add(".".join(parts))
    return found


def test_every_public_module_is_in_the_reference_or_says_why_not() -> None:
    said = set(REFERENCE_MODULES) | set(NOT_IN_REFERENCE)
    unsaid = {m for m in public_modules() if m not in said and m.rsplit(".", 1)[0] not in said}
    assert unsaid == set(), "add them to REFERENCE_MODULES or NOT_IN_REFERENCE"


def missing_entries(entries: list[Entry]) -> list[str]:
    """The public names (``module.name``) that no entry documents: by object, so that a
    name exported by two modules (``sepp_lite.Task``, ``sepp_lite.tasks.Task``) needs one."""
    documented = {id(entry.obj) for entry in entries}
    return [
        f"{module}.{name}"
        for module in REFERENCE_MODULES
        for name in resolve(module).__all__
        if name != "__version__" and id(getattr(resolve(module), name)) not in documented
    ]


def test_every_public_name_has_an_entry_in_the_reference() -> None:
    assert missing_entries(reference_entries()) == []


def test_a_name_without_its_entry_is_missing() -> None:
    import sepp_lite

    entries = reference_entries()
    without = [entry for entry in entries if entry.obj is not sepp_lite.Worker]
    assert len(without) == len(entries) - 1
    before = missing_entries(entries)
    assert [name for name in missing_entries(without) if name not in before] == ["sepp_lite.Worker"]


def test_each_object_has_one_entry_under_a_heading_of_its_own() -> None:
    """One entry per object (the async and the blocking SeppClient are two objects, and
    their headings must tell them apart)."""
    entries = reference_entries()
    by_object: dict[int, list[str]] = {}
    by_heading: dict[str, list[str]] = {}
    by_toc_label: dict[str, list[str]] = {}
    for entry in entries:
        by_object.setdefault(id(entry.obj), []).append(entry.path)
        by_heading.setdefault(entry.heading, []).append(entry.path)
        by_toc_label.setdefault(entry.toc_label, []).append(entry.path)
    assert [paths for paths in by_object.values() if len(paths) > 1] == []
    assert {h: paths for h, paths in by_heading.items() if len(paths) > 1} == {}
    assert {h: paths for h, paths in by_toc_label.items() if len(paths) > 1} == {}


# What griffe renders: its expressions (annotations, defaults, bases), or the str our
# extension put in place of a default; a str's quoted parts are values, not names.
def private_names(part: object) -> list[str]:
    if part is None:
        return []
    if isinstance(part, str):
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", part)
        return re.findall(r"(?<![\w.])_\w*|(?<=\.)_\w*", unquoted)
    import griffe

    return [
        element.name
        for element in part.iterate(flat=True)  # type: ignore[attr-defined]
        if isinstance(element, griffe.ExprName) and element.name.startswith("_")
    ]


def shown_parts(obj: Any) -> Iterator[tuple[str, object]]:
    """Every annotation, default, base and value that an entry's page shows, by where."""
    import griffe

    if obj.is_alias:
        obj = obj.final_target
    if isinstance(obj, griffe.Function):
        for function in [obj, *(obj.overloads or [])]:
            yield f"{function.path} ->", function.returns
            for param in function.parameters:
                yield f"{function.path}({param.name} name)", param.name
                yield f"{function.path}({param.name})", param.annotation
                yield f"{function.path}({param.name}=)", param.default
    elif isinstance(obj, griffe.Attribute):
        yield obj.path, obj.annotation
        yield f"{obj.path} =", obj.value
    elif isinstance(obj, griffe.Class):
        for base in obj.bases:
            yield f"{obj.path} bases", base
        for name, member in obj.members.items():
            if (name == "__init__" or not name.startswith("_")) and not member.is_alias:
                yield from shown_parts(member)


@pytest.fixture(scope="module")
def griffe_package() -> Any:
    """sepp_lite as the site's build reads it: griffe with the extensions of mkdocs.yml."""
    griffe = pytest.importorskip("griffe", reason="griffelib needs Python 3.11+")
    text = MKDOCS_YML.read_text(encoding="utf-8")
    paths = re.findall(r"^\s+- (docs/_gen/griffe_\w+\.py)$", text, re.MULTILINE)
    assert paths, "mkdocs.yml names the griffe extensions"
    extensions = griffe.load_extensions(*(str(ROOT / path) for path in paths))
    return griffe.load(
        "sepp_lite", search_paths=[str(ROOT)], extensions=extensions, resolve_aliases=True
    )


def test_the_reference_signatures_name_nothing_private(griffe_package: Any) -> None:
    """Defaults render as values (``rpc_timeout = timedelta(seconds=30)``), never as a
    private name (``_DEFAULT_RPC_TIMEOUT``), and no annotation names a private type."""
    shown = []
    for entry in reference_entries():
        target = griffe_package[entry.path.split(".", 1)[1]]
        for where, part in shown_parts(target):
            shown.extend(f"{where}: {name}" for name in private_names(part))
    assert shown == []


def test_the_private_name_check_sees_names_in_every_form() -> None:
    assert private_names("timedelta(seconds=30)") == []
    assert private_names("'_quoted'") == []
    assert private_names("_DEFAULT_LEASE_S") == ["_DEFAULT_LEASE_S"]
    assert private_names("_coalesce.DEFAULT_MAX_IN_FLIGHT") == ["_coalesce"]
    assert private_names("Options._hidden") == ["_hidden"]


def test_a_default_shows_as_its_value() -> None:
    pytest.importorskip("griffe", reason="griffelib needs Python 3.11+")
    path = DOCS / "_gen" / "griffe_signatures.py"
    spec = importlib.util.spec_from_file_location("griffe_signatures", path)
    assert spec is not None and spec.loader is not None
    values = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(values)
    assert values.plain(timedelta(hours=24)) == "timedelta(hours=24)"
    assert values.plain(timedelta(seconds=90)) == "timedelta(seconds=90)"
    assert values.plain(timedelta(milliseconds=1500)) == "timedelta(seconds=1.5)"
    assert values.plain((1, "a")) == "(1, 'a')" and values.plain((2.0,)) == "(2.0,)"
    assert values.plain(None) == "None" and values.plain(16 * 1024 * 1024) == "16777216"
    assert values.plain(object()) is None and values.plain((1, object())) is None
