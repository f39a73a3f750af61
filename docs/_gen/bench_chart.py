"""The benchmark chart of the documentation, and its text equivalent, from the results
`make bench` writes (bench/results/latest.json). Standard library only.

Both are committed, so that docs/benchmarks.md shows them where Markdown is read
without a build (the repository's own pages): the chart as docs/img/bench.svg, the
tables between the page's ``<!-- bench-table -->`` marks. ``make bench`` rewrites both
(``--update``); tests/test_docs.py fails when either differs from what this module
makes of latest.json.

    python docs/_gen/bench_chart.py --update                              # after a bench run
    python docs/_gen/bench_chart.py bench/results/latest.json out.svg   # to look at it

Every ratio is sepp_lite's CPU (or time, or size) over sepp-py's on CPython, the median
of the paired runs where the bench pairs them: below 1 means sepp_lite spends less."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from xml.sax.saxutils import escape

# The bench's workload names, as a reader knows them (an unknown one shows its name).
LABELS = {
    "batch": "enqueue_batch of 256 jobs",
    "batch_plain": "enqueue_batch of 256 plain jobs",
    "enqueue16": "enqueue, 16 concurrent callers",
    "enqueue64": "enqueue, 64 concurrent callers",
    "threads8": "enqueue from 8 threads (sync)",
    "reserve_ack": "reserve 32 at a time + ack each",
    "worker": "Worker, no-op handler",
    "small_call": "get_server_info in sequence",
}
SERIES = (
    ("cpython", "sepp_lite on CPython", "#00897b"),
    ("pypy", "sepp_lite on PyPy", "#ef6c00"),
    ("nursery", "sepp_lite on PyPy, nursery 4MB", "#6a1b9a"),
)
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "latest.json"
CHART = ROOT / "docs" / "img" / "bench.svg"
PAGE = ROOT / "docs" / "benchmarks.md"
TABLE_START, TABLE_END = "<!-- bench-table -->", "<!-- /bench-table -->"
WIDTH, LABEL_X, BARS_X, BAR_H, BAR_GAP, GROUP_GAP = 720, 12, 250, 14, 3, 14
FONT = {"font-family": "sans-serif", "font-size": "12", "fill": "#1f2933"}


@dataclass(frozen=True)
class Row:
    label: str
    values: tuple[tuple[str, float], ...]  # (series key, ratio), in SERIES order


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def _label(name: str) -> str:
    return LABELS.get(name, name)


def _ratio(mine: Optional[float], theirs: Optional[float]) -> Optional[float]:
    return mine / theirs if mine is not None and theirs else None


def cpu_rows(data: dict[str, Any]) -> list[Row]:
    """One row per workload: the CPython pair ratio, then PyPy's where it ran."""
    pypy = data.get("pypy") or {}
    rows = []
    for workload in data.get("workloads", []):
        name = workload["workload"]
        values = [("cpython", float(workload["pair_ratio_median"]))]
        if name in pypy:
            values.append(("pypy", float(pypy[name]["pypy_vs_sepp_pair_median"])))
            nursery = pypy[name].get("pypy_nursery_vs_sepp_pair_median")
            if nursery is not None:
                values.append(("nursery", float(nursery)))
        rows.append(Row(_label(name), tuple(values)))
    return rows


def other_rows(data: dict[str, Any]) -> list[Row]:
    """The median latency of a small call, and the footprint (CPython only)."""
    rows = []
    for workload in data.get("workloads", []):
        if "p50_pair_ratio_median" in workload:
            label = f"{_label(workload['workload'])}: p50 latency"
            rows.append(Row(label, (("cpython", float(workload["p50_pair_ratio_median"])),)))
    footprint = data.get("footprint") or {}
    for key, label in (
        ("import_ms", "cold import time"),
        ("rss_kib", "memory (RSS) after connect"),
        ("installed_mib", "installed size, with dependencies"),
    ):
        pair = footprint.get(key) or {}
        ratio = _ratio(pair.get("sepp_lite"), pair.get("sepp"))
        if ratio is not None:
            rows.append(Row(label, (("cpython", ratio),)))
    return rows


