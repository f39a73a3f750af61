"""Soak test: a long, paced run of producers and worker processes against one server,
checked job by job at the end.

The driver process hosts the in-process server (``SeppTestServer``, whose state keeps
running totals) and the producers: ``--producers`` asyncio tasks, each with its own
``SeppClient``, a retry policy and an idempotency key on every job, paced so that
``--jobs`` jobs are spread over ``--minutes``. ``--workers`` worker processes (this
script again, with ``worker``) each run a ``Worker`` and write one line per delivery,
per successful ack or nack and per failed one to their own file. Jobs get a fate from
their index: most are acked, some fail once and are retried, some are dead-lettered
at once, some fail until their attempts run out, and a few run past their lease so
that the server really redelivers them.

When every job is settled the workers get SIGTERM (a graceful drain) and the driver
checks, with pass/fail per line:

* every job was enqueued exactly once (by the server's own count),
* acked + dead-lettered = enqueued, and each job ended as its fate says,
* no job was acked twice,
* every redelivery follows a retry nack or a lease that really lapsed (the previous
  delivery's handler outlived its lease, or its settle found the lease gone), and the
  server's lease-expiry count matches,
* the workers saw every delivery the server made,
* memory is flat: each worker's RSS at the end is within 10 % of its RSS at a fifth of
  the run (minute 2 of the default 10),
* the workers exited cleanly.

Defaults: 100,000 jobs over 10 minutes, 4 producers, 4 workers (``make soak``).
``--json FILE`` also writes the summary as JSON. Exit status 1 when a check fails.
Everything binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sepp_lite as sepp
from sepp_lite.errors import LeaseError
from sepp_lite.testing import SeppTestServer

QUEUE = "soak"
JOB_TYPE = "soak"
BATCH = 10
MAX_ATTEMPTS = 3

# Fates by job index modulo 200: 85.5 % ack, 8 % retry once, 4 % dead-letter at once,
# 2 % fail on every attempt, 0.5 % outlive their first lease.
_FATES = [("ack", 170), ("retry", 16), ("permanent", 8), ("exhaust", 4), ("slow", 1), ("ack", 1)]
FATE_OF = [fate for fate, count in _FATES for _ in range(count)]
ACKED_FATES = frozenset({"ack", "retry", "slow"})


def fate_of(index: int) -> str:
    return FATE_OF[index % len(FATE_OF)]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------
# The worker process


class RecordingClient(sepp.SeppClient):
    """A client that writes a line for every ack and nack, successful or not."""

    log: IO[str]

    async def ack(self, ctx: sepp.JobCtx) -> None:
        try:
            await super().ack(ctx)
        except LeaseError as error:
            self.log.write(f"E {ctx.id} {ctx.attempt} ack {type(error).__name__}\n")
            raise
        self.log.write(f"A {ctx.id} {ctx.attempt}\n")

    async def nack(
        self,
        ctx: sepp.JobCtx,
        retry: sepp.RetryDirective = sepp.RetryDirective.DEFAULT,
        reason: str = "",
    ) -> bool:
        try:
            dead = await super().nack(ctx, retry, reason)
        except LeaseError as error:
            self.log.write(f"E {ctx.id} {ctx.attempt} nack {type(error).__name__}\n")
            raise
        self.log.write(f"N {ctx.id} {ctx.attempt} {int(dead)}\n")
        return dead


async def _flush_every(log: IO[str], seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        log.flush()


def _dump_tasks() -> None:
    """SIGUSR1: print every task's stack to stderr (the driver asks before a SIGKILL)."""
    for task in asyncio.all_tasks():
        print(f"--- {task!r}", file=sys.stderr)
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                print(f"    {frame.f_code.co_filename}:{frame.f_lineno}", file=sys.stderr)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    sys.stderr.flush()


