"""Install the requirements of sepp-lite's extras (argv[1], comma-separated) that this
interpreter has wheels for, one at a time, and say which it has none for.

For an interpreter whose ABI is newer than the wheels on the package index (PyPy 8):
.ci/sid-suite runs it, with PIP_ONLY_BINARY=:all:, after `pip install -e .[extras]`
failed. The tests of what is left out skip, or take another way (tests/pki.py).
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement


def wanted(extras: set[str]) -> list[Requirement]:
    """The requirements of these extras that apply here, following sepp-lite[...]."""
    found: list[Requirement] = []
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in requires("sepp-lite") or []:
            req = Requirement(line)
            if req.marker is None or not req.marker.evaluate({"extra": extra}):
                continue
            if req.name == "sepp-lite":
                todo.extend(req.extras)
            elif str(req) not in map(str, found):
                found.append(req)
    return found


def main() -> int:
    missing = []
    for req in wanted(set(sys.argv[1].split(","))):
        spec = str(req).split(";")[0]
        pip = [sys.executable, "-m", "pip", "install", "-q", spec]
        if subprocess.run(pip, capture_output=True).returncode != 0:
            missing.append(spec)
    if missing:
        print("no wheel for this interpreter, left out:", ", ".join(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
