"""Every code block of README.md runs, in document order, against servers that
tests/doc_examples.py starts (its docstring has the conventions: ``<!-- file: NAME -->``,
``# exits N``, the setup commands that do not run). Only the first block (``make demo``,
``make test``) and setup commands do not run.

The examples must not lean on each other's leftovers: each section's examples use
queues of their own (checked statically), and the sections also run in reverse order
on fresh servers. CI (``.ci/run``) runs the Install section's setup commands.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.doc_examples import (
    ROOT,
    Block,
    Env,
    expected_status,
    make_env,
    queue_owners,
    read_blocks,
    run_block,
    unrun_blocks,
)

pytestmark = pytest.mark.timeout(120)

README = ROOT / "README.md"
BLOCKS = read_blocks(README)
RUNNABLE = [block for block in BLOCKS if block.runs]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from make_env(tmp_path_factory, BLOCKS)


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"line{b.line}" for b in RUNNABLE])
def test_readme_block(block: Block, env: Env) -> None:
    run_block(block, env)


# -- the README's shape -----------------------------------------------------------------


def test_readme_begins_with_make_demo_and_make_test() -> None:
    lines = README.read_text().splitlines()
    assert lines[0] == "# sepp_lite" and lines[1] == ""
    first = BLOCKS[0]
    assert first.line == 3 and first.lang == "sh"
    assert [command.split("#")[0].strip() for command in first.commands()] == [
        "make demo",
        "make test",
    ]


def test_every_block_runs_or_is_a_setup_command() -> None:
    """No block is left untested by accident: what does not run is the first block,
    setup commands (``pip install``, ``make dist``), and data files the commands read."""
    assert BLOCKS[0].commands() and not BLOCKS[0].runs
    assert unrun_blocks(BLOCKS[1:]) == []


def test_the_block_reader_finds_what_it_should() -> None:
    """The runner's own parsing, so a README edit cannot make blocks vanish quietly."""
    langs = [block.lang for block in BLOCKS]
    # The first run, the install commands, a server, a task, a producer and a worker.
    assert langs.count("sh") >= 2 and langs.count("python") >= 2 and "console" in langs
    assert [b.section for b in BLOCKS if b.lang == "python"] == ["A first job"] * 3
    text = "$ sepp-lite a \\\n  --b\noutput\n$ sepp-lite c # exits 1\n"
    console = Block(1, "console", text, None)
    assert console.runs
    assert console.commands() == ["sepp-lite a --b", "sepp-lite c # exits 1"]
    assert expected_status("sepp-lite c # exits 1") == ("sepp-lite c", 1)
    assert expected_status("sepp-lite c # a comment") == ("sepp-lite c", 0)


# -- examples that stand alone ----------------------------------------------------------


def test_each_section_uses_queues_of_its_own() -> None:
    owner = queue_owners(RUNNABLE)
    # The parsing finds what the examples use: the producer's and the worker's queue,
    # in one section (the site's pages are checked among themselves in test_docs.py).
    assert owner == {"emails": "README.md: A first job"}


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from make_env(tmp_path_factory, BLOCKS)


@pytest.mark.slow
def test_the_sections_also_run_in_reverse_order(fresh_env: Env) -> None:
    """Each section's examples work whatever ran before them: here on fresh servers,
    last section first (within a section, in order: the worker needs the producer's
    job). The short README has one such section; the site's pages hold the rest."""
    sections: dict[str, list[Block]] = {}
    for block in RUNNABLE:
        sections.setdefault(block.section, []).append(block)
    assert list(sections) == ["A first job"]  # a server, then a producer and its worker
    for name in reversed(list(sections)):
        for block in sections[name]:
            test_readme_block(block, fresh_env)


# -- what a user looks for --------------------------------------------------------------


def test_the_sections_a_user_looks_for_are_there() -> None:
    """A newcomer's page: what it is, how to install it, a first job, and where the rest
    is; each link into the site names a page that exists (the site's own links are
    checked by `make docs`, strictly)."""
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == ["What this is", "Install", "A first job", "Documentation"]
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert len(set(links)) >= 15
    for link in links:
        assert (ROOT / link).is_file(), link
    for page in ("tasks.md", "periodic.md", "reference/checks.md", "troubleshooting.md"):
        assert f"docs/{page}" in links, page
    assert len(text.splitlines()) <= 150  # read in five minutes
    # `pip install sepp-lite` is not a command to run yet: no index serves it, so the
    # README does not name it at all (a requirement with a file:// URL is fine).
    from_index = re.compile(r"pip install\s+['\"]?sepp-lite\b(?!\S*\s*@)")
    assert not from_index.search(text)
    prose = " ".join(text.split())
    assert "sepp_lite is not published on PyPI yet" in prose


def test_the_first_job_is_a_typed_task() -> None:
    """A task, then its producer and its worker; the raw API is a link away."""
    first_job = [b for b in BLOCKS if b.section == "A first job" and b.lang == "python"]
    task, producer, worker = first_job
    assert task.file == "welcome.py" and "@tasks.task" in task.text
    assert "send_welcome.enqueue(" in producer.text and "tasks.worker(" in worker.text
    assert not [b for b in BLOCKS if "EnqueueRequest(" in b.text]
    assert "docs/getting-started.md#the-raw-api-bytes-and-code-written-for-sepp-py" in (
        README.read_text()
    )


def test_the_changelog_has_a_versioning_policy_and_this_version() -> None:
    from sepp_lite import __version__

    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, re.MULTILINE)
    assert headings[:2] == ["Versioning", "[Unreleased]"]
    assert f"[{__version__}]" in [heading.split(" - ")[0] for heading in headings]
    assert "Semantic Versioning" in changelog
