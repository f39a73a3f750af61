"""``sepp-lite`` as a real process whose output goes away: every command ends quietly
when the reader of its stdout has gone, except ``drain-dead-letters``, which never
destroys a dead letter unwritten (killed between calls, stopped by a closed pipe or a
full device: what was written plus what is left on the server, plus what it printed
on stderr because it could not write it, is every record); and
``requeue-dead-letters`` replays an archive, twice without duplicates."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer
from tests.cli_helpers import child_env, sepp_lite, started
from tests.client_helpers import unique_queue

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes and signals"),
]


async def run_with_stdout_closed(*args: str) -> tuple[int, str]:
    """Run ``sepp-lite args`` with a stdout whose reader is gone before it writes a
    byte; ``(exit status, stderr)``."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        async with started(*args, stdout=write_end) as proc:
            os.close(write_end)
            write_end = -1
            _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if write_end != -1:
            os.close(write_end)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


class Reader:
    """The read end of a child's stdout pipe, read a line at a time and closed when
    the test says (the reader going away, as ``head -1`` does)."""

    def __init__(self) -> None:
        self.fd, self.write_end = os.pipe()
        self.buffer = b""

    async def line(self) -> str:
        while b"\n" not in self.buffer:
            chunk = await asyncio.to_thread(os.read, self.fd, 65536)
            assert chunk, "the child closed its stdout"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode() + "\n"

    def close(self) -> None:
        if self.fd != -1:
            os.close(self.fd)
            self.fd = -1


@asynccontextmanager
async def started_with_reader(
    *args: str,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, Reader]]:
    reader = Reader()
    try:
        async with started(*args, stdout=reader.write_end) as proc:
            os.close(reader.write_end)
            yield proc, reader
    finally:
        reader.close()


async def dead_letters(server: SeppTestServer, queue: str, n: int) -> set[str]:
    """Dead-letter ``n`` jobs of ``queue``; their ids."""
    async with await sepp.SeppClient.connect(server.addr) as client:
        jobs = [
            sepp.EnqueueRequest(queue, "t", payload=sepp.Payload(b"body %d" % i, "text/x"))
            for i in range(n)
        ]
        await client.enqueue_batch(jobs)
        ids: set[str] = set()
        while len(ids) < n:
            options = sepp.ReserveOptions([queue], timedelta(seconds=30), 1.0, max_jobs=n)
            for job in await client.reserve(options):
                await client.nack(job.ctx, sepp.RetryDirective.DEAD_LETTER, "broken")
                ids.add(job.ctx.id)
    assert server.counts(queue).dead == n
    return ids


def ids_of(text: str) -> list[str]:
    """The job ids of the JSON lines (records) in ``text``; other lines are skipped."""
    return [json.loads(line)["job_id"] for line in text.splitlines() if line.startswith("{")]


