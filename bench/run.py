"""``make bench``: sepp_lite against the official client (sepp-py 0.1.0 on grpcio), same
run, same server, alternating A B A B ... so both see the same machine.

Sets up what it needs: ``.venv-bench`` (sepp_lite and sepp-py, without OpenTelemetry),
``.venv-bench-pypy`` when ``pypy3`` exists, and two throwaway venvs for installed size.
The server (``python -m sepp_lite.testing``) runs in its own process; its CPU time is
reported beside the client's. Every client run is a fresh process.

Reported per workload: the median client CPU per job of each client, the ratio of the
medians, and the median of the per-round ratios (each round runs the two clients back
to back, so that ratio cancels slow phases of a shared machine best). A second table
compares sepp_lite's blocking client (``sepp_lite.sync``) with its async one the same
way, a third a typed-task Worker (``sepp_lite.Tasks``) with the raw one, a fourth
sepp_lite with OpenTelemetry installed but unused against not installed (in
``.venv-bench-otel``). With a free-threaded CPython (``--ft-python``, or
``python3.13t`` on PATH) a last row times a CPU-bound plain ``def`` task on it, with its
GIL off and on, and on a regular CPython (``--gil-python``). Results go to
``bench/results/latest.{md,json}``.

    python bench/run.py [--rounds 5] [--jobs 3000] [--workloads batch,worker] [--no-pypy]

``bench/against.py REF`` (``make bench-against``) measures this tree against sepp_lite
at the git commit REF instead, with this module's pieces (it imports this module; this
module imports nothing of it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
WORKLOADS = [
    "batch",
    "batch_plain",
    "enqueue16",
    "enqueue64",
    "threads8",
    "reserve_ack",
    "worker",
    "small_call",
]
LABELS = {
    "batch": "enqueue_batch of 256 jobs, CPU per job",
    "batch_plain": "enqueue_batch of 256 plain jobs (256-byte payload only), CPU per job",
    "enqueue16": "enqueue, 16 concurrent callers, CPU per job",
    "enqueue64": "enqueue, 64 concurrent callers, CPU per job",
    "threads8": "enqueue from 8 threads: sepp_lite.sync against sepp-py on a loop thread "
    "(run_coroutine_threadsafe), CPU per job",
    "reserve_ack": "reserve 32 at a time + ack each, CPU per job",
    "worker": "Worker, no-op handler, max_in_flight=64, CPU per job",
    "small_call": "get_server_info in sequence, CPU per call",
}
# Client CPU per job, sepp_lite / sepp-py (issue 15), and the small call's p50 latency.
# Issue 32: enqueue64 (coalesced enqueues), threads8 (the blocking client) and batch_plain.
GOALS = {
    "batch": 0.8,
    "batch_plain": 0.8,
    "enqueue16": 0.6,
    "enqueue64": 0.15,
    "threads8": 0.3,
    "reserve_ack": 0.6,
    "worker": 0.6,
    "small_call": 0.6,
}
P50_GOAL = 0.8
# PyPy (warmed up): the Worker's CPU per job against sepp-py's on CPython.
PYPY_WORKER_GOAL = 0.35
# The blocking client against the async one, both sepp_lite on the same interpreter.
SYNC_WORKLOADS = ["enqueue1"]
SYNC_LABELS = {"enqueue1": "enqueue one job at a time, CPU per job"}
SYNC_GOAL = 1.3
# A typed-task Worker (sepp_lite.Tasks, a small dataclass decoded from JSON) against the
# raw Worker on the same payloads, both sepp_lite: CPU per job (issue 30).
TYPED_GOAL = 1.15
TYPED_LABEL = "Worker, no-op, max_in_flight=64: typed task (small dataclass) / raw handler"
# A three-step workflow (task.then, two hand-offs by the worker) against three single
# enqueues of the same tasks by the producer, both sepp_lite: CPU per workflow (issue 40).
WORKFLOW_LABEL = "three steps, tasks worker max_in_flight=64: chain / three single enqueues"


# OpenTelemetry installed but unused (no provider set: what a dependency that pulls the
# API in leaves) against not installed, both sepp_lite, CPU per job (issue 38). One venv
# with the API and the SDK; its runs alternate with and without the environment variable
# that makes workloads.py block the import, so OpenTelemetry is the only difference.
OTEL_WORKLOADS = {
    "worker": "Worker, no-op, max_in_flight=64, CPU per job",
    "small_call": "get_server_info in sequence, CPU per call",
}
OTEL_GOAL = 1.05
OTEL_PACKAGES = ("opentelemetry-api", "opentelemetry-sdk")
BLOCK_OTEL = {"SEPP_BENCH_BLOCK_OTEL": "1"}
# A few µs in 70-100 µs per job: runs three times the usual length, as the typed row's.
OTEL_JOBS_SCALE = 3


# Free-threaded CPython (issue 41): a CPU-bound plain def task (workloads.py's
# cpu_tasks, ~10 ms of pure Python) x 200 on a worker with 2 threads, wall time on the
# free-threaded build against the same binary with its GIL on (PYTHON_GIL=1), and
# against a regular CPython of the same version when one is found.
FT_JOBS = 200
FT_GOAL = 0.6
FT_LABEL = "CPU-bound def task (~10 ms pure Python), worker with 2 threads, wall time"


# Installed packages have their bytecode compiled (pip does it); a caller's
# PYTHONDONTWRITEBYTECODE must not make sepp_lite compile its source on every import.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def sh(*cmd: str | Path, env: dict[str, str] | None = None, **kw: Any) -> str:
    """Run ``cmd``, return its output; ``env`` adds variables to the bench's environment."""
    done = subprocess.run(
        [str(c) for c in cmd], check=True, capture_output=True, text=True,
        env={**ENV, **(env or {})}, **kw,
    )  # fmt: skip
    return str(done.stdout)


