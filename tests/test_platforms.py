"""The platform matrix: .ci/record-platform turns a pytest JUnit XML file into
docs/platforms/results/NAME.json, docs/_gen/platforms.py renders those into the table of
docs/platforms.md (which must be what the committed results render), and ``make
platforms`` runs every platform's suite, keeps going past a failed one and fails at the
end."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / ".ci" / "record-platform"


def load(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load("platforms_gen", ROOT / "docs" / "_gen" / "platforms.py")


def junit(tmp_path: Path, body: str, name: str = "run.xml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


# What pytest 8 writes (the attributes that matter), with one suite.
PYTEST_XML = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="1" failures="2" skipped="3" tests="20" time="81.237"
 timestamp="2026-12-05T13:00:00" hostname="h"><testcase classname="t" name="a" time="0.1"/>
</testsuite></testsuites>"""


def record(tmp_path: Path, junit_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RECORD), "--name", "cpython-3.11-s390x", "--junit", str(junit_path),
         "--source", "make foreign-arch", "--out", str(tmp_path / "out"), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


def test_a_run_is_recorded_with_its_counts_and_where_it_ran(tmp_path: Path) -> None:
    version = "3.11.2 (main, Mar 13 2023, 12:18:29) [GCC 12.2.0]"
    done = record(tmp_path, junit(tmp_path, PYTEST_XML), "--python", version, "--arch", "s390x",
                  "--libc", "glibc", "--note", "client suites")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out" / "cpython-3.11-s390x.json").read_text("utf-8"))
    assert result["name"] == "cpython-3.11-s390x"
    assert (result["interpreter"], result["version"]) == ("CPython", "3.11.2")
    assert (result["arch"], result["libc"]) == ("s390x", "glibc")
    assert (result["passed"], result["skipped"], result["failed"]) == (14, 3, 3)
    assert result["seconds"] == 81.2 and result["source"] == "make foreign-arch"
    assert result["note"] == "client suites" and result["date"].endswith(" UTC")
    assert result["commit"] is None or len(result["commit"].split("+")[0]) == 12
    assert "14 passed, 3 skipped, 3 failed" in done.stdout


def test_several_suites_are_summed(tmp_path: Path) -> None:
    xml = (
        '<testsuites><testsuite tests="5" failures="0" errors="0" skipped="1" time="1.5"/>'
        '<testsuite tests="7" failures="1" errors="0" skipped="0" time="2"/></testsuites>'
    )
    done = record(tmp_path, junit(tmp_path, xml), "--python", "Python 3.9.18")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out" / "cpython-3.11-s390x.json").read_text("utf-8"))
    assert (result["passed"], result["skipped"], result["failed"], result["seconds"]) == (
        10, 1, 1, 3.5)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("", "not a readable JUnit XML file"),
        ("<testsuites><testsuite tests='3'", "not a readable JUnit XML file"),
        ("<html><body/></html>", "no <testsuite>"),
        ("<testsuites/>", "no <testsuite>"),
        ("<testsuite tests='3' failures='0' errors='0'/>", "without the 'skipped' count"),
        ("<testsuite tests='3' failures='x' errors='0' skipped='0'/>", "is not a number"),
        ("<testsuite tests='0' failures='0' errors='0' skipped='0'/>", "no tests ran"),
        ("<testsuite tests='2' failures='2' errors='1' skipped='0'/>", "more failures"),
    ],
)
def test_a_junit_file_it_cannot_read_is_an_error(tmp_path: Path, body: str, why: str) -> None:
    done = record(tmp_path, junit(tmp_path, body), "--python", "3.11.2")
    assert done.returncode == 1 and why in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_junit_file_is_an_error(tmp_path: Path) -> None:
    done = record(tmp_path, tmp_path / "absent.xml", "--python", "3.11.2")
    assert done.returncode == 1 and "absent.xml" in done.stderr


def test_a_name_that_is_no_file_name_is_refused(tmp_path: Path) -> None:
    xml = junit(tmp_path, PYTEST_XML)
    done = subprocess.run(
        [sys.executable, str(RECORD), "--name", "../up", "--python", "3.11.2", "--junit",
         str(xml), "--source", "s", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "--name" in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "up.json").exists()


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("3.11.2 (main, Mar 13 2023, 12:18:29) [GCC 12.2.0]", ("CPython", "3.11.2")),
        ("Python 3.14.10", ("CPython", "3.14.10")),
        ("3.15.0rc1", ("CPython", "3.15.0rc1")),
        (
            "3.13.5 experimental free-threading build (main) [GCC 14.2.0]",
            ("CPython (free-threaded)", "3.13.5"),
        ),
        (
            "3.11.13 (4a6a2b7a5e1c, Jul 01 2026, 10:00:00)\n[PyPy 8.0.1 with GCC 15.1.0]",
            ("PyPy", "3.11.13 (PyPy 8.0.1)"),
        ),
    ],
)
def test_the_interpreter_is_told_by_its_version_string(
    version: str, expected: tuple[str, str]
) -> None:
    module = load("record_platform", RECORD)
    assert module.interpreter(version) == expected


