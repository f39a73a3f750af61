"""``sepp-lite`` as a real process: ``python -m sepp_lite`` and the console script, exit
codes, a real terminal for the progress bar, ``serve``, and ``worker`` stopped by
SIGTERM (gracefully) and by a second signal (hard)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer
from tests.cli_helpers import child_env, sepp_lite, started
from tests.client_helpers import free_port, unique_queue
from tests.pki import ca_pem, server_pem

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and ptys"),
]

SECRET = "process-s3cret-never-shown"


async def test_exit_codes_of_python_m_sepp_lite(server: SeppTestServer) -> None:
    queue = unique_queue()
    code, out, err = await sepp_lite("enqueue", queue, "t", "--addr", server.addr)
    assert (code, err) == (0, "") and len(out.strip()) == 36  # a job id
    code, out, err = await sepp_lite("enqueue", queue, "t", "--addr", server.addr, "--delay", "1e8")
    assert code == 1 and out == ""
    assert err.startswith("error: job rejected: ") and err.count("\n") == 1
    unreachable = f"127.0.0.1:{free_port()}"
    code, out, err = await sepp_lite("info", "--addr", unreachable, "--api-key", SECRET)
    assert (code, out) == (2, "")
    assert err == f"error: cannot connect to the sepp server at {unreachable}: connection refused\n"
    code, _, err = await sepp_lite("enqueue", queue)
    assert code == 2 and err.count("\n") == 1 and "JOB_TYPE is required" in err


async def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    # In a process of its own: when a TLS command ends, the event loop closes before
    # the server answers the client's TLS close_notify, and in-process that would leave
    # the socket to the garbage collector.
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca_pem())
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    async with SeppTestServer(**server_pem()) as server:
        addr = f"localhost:{server.port}"
        code, out, err = await sepp_lite("info", "--addr", addr, "--ca", str(ca_file), "--json")
        assert (code, err) == (0, "") and json.loads(out)["version"]
        # The system's roots do not know this CA: a connection error, so exit 2.
        code, _, err = await sepp_lite("info", "--addr", addr, "--tls")
        assert code == 2 and err.count("\n") == 1
        assert "TLS certificate verification failed" in err
        code, _, err = await sepp_lite("info", "--addr", addr, "--ca", str(not_pem))
        assert code == 2 and err == f"error: --ca {not_pem} is not a PEM certificate file\n"
        missing = tmp_path / "missing.pem"
        code, _, err = await sepp_lite("info", "--addr", addr, "--ca", str(missing))
        assert code == 2
        assert err == f"error: cannot read --ca {missing}: No such file or directory\n"


async def test_a_tls_mismatch_says_the_one_thing_that_is_true(tmp_path: Path) -> None:
    # Before: "...: is the server using TLS? It answered in plaintext: connect without
    # TLS (http://); is the server not using TLS? try without --tls, --ca and https://".
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca_pem())
    async with SeppTestServer(**server_pem()) as tls_server, SeppTestServer() as plain_server:
        addr = f"localhost:{tls_server.port}"
        code, out, err = await sepp_lite("info", "--addr", addr, "--timeout", "5")
        assert (code, out) == (2, "")
        assert err == (
            f"error: cannot connect to the sepp server at {addr}: the server uses TLS: "
            "connect with --tls (or --ca FILE for a private CA)\n"
        )
        addr = f"localhost:{plain_server.port}"
        for options in (["--ca", str(ca_file)], ["--tls"]):
            code, out, err = await sepp_lite("info", "--addr", addr, *options)
            assert (code, out) == (2, "")
            assert err == (
                f"error: cannot connect to the sepp server at {addr}: the server does not "
                "use TLS: connect without --tls, --ca and https://\n"
            )


@pytest.mark.parametrize("command", [["-m", "sepp_lite", "serve"], ["-m", "sepp_lite.testing"]])
async def test_serve_names_the_address_it_could_not_bind(
    server: SeppTestServer, command: list[str]
) -> None:
    # Before: "error: cannot listen: [Errno 98] Address already in use".
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *command,
        "--port",
        str(server.port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == (2 if command[1] == "sepp_lite" else 1) and out == b""
    assert err.decode() == (
        f"error: cannot listen on 127.0.0.1:{server.port}: the address is already in use "
        "(is another server running there? --port 0 picks a free port)\n"
    )


async def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("sepp-lite")
    proc = await asyncio.create_subprocess_exec(
        str(script), "--version", stdout=asyncio.subprocess.PIPE, env=child_env()
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0 and out.decode().strip() == f"sepp-lite {sepp.__version__}"


def read_terminal(fd: int) -> bytes:
    """Everything written to a pty until its last writer closes it."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def test_progress_bar_on_a_real_terminal(server: SeppTestServer, tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps({"payload": str(i)}) + "\n" for i in range(300)))
    argv = ["enqueue", "q", "t", "--jsonl", str(path), "--addr", server.addr]
    master, slave = os.openpty()
    try:
        async with started(*argv, stderr=slave) as proc:
            os.close(slave)
            slave = -1
            # Read while the child writes: a full pty buffer would block it.
            drawn = asyncio.ensure_future(asyncio.to_thread(read_terminal, master))
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            terminal = (await asyncio.wait_for(drawn, 30)).decode()
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    assert proc.returncode == 0
    assert out.decode().strip() == "300 accepted, 0 rejected, 0 malformed"
    assert terminal.startswith("\r[") and "300/300 100%" in terminal
    assert "lines/s" in terminal and "ETA" in terminal
    # Piped, the same command draws nothing.
    code, out_text, err = await sepp_lite(*argv)
    assert (code, err) == (0, "")


