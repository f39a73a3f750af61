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
tested here too.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
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


def reference_names() -> set[str]:
    """What the API reference documents: ``::: sepp_lite.NAME`` directives, the names
    in their ``members:`` lists, and whole modules (``::: sepp_lite._rejections``)."""
    names: set[str] = set()
    for page in (DOCS / "reference").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        names.update(re.findall(r"^::: (\S+)$", text, re.MULTILINE))
        for target, members in re.findall(
            r"^::: (\S+)\n(?:    .*\n)*?      members:\n((?:        - \S+\n)+)", text, re.M
        ):
            names.update(f"{target}.{m}" for m in re.findall(r"- (\S+)", members))
    return names


def test_every_public_name_is_in_the_api_reference() -> None:
    import sepp_lite
    import sepp_lite.monitor
    import sepp_lite.testing

    documented = reference_names()
    rejections = "sepp_lite._rejections" in documented
    missing = []
    for name in sepp_lite.__all__:
        module = getattr(getattr(sepp_lite, name), "__module__", "")
        if name == "__version__" or (rejections and module == "sepp_lite._rejections"):
            continue
        if f"sepp_lite.{name}" not in documented and f"sepp_lite.errors.{name}" not in documented:
            missing.append(name)
    for name in sepp_lite.testing.__all__:
        if f"sepp_lite.testing.{name}" not in documented:
            missing.append(f"testing.{name}")
    assert "sepp_lite.monitor" in documented and "sepp_lite.sync.SeppClient" in documented
    assert missing == []


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
    # The life cycle has a picture and the same in words.
    assert "(img/lifecycle.svg)" in text["concepts.md"] and "dead-lettered" in text["concepts.md"]
    ET.parse(DOCS / "img" / "lifecycle.svg")


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
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    assert "(img/bench.svg)" in page and "<!-- bench-table -->" in page


def test_the_chart_script_writes_the_svg(chart: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "bench.svg"
    source = ROOT / "bench" / "results" / "latest.json"
    subprocess.run(
        [sys.executable, str(DOCS / "_gen" / "bench_chart.py"), str(source), str(out)], check=True
    )
    assert out.read_text(encoding="utf-8") == chart.svg(chart.load(source))