def _text(x: float, y: float, content: str, **attributes: str) -> str:
    """A <text> element in the chart's font; ``font_size="15"`` overrides a default."""
    merged = {**FONT, **{k.replace("_", "-"): v for k, v in attributes.items()}}
    attrs = " ".join(f'{name}="{value}"' for name, value in merged.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" {attrs}>{escape(content)}</text>'


def _bars(rows: list[Row], top: float, scale: float) -> Iterator[str]:
    colors = {key: color for key, _, color in SERIES}
    y = top
    for row in rows:
        height = len(row.values) * (BAR_H + BAR_GAP)
        yield _text(LABEL_X, y + height / 2 + 2, row.label, dominant_baseline="middle")
        for key, value in row.values:
            width = max(value * scale, 1.0)
            yield (
                f'<rect x="{BARS_X}" y="{y:.1f}" width="{width:.1f}" height="{BAR_H}" '
                f'fill="{colors[key]}"><title>{escape(row.label)}: {value:.2f}×</title></rect>'
            )
            yield _text(BARS_X + width + 5, y + BAR_H - 3, f"{value:.2f}×")
            y += BAR_H + BAR_GAP
        y += GROUP_GAP


def _height(rows: list[Row]) -> float:
    return sum(len(r.values) * (BAR_H + BAR_GAP) + GROUP_GAP for r in rows)


def svg(data: dict[str, Any]) -> str:
    """The chart: one horizontal bar per ratio, a line at sepp-py's 1.0."""
    cpu, other = cpu_rows(data), other_rows(data)
    peak = max([1.0] + [v for row in cpu + other for _, v in row.values])
    scale = (WIDTH - BARS_X - 60) / (peak * 1.05)
    date = (data.get("machine") or {}).get("date", "")
    title = "sepp_lite against sepp-py 0.1.0 on CPython (1.0 = the same, lower is better)"
    parts = [
        _text(LABEL_X, 22, title, font_size="15", font_weight="bold"),
        _text(LABEL_X, 40, f"make bench, {date}"),
    ]
    for index, (_, name, color) in enumerate(SERIES):
        x = LABEL_X + index * 200
        parts.append(f'<rect x="{x}" y="52" width="12" height="12" fill="{color}"/>')
        parts.append(_text(x + 17, 62, name))
    top = 96.0
    parts.append(_text(LABEL_X, top - 8, "CPU per job", font_weight="bold"))
    parts.extend(_bars(cpu, top, scale))
    second = top + _height(cpu) + 24
    parts.append(_text(LABEL_X, second - 8, "Latency and footprint", font_weight="bold"))
    parts.extend(_bars(other, second, scale))
    bottom = second + _height(other)
    one = BARS_X + scale
    parts.append(
        f'<line x1="{one:.1f}" y1="{top - 20}" x2="{one:.1f}" y2="{bottom:.1f}" '
        'stroke="#52606d" stroke-dasharray="4 3"/>'
    )
    parts.append(_text(one - 4, top - 10, "sepp-py = 1.0", fill="#52606d", text_anchor="end"))
    height = bottom + 10
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" role="img" '
        'aria-label="Bar chart of sepp_lite against sepp-py; the table below has the numbers">'
        f'<rect width="100%" height="100%" fill="#ffffff"/>{"".join(parts)}</svg>\n'
    )


def _x(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2f}×"


def _us(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}"


