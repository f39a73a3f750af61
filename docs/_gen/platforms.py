"""The table of test runs in docs/platforms.md, from the results .ci/record-platform
writes (docs/platforms/results/*.json, one per interpreter and platform). Standard
library only.

The table is committed between the page's ``<!-- platform-table -->`` marks, so that
the page shows it where Markdown is read without a build; ``make platforms`` rewrites it
(``--update``), and tests/test_platforms.py fails when it differs from what this module
makes of the committed results.

    python docs/_gen/platforms.py --update      # after recording runs
    python docs/_gen/platforms.py               # print the table"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "platforms" / "results"
PAGE = ROOT / "docs" / "platforms.md"
TABLE_START, TABLE_END = "<!-- platform-table -->", "<!-- /platform-table -->"
FIELDS: dict[str, type | tuple[type, ...]] = {
    "interpreter": str,
    "version": str,
    "arch": str,
    "libc": str,
    "source": str,
    "passed": int,
    "skipped": int,
    "failed": int,
    "seconds": (int, float),
    "date": str,
}
# The order of the table: the interpreters, then the newer version, then x86_64 first.
KINDS = ("CPython", "CPython (free-threaded)", "PyPy")


def load(folder: Path = RESULTS) -> list[dict[str, Any]]:
    """Every result in the folder, each checked to have the fields the table shows."""
    results = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for field, kind in FIELDS.items():
            if not isinstance(data.get(field), kind) or isinstance(data.get(field), bool):
                raise ValueError(f"{path}: {field!r} missing or not a {kind}")
        results.append(data)
    return results


def order(result: dict[str, Any]) -> tuple[Any, ...]:
    kind = result["interpreter"]
    rank = KINDS.index(kind) if kind in KINDS else len(KINDS)
    numbers = tuple(int(n) for n in re.findall(r"\d+", result["version"].split()[0])[:3])
    return (rank, kind, tuple(-n for n in numbers), result["arch"] != "x86_64", result["arch"])


def cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown table: one row per result, the newest interpreters first."""
    lines = [
        "| interpreter | version | arch / libc | where it ran | passed | skipped | failed "
        "| time | date |",
        "|---|---|---|---|--:|--:|--:|--:|---|",
    ]
    for r in sorted(results, key=order):
        note = f" ({r['note']})" if r.get("note") else ""
        lines.append(
            f"| {cell(r['interpreter'])} | {cell(r['version'])} | {cell(r['arch'])} / "
            f"{cell(r['libc'])} | {cell(r['source'] + note)} | {r['passed']} | {r['skipped']} "
            f"| {r['failed']} | {duration(r['seconds'])} | {cell(r['date'].split()[0])} |"
        )
    if not results:
        lines.append("| (no runs recorded) | | | | | | | | |")
    return "\n".join(lines) + "\n"


def rendered(page_text: str, results: list[dict[str, Any]]) -> str:
    """The page with the table between its marks replaced by the results' table."""
    start, end = page_text.find(TABLE_START), page_text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {TABLE_START} ... {TABLE_END} marks")
    head = page_text[: start + len(TABLE_START)]
    # Blank lines around it: Markdown takes a table right after a comment for raw HTML.
    return f"{head}\n\n{table(results)}\n{page_text[end:]}"


def update(folder: Path = RESULTS, page: Path = PAGE) -> bool:
    """Rewrite the page's table; whether it changed."""
    old = Path(page).read_text(encoding="utf-8")
    new = rendered(old, load(folder))
    if new != old:
        Path(page).write_text(new, encoding="utf-8")
    return new != old


def main(argv: list[str]) -> int:
    if argv == ["--update"]:
        changed = update()
        print(f"{PAGE.relative_to(ROOT)}: {'updated' if changed else 'unchanged'}")
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(table(load()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