async def worker_main(args: argparse.Namespace, log: IO[str]) -> int:
    lease = float(args.lease)
    client = await RecordingClient.connect(
        args.addr,
        retry_policy=sepp.RetryPolicy(max_attempts=5, initial_backoff=0.05, max_backoff=1.0),
    )
    client.log = log
    worker = sepp.Worker(
        client,
        [QUEUE],
        lease,
        wait_timeout=5,
        max_in_flight=args.in_flight,
        reserve_error_backoff=0.2,
    )

    @worker.handler(JOB_TYPE)
    async def handle(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        fate = str(ctx.custom.get("fate"))
        start = now_ms()
        outcome = "ack"
        try:
            if fate == "slow" and ctx.attempt == 1:
                await asyncio.sleep(lease + 1.5)
            else:
                await asyncio.sleep(random.random() * 0.004)
            if fate == "retry" and ctx.attempt == 1:
                outcome = "retry"
                raise sepp.HandlerError.retry("soak: fails once")
            if fate == "permanent":
                outcome = "permanent"
                raise sepp.HandlerError.permanent("soak: dead-letter now")
            if fate == "exhaust":
                outcome = "exhaust"
                raise RuntimeError("soak: fails every time")
        finally:
            expiry = int(ctx.lease_expires_at.timestamp() * 1000)
            log.write(f"D {ctx.id} {ctx.attempt} {fate} {expiry} {start} {now_ms()} {outcome}\n")

    flusher = asyncio.ensure_future(_flush_every(log, 2.0))
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks)
    try:
        print("ready", flush=True)
        with sepp.shutdown_on_signals(worker.shutdown_handle()):
            await worker.run()
    finally:
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
        await client.close()
    return 0


# ---------------------------------------------------------------------------------------
# The driver


def rss_bytes(pid: int) -> Optional[int]:
    """Resident set size of ``pid`` from /proc (Linux), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Produced:
    """What the producers got back: job id per index, and how calls went."""

    ids: dict[int, str] = field(default_factory=dict)
    deduplicated: int = 0
    errors: list[str] = field(default_factory=list)


async def produce(
    addr: str,
    indexes: Sequence[int],
    per_second: float,
    run_id: str,
    out: Produced,
) -> None:
    """Enqueue the jobs of ``indexes`` in batches, paced at ``per_second`` jobs/s."""
    policy = sepp.RetryPolicy(max_attempts=8, initial_backoff=0.05, max_backoff=1.0)
    loop = asyncio.get_running_loop()
    async with await sepp.SeppClient.connect(addr, retry_policy=policy) as client:
        start = loop.time()
        for offset in range(0, len(indexes), BATCH):
            due = start + offset / per_second
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            batch = indexes[offset : offset + BATCH]
            requests = [
                sepp.EnqueueRequest(
                    QUEUE,
                    JOB_TYPE,
                    payload=sepp.Payload(f"job {index}".encode(), "text/plain"),
                    idempotency_key=f"{run_id}-{index}",
                    max_attempts=MAX_ATTEMPTS,
                    custom={"fate": fate_of(index), "index": index},
                )
                for index in batch
            ]
            try:
                results = await client.enqueue_batch(requests)
            except sepp.SeppError as error:
                out.errors.append(f"batch at {batch[0]}: {error}")
                continue
            for index, result in zip(batch, results):
                if isinstance(result, sepp.EnqueueAck):
                    out.ids[index] = result.job_id
                    out.deduplicated += result.deduplicated
                else:
                    out.errors.append(f"job {index} rejected: {result}")


@dataclass
class WorkerProc:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    rss: list[tuple[float, int]] = field(default_factory=list)


def start_worker(index: int, addr: str, work: Path, args: argparse.Namespace) -> WorkerProc:
    log = work / f"worker-{index}.log"
    command = [sys.executable, __file__, "worker", "--addr", addr, "--log", str(log)]
    command += ["--lease", str(args.lease), "--in-flight", str(args.in_flight)]
    stderr = open(work / f"worker-{index}.stderr", "wb")
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
    finally:
        stderr.close()
    return WorkerProc(index, proc, log)


async def wait_ready(workers: Sequence[WorkerProc], timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    for worker in workers:
        assert worker.proc.stdout is not None
        line = await asyncio.wait_for(
            loop.run_in_executor(None, worker.proc.stdout.readline), timeout
        )
        if line.strip() != b"ready":
            raise RuntimeError(f"worker {worker.index} did not start: {line!r}")


async def stop_workers(workers: Sequence[WorkerProc], timeout: float = 30.0) -> list[Optional[int]]:
    """SIGTERM (a graceful drain), then SIGKILL whatever is left; the exit codes. The
    server shares this event loop and must keep answering while the workers drain."""
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    for _ in range(int(timeout / 0.05)):
        if all(worker.proc.poll() is not None for worker in workers):
            break
        await asyncio.sleep(0.05)
    codes: list[Optional[int]] = []
    for worker in workers:
        code = worker.proc.poll()
        if code is None:
            worker.proc.send_signal(signal.SIGUSR1)  # its tasks' stacks go to its stderr
            await asyncio.sleep(0.5)
            worker.proc.kill()
        worker.proc.wait(10)
        if worker.proc.stdout is not None:
            worker.proc.stdout.close()
        codes.append(code)
    return codes


def settled(server: SeppTestServer) -> bool:
    totals = server.state.totals()
    ready, scheduled, in_flight, _ = server.counts(QUEUE)
    done = totals["acked"] + totals["dead_lettered"] >= totals["enqueued"]
    return done and ready == 0 and scheduled == 0 and in_flight == 0


async def monitor(
    server: SeppTestServer,
    workers: Sequence[WorkerProc],
    started: float,
    every: float,
    print_every: float,
) -> None:
    """Sample the workers' RSS every ``every`` s; print progress now and then."""
    printed = 0.0
    while True:
        elapsed = time.monotonic() - started
        for worker in workers:
            rss = rss_bytes(worker.proc.pid)
            if rss is not None and worker.proc.poll() is None:
                worker.rss.append((elapsed, rss))
        if elapsed - printed >= print_every:
            printed = elapsed
            totals = server.state.totals()
            rss_mb = " ".join(f"{w.rss[-1][1] / 2**20:.1f}" for w in workers if w.rss)
            print(
                f"[{elapsed:7.1f} s] enqueued={totals['enqueued']} acked={totals['acked']} "
                f"dead={totals['dead_lettered']} expired={totals['lease_expired']} "
                f"counts={tuple(server.counts(QUEUE))} worker RSS MiB: {rss_mb}",
                flush=True,
            )
        await asyncio.sleep(every)


