"""The Makefile's first-run targets, as ``make -n`` prints them for a fresh venv:
``make demo`` installs sepp_lite with its runtime dependencies only, ``make test``
the whole toolchain, and ``make dist`` builds a wheel. (CI runs ``make demo`` and
``make dist`` for real on a fresh machine, and installs the wheel.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


OUTER_MAKE = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "EXTRAS", "VENV", "PYTHON"}
OUTER_MAKE |= {"PROTO_VENV", "PYTEST_ARGS", "PYTEST_WORKERS", "DEMO_ARGS", "ARCH", "DIST"}


def planned(target: str, tmp_path: Path, *variables: str) -> list[str]:
    """The commands ``make TARGET`` would run with a venv that does not exist yet."""
    # Run under `make test`, the outer make's flags and level must not leak in, nor the
    # variables it was given on its command line (make exports those: CI runs
    # `make test EXTRAS=test`).
    env = {k: v for k, v in os.environ.items() if k not in OUTER_MAKE}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={tmp_path / 'venv'}", *variables],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def installs(commands: list[str]) -> list[str]:
    return [c for c in commands if " -m pip install " in c and "--upgrade pip" not in c]


def test_make_demo_installs_only_the_runtime(tmp_path: Path) -> None:
    commands = planned("demo", tmp_path)
    assert [c.split(" -m pip ")[1] for c in installs(commands)] == ["install -q -e ."]
    assert commands[-1].endswith("/bin/sepp-lite demo")


def test_make_test_installs_the_dev_toolchain(tmp_path: Path) -> None:
    commands = planned("test", tmp_path)
    assert [c.split(" -m pip ")[1] for c in installs(commands)] == ["install -q -e '.[dev]'"]
    assert " -m pytest" in commands[-1]


def test_after_make_test_make_demo_installs_nothing(tmp_path: Path) -> None:
    # The full install marks the runtime one done as well.
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-dev").touch()
    (venv / ".installed-runtime").touch()
    commands = planned("demo", tmp_path)
    assert installs(commands) == [] and len(commands) == 1
    marker = [c for c in planned("install", tmp_path / "other") if c.startswith("touch ")]
    assert marker and marker[0].endswith(".installed-runtime")


def test_make_dist_builds_a_wheel(tmp_path: Path) -> None:
    commands = planned("dist", tmp_path)
    assert any(" -m pip wheel " in c and "--no-deps" in c and "dist" in c for c in commands)


def test_make_foreign_arch_runs_the_script_for_that_architecture(tmp_path: Path) -> None:
    assert planned("foreign-arch", tmp_path, "ARCH=riscv64") == [".ci/foreign-arch riscv64"]
    assert planned("foreign-arch", tmp_path) == [".ci/foreign-arch s390x"]


def test_the_foreign_arch_script_refuses_an_unknown_architecture() -> None:
    # Checked before anything is installed, mounted or downloaded.
    done = subprocess.run(
        [str(ROOT / ".ci" / "foreign-arch"), "x86-64"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "a Debian architecture name (s390x, riscv64" in done.stderr