async def test_jsonl_interrupted_by_ctrl_c_says_how_far_it_got(tmp_path: Path) -> None:
    server = SeppTestServer(max_enqueue_batch=2)
    sending, release = asyncio.Event(), asyncio.Event()

    async def held() -> None:
        sending.set()  # the command now waits for this call's answer
        await release.wait()

    server.before_call("EnqueueBatch", held)
    rejected = tmp_path / "rejected.jsonl"
    argv = ["enqueue", "q", "t", "--jsonl", "-", "--rejected", str(rejected)]
    async with server:
        async with started(*argv, "--addr", server.addr, stdin=asyncio.subprocess.PIPE) as proc:
            assert proc.stdin is not None
            proc.stdin.write(b"".join(b'{"payload": "%d"}\n' % i for i in range(3)))
            await asyncio.wait_for(sending.wait(), 30)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            release.set()
    assert proc.returncode == 130
    assert out.decode().splitlines() == [
        "0 accepted, 0 rejected, 0 malformed, 2 not sent",
        "interrupted after line 2: lines 1-2 were being sent and may or may not be enqueued "
        "(an idempotency key makes sending one again safe); the lines after line 2 were "
        "not read",
        f"2 line(s) not enqueued written to {rejected}",
    ]
    assert err.decode() == "error: interrupted\n"
    # stdin may never end, so what it still holds is not read; the rest is in the file.
    assert rejected.read_bytes() == b'{"payload": "0"}\n{"payload": "1"}\n'


async def test_ctrl_c_writes_every_line_not_known_to_be_enqueued(tmp_path: Path) -> None:
    # Batches of 3 jobs from a 20-line file: lines 1-3 are enqueued; the call for lines
    # 4, 6 and 7 (line 5 is malformed) hangs; Ctrl-C then. The rejected file must get lines 4-20, in
    # order, so the import resumes from it.
    server = SeppTestServer(max_enqueue_batch=3)
    calls, held = 0, asyncio.Event()
    release = asyncio.Event()

    async def second_call_hangs() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            held.set()
            await release.wait()

    server.before_call("EnqueueBatch", second_call_hangs)
    lines = [b'{"payload": "%d"}\n' % i for i in range(1, 21)]
    lines[4] = b'{"payload": 5, "oops": 1}\n'
    source, rejected = tmp_path / "jobs.jsonl", tmp_path / "rejected.jsonl"
    source.write_bytes(b"".join(lines))
    queue = unique_queue()
    argv = ["enqueue", queue, "t", "--jsonl", str(source), "--rejected", str(rejected)]
    async with server:
        async with started(*argv, "--addr", server.addr) as proc:
            await asyncio.wait_for(held.wait(), 30)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            release.set()
        assert server.counts(queue).ready <= 6  # lines 1-3, and maybe the held call's
    assert proc.returncode == 130
    assert out.decode().splitlines() == [
        "3 accepted, 0 rejected, 1 malformed, 16 not sent",
        "  line 5: malformed: unknown key(s): oops",
        "interrupted after line 7: lines 4-7 were being sent and may or may not be enqueued "
        "(an idempotency key makes sending one again safe)",
        f"17 line(s) not enqueued written to {rejected}",
    ]
    assert err.decode() == "error: interrupted\n"
    assert rejected.read_bytes() == b"".join(lines[3:])


async def test_serve_answers_and_stops_on_sigterm() -> None:
    async with started("serve", "--port", "0", "--dead-letter-retention", "60") as proc:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert "queue server listening addr=127.0.0.1:" in line
        addr = line.split("addr=")[1].split()[0]
        code, out, _ = await sepp_lite("info", "--addr", addr, "--json")
        assert code == 0 and json.loads(out)["dead_letter_retention_enabled"] is True
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0 and b"queue server stopped" in rest


async def test_serve_with_a_bad_configuration_is_exit_2(tmp_path: Path) -> None:
    code, _, err = await sepp_lite("serve", "--port", "0", "--tls-cert", str(tmp_path / "c"))
    assert code == 2 and err == "error: --tls-cert and --tls-key go together\n"


