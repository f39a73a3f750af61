"""The repository's files as git lists them, for the tests that read the tree
(``test_architecture.py``) or copy it (``test_deploy.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def repo_files() -> tuple[str, ...]:
    """The paths, relative to the repository's root, of the files git tracks and of the
    untracked ones it does not ignore, as the working tree has them now (a tracked file
    deleted since is left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return tuple(name for name in listed if (ROOT / name).is_file())