class HeldCall:
    """A server hook that lets calls through until the ``n``-th, which waits until
    :meth:`release`, then fails without touching the state (so a test decides
    whether the held call drains anything: here, never)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0
        self.reached = asyncio.Event()
        self.released = asyncio.Event()
        self.fail = True

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.n:
            self.reached.set()
            await self.released.wait()
            if self.fail:
                raise GRPCError(Status.UNAVAILABLE, "held by the test")

    async def wait(self) -> None:
        await asyncio.wait_for(self.reached.wait(), 60)


# -- every command: a reader that goes away ends it quietly ----------------------------


async def test_every_command_ends_quietly_when_its_reader_has_gone(tmp_path: Path) -> None:
    # Before: `sepp-lite info | head -1` exited 1 with "unexpected BrokenPipeError".
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"payload": "a"}\n{"payload": "b"}\n')
    async with SeppTestServer(dead_letter_retention_ms=60_000) as server:
        queue = unique_queue()
        archive = tmp_path / "dead.jsonl"
        await dead_letters(server, queue, 2)
        code, _ = await run_with_stdout_closed(
            "drain-dead-letters", "--addr", server.addr, "--out", str(archive)
        )
        assert code == 0
        commands = [
            ["info", "--addr", server.addr],
            ["info", "--addr", server.addr, "--json"],
            ["enqueue", queue, "t", "--addr", server.addr],
            ["enqueue", queue, "t", "--jsonl", str(jobs), "--addr", server.addr],
            ["requeue-dead-letters", str(archive), "--addr", server.addr],
            ["--help"],
            ["info", "--help"],
            ["--version"],
        ]
        for argv in commands:
            assert await run_with_stdout_closed(*argv) == (0, ""), argv
        # They did their work: 1 + 2 jobs enqueued, 2 replayed.
        assert server.counts(queue).ready == 5


async def test_a_reader_that_goes_away_between_lines_of_a_table(tmp_path: Path) -> None:
    # `sepp-lite demo | head -1`: the reader takes a line, then leaves.
    async with started_with_reader("demo", "--jobs", "10") as (proc, reader):
        assert (await asyncio.wait_for(reader.line(), 60)).startswith("sepp-lite demo: 10 jobs")
        reader.close()
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, err.decode()) == (0, "")


# -- the drain: nothing destroyed unwritten --------------------------------------------


async def test_the_drain_refuses_to_run_without_a_reader_before_draining() -> None:
    async with SeppTestServer(dead_letter_retention_ms=60_000) as server:
        queue = unique_queue()
        await dead_letters(server, queue, 5)
        code, err = await run_with_stdout_closed(
            "drain-dead-letters", "--addr", server.addr, "--yes"
        )
        assert server.counts(queue).dead == 5  # checked before the first call
    assert code == 1
    assert err == (
        "error: stopped: the reader of stdout has gone; 0 dead-letter record(s) written, "
        "any others are still on the server\n"
    )


async def test_a_pipe_closed_between_calls_loses_nothing() -> None:
    # `drain-dead-letters --yes | head -1`, made deterministic: the reader takes the
    # first call's record, then leaves while the second call is on its way.
    server = SeppTestServer(dead_letter_retention_ms=60_000)
    held = HeldCall(2)
    held.fail = False  # this call drains its records: the write that follows fails
    server.before_call("DrainDeadLetters", held)
    async with server:
        queue = unique_queue()
        every = await dead_letters(server, queue, 20)
        argv = ["drain-dead-letters", "--addr", server.addr, "--yes", "--batch", "4"]
        async with started_with_reader(*argv) as (proc, reader):
            first = await asyncio.wait_for(reader.line(), 60)
            await held.wait()
            reader.close()
            held.released.set()
            _, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
            err = err_bytes.decode()
        left = server.counts(queue).dead
        async with await sepp.SeppClient.connect(server.addr) as client:
            remaining = {r.job_id for r in await client.drain_dead_letters(queue, 256)}
    assert proc.returncode == 1, err
    written, printed = ids_of(first), ids_of(err)
    # Calls ask for 1, then 2: the second call's 2 records could not be written, and
    # are on stderr, not lost; the others never left the server.
    assert (len(written), len(printed), left) == (1, 2, 17)
    assert set(written) | set(printed) | remaining == every
    assert err.splitlines()[-1] == (
        "error: cannot write to stdout: broken pipe; 1 dead-letter record(s) written; the 2 "
        "record(s) of the last call, no longer on the server, could not be written: they "
        "are above, on stderr; any others are still on the server"
    )


async def test_killed_between_calls_every_record_is_written_or_on_the_server(
    tmp_path: Path,
) -> None:
    server = SeppTestServer(dead_letter_retention_ms=60_000)
    held = HeldCall(4)  # after calls of 1, 2 and 4 records
    server.before_call("DrainDeadLetters", held)
    out = tmp_path / "dead.jsonl"
    async with server:
        queue = unique_queue()
        every = await dead_letters(server, queue, 40)
        argv = ["drain-dead-letters", "--addr", server.addr, "--out", str(out), "--batch", "8"]
        async with started(*argv) as proc:
            await held.wait()
            proc.send_signal(signal.SIGKILL)  # no chance to flush anything more
            await asyncio.wait_for(proc.wait(), 60)
        held.released.set()  # the held call then fails: it drains nothing
        left = server.counts(queue).dead
        async with await sepp.SeppClient.connect(server.addr) as client:
            remaining = {r.job_id for r in await client.drain_dead_letters(queue, 256)}
    written = ids_of(out.read_text())
    assert (len(written), left) == (7, 33)
    assert set(written) | remaining == every and len(set(written)) == 7


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
async def test_a_full_device_stops_the_drain_with_the_counts(tmp_path: Path) -> None:
    async with SeppTestServer(dead_letter_retention_ms=60_000) as server:
        queue = unique_queue()
        every = await dead_letters(server, queue, 10)
        argv = ["drain-dead-letters", "--addr", server.addr, "--out", "/dev/full"]
        async with started(*argv) as proc:
            out, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
        err = err_bytes.decode()
        left = server.counts(queue).dead
    assert proc.returncode == 1 and out == b""
    # The first call asks for one record: output that fails from the start costs that
    # one, and it is printed on stderr.
    printed = ids_of(err)
    assert (len(printed), left) == (1, 9) and set(printed) < every
    assert err.splitlines()[-1] == (
        "error: cannot write to /dev/full: no space left on device; 0 dead-letter record(s) "
        "written; the 1 record(s) of the last call, no longer on the server, could not be "
        "written: they are above, on stderr; any others are still on the server"
    )


async def test_ctrl_c_stops_the_drain_after_the_call_in_flight(tmp_path: Path) -> None:
    # The call in flight may already have removed its records: they are written first.
    server = SeppTestServer(dead_letter_retention_ms=60_000)
    held = HeldCall(2)
    held.fail = False
    server.before_call("DrainDeadLetters", held)
    out = tmp_path / "dead.jsonl"
    async with server:
        queue = unique_queue()
        await dead_letters(server, queue, 10)
        argv = ["drain-dead-letters", "--addr", server.addr, "--out", str(out)]
        async with started(*argv) as proc:
            assert proc.stderr is not None
            await held.wait()
            proc.send_signal(signal.SIGINT)
            said = await asyncio.wait_for(proc.stderr.readline(), 60)
            held.released.set()  # the call in flight answers only after Ctrl-C
            _, rest = await asyncio.wait_for(proc.communicate(), 60)
            err = said + rest
        left = server.counts(queue).dead
    assert proc.returncode == 130, err.decode()
    assert (len(ids_of(out.read_text())), left) == (3, 7)
    assert err.decode().splitlines() == [
        "stopping after the call in flight (Ctrl-C again to stop now)",
        f"drained 3 dead-letter record(s) into {out}",
        "error: interrupted; any others are still on the server",
    ]


# -- requeue ----------------------------------------------------------------------------


async def test_requeue_twice_creates_no_duplicates(tmp_path: Path) -> None:
    archive = tmp_path / "dead.jsonl"
    async with SeppTestServer(dead_letter_retention_ms=60_000) as server:
        queue, other = unique_queue(), unique_queue()
        await dead_letters(server, queue, 5)
        await dead_letters(server, other, 2)
        code, _, err = await sepp_lite(
            "drain-dead-letters", "--addr", server.addr, "--out", str(archive)
        )
        assert (code, err) == (0, f"drained 7 dead-letter record(s) into {archive}\n")
        argv = ["requeue-dead-letters", str(archive), "--addr", server.addr]
        assert await sepp_lite(*argv) == (0, "7 accepted, 0 rejected, 0 malformed\n", "")
        assert (server.counts(queue).ready, server.counts(other).ready) == (5, 2)
        assert await sepp_lite(*argv) == (
            0,
            "7 accepted (7 deduplicated), 0 rejected, 0 malformed\n",
            "",
        )
        assert (server.counts(queue).ready, server.counts(other).ready) == (5, 2)


def limit_file_size(limit: int) -> None:
    """In the child, before exec: files may not grow past ``limit`` bytes, and a write
    past it fails with EFBIG instead of killing the process (SIGXFSZ ignored)."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