def venv(path: Path, python: str, *packages: str) -> Path:
    """Create ``path`` with ``packages`` unless it exists; return its interpreter. This
    project itself is (re)installed as a wheel every time, so the bench measures the
    current code the way users get it (compiled bytecode, no editable-install hooks)."""
    exe = path / "bin" / "python"
    marker = path / ".bench-ready"
    others = [p for p in packages if p != str(ROOT)]
    if not marker.exists():
        if not exe.exists():
            sh(python, "-m", "venv", path)
        sh(exe, "-m", "pip", "install", "-q", "--upgrade", "pip")
        if others:
            sh(exe, "-m", "pip", "install", "-q", *others)
        marker.write_text(" ".join(others))
    if str(ROOT) in packages:
        sh(exe, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", ROOT)
        sh(exe, "-m", "pip", "install", "-q", ROOT)
    return exe


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Which server the clients meet: "grpcio" (bench/grpcio_server.py: grpcio's C core in
# front of the in-process state machine) or "grpclib" (python -m sepp_lite.testing).
SERVER_KIND = {"kind": "grpcio"}


class Server:
    """The bench server in its own process, with its CPU time readable. PyPy has no
    grpcio: a PyPy server is always the grpclib one."""

    def __init__(self, python: Path) -> None:
        self.port = free_port()
        self.kind = SERVER_KIND["kind"] if "pypy" not in str(python) else "grpclib"
        if self.kind == "grpcio":
            command = [str(python), str(BENCH / "grpcio_server.py"), "--port", str(self.port)]
        else:
            command = [str(python), "-m", "sepp_lite.testing", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=ENV,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "queue server listening" not in line:
            raise RuntimeError(f"the server did not start: {line!r}")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_client(
    python: Path,
    client: str,
    workload: str,
    jobs: int,
    server: Server,
    skip: int = 0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    before, started = server.cpu_seconds(), time.perf_counter()
    args = ["--client", client, "--addr", server.addr, "--workload", workload]
    out = sh(python, BENCH / "workloads.py", *args, "--jobs", str(jobs), "--skip", str(skip),
             cwd=ROOT, env=env)  # fmt: skip
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["server_cpu_s"] = server.cpu_seconds() - before
    result["run_wall_s"] = time.perf_counter() - started
    return result


# A contender: the interpreter, the client (workloads.py's --client), extra environment.
Contender = tuple[Path, str, dict[str, str]]


def alternate(
    server: Server,
    contenders: dict[str, Contender],
    workload: str,
    rounds: int,
    jobs: int,
    skip: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """Runs of every contender (an interpreter and a ``--client`` of workloads.py)
    against ``server``, the order flipped every round so that all see the same
    machine."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    names = list(contenders)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            python, client, env = contenders[name]
            runs[name].append(run_client(python, client, workload, jobs, server, skip, env))
    return runs


# An enqueue_batch job costs about a fifteenth of the CPU of a job in the other
# workloads: at --jobs 3000 one run measured some 25 ms of CPU, and in the run of
# 2026-12-02 that began at 14:51 its five pair ratios spread from 0.63 to 1.05. Its runs
# get this many times the jobs, so that each measures a few hundred ms of CPU, as the
# others do.
JOBS_SCALE = {"batch": 10, "batch_plain": 10}
# The sepp_lite client a workload runs, when it is not the async one.
LITE_CLIENT = {"threads8": "sepp_lite.sync"}


def compare(
    python: Path, server_python: Path, workload: str, rounds: int, jobs: int
) -> dict[str, Any]:
    jobs *= JOBS_SCALE.get(workload, 1)
    contenders: dict[str, Contender] = {
        "sepp_lite": (python, LITE_CLIENT.get(workload, "sepp_lite"), {}),
        "sepp": (python, "sepp", {}),
    }
    with Server(server_python) as server:
        runs = alternate(server, contenders, workload, rounds, jobs)
    return summarize(workload, runs)


def sync_comparison(python: Path, workload: str, rounds: int, jobs: int) -> dict[str, Any]:
    """sepp_lite's blocking client against its async client, CPU per job."""
    contenders: dict[str, Contender] = {
        "sync": (python, "sepp_lite.sync", {}),
        "async": (python, "sepp_lite", {}),
    }
    with Server(python) as server:
        runs = alternate(server, contenders, workload, rounds, jobs)
    sync, async_ = runs["sync"], runs["async"]
    ratios = [a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in zip(sync, async_)]
    return {
        "workload": workload,
        "sync_cpu_us": _median(sync, "cpu_us_per_job"),
        "async_cpu_us": _median(async_, "cpu_us_per_job"),
        "pair_ratio_median": statistics.median(ratios),
        "pair_ratios": ratios,
        "server_cpu_share": _server_share(sync + async_),
        "runs": runs,
    }


# The typed and the raw Worker differ by a few µs in some 110 µs per job: at 3000 jobs a
# run (about 0.35 s of CPU) the pair ratios of one run on a loaded 2-core machine spread
# from 0.89 to 1.40; runs three times longer measure the difference more steadily.
TYPED_JOBS_SCALE = 3


def typed_comparison(python: Path, rounds: int, jobs: int) -> dict[str, Any]:
    """The typed-task Worker against the raw Worker, alternating, same payloads."""
    jobs *= TYPED_JOBS_SCALE
    runs: dict[str, list[dict[str, Any]]] = {"typed": [], "raw": []}
    order = [("typed", "typed_worker"), ("raw", "worker_json")]
    with Server(python) as server:
        for index in range(rounds):
            for name, workload in order if index % 2 == 0 else order[::-1]:
                runs[name].append(run_client(python, "sepp_lite", workload, jobs, server))
    typed, raw = runs["typed"], runs["raw"]
    ratios = [a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in zip(typed, raw)]
    return {
        "typed_cpu_us": _median(typed, "cpu_us_per_job"),
        "raw_cpu_us": _median(raw, "cpu_us_per_job"),
        "pair_ratio_median": statistics.median(ratios),
        "pair_ratios": ratios,
        "server_cpu_share": _server_share(typed + raw),
        "jobs": jobs,
        "runs": runs,
    }


def workflow_comparison(python: Path, rounds: int, jobs: int) -> dict[str, Any]:
    """Three-step workflows (``chain3``) against three single enqueues of the same
    tasks (``singles3``), alternating; ``jobs`` workflows per run (a third of the
    jobs: each is three)."""
    workflows = max(1, jobs // 3)
    runs: dict[str, list[dict[str, Any]]] = {"chain": [], "singles": []}
    order = [("chain", "chain3"), ("singles", "singles3")]
    with Server(python) as server:
        for index in range(rounds):
            for name, workload in order if index % 2 == 0 else order[::-1]:
                runs[name].append(run_client(python, "sepp_lite", workload, workflows, server))
    chain, singles = runs["chain"], runs["singles"]
    ratios = [a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in zip(chain, singles)]
    hand_offs = [(a["cpu_us_per_job"] - b["cpu_us_per_job"]) / 2 for a, b in zip(chain, singles)]
    return {
        "chain_cpu_us": _median(chain, "cpu_us_per_job"),
        "singles_cpu_us": _median(singles, "cpu_us_per_job"),
        "pair_ratio_median": statistics.median(ratios),
        "pair_ratios": ratios,
        "hand_off_extra_us": statistics.median(hand_offs),
        "server_cpu_share": _server_share(chain + singles),
        "workflows": workflows,
        "runs": runs,
    }


def otel_comparison(
    python: Path, server_python: Path, workload: str, rounds: int, jobs: int
) -> dict[str, Any]:
    """sepp_lite with OpenTelemetry installed and unconfigured against the same
    interpreter with OpenTelemetry unimportable, alternating."""
    jobs *= OTEL_JOBS_SCALE
    contenders: dict[str, Contender] = {
        "installed": (python, "sepp_lite", {}),
        "absent": (python, "sepp_lite", BLOCK_OTEL),
    }
    with Server(server_python) as server:
        runs = alternate(server, contenders, workload, rounds, jobs)
    installed, absent = runs["installed"], runs["absent"]
    # Each side really is what it says: a mistake here would report a ratio of 1.
    assert all(run["otel_imported"] for run in installed), "OpenTelemetry was not imported"
    assert not any(run["otel_imported"] for run in absent), "OpenTelemetry was not blocked"
    ratios = [a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in zip(installed, absent)]
    row = {
        "workload": workload,
        "jobs": jobs,
        "installed_cpu_us": _median(installed, "cpu_us_per_job"),
        "absent_cpu_us": _median(absent, "cpu_us_per_job"),
        "pair_ratio_median": statistics.median(ratios),
        "pair_ratios": ratios,
        "server_cpu_share": _server_share(installed + absent),
        "runs": runs,
    }
    row["ratio_of_medians"] = row["installed_cpu_us"] / row["absent_cpu_us"]
    return row


def ft_comparison(ft: Path, gil: Path | None, server_python: Path, rounds: int) -> dict[str, Any]:
    """The free-threaded interpreter ``ft`` with its GIL off, the same with it on, and
    the regular ``gil`` (if any), alternating: wall time of ``cpu_tasks``."""
    contenders: dict[str, Contender] = {
        "free_threaded": (ft, "sepp_lite", {"PYTHON_GIL": "0"}),
        "gil_on": (ft, "sepp_lite", {"PYTHON_GIL": "1"}),
    }
    if gil is not None:
        contenders["regular"] = (gil, "sepp_lite", {})
    with Server(server_python) as server:
        runs = alternate(server, contenders, "cpu_tasks", rounds, FT_JOBS)
    # Each side is what it says (PYTHON_GIL=0 on a build with a GIL would run it).
    assert not any(run["gil"] for run in runs["free_threaded"]), "the GIL was on"
    assert all(run["gil"] for run in runs["gil_on"] + runs.get("regular", [])), "no GIL"
    row: dict[str, Any] = {"jobs": FT_JOBS, "runs": runs}
    for name, side in runs.items():
        row[f"{name}_wall_s"] = _median(side, "wall_s")
        # The cores the client had (its CPU seconds per wall second): about 2 for the
        # free-threaded build on an idle 2-core machine, less while others take them.
        row[f"{name}_cores"] = statistics.median(
            run["cpu_us_per_job"] * run["jobs"] / 1e6 / run["wall_s"] for run in side
        )
    for name in runs.keys() - {"free_threaded"}:
        ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(runs["free_threaded"], runs[name])]
        row[f"vs_{name}_pair_median"] = statistics.median(ratios)
        row[f"vs_{name}_pair_ratios"] = ratios
    row["server_cpu_share"] = _server_share([run for side in runs.values() for run in side])
    return row


def free_threading(
    report: dict[str, Any], ft_python: str, gil_python: str | None, server: Path, rounds: int
) -> None:
    """The free-threading rows into ``report["free_threading"]``, with the interpreters'
    versions; also kept in bench/results/free-threading.{json,md} on their own."""
    print("== free-threaded CPython: cpu_tasks", flush=True)
    ft = venv(ROOT / ".venv-bench-ft", ft_python, str(ROOT))
    gil = venv(ROOT / ".venv-bench-gil", gil_python, str(ROOT)) if gil_python else None
    row = ft_comparison(ft, gil, server, rounds)
    row["versions"] = {"free_threaded": versions(ft)["python"] + " (free-threaded build)"}
    if gil is not None:
        row["versions"]["regular"] = versions(gil)["python"]
    report["free_threading"] = row
    print(
        f"   free-threaded {row['free_threaded_wall_s']:.2f} s, GIL on "
        f"{row['gil_on_wall_s']:.2f} s, ratio {row['vs_gil_on_pair_median']:.2f}",
        flush=True,
    )
    RESULTS.mkdir(exist_ok=True)
    alone = {"machine": report["machine"], "rounds": rounds, "free_threading": row}
    (RESULTS / "free-threading.json").write_text(json.dumps(alone, indent=2))
    (RESULTS / "free-threading.md").write_text("\n".join(_ft_rows(alone)).lstrip() + "\n")


def _server_share(runs: list[dict[str, Any]]) -> float:
    """Server CPU seconds per wall second of a client run, the median over ``runs``."""
    return statistics.median(r["server_cpu_s"] / max(r["run_wall_s"], 1e-9) for r in runs)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def summarize(workload: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    lite, official = runs["sepp_lite"], runs["sepp"]
    pair_ratios = [a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in zip(lite, official)]
    summary: dict[str, Any] = {
        "workload": workload,
        "sepp_lite_cpu_us": _median(lite, "cpu_us_per_job"),
        "sepp_cpu_us": _median(official, "cpu_us_per_job"),
        "pair_ratio_median": statistics.median(pair_ratios),
        "pair_ratios": pair_ratios,
        "server_cpu_share": _server_share(lite + official),
        "sepp_lite_rss_kib": _median(lite, "rss_kib"),
        "sepp_rss_kib": _median(official, "rss_kib"),
        "runs": runs,
    }
    summary["ratio_of_medians"] = summary["sepp_lite_cpu_us"] / summary["sepp_cpu_us"]
    if workload == "small_call":
        for key in ("p50_us", "p99_us"):
            summary[f"sepp_lite_{key}"] = _median(lite, key)
            summary[f"sepp_{key}"] = _median(official, key)
        p50 = [a["p50_us"] / b["p50_us"] for a, b in zip(lite, official)]
        summary["p50_pair_ratio_median"] = statistics.median(p50)
    return summary


# PyPy against CPython, both running sepp_lite, measured in steady state: each run
# leaves its first half out (the JIT compiles during it; a worker runs for hours). The
# Worker's many code paths take the JIT longer: after 10,000 jobs PyPy still spent
# 140-180 µs per job, after 40,000 about 100-120 (measured 2026-12-02).
PYPY_JOBS = {"batch": 51200, "reserve_ack": 20000, "worker": 80000, "small_call": 6000}

# PyPy's nursery (its young generation) defaults to half the CPU's last-level cache
# ("1.0MB" on these machines, per gc.get_stats()). A job allocates about 50 KiB there
# (asyncio is pure Python on PyPy), so the Worker spent about 30 % of its CPU in the
# GC (gc.get_stats().total_gc_time). The PyPy runs are made both with the default and
# with this size, which docs/platforms.md recommends for PyPy workers.
PYPY_NURSERY = "4MB"


def pypy_comparison(
    pypy: Path, cpython: Path, workload: str, rounds: int, server_python: Path
) -> dict[str, Any]:
    """Alternate PyPy and CPython sepp_lite clients, and sepp-py on CPython, against
    one server (its CPU share is reported: on two cores a server near one core competes
    with the client)."""
    jobs = PYPY_JOBS[workload]
    contenders: dict[str, Contender] = {
        "pypy": (pypy, "sepp_lite", {}),
        "pypy_nursery": (pypy, "sepp_lite", {"PYPY_GC_NURSERY": PYPY_NURSERY}),
        "cpython": (cpython, "sepp_lite", {}),
        "sepp": (cpython, "sepp", {}),
    }
    with Server(server_python) as server:
        run_client(pypy, "sepp_lite", workload, jobs // 4, server)  # warm the server up
        runs = alternate(server, contenders, workload, rounds, jobs, jobs // 2)
    speedups = [
        a["jobs_per_cpu_s"] / b["jobs_per_cpu_s"] for a, b in zip(runs["pypy"], runs["cpython"])
    ]

    def against_official(name: str) -> float:
        pairs = zip(runs[name], runs["sepp"])
        return float(statistics.median(a["cpu_us_per_job"] / b["cpu_us_per_job"] for a, b in pairs))

    return {
        "sepp_cpu_us": _median(runs["sepp"], "cpu_us_per_job"),
        "pypy_vs_sepp_pair_median": against_official("pypy"),
        "pypy_nursery_vs_sepp_pair_median": against_official("pypy_nursery"),
        "pypy_nursery_cpu_us": _median(runs["pypy_nursery"], "cpu_us_per_job"),
        "jobs": jobs,
        "pypy_cpu_us": _median(runs["pypy"], "cpu_us_per_job"),
        "cpython_cpu_us": _median(runs["cpython"], "cpu_us_per_job"),
        "pypy_jobs_per_cpu_s": _median(runs["pypy"], "jobs_per_cpu_s"),
        "cpython_jobs_per_cpu_s": _median(runs["cpython"], "jobs_per_cpu_s"),
        "speedup_pair_median": statistics.median(speedups),
        "server_cpu_share": _server_share(runs["pypy"] + runs["cpython"]),
        "runs": runs,
    }


def import_times(python: Path, modules: list[str], rounds: int = 11) -> dict[str, float]:
    """Median extra wall time, over a bare interpreter start, until each module's client
    class is usable (``import module; module.SeppClient``), in ms. The modules take
    turns, the order flipped every round, so a machine that slows down during the
    measurement weighs on both alike."""

    def timed(code: str) -> float:
        start = time.perf_counter()
        sh(python, "-c", code, cwd="/")
        return time.perf_counter() - start

    samples: dict[str, list[float]] = {module: [] for module in modules}
    for number in range(rounds):
        for module in modules if number % 2 == 0 else modules[::-1]:
            samples[module].append(timed(f"import {module}; {module}.SeppClient") - timed("pass"))
    return {module: statistics.median(times) * 1000 for module, times in samples.items()}


def installed_mib(python: str, *packages: str) -> tuple[float, list[str]]:
    """Size of a fresh venv's site-packages holding ``packages`` (pip, setuptools and
    their helpers excluded), with the distributions it took."""
    name = hashlib.sha1(" ".join(packages).encode()).hexdigest()[:10]
    target = BENCH / f".venv-size-{name}"
    exe = venv(target, python, *packages)
    site = Path(sh(exe, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    skip = ("pip", "setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")
    total = 0
    for entry in site.iterdir():
        if entry.name.startswith(skip) or entry.name == "__pycache__":
            continue
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    dists = sorted(
        p.name.rsplit(".", 1)[0] for p in site.glob("*.dist-info") if not p.name.startswith(skip)
    )
    return total / 2**20, dists


def machine() -> dict[str, Any]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def versions(python: Path) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, platform, json\n"
        "out = {'python': platform.python_implementation() + ' ' + platform.python_version()}\n"
        "for n in ['sepp-lite', 'sepp-py', 'grpcio', 'protobuf', 'grpclib', 'h2', 'hpack',"
        " 'betterproto', 'multidict', 'opentelemetry-api', 'opentelemetry-sdk']:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(sh(python, "-c", script))  # type: ignore[no-any-return]


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _workload_rows(report: dict[str, Any]) -> list[str]:
    lines = [
        _row("workload", "sepp_lite µs", "sepp-py µs", "ratio (median of pairs)",
             "ratio of medians", "goal", "server CPU share"),
        _row("---", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]  # fmt: skip
    for row in report["workloads"]:
        goal = GOALS.get(row["workload"])
        lines.append(
            _row(
                LABELS[row["workload"]],
                f"{row['sepp_lite_cpu_us']:.1f}",
                f"{row['sepp_cpu_us']:.1f}",
                f"{row['pair_ratio_median']:.2f}×",
                f"{row['ratio_of_medians']:.2f}×",
                f"≤ {goal:g}×" if goal else "—",
                f"{row['server_cpu_share']:.2f}",
            )
        )
    return lines


def _latency_rows(row: dict[str, Any]) -> list[str]:
    return [
        "",
        _row("get_server_info latency", "sepp_lite", "sepp-py", "ratio (median of pairs)", "goal"),
        _row("---", "---:", "---:", "---:", "---:"),
        _row("p50", f"{row['sepp_lite_p50_us']:.0f} µs", f"{row['sepp_p50_us']:.0f} µs",
             f"{row['p50_pair_ratio_median']:.2f}×", f"≤ {P50_GOAL:.1f}×"),
        _row("p99", f"{row['sepp_lite_p99_us']:.0f} µs", f"{row['sepp_p99_us']:.0f} µs", "", ""),
    ]  # fmt: skip


def _peak_rows(peak: dict[str, float] | None, line: Callable[..., str]) -> list[str]:
    """Peak RSS after connect, raw and above a bare interpreter's (issue 32) and above
    the asyncio floor's."""
    if not peak:
        return []
    above = {name: peak[name] - peak["bare"] for name in ("sepp_lite", "sepp")}
    floor = {name: peak[name] - peak["floor"] for name in ("sepp_lite", "sepp")}
    return [
        line("peak RSS after connect", peak["sepp_lite"] / 1024, peak["sepp"] / 1024, "MiB", "—"),
        line(f"peak RSS after connect above a bare interpreter's ({peak['bare'] / 1024:.1f} MiB)",
             above["sepp_lite"] / 1024, above["sepp"] / 1024, "MiB", "≤ 0.2×"),
        line(f"peak RSS after connect above the asyncio floor's ({peak['floor'] / 1024:.1f} MiB)",
             floor["sepp_lite"] / 1024, floor["sepp"] / 1024, "MiB", "—"),
    ]  # fmt: skip


def _footprint_rows(foot: dict[str, Any]) -> list[str]:
    def line(label: str, lite: float, official: float, unit: str, goal: str) -> str:
        return _row(label, f"{lite:.1f} {unit}", f"{official:.1f} {unit}",
                    f"{lite / official:.2f}×", goal)  # fmt: skip

    return [
        "",
        _row("footprint", "sepp_lite", "sepp-py", "ratio", "goal"),
        _row("---", "---:", "---:", "---:", "---:"),
        line("cold import", foot["import_ms"]["sepp_lite"], foot["import_ms"]["sepp"], "ms",
             "≤ 0.5×"),
        line("RSS after connect", foot["rss_kib"]["sepp_lite"] / 1024,
             foot["rss_kib"]["sepp"] / 1024, "MiB", "≤ 0.5×"),
        *_peak_rows(foot.get("peak_rss_kib"), line),
        line("installed, with dependencies", foot["installed_mib"]["sepp_lite"],
             foot["installed_mib"]["sepp"], "MiB", "≤ 0.3×"),
        "",
        "RSS is measured in a process that only connects and makes one call; peak RSS is "
        "its VmHWM, a bare interpreter's a process that imports nothing. The floor, "
        "an interpreter with asyncio (and the ssl module asyncio imports) holding one "
        f"open TCP connection, is {foot['rss_kib']['floor'] / 1024:.1f} MiB: "
        f"{foot['rss_kib']['floor'] / foot['rss_kib']['sepp']:.2f}× sepp-py's RSS.",
        "",
        f"sepp_lite installs: {', '.join(foot['dists']['sepp_lite'])}",
        f"sepp-py installs: {', '.join(foot['dists']['sepp'])}",
    ]  # fmt: skip


def _pypy_rows(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "sepp_lite on PyPy and on CPython, same run, alternating, against one server "
        f"(running on {report.get('pypy_server', 'pypy')}); steady state (each run's first "
        "half, the JIT's warm-up, is left out):",
        "",
        _row("workload", "PyPy jobs/CPU s", "CPython jobs/CPU s",
             "PyPy / CPython (median of pairs)", "PyPy µs/job", "sepp-py (CPython) µs/job",
             "PyPy / sepp-py CPU per job", f"PyPy, nursery {PYPY_NURSERY}, µs/job",
             f"PyPy, nursery {PYPY_NURSERY} / sepp-py", "server CPU share"),
        _row("---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]  # fmt: skip
    for workload, row in report["pypy"].items():
        lines.append(
            _row(
                LABELS[workload].split(",")[0],
                f"{row['pypy_jobs_per_cpu_s']:.0f}",
                f"{row['cpython_jobs_per_cpu_s']:.0f}",
                f"{row['speedup_pair_median']:.2f}×",
                f"{row['pypy_cpu_us']:.1f}",
                f"{row['sepp_cpu_us']:.1f}",
                f"{row['pypy_vs_sepp_pair_median']:.2f}×",
                f"{row['pypy_nursery_cpu_us']:.1f}",
                f"{row['pypy_nursery_vs_sepp_pair_median']:.2f}×",
                f"{row['server_cpu_share']:.2f}",
            )
        )
    lines += [
        "",
        f"Goal: PyPy Worker CPU per job ≤ {PYPY_WORKER_GOAL}× sepp-py's on CPython (warmed up). "
        f"The nursery columns run PyPy with `PYPY_GC_NURSERY={PYPY_NURSERY}` (docs/platforms.md, "
        "section 'PyPy'); the others with PyPy's default.",
    ]
    return lines


def _sync_rows(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "sepp_lite's blocking client (`sepp_lite.sync`) against its async client, same "
        "interpreter, same server, alternating:",
        "",
        _row("workload", "sync µs", "async µs", "sync / async (median of pairs)", "goal",
             "server CPU share"),
        _row("---", "---:", "---:", "---:", "---:", "---:"),
    ]  # fmt: skip
    for workload, row in report["sync"].items():
        lines.append(
            _row(
                SYNC_LABELS[workload],
                f"{row['sync_cpu_us']:.1f}",
                f"{row['async_cpu_us']:.1f}",
                f"{row['pair_ratio_median']:.2f}×",
                f"≤ {SYNC_GOAL:.1f}×",
                f"{row['server_cpu_share']:.2f}",
            )
        )
    return lines


def _typed_rows(row: dict[str, Any]) -> list[str]:
    spread = ", ".join(f"{ratio:.2f}" for ratio in sorted(row["pair_ratios"]))
    return [
        "",
        "Typed tasks against the raw Worker, both sepp_lite, same server and payloads "
        f"(a 70-byte JSON object), {row['jobs']} jobs per run, alternating; pair ratios "
        f"{spread}:",
        "",
        _row("workload", "typed µs", "raw µs", "typed / raw (median of pairs)", "goal",
             "server CPU share"),
        _row("---", "---:", "---:", "---:", "---:", "---:"),
        _row(TYPED_LABEL, f"{row['typed_cpu_us']:.1f}", f"{row['raw_cpu_us']:.1f}",
             f"{row['pair_ratio_median']:.2f}×", f"≤ {TYPED_GOAL:.2f}×",
             f"{row['server_cpu_share']:.2f}"),
    ]  # fmt: skip


def _workflow_rows(row: dict[str, Any]) -> list[str]:
    spread = ", ".join(f"{ratio:.2f}" for ratio in sorted(row["pair_ratios"]))
    return [
        "",
        "Workflows: a three-step chain (`task.then`, two hand-offs by the worker) against "
        "three single enqueues of the same tasks by the producer, both sepp_lite, "
        f"{row['workflows']} workflows per run, alternating; pair ratios {spread}:",
        "",
        _row("workload", "chain µs", "singles µs", "chain / singles (median of pairs)",
             "extra per hand-off", "server CPU share"),
        _row("---", "---:", "---:", "---:", "---:", "---:"),
        _row(WORKFLOW_LABEL, f"{row['chain_cpu_us']:.1f}", f"{row['singles_cpu_us']:.1f}",
             f"{row['pair_ratio_median']:.2f}×", f"{row['hand_off_extra_us']:.1f} µs",
             f"{row['server_cpu_share']:.2f}"),
    ]  # fmt: skip


def _otel_rows(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "OpenTelemetry installed but unused (no tracer or meter provider set) against not "
        "installed, both sepp_lite, one venv with "
        f"{', '.join(f'{k} {v}' for k, v in report['otel_versions'].items())}, runs "
        "alternating with the import blocked and not:",
        "",
        _row("workload", "installed µs", "absent µs", "installed / absent (median of pairs)",
             "ratio of medians", "pair ratios, low–high", "goal", "server CPU share"),
        _row("---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]  # fmt: skip
    for workload, row in report["otel"].items():
        lines.append(
            _row(
                f"{OTEL_WORKLOADS[workload]} ({row['jobs']} jobs)",
                f"{row['installed_cpu_us']:.1f}",
                f"{row['absent_cpu_us']:.1f}",
                f"{row['pair_ratio_median']:.3f}×",
                f"{row['ratio_of_medians']:.3f}×",
                f"{min(row['pair_ratios']):.2f}–{max(row['pair_ratios']):.2f}",
                f"≤ {OTEL_GOAL:.2f}×",
                f"{row['server_cpu_share']:.2f}",
            )
        )
    return lines


def _ft_rows(report: dict[str, Any]) -> list[str]:
    row = report["free_threading"]
    names = {"gil_on": "same binary, PYTHON_GIL=1", "regular": "regular CPython"}
    lines = [
        "",
        "Free-threaded CPython, a CPU-bound plain `def` task, wall time, "
        f"{report['machine']['date']}, {report['rounds']} rounds alternating "
        f"({', '.join(f'{k}: {v}' for k, v in row['versions'].items())}):",
        "",
        _row("workload", "free-threaded s", "against", "its s",
             "free-threaded / it (median of pairs)", "pair ratios, low–high", "goal",
             "cores used, free-threaded / it", "server CPU share"),
        _row("---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:"),
    ]  # fmt: skip
    for name, label in names.items():
        if f"{name}_wall_s" not in row:
            continue
        ratios = row[f"vs_{name}_pair_ratios"]
        lines.append(
            _row(
                f"{FT_LABEL} ({row['jobs']} jobs)",
                f"{row['free_threaded_wall_s']:.2f}",
                label,
                f"{row[f'{name}_wall_s']:.2f}",
                f"{row[f'vs_{name}_pair_median']:.2f}×",
                f"{min(ratios):.2f}–{max(ratios):.2f}",
                f"≤ {FT_GOAL:.1f}×",
                f"{row['free_threaded_cores']:.2f} / {row[f'{name}_cores']:.2f}",
                f"{row['server_cpu_share']:.2f}",
            )
        )
    lines += [
        "",
        "Cores used: the client's CPU seconds per wall second (median). On a 2-core machine "
        "the free-threaded run can reach 2 only while nothing else runs; the ratio follows.",
    ]
    return lines


def _scaled_jobs(report: dict[str, Any]) -> str:
    """The job counts of the measured workloads that JOBS_SCALE changes, as a note."""
    scaled = [
        f"{report['jobs'] * JOBS_SCALE[row['workload']]} for {row['workload']}"
        for row in report["workloads"]
        if row["workload"] in JOBS_SCALE
    ]
    return f" ({', '.join(scaled)})" if scaled else ""


def markdown(report: dict[str, Any]) -> str:
    info = report["machine"]
    lines = [
        "# sepp_lite vs sepp-py 0.1.0",
        "",
        f"{info['date']}; {info['cpu']}, {info['cores']} cores, Linux {info['kernel']}.",
        f"CPython: {json.dumps(report['versions'])}",
    ]
    if report.get("pypy_versions"):
        lines.append(f"PyPy: {json.dumps(report['pypy_versions'])}")
    lines += [
        "",
        f"{report['rounds']} rounds per workload, clients alternating; {report['jobs']} jobs "
        f"per run{_scaled_jobs(report)}; server "
        f"({report.get('server', 'grpclib')}: the sepp state machine behind that HTTP/2 "
        "stack) in its own process (its CPU share: server CPU seconds per wall second of a "
        "client run, set-up included).",
    ]
    if report["workloads"]:
        lines += ["", *_workload_rows(report)]
    lines += [r for row in report["workloads"] if row["workload"] == "small_call"
              for r in _latency_rows(row)]  # fmt: skip
    if report.get("sync"):
        lines += _sync_rows(report)
    if report.get("typed"):
        lines += _typed_rows(report["typed"])
    if report.get("workflow"):
        lines += _workflow_rows(report["workflow"])
    if report.get("otel"):
        lines += _otel_rows(report)
    if report.get("footprint"):
        lines += _footprint_rows(report["footprint"])
    if report.get("pypy"):
        lines += _pypy_rows(report)
    if report.get("free_threading"):
        lines += _ft_rows(report)
    return "\n".join(lines) + "\n"


# RSS after connect, in a process that does nothing else (the workloads' harness
# imports argparse, json, statistics and uuid, a few MiB that are no client's). With
# ``-`` for the module: the floor, an interpreter with asyncio (which imports ssl)
# and one open TCP connection, which any asyncio client starts from. Prints the RSS
# and the peak RSS (VmHWM), in KiB.
RSS_AFTER_CONNECT = """
import asyncio, importlib, sys
module = sys.argv[1]
host, port = sys.argv[2].rsplit(":", 1)

def status():
    with open("/proc/self/status") as file:
        fields = dict(line.split(":", 1) for line in file)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

async def main():
    if module == "-":
        _, writer = await asyncio.open_connection(host, int(port))
    else:
        client = await importlib.import_module(module).SeppClient.connect(sys.argv[2])
        await client.get_server_info()
    rss = status()
    if module == "-":
        writer.close()
        await writer.wait_closed()
    else:
        await client.close()
    return rss

print(*asyncio.run(main()))
"""
# A bare interpreter: started, nothing imported (no asyncio either), the same figures.
RSS_BARE = """
with open("/proc/self/status") as file:
    fields = dict(line.split(":", 1) for line in file)
print(int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0]))
"""


def _memory(python: Path, addr: str, module: str | None) -> tuple[float, float]:
    """Median (RSS, peak RSS) in KiB over three processes; ``None``: a bare one."""
    script = RSS_BARE if module is None else RSS_AFTER_CONNECT
    args = [] if module is None else [module, addr]
    samples = [sh(python, "-c", script, *args, cwd="/").split() for _ in range(3)]
    return (
        statistics.median(int(rss) for rss, _ in samples),
        statistics.median(int(peak) for _, peak in samples),
    )


def footprint(python: Path, server_python: Path) -> dict[str, Any]:
    modules = (("sepp_lite", "sepp_lite"), ("sepp", "sepp"), ("floor", "-"), ("bare", None))
    with Server(server_python) as server:
        memory = {name: _memory(python, server.addr, module) for name, module in modules}
    lite_size, lite_dists = installed_mib(sys.executable, str(ROOT))
    seppy_size, seppy_dists = installed_mib(sys.executable, "sepp-py==0.1.0")
    return {
        "import_ms": import_times(python, ["sepp_lite", "sepp"]),
        "rss_kib": {name: rss for name, (rss, _) in memory.items()},
        "peak_rss_kib": {name: peak for name, (_, peak) in memory.items()},
        "installed_mib": {"sepp_lite": lite_size, "sepp": seppy_size},
        "dists": {"sepp_lite": lite_dists, "sepp": seppy_dists},
    }


def otel_cost(report: dict[str, Any], server_python: Path, rounds: int, jobs: int) -> None:
    """The rows of OpenTelemetry installed and unused against not installed, into
    ``report["otel"]``."""
    python = venv(ROOT / ".venv-bench-otel", sys.executable, str(ROOT), *OTEL_PACKAGES)
    found = versions(python)
    report["otel_versions"] = {name: found[name] for name in OTEL_PACKAGES if name in found}
    report["otel"] = {}
    for workload in OTEL_WORKLOADS:
        print(f"== OpenTelemetry unused: {workload}", flush=True)
        row = report["otel"][workload] = otel_comparison(
            python, server_python, workload, rounds, jobs
        )
        print(
            f"   installed {row['installed_cpu_us']:.1f} us, absent {row['absent_cpu_us']:.1f} us,"
            f" installed / absent {row['pair_ratio_median']:.3f}",
            flush=True,
        )


def sepp_lite_only(report: dict[str, Any], python: Path, args: argparse.Namespace) -> None:
    """The comparisons of sepp_lite with itself that ``args`` leaves in: blocking
    against async, typed tasks against raw, OpenTelemetry unused against absent."""
    if not args.no_sync:
        report["sync"] = {}
        for workload in SYNC_WORKLOADS:
            print(f"== sync: {workload}", flush=True)
            row = report["sync"][workload] = sync_comparison(
                python, workload, args.rounds, args.jobs
            )
            print(f"   sync / async {row['pair_ratio_median']:.2f}", flush=True)
    if not args.no_typed:
        print("== typed tasks", flush=True)
        row = report["typed"] = typed_comparison(python, args.rounds, args.jobs)
        print(f"   typed / raw {row['pair_ratio_median']:.2f}", flush=True)
    if not args.no_workflow:
        print("== workflows", flush=True)
        row = report["workflow"] = workflow_comparison(python, args.rounds, args.jobs)
        print(
            f"   chain {row['chain_cpu_us']:.1f} us, singles {row['singles_cpu_us']:.1f} us, "
            f"chain / singles {row['pair_ratio_median']:.2f}",
            flush=True,
        )
    if not args.no_otel:
        otel_cost(report, python, args.rounds, args.jobs)


def add_server_option(parser: argparse.ArgumentParser) -> None:
    """``--server``, which peer the clients talk to (here and in bench/against.py)."""
    parser.add_argument(
        "--server", choices=["grpcio", "grpclib"], default="grpcio",
        help="grpcio's C core (default, as fast a peer as the real server) or grpclib",
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description="sepp_lite vs sepp-py, side by side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument(
        "--workloads", default=None, help=f"comma-separated (default {','.join(WORKLOADS)})"
    )
    parser.add_argument("--no-pypy", action="store_true")
    parser.add_argument("--no-footprint", action="store_true")
    parser.add_argument("--no-compare", action="store_true", help="skip sepp-py comparisons")
    parser.add_argument("--no-sync", action="store_true", help="skip the blocking client's")
    parser.add_argument("--no-typed", action="store_true", help="skip typed tasks vs raw")
    parser.add_argument(
        "--no-workflow", action="store_true", help="skip the chain vs single enqueues"
    )
    parser.add_argument(
        "--no-otel", action="store_true",
        help="skip OpenTelemetry installed-but-unused vs not installed",
    )  # fmt: skip
    parser.add_argument(
        "--pypy-server", choices=["cpython", "pypy"], default="cpython",
        help="the interpreter of the server in the PyPy comparison",
    )  # fmt: skip
    parser.add_argument(
        "--ft-python", default=shutil.which("python3.13t"),
        help="a free-threaded CPython for the free-threading row (default: python3.13t "
        "on PATH; the row is left out without one)",
    )  # fmt: skip
    parser.add_argument(
        "--gil-python", default=shutil.which("python3.13"),
        help="a regular CPython of the same version, for that row (default: python3.13)",
    )  # fmt: skip
    parser.add_argument("--no-ft", action="store_true", help="skip the free-threading row")
    parser.add_argument(
        "--ft-only", action="store_true",
        help="only the free-threading row, into bench/results/free-threading.* (latest.* "
        "and the documentation's tables are left alone)",
    )  # fmt: skip
    add_server_option(parser)
    args = parser.parse_args()
    SERVER_KIND["kind"] = args.server
    args.workloads = args.workloads or ",".join(WORKLOADS)
    python = venv(ROOT / ".venv-bench", sys.executable, str(ROOT), "sepp-py==0.1.0")
    report: dict[str, Any] = {
        "machine": machine(),
        "versions": versions(python),
        "rounds": args.rounds,
        "jobs": args.jobs,
        "server": args.server,
        "workloads": [],
    }
    if args.ft_only:
        if not args.ft_python:
            parser.error("--ft-only needs a free-threaded CPython: --ft-python PATH")
        free_threading(report, args.ft_python, args.gil_python, python, args.rounds)
        print((RESULTS / "free-threading.md").read_text())
        return 0
    for workload in [] if args.no_compare else args.workloads.split(","):
        print(f"== {workload}", flush=True)
        row = compare(python, python, workload, args.rounds, args.jobs)
        lite, official = row["sepp_lite_cpu_us"], row["sepp_cpu_us"]
        ratio = row["pair_ratio_median"]
        print(
            f"   sepp_lite {lite:.1f} us, sepp-py {official:.1f} us, ratio {ratio:.2f}", flush=True
        )
        report["workloads"].append(row)
    sepp_lite_only(report, python, args)
    if not args.no_footprint:
        print("== footprint", flush=True)
        report["footprint"] = footprint(python, python)
    pypy = shutil.which("pypy3")
    if pypy and not args.no_pypy:
        print("== PyPy", flush=True)
        pypy_python = venv(ROOT / ".venv-bench-pypy", pypy, str(ROOT))
        report["pypy_versions"] = versions(pypy_python)
        report["pypy"] = {}
        for workload in args.workloads.split(","):
            if workload in PYPY_JOBS:
                print(f"== PyPy: {workload}", flush=True)
                server_python = pypy_python if args.pypy_server == "pypy" else python
                report["pypy"][workload] = pypy_comparison(
                    pypy_python, python, workload, args.rounds, server_python
                )
        report["pypy_server"] = args.pypy_server
    if args.ft_python and not args.no_ft:
        free_threading(report, args.ft_python, args.gil_python, python, args.rounds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(report, indent=2))
    (RESULTS / "latest.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
