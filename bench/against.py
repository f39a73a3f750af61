"""``make bench-against AGAINST=REF``: sepp_lite as it is in this tree against sepp_lite
at the git commit REF, same run, same server, alternating (issue 29: "the speed does not
drop, side by side before and after").

    python bench/against.py REF [--rounds 5] [--jobs 3000] [--workloads worker,...]

REF is exported with ``git archive`` into a temporary directory and installed, as a
wheel like the tree's, into ``.venv-bench-ref`` beside ``.venv-bench`` (reinstalled
only when REF names another commit). Both sides run this tree's ``bench/workloads.py``,
so a workload measures the same thing on both. Reported per workload: the median CPU
per job of each side, the median of the per-round ratios (tree / REF; below 1 is
faster), the ratio of the medians, and the spread of the pair ratios (lowest and
highest), the same statistics as the comparison with sepp-py.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import run

# The workloads it runs by default: every sepp_lite one, async, blocking
# (``sync:``) and the typed-task Worker.
WORKLOADS = [*run.WORKLOADS, "sync:enqueue1", "typed_worker"]
LABELS = {
    **run.LABELS,
    "threads8": "enqueue from 8 threads (sepp_lite.sync), CPU per job",
    "sync:enqueue1": "sepp_lite.sync, enqueue one job at a time, CPU per job",
    "typed_worker": "typed-task Worker, no-op, max_in_flight=64, CPU per job",
}
REF_VENV = run.ROOT / ".venv-bench-ref"


def commit_of(ref: str) -> str:
    """The full commit id ``ref`` names in this repository."""
    return run.sh("git", "-C", run.ROOT, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()


def ref_python(commit: str, base_python: str) -> Path:
    """``.venv-bench-ref`` holding sepp_lite exactly as it was at ``commit``."""
    exe = run.venv(REF_VENV, base_python)
    stamp = REF_VENV / ".bench-commit"
    if stamp.exists() and stamp.read_text() == commit:
        return exe
    archive = subprocess.run(
        ["git", "-C", str(run.ROOT), "archive", "--format=tar", commit],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="sepp-bench-ref-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp)  # our own repository's commit
        run.sh(exe, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", tmp)
        run.sh(exe, "-m", "pip", "install", "-q", tmp)
    stamp.write_text(commit)
    return exe


def _client(workload: str) -> tuple[str, str]:
    """workloads.py's ``--client`` and ``--workload`` for one of ours."""
    if workload.startswith("sync:"):
        return "sepp_lite.sync", workload.split(":", 1)[1]
    return run.LITE_CLIENT.get(workload, "sepp_lite"), workload


def compare_one(tree: Path, ref: Path, workload: str, rounds: int, jobs: int) -> dict[str, Any]:
    client, name = _client(workload)
    jobs *= run.JOBS_SCALE.get(name, 1)
    contenders: dict[str, run.Contender] = {"tree": (tree, client, {}), "ref": (ref, client, {})}
    with run.Server(tree) as server:
        runs = run.alternate(server, contenders, name, rounds, jobs)
    ratios = [a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in zip(runs["tree"], runs["ref"])]
    row = {
        "workload": workload,
        "jobs": jobs,
        "tree_cpu_us": run._median(runs["tree"], "cpu_us_per_job"),
        "ref_cpu_us": run._median(runs["ref"], "cpu_us_per_job"),
        "pair_ratio_median": statistics.median(ratios),
        "pair_ratios": ratios,
        "server_cpu_share": run._server_share(runs["tree"] + runs["ref"]),
        "runs": runs,
    }
    row["ratio_of_medians"] = row["tree_cpu_us"] / row["ref_cpu_us"]
    return row


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# sepp_lite: this tree against {report['ref']} ({report['commit'][:12]})",
        "",
        f"{report['machine']['date']}; {report['machine']['cpu']}, "
        f"{report['machine']['cores']} cores. {report['rounds']} rounds per workload, the "
        "two alternating (order flipped every round), one server process "
        f"({report['server']}); this tree's bench/workloads.py drives both.",
        "",
        run._row("workload", "tree µs", f"{report['ref']} µs", "tree / ref (median of pairs)",
                 "ratio of medians", "pair ratios, low–high", "server CPU share"),
        run._row("---", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]  # fmt: skip
    for row in report["workloads"]:
        lines.append(
            run._row(
                f"{LABELS.get(row['workload'], row['workload'])} ({row['jobs']} jobs)",
                f"{row['tree_cpu_us']:.1f}",
                f"{row['ref_cpu_us']:.1f}",
                f"{row['pair_ratio_median']:.3f}×",
                f"{row['ratio_of_medians']:.3f}×",
                f"{min(row['pair_ratios']):.2f}–{max(row['pair_ratios']):.2f}",
                f"{row['server_cpu_share']:.2f}",
            )
        )
    return "\n".join(lines) + "\n"


def compare_all(ref: str, workloads: list[str], rounds: int, jobs: int, server: str) -> int:
    base = sys.executable
    tree = run.venv(run.ROOT / ".venv-bench", base, str(run.ROOT), "sepp-py==0.1.0")
    commit = commit_of(ref)
    print(f"== sepp_lite at {ref} ({commit[:12]}) into {REF_VENV.name}", flush=True)
    ref_exe = ref_python(commit, base)
    report: dict[str, Any] = {
        "ref": ref,
        "commit": commit,
        "machine": run.machine(),
        "rounds": rounds,
        "server": server,
        "workloads": [],
    }
    for workload in workloads:
        print(f"== {workload}: tree against {ref}", flush=True)
        row = compare_one(tree, ref_exe, workload, rounds, jobs)
        print(
            f"   tree {row['tree_cpu_us']:.1f} us, {ref} {row['ref_cpu_us']:.1f} us, "
            f"tree / ref {row['pair_ratio_median']:.3f} "
            f"({min(row['pair_ratios']):.2f}-{max(row['pair_ratios']):.2f})",
            flush=True,
        )
        report["workloads"].append(row)
    run.RESULTS.mkdir(exist_ok=True)
    (run.RESULTS / "against.json").write_text(json.dumps(report, indent=2))
    (run.RESULTS / "against.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="this tree against sepp_lite at a commit")
    parser.add_argument("ref", metavar="REF", help="a git commit, tag or branch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument(
        "--workloads", default=None, help=f"comma-separated (default {','.join(WORKLOADS)})"
    )
    run.add_server_option(parser)
    args = parser.parse_args()
    run.SERVER_KIND["kind"] = args.server
    chosen = args.workloads.split(",") if args.workloads else WORKLOADS
    return compare_all(args.ref, chosen, args.rounds, args.jobs, args.server)


if __name__ == "__main__":
    sys.exit(main())