def _cpu_table(data: dict[str, Any]) -> list[str]:
    pypy = data.get("pypy") or {}
    lines = [
        "| workload | sepp_lite µs | sepp-py µs | sepp_lite / sepp-py | PyPy / sepp-py "
        "| PyPy, nursery 4MB / sepp-py |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in data.get("workloads", []):
        on_pypy = pypy.get(w["workload"], {})
        lines.append(
            f"| {_label(w['workload'])}, CPU per job | {_us(w['sepp_lite_cpu_us'])} "
            f"| {_us(w['sepp_cpu_us'])} | {_x(w['pair_ratio_median'])} "
            f"| {_x(on_pypy.get('pypy_vs_sepp_pair_median'))} "
            f"| {_x(on_pypy.get('pypy_nursery_vs_sepp_pair_median'))} |"
        )
    return lines


def _latency_rows(workload: dict[str, Any]) -> list[str]:
    """p50 with the median of the paired ratios (as the chart), p99 as measured."""
    lines = []
    for pct, ratio in (("p50", workload.get("p50_pair_ratio_median")), ("p99", None)):
        mine, theirs = workload.get(f"sepp_lite_{pct}_us"), workload.get(f"sepp_{pct}_us")
        if mine is not None and theirs is not None:
            lines.append(
                f"| {_label(workload['workload'])}: {pct} latency | {mine:.0f} µs "
                f"| {theirs:.0f} µs | {_x(ratio)} |"
            )
    return lines


def _other_table(data: dict[str, Any]) -> list[str]:
    lines = ["| measure | sepp_lite | sepp-py | ratio |", "| --- | ---: | ---: | ---: |"]
    for workload in data.get("workloads", []):
        lines += _latency_rows(workload)
    footprint = data.get("footprint") or {}
    for key, label, unit, divisor in (
        ("import_ms", "cold import time", "ms", 1),
        ("rss_kib", "memory (RSS) after connect", "MiB", 1024),
        ("installed_mib", "installed size, with dependencies", "MiB", 1),
    ):
        pair = footprint.get(key) or {}
        mine, theirs = pair.get("sepp_lite"), pair.get("sepp")
        if mine is not None and theirs is not None:
            lines.append(
                f"| {label} | {mine / divisor:.1f} {unit} | {theirs / divisor:.1f} {unit} "
                f"| {_x(_ratio(mine, theirs))} |"
            )
    return lines


def markdown_tables(data: dict[str, Any]) -> str:
    """The chart's numbers as Markdown tables, with the run's date and machine."""
    machine = data.get("machine") or {}
    versions = data.get("versions") or {}
    pypy_versions = data.get("pypy_versions") or {}
    intro = (
        f"Measured {machine.get('date', '?')} on {machine.get('cpu', '?')} "
        f"({machine.get('cores', '?')} cores), {versions.get('python', '?')}"
        + (f" and {pypy_versions['python']}" if "python" in pypy_versions else "")
        + f", sepp_lite {versions.get('sepp-lite', '?')} against sepp-py "
        f"{versions.get('sepp-py', '?')} (grpcio {versions.get('grpcio', '?')}); "
        f"{data.get('rounds', '?')} rounds per workload, {data.get('jobs', '?')} jobs per run."
    )
    parts = [intro, "", *_cpu_table(data), "", *_other_table(data)]
    sync = (data.get("sync") or {}).get("enqueue1")
    if sync:
        parts += [
            "",
            "The blocking client (`sepp_lite.sync`) against the async one, enqueueing one job "
            f"at a time: {sync['sync_cpu_us']:.1f} µs against {sync['async_cpu_us']:.1f} µs "
            f"of CPU per job ({_x(sync['pair_ratio_median'])}).",
        ]
    threads = data.get("free_threading")
    if threads:
        parts += [
            "",
            f"On {threads['versions']['free_threaded']}, a CPU-bound plain `def` task "
            f"(about 10 ms of pure Python) × {threads['jobs']} on a worker with 2 threads: "
            f"{threads['free_threaded_wall_s']:.2f} s against {threads['gil_on_wall_s']:.2f} s "
            f"with its GIL on, PYTHON_GIL=1 ({_x(threads['vs_gil_on_pair_median'])}).",
        ]
    return "\n".join(parts) + "\n"


def with_tables(page: str, data: dict[str, Any]) -> str:
    """The page with the tables of ``data`` between its table marks (and nothing else)."""
    start = page.index(TABLE_START) + len(TABLE_START)
    end = page.index(TABLE_END, start)
    return page[:start] + "\n\n" + markdown_tables(data) + "\n" + page[end:]


def update(results: Path = RESULTS, chart: Path = CHART, page: Path = PAGE) -> None:
    """Rewrite the committed chart and the page's tables from ``results``."""
    data = load(results)
    chart.write_text(svg(data), encoding="utf-8")
    page.write_text(with_tables(page.read_text(encoding="utf-8"), data), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update()
    else:
        source, target = Path(sys.argv[1]), Path(sys.argv[2])
        target.write_text(svg(load(source)), encoding="utf-8")