WORKER_MODULE = """
import asyncio
import pathlib
import sepp_lite as sepp

MARKS = pathlib.Path({marks!r})


def make_worker(client):
    worker = sepp.Worker(client, [{queue!r}], lease_duration=30)

    @worker.handler("slow")
    async def slow(payload, ctx):
        (MARKS / ("started-" + ctx.id)).touch()
        await asyncio.sleep(float(payload.data))
        (MARKS / ("done-" + ctx.id)).touch()

    return worker
"""


@asynccontextmanager
async def worker_process(
    server: SeppTestServer, tmp_path: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """A ``sepp-lite worker`` child on a fresh queue, once it has started."""
    queue = unique_queue()
    module = tmp_path / "slow_tasks.py"
    module.write_text(WORKER_MODULE.format(marks=str(tmp_path), queue=queue))
    argv = ["worker", "slow_tasks:make_worker", "--app-dir", str(tmp_path)]
    async with started(*argv, "--addr", server.addr, "--api-key", SECRET) as proc:
        assert proc.stderr is not None
        while True:  # the worker logs "... started: queues=..." once it is polling
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "the worker exited before starting"
            if "started: queues=" in line:
                break
        yield proc, queue


NEVER_WORKS = """
import sepp_lite as sepp


def make_worker(client):
    worker = sepp.Worker(client, [{queue!r}], lease_duration=30)
    worker.handle("t", lambda payload, ctx: None)
    return worker
"""


@pytest.mark.parametrize("until_idle", [[], ["--until-idle"]], ids=["serving", "until-idle"])
@pytest.mark.parametrize(
    ("server_options", "cli_options", "error"),
    [
        (
            {"strict_queues": True},
            [],
            'error: queues not declared on the server (strict mode): ["{queue}"]',
        ),
        (
            {"api_keys": [SECRET]},
            ["--api-key", "wrong-key"],
            "error: the server refused the credentials: invalid API key",
        ),
    ],
    ids=["strict", "wrong-key"],
)
async def test_a_worker_that_can_never_work_exits_1_with_one_error_line(
    server_options: dict[str, object],
    cli_options: list[str],
    error: str,
    until_idle: list[str],
    tmp_path: Path,
) -> None:
    # Before: a WARNING every second, forever, even with --until-idle.
    queue = unique_queue()
    (tmp_path / "never_works.py").write_text(NEVER_WORKS.format(queue=queue))
    argv = ["worker", "never_works:make_worker", "--app-dir", str(tmp_path), *until_idle]
    async with SeppTestServer(**server_options) as refusing:  # type: ignore[arg-type]
        code, out, err = await sepp_lite(*argv, "--addr", refusing.addr, *cli_options)
    lines = err.strip().splitlines()
    assert code == 1 and out == "" and "Traceback" not in err
    assert lines[-1] == error.format(queue=queue)
    # No log line repeats the error or reports it at ERROR: the error line is the one.
    assert [line for line in lines if "refused the" in line or "not declared" in line] == [
        lines[-1]
    ]
    assert not [line for line in lines if " ERROR " in line or " WARNING sepp_lite: res" in line]


async def enqueue_and_wait_for_start(
    server: SeppTestServer, tmp_path: Path, queue: str, seconds: float
) -> str:
    async with await sepp.SeppClient.connect(server.addr) as client:
        payload = sepp.Payload(str(seconds).encode(), "text/plain")
        ack = await client.enqueue(sepp.EnqueueRequest(queue, "slow", payload=payload))
    for _ in range(500):
        if (tmp_path / f"started-{ack.job_id}").exists():
            return ack.job_id
        await asyncio.sleep(0.01)
    raise AssertionError("the handler never started")


async def test_worker_drains_and_exits_0_on_sigterm(server: SeppTestServer, tmp_path: Path) -> None:
    async with worker_process(server, tmp_path) as (proc, queue):
        job_id = await enqueue_and_wait_for_start(server, tmp_path, queue, 0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    text = err.decode()
    assert proc.returncode == 0, text
    # The job in flight finished and was acked before the process left.
    assert (tmp_path / f"done-{job_id}").exists()
    assert server.counts(queue) == (0, 0, 0, 0)
    assert "SIGTERM received: shutting down gracefully" in text and "stopped" in text
    assert "Traceback" not in text and SECRET not in text


async def test_worker_second_signal_stops_hard_with_exit_1(
    server: SeppTestServer, tmp_path: Path
) -> None:
    async with worker_process(server, tmp_path) as (proc, queue):
        job_id = await enqueue_and_wait_for_start(server, tmp_path, queue, 60)
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.2)  # the first signal starts the drain...
        assert proc.returncode is None
        proc.send_signal(signal.SIGTERM)  # ...the second one ends it
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    text = err.decode()
    assert proc.returncode == 1, text
    assert text.rstrip().splitlines()[-1].startswith("error: stopped hard by a second signal")
    assert not (tmp_path / f"done-{job_id}").exists()
    # Handed back at once (never acked), long before its lease would have lapsed.
    assert server.counts(queue) == (1, 0, 0, 0)
    assert server.state.totals()["lease_expired"] == 0
    assert "Traceback" not in text and SECRET not in text