async def test_a_write_that_fails_midway_leaves_whole_lines(tmp_path: Path) -> None:
    # A record is about 400 bytes: the first fits under the limit, the second is cut
    # short (a partial write, then EFBIG). The archive keeps its earlier content and
    # whole lines only; the records of the failed call are on stderr.
    out = tmp_path / "dead.jsonl"
    out.write_bytes(b"kept\n")
    async with SeppTestServer(dead_letter_retention_ms=60_000) as server:
        queue = unique_queue()
        every = await dead_letters(server, queue, 10)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sepp_lite",
            "drain-dead-letters",
            "--addr",
            server.addr,
            "--out",
            str(out),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            preexec_fn=lambda: limit_file_size(5 + 600),
        )
        _, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
        err = err_bytes.decode()
        left = server.counts(queue).dead
    assert proc.returncode == 1, err
    kept, *lines = out.read_text().splitlines(keepends=True)
    assert kept == "kept\n" and all(line.endswith("}\n") for line in lines)
    written, printed = ids_of("".join(lines)), ids_of(err)
    assert (len(written), len(printed), left) == (1, 2, 7)
    assert set(written) | set(printed) < every
    assert err.splitlines()[-1].startswith(f"error: cannot write to {out}: file too large; ")


async def test_drain_into_head_1_removes_only_what_head_printed() -> None:
    # The newcomer's `drain-dead-letters --yes | head -1`, as a real shell pipeline: the
    # drain waits until head has taken its line and had a moment to exit, so the next
    # call is not made and no record ends up on stderr. Five times, as it was a race.
    async def scenario() -> list[tuple[int, str, str, int]]:
        results = []
        async with SeppTestServer(dead_letter_retention_ms=60_000) as server:
            queue = unique_queue()
            await dead_letters(server, queue, 20)
            for _ in range(5):
                before = server.counts(queue).dead
                command = (
                    f"{shlex.quote(sys.executable)} -m sepp_lite drain-dead-letters "
                    f"--addr {server.addr} --queue {queue} --yes | head -1; "
                    "exit ${PIPESTATUS[0]}"
                )
                proc = await asyncio.create_subprocess_exec(
                    "bash", "-c", command, stdout=PIPE, stderr=PIPE, env=child_env()
                )
                out, err = await asyncio.wait_for(proc.communicate(), 60)
                assert proc.returncode is not None
                removed = before - server.counts(queue).dead
                results.append((proc.returncode, out.decode(), err.decode(), removed))
        return results

    for code, out, err, removed in await scenario():
        assert (len(out.splitlines()), removed) == (1, 1), (out, err)
        assert code == 1 and err.startswith("error: stopped: the reader of stdout has gone"), err
        assert "job_id" not in err  # no record had to be printed on stderr