def test_a_version_string_without_a_version_is_an_error(tmp_path: Path) -> None:
    done = record(tmp_path, junit(tmp_path, PYTEST_XML), "--python", "python")
    assert done.returncode == 1 and "no version number" in done.stderr


# -- the table -------------------------------------------------------------------------


def result(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "interpreter": "CPython",
        "version": "3.11.2",
        "arch": "x86_64",
        "libc": "glibc",
        "source": "CI",
        "passed": 10,
        "skipped": 1,
        "failed": 0,
        "seconds": 75.0,
        "date": "2026-12-05 13:00 UTC",
    }
    return {**base, **fields}


def test_the_table_orders_interpreters_newest_first(gen: ModuleType) -> None:
    rows = [
        result(version="3.9.18", passed=1),
        result(interpreter="PyPy", version="3.11.13 (PyPy 8.0.1)", passed=2),
        result(version="3.11.2", arch="s390x", passed=3, note="client | suites"),
        result(version="3.14.10", passed=4, seconds=5.4),
        result(version="3.11.9", passed=5),
        result(interpreter="CPython (free-threaded)", version="3.13.5", passed=6),
    ]
    lines = gen.table(rows).splitlines()
    assert lines[0].startswith("| interpreter | version | arch / libc |")
    order = [int(re.split(r"(?<!\\)\|", line)[5]) for line in lines[2:]]
    assert order == [4, 5, 3, 1, 6, 2]
    assert "| 3.14.10 | x86_64 / glibc | CI | 4 | 1 | 0 | 5 s | 2026-12-05 |" in lines[2]
    assert "CI (client \\| suites)" in lines[4] and "| 1 min 15 s |" in lines[4]


def test_a_result_without_a_field_is_an_error(gen: ModuleType, tmp_path: Path) -> None:
    bad = result()
    del bad["failed"]
    (tmp_path / "x.json").write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match="'failed'"):
        gen.load(tmp_path)


def test_the_page_keeps_what_is_around_the_table(gen: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text(json.dumps(result()), encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(f"# P\n\nabove\n\n{gen.TABLE_START}\nSTALE\n{gen.TABLE_END}\n\nbelow\n")
    assert gen.update(tmp_path / "results", page)
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# P\n\nabove\n\n{gen.TABLE_START}\n\n| interpreter")
    assert text.endswith(f"|\n\n{gen.TABLE_END}\n\nbelow\n") and "STALE" not in text
    assert not gen.update(tmp_path / "results", page)  # idempotent


def test_the_committed_table_is_what_the_committed_results_render(gen: ModuleType) -> None:
    page = gen.PAGE.read_text(encoding="utf-8")
    assert page == gen.rendered(page, gen.load()), (
        "docs/platforms.md's table is stale: python docs/_gen/platforms.py --update"
    )


def test_every_committed_result_is_named_as_record_platform_names_it(gen: ModuleType) -> None:
    for path in sorted(gen.RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["name"] == path.stem and data["commit"], path


# -- make platforms --------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_platforms_keeps_going_and_fails_at_the_end(tmp_path: Path) -> None:
    # Stand-ins for the scripts: each says how it was called; the sid suite fails.
    scripts = tmp_path / "ci"
    scripts.mkdir()
    for name, status in (("sid-suite", 1), ("platform-suite", 0), ("foreign-arch", 0)):
        script = scripts / name
        script.write_text(
            f'#!/bin/sh\necho "{name} $* SUITE=${{SUITE:-}} RESULTS=$PLATFORM_RESULTS"\n'
            f"exit {status}\n"
        )
        script.chmod(0o755)
    logs, results = tmp_path / "logs", tmp_path / "results"
    outer = {"MFLAGS", "SUITE", "PYTHON", "CI_SCRIPTS", "PLATFORM_LOGS", "PLATFORM_RESULTS"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in outer}
    done = subprocess.run(
        ["make", "--no-print-directory", "platforms", f"CI_SCRIPTS={scripts}",
         f"PLATFORM_LOGS={logs}", f"PLATFORM_RESULTS={results}",
         f"PLATFORMS_TABLE=echo table > {tmp_path / 'table'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "FAILED: cpython-3.14" in done.stderr
    logged = {p.name: p.read_text().strip() for p in logs.iterdir()}
    assert logged == {
        "cpython-3.14.log": f"sid-suite python3.14 SUITE= RESULTS={results}",
        "musl.log": f"platform-suite musl SUITE= RESULTS={results}",
        "s390x.log": f"foreign-arch s390x SUITE= RESULTS={results}",
        "ppc64el.log": f"foreign-arch ppc64el SUITE= RESULTS={results}",
        "riscv64.log": f"foreign-arch riscv64 SUITE=trixie RESULTS={results}",
    }
    assert (tmp_path / "table").read_text() == "table\n"  # the table after every run
