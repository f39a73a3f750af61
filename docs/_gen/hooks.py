"""MkDocs hooks (mkdocs.yml `hooks:`): the benchmark chart and its table, generated at
build time from bench/results/latest.json by bench_chart.py, never drawn by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_chart

TABLE_MARK = "<!-- bench-table -->"
CHART_PATH = "img/bench.svg"


def _results(config: Any) -> dict[str, Any]:
    root = Path(config.config_file_path).resolve().parent
    return bench_chart.load(root / "bench" / "results" / "latest.json")


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, CHART_PATH, content=bench_chart.svg(_results(config))))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if TABLE_MARK in markdown:
        markdown = markdown.replace(TABLE_MARK, bench_chart.markdown_tables(_results(config)))
    return markdown
