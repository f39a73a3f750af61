"""The soak run (``bench/soak.py``, ``make soak``) at a small scale: 2,000 jobs over
10 seconds, 4 producers, 2 worker processes. Every check of the full run must pass,
and the job fates make the server's totals exact numbers."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent
SOAK = ROOT / "bench" / "soak.py"
JOBS = 2000
# Fates repeat every 200 jobs: 171 acked, 16 fail once, 8 dead-lettered at once,
# 4 fail all 3 attempts, 1 outlives its first lease.
RETRY, PERMANENT, EXHAUST, SLOW = 160, 80, 40, 10


# A 10-second run measures CPython's memory from its 2nd second on; PyPy's JIT is
# still compiling then and grows the workers by some 15 %, so it gets more room.
RSS_TOLERANCE = 0.35 if platform.python_implementation() == "PyPy" else 0.10


def test_small_soak_passes_every_check(tmp_path: Path) -> None:
    summary_file = tmp_path / "soak.json"
    command = [sys.executable, str(SOAK), "--jobs", str(JOBS), "--minutes", "0.17"]
    command += ["--workers", "2", "--lease", "2", "--sample-every", "0.5"]
    command += ["--print-every", "5", "--settle-timeout", "40", "--json", str(summary_file)]
    command += ["--rss-tolerance", str(RSS_TOLERANCE)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=80, cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert summary_file.exists(), output
    summary = json.loads(summary_file.read_text())
    failed = [check for check in summary["checks"] if not check["passed"]]
    assert failed == [], output
    assert proc.returncode == 0, output
    assert summary["passed"] is True
    assert len(summary["checks"]) == 8

    totals = summary["totals"]
    assert totals["enqueued"] == JOBS
    assert totals["dead_lettered"] == PERMANENT + EXHAUST
    assert totals["acked"] == JOBS - PERMANENT - EXHAUST
    # Every slow job's first lease lapses; a loaded machine may let a few more lapse,
    # and the redelivery check has accounted for each of them.
    lapses = totals["lease_expired"]
    assert SLOW <= lapses <= SLOW + 20
    assert summary["redelivery_causes"]["handler outlived its lease"] >= SLOW
    assert summary["redelivery_causes"]["retry nack"] == RETRY + 2 * EXHAUST
    # One delivery per job, one more per retry nack and per lapsed lease.
    assert totals["delivered"] == JOBS + RETRY + 2 * EXHAUST + lapses
    assert totals["nacked"] == RETRY + PERMANENT + 3 * EXHAUST
    assert totals["deduplicated"] == summary["producer_deduplicated"]

    assert [row["worker"] for row in summary["rss"]] == [0, 1]
    for row in summary["rss"]:
        assert abs(row["change_pct"]) <= RSS_TOLERANCE * 100
        assert 5 < row["baseline_mib"] < 500
        assert row["end_s"] > row["baseline_s"]
    assert "soak PASSED" in proc.stdout