# ---------------------------------------------------------------------------------------
# Checks


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class Logs:
    deliveries: dict[tuple[str, int], tuple[str, int, int, int, str]] = field(default_factory=dict)
    duplicate_deliveries: int = 0
    acks: list[str] = field(default_factory=list)
    nacks: dict[tuple[str, int], bool] = field(default_factory=dict)
    settle_errors: set[tuple[str, int]] = field(default_factory=set)


def read_logs(paths: Sequence[Path]) -> Logs:
    logs = Logs()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            kind, job_id, attempt = parts[0], parts[1], int(parts[2])
            if kind == "D":
                key = (job_id, attempt)
                if key in logs.deliveries:
                    logs.duplicate_deliveries += 1
                fate, expiry, start, end, outcome = parts[3], *map(int, parts[4:7]), parts[7]
                logs.deliveries[key] = (fate, expiry, start, end, outcome)
            elif kind == "A":
                logs.acks.append(job_id)
            elif kind == "N":
                logs.nacks[(job_id, attempt)] = parts[3] == "1"
            elif kind == "E":
                logs.settle_errors.add((job_id, attempt))
    return logs


def redelivery_check(logs: Logs, lease_expired: int) -> tuple[Check, dict[str, int]]:
    """Each delivery with attempt k > 1 must follow a retry nack of attempt k-1 or a
    lease of attempt k-1 that really lapsed."""
    causes: Counter[str] = Counter()
    unexplained: list[str] = []
    for (job_id, attempt), _ in logs.deliveries.items():
        if attempt == 1:
            continue
        previous = (job_id, attempt - 1)
        earlier = logs.deliveries.get(previous)
        if logs.nacks.get(previous) is False:
            causes["retry nack"] += 1
        elif earlier is not None and earlier[3] >= earlier[1]:
            causes["handler outlived its lease"] += 1
        elif previous in logs.settle_errors:
            causes["settle found the lease gone"] += 1
        else:
            unexplained.append(f"{job_id} attempt {attempt}")
    lapses = causes["handler outlived its lease"] + causes["settle found the lease gone"]
    passed = not unexplained and lapses == lease_expired
    detail = ", ".join(f"{name}: {count}" for name, count in sorted(causes.items()))
    detail += f"; server lease expiries: {lease_expired}; unexplained: {len(unexplained)}"
    if unexplained:
        detail += f" (e.g. {unexplained[:3]})"
    return Check("redeliveries only after a retry nack or a lapsed lease", passed, detail), dict(
        causes
    )


def memory_check(
    workers: Sequence[WorkerProc], baseline_at: float, tolerance: float
) -> tuple[Check, list[Any]]:
    rows = []
    passed = bool(workers)
    for worker in workers:
        if len(worker.rss) < 2:
            passed = False
            rows.append({"worker": worker.index, "error": "not enough samples"})
            continue
        base = min(worker.rss, key=lambda sample: abs(sample[0] - baseline_at))
        last = worker.rss[-1]
        change = (last[1] - base[1]) / base[1]
        passed = passed and abs(change) <= tolerance
        rows.append(
            {
                "worker": worker.index,
                "baseline_s": round(base[0], 1),
                "baseline_mib": round(base[1] / 2**20, 2),
                "end_s": round(last[0], 1),
                "end_mib": round(last[1] / 2**20, 2),
                "change_pct": round(change * 100, 2),
                "peak_mib": round(max(rss for _, rss in worker.rss) / 2**20, 2),
            }
        )
    detail = "; ".join(
        f"w{r['worker']}: {r['baseline_mib']} MiB at {r['baseline_s']} s -> "
        f"{r['end_mib']} MiB at {r['end_s']} s ({r['change_pct']:+.1f} %)"
        if "error" not in r
        else f"w{r['worker']}: {r['error']}"
        for r in rows
    )
    return Check(f"worker RSS flat (within {tolerance:.0%})", passed, detail), rows


def run_checks(
    args: argparse.Namespace,
    server: SeppTestServer,
    produced: Produced,
    logs: Logs,
    workers: Sequence[WorkerProc],
    exit_codes: Sequence[Optional[int]],
    baseline_at: float,
) -> tuple[list[Check], dict[str, Any]]:
    totals = server.state.totals()
    dead_ids = {record.job.id for record in server.state.dead_letters(QUEUE)}
    acked_ids = set(logs.acks)
    checks: list[Check] = []

    distinct = len(set(produced.ids.values()))
    checks.append(
        Check(
            "every job enqueued exactly once",
            totals["enqueued"] == args.jobs == distinct == len(produced.ids)
            and not produced.errors,
            f"requested {args.jobs}, producers got {len(produced.ids)} ids ({distinct} distinct, "
            f"{produced.deduplicated} deduplicated retries, {len(produced.errors)} errors), "
            f"server enqueued {totals['enqueued']}",
        )
    )
    checks.append(
        Check(
            "acked + dead-lettered = enqueued",
            totals["acked"] + totals["dead_lettered"] == totals["enqueued"],
            f"{totals['acked']} + {totals['dead_lettered']} = "
            f"{totals['acked'] + totals['dead_lettered']} vs {totals['enqueued']}",
        )
    )
    twice = [job_id for job_id, count in Counter(logs.acks).items() if count > 1]
    checks.append(
        Check(
            "no job acked twice",
            not twice and len(logs.acks) == totals["acked"],
            f"{len(logs.acks)} successful acks by the workers, {len(acked_ids)} distinct, "
            f"server acked {totals['acked']}; acked twice: {len(twice)}",
        )
    )
    wrong = [
        index
        for index, job_id in produced.ids.items()
        if (job_id in acked_ids) != (fate_of(index) in ACKED_FATES)
        or (job_id in dead_ids) == (fate_of(index) in ACKED_FATES)
    ]
    checks.append(
        Check(
            "every job ended as its fate says",
            not wrong,
            f"fates: {dict(Counter(fate_of(i) for i in produced.ids))}; "
            f"dead letters: {len(dead_ids)}; wrong: {len(wrong)}",
        )
    )
    redelivery, causes = redelivery_check(logs, totals["lease_expired"])
    checks.append(redelivery)
    checks.append(
        Check(
            "workers saw every delivery",
            len(logs.deliveries) == totals["delivered"] and logs.duplicate_deliveries == 0,
            f"server delivered {totals['delivered']}, workers logged {len(logs.deliveries)} "
            f"(same delivery twice: {logs.duplicate_deliveries})",
        )
    )
    memory, rss_rows = memory_check(workers, baseline_at, args.rss_tolerance)
    checks.append(memory)
    checks.append(
        Check(
            "workers exited cleanly",
            all(code == 0 for code in exit_codes),
            f"exit codes {list(exit_codes)}",
        )
    )
    numbers = {
        "totals": totals,
        "redelivery_causes": causes,
        "rss": rss_rows,
        "producer_deduplicated": produced.deduplicated,
    }
    return checks, numbers


# ---------------------------------------------------------------------------------------
# Main


async def drive(args: argparse.Namespace, work: Path) -> int:
    run_id = f"soak{os.getpid()}-{int(time.time())}"
    duration = args.minutes * 60.0
    per_second = args.jobs / duration if duration > 0 else float("inf")
    server = SeppTestServer(host="127.0.0.1", port=0, dead_letter_retention_ms=86_400_000)
    await server.start()
    workers: list[WorkerProc] = []
    produced = Produced()
    started = time.monotonic()
    exit_codes: list[Optional[int]] = []
    monitor_task: Optional[asyncio.Future[None]] = None
    try:
        workers = [start_worker(i, server.addr, work, args) for i in range(args.workers)]
        await wait_ready(workers)
        print(
            f"soak: {args.jobs} jobs over {args.minutes} min ({per_second:.1f} jobs/s), "
            f"{args.producers} producers, {args.workers} workers, lease {args.lease} s, "
            f"server {server.addr}, logs in {work}",
            flush=True,
        )
        started = time.monotonic()
        monitor_task = asyncio.ensure_future(
            monitor(server, workers, started, args.sample_every, args.print_every)
        )
        shares = [list(range(p, args.jobs, args.producers)) for p in range(args.producers)]
        await asyncio.gather(
            *(
                produce(server.addr, share, per_second / args.producers, run_id, produced)
                for share in shares
            )
        )
        produced_at = time.monotonic() - started
        for _ in range(int(args.settle_timeout / 0.2)):
            if settled(server):
                break
            await asyncio.sleep(0.2)
        settled_at = time.monotonic() - started
        await asyncio.sleep(min(1.0, args.sample_every))  # one more RSS sample at the end
    finally:
        if monitor_task is not None:
            monitor_task.cancel()
            await asyncio.gather(monitor_task, return_exceptions=True)
        exit_codes = await stop_workers(workers)
    try:
        logs = read_logs([w.log for w in workers])
        baseline_at = 0.2 * max(duration, 1.0)
        checks, numbers = run_checks(args, server, produced, logs, workers, exit_codes, baseline_at)
    finally:
        await server.stop()
    numbers.update(
        jobs=args.jobs,
        minutes=args.minutes,
        producers=args.producers,
        workers=args.workers,
        lease_s=args.lease,
        produced_s=round(produced_at, 1),
        settled_s=round(settled_at, 1),
        throughput_jobs_per_s=round(args.jobs / max(settled_at, 1e-9), 1),
    )
    return report(args, checks, numbers)


def report(args: argparse.Namespace, checks: Sequence[Check], numbers: dict[str, Any]) -> int:
    totals = numbers["totals"]
    print()
    print(
        f"soak summary: {numbers['jobs']} jobs, produced in {numbers['produced_s']} s, "
        f"all settled at {numbers['settled_s']} s ({numbers['throughput_jobs_per_s']} jobs/s)"
    )
    print("server totals: " + ", ".join(f"{k}={v}" for k, v in totals.items()))
    for check in checks:
        print(f"  [{'PASS' if check.passed else 'FAIL'}] {check.name}: {check.detail}")
    passed = all(check.passed for check in checks)
    print(f"soak {'PASSED' if passed else 'FAILED'}", flush=True)
    if args.json:
        summary = {
            "passed": passed,
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks],
            **numbers,
        }
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if passed else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    worker = sub.add_parser("worker", help="(internal) one worker process")
    worker.add_argument("--addr", required=True)
    worker.add_argument("--log", required=True)
    worker.add_argument("--lease", type=float, default=5.0)
    worker.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long producing lasts")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lease", type=float, default=5.0, help="the workers' lease, seconds")
    parser.add_argument("--in-flight", type=int, default=32, help="max_in_flight per worker")
    parser.add_argument("--sample-every", type=float, default=5.0, help="RSS sampling, seconds")
    parser.add_argument("--print-every", type=float, default=30.0, help="progress, seconds")
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument(
        "--rss-tolerance",
        type=float,
        default=0.10,
        help="allowed RSS change from a fifth of the run to its end (default 0.10)",
    )
    parser.add_argument("--json", help="also write the summary to this file")
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    args = parser.parse_args(argv)
    if args.role is None and (args.jobs < 1 or args.producers < 1 or args.workers < 1):
        parser.error("--jobs, --producers and --workers must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.role == "worker":
        with open(args.log, "a", buffering=1 << 16) as log:
            return asyncio.run(worker_main(args, log))
    if args.keep:
        work = Path(tempfile.mkdtemp(prefix="sepp-soak-"))
        return asyncio.run(drive(args, work))
    with tempfile.TemporaryDirectory(prefix="sepp-soak-") as tmp:
        return asyncio.run(drive(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
