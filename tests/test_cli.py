"""``sepp-lite`` run in-process (``main(argv)`` in a thread, the in-process server in
the test's loop): every subcommand but ``serve``, its output, its exit codes and its
bad-input paths. ``tests/test_cli_process.py`` runs it as a real process."""

from __future__ import annotations

import asyncio
import base64
import errno
import io
import json
import os
import socket
import stat
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from grpclib.exceptions import GRPCError

import sepp_lite as sepp
from sepp_lite import cli
from sepp_lite._wire.transport import describe_connect_failure
from sepp_lite.cli import common, enqueue
from sepp_lite.errors import Status
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import free_port, unique_queue

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret-Key-that-must-never-show"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class FakeTerminal(io.StringIO):
    """A text stream that says it is a terminal (what the progress bar checks)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI reads these as defaults: a developer's own settings must not leak in.
    monkeypatch.delenv("SEPP_ADDR", raising=False)
    monkeypatch.delenv("SEPP_API_KEY", raising=False)


async def run(*argv: str) -> int:
    """``sepp-lite argv`` in a thread: it runs its own event loop with asyncio.run."""
    return await asyncio.to_thread(cli.main, list(argv))


async def reserve_one(client: sepp.SeppClient, queue: str) -> sepp.Job:
    jobs = await client.reserve(sepp.ReserveOptions([queue], timedelta(seconds=30), 1.0))
    assert jobs, f"no job in {queue}"
    return jobs[0]


async def dead_letter(client: sepp.SeppClient, queue: str, n: int) -> None:
    """Put ``n`` jobs into ``queue``'s dead letters."""
    for i in range(n):
        await client.enqueue(
            sepp.EnqueueRequest(queue, "t", payload=sepp.Payload(f"body {i}".encode(), "text/x"))
        )
        job = await reserve_one(client, queue)
        assert await client.nack(job.ctx, sepp.RetryDirective.DEAD_LETTER, "broken")


def last_line(text: str) -> str:
    """The error line of a command that also logs (worker): the last, no traceback."""
    assert "Traceback" not in text
    return text.strip().splitlines()[-1]


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# -- the parser -----------------------------------------------------------------------


async def test_help_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run("--help") == 0
    out = capsys.readouterr().out
    commands = ("serve", "info", "enqueue", "worker", "drain-dead-letters", "demo")
    for command in (*commands, "requeue-dead-letters"):
        assert command in out
    assert await run("--version") == 0
    assert capsys.readouterr().out.strip() == f"sepp-lite {sepp.__version__}"
    assert await run() == 2
    assert "required: COMMAND" in one_line(capsys.readouterr().err)
    assert await run("enqueue", "q", "t", "--priority", "10") == 2
    assert "--priority: must be from 0 to 9" in one_line(capsys.readouterr().err)
    assert await run("enqueue", "q", "t", "--custom", "novalue") == 2
    assert "expected KEY=VALUE" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--addr", "127.0.0.1:1", "info"],
            "--addr goes after the command: sepp-lite info --addr 127.0.0.1:1",
        ),
        (
            ["--debug", "--tls", "--addr=h:1", "enqueue", "q", "t", "--payload", "a b"],
            "--tls, --addr go after the command: "
            "sepp-lite --debug enqueue --tls --addr=h:1 q t --payload 'a b'",
        ),
        (["--api-key", "k"], "--api-key goes after a command: sepp-lite COMMAND --api-key ..."),
    ],
)
async def test_options_before_the_command_say_where_they_go(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run(*argv) == 2
    err = one_line(capsys.readouterr().err)
    assert err == f"sepp-lite: error: {message} (see sepp-lite --help)"


def test_misplaced_options_leave_good_command_lines_alone() -> None:
    commands = cli.build_parser().command_names
    assert "worker" in commands and "drain-dead-letters" in commands
    for argv in (["info", "--addr", "x"], ["--debug", "info"], ["--version"], [], ["nope"]):
        assert cli.misplaced_options(argv, commands) is None


def test_a_tls_mismatch_says_the_one_thing_that_is_true() -> None:
    # The transport's verdict, in the command line's terms: one statement, one remedy.
    error = sepp.ConnectError("h:1", "connection lost")
    assert common.describe(error) == "cannot connect to the sepp server at h:1: connection lost"
    error = sepp.ConnectError("h:1", "the library's words", server_uses_tls=True)
    assert common.describe(error) == (
        "cannot connect to the sepp server at h:1: the server uses TLS: "
        "connect with --tls (or --ca FILE for a private CA)"
    )
    error = sepp.ConnectError("h:1", "the library's words", server_uses_tls=False)
    assert common.describe(error) == (
        "cannot connect to the sepp server at h:1: the server does not use TLS: "
        "connect without --tls, --ca and https://"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("false", False),
        ("42", 42),
        ("-7", -7),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("hello", "hello"),
        ('"42"', "42"),
        ('"true"', "true"),
        ("", ""),
        ("nan", "nan"),  # not a number literal: stays text
        ("True", "True"),  # only lowercase true/false are booleans
    ],
)
def test_custom_values_are_typed(text: str, value: object) -> None:
    parsed = enqueue.parse_custom_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_custom_ints_must_fit_64_bits() -> None:
    assert enqueue.parse_custom_value(str(2**63 - 1)) == 2**63 - 1
    with pytest.raises(ValueError, match="64 bits"):
        enqueue.parse_custom_value(str(2**63))


# -- info -----------------------------------------------------------------------------


async def test_info_table_and_json(
    server: SeppTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run("info", "--addr", server.addr) == 0
    table = capsys.readouterr().out
    assert "version" in table and "0.1.0" in table
    assert "max enqueue batch" in table and "256" in table
    assert "allowed encodings" in table and "any" in table
    assert "dead letter retention enabled  yes" in table
    assert await run("info", "--addr", server.addr, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_enqueue_batch"] == 256
    assert data["max_lease_duration"] == 300.0
    assert data["dead_letter_retention_enabled"] is True
    assert data["server_time"].endswith("Z")


async def test_addr_comes_from_the_environment(
    server: SeppTestServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEPP_ADDR", server.addr)
    assert await run("info", "--json") == 0
    assert json.loads(capsys.readouterr().out)["version"] == "0.1.0"


async def test_unreachable_server_is_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    addr = f"127.0.0.1:{free_port()}"
    assert await run("info", "--addr", addr) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err) == (
        f"error: cannot connect to the sepp server at {addr}: connection refused"
    )
    # --debug adds the traceback (and the library's own log lines).
    assert await run("info", "--addr", addr, "--debug") == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ConnectError" in err
    assert err.rstrip().endswith("connection refused")


@pytest.mark.parametrize(
    ("addr", "problem"),
    [
        ("localhost:notaport", "the port 'notaport' is not a number"),
        ("http://127.0.0.1:50051/foo", "it has a path ('/foo'), which a gRPC address cannot"),
        ("grpc://127.0.0.1:50051", "unknown scheme 'grpc://'"),
        ("127.0.0.1:", "the port is empty"),
        ("127.0.0.1:70000", "the port 70000 is out of range (1 to 65535)"),
        ("[::1:50051", "an IPv6 address has no closing ']'"),
    ],
)
async def test_a_bad_address_is_a_usage_error_naming_it_whole(
    addr: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "bad address 'http://127.0.0.1:50051/foo': ... bad port '50051/foo'".
    assert await run("info", "--addr", addr) == 2
    assert one_line(capsys.readouterr().err) == (
        f"error: --addr: cannot parse the address {addr!r}: {problem} "
        "(expected host:port, http://host:port, https://host[:port] or unix:/path)"
    )


async def test_wrong_or_missing_key_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    async with SeppTestServer(api_keys=[SECRET]) as server:
        assert await run("info", "--addr", server.addr, "--api-key", "wrong-key") == 1
        err = one_line(capsys.readouterr().err)
        assert err == "error: the server refused the credentials: invalid API key"
        assert await run("info", "--addr", server.addr) == 1
        assert "missing API key" in one_line(capsys.readouterr().err)
        assert await run("info", "--addr", server.addr, "--api-key", SECRET) == 0
        assert "max payload bytes" in capsys.readouterr().out


async def test_the_api_key_never_appears_in_any_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Success, refusal, rejection, connection failure, help and --debug tracebacks:
    the key (given as an option or through the environment) is never printed."""
    seen: list[str] = []
    bad_lines = tmp_path / "jobs.jsonl"
    bad_lines.write_text('{"job_type": "t"}\nnot json\n')
    async with SeppTestServer(api_keys=[SECRET, "other-key"]) as server:
        runs: list[tuple[str, ...]] = [
            ("info", "--addr", server.addr, "--api-key", SECRET, "--debug"),
            ("info", "--addr", server.addr, "--api-key", SECRET + "x", "--debug"),
            ("info", "--addr", f"127.0.0.1:{free_port()}", "--api-key", SECRET, "--debug"),
            ("enqueue", "q", "t", "--addr", server.addr, "--api-key", SECRET, "--delay", "1e9"),
            ("enqueue", "q", "--jsonl", str(bad_lines), "--addr", server.addr, "--debug"),
            ("drain-dead-letters", "--addr", server.addr, "--api-key", SECRET, "--debug", "--yes"),
            ("requeue-dead-letters", str(bad_lines), "--addr", server.addr, "--debug"),
            ("info", "--help"),
        ]
        monkeypatch.setenv("SEPP_API_KEY", SECRET)
        for argv in runs:
            await run(*argv)
            captured = capsys.readouterr()
            seen.append(captured.out + captured.err)
    assert all(SECRET not in text for text in seen), [t for t in seen if SECRET in t]
    assert "Traceback" in seen[1]  # the --debug runs did print their tracebacks


# -- enqueue: one job -----------------------------------------------------------------


async def test_enqueue_one_job_with_every_option(
    server: SeppTestServer, client: sepp.SeppClient, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = unique_queue()
    argv = ["enqueue", queue, "send_email", "--addr", server.addr, "--priority", "7"]
    argv += ["--payload", '{"to": "ada@example.com"}', "--encoding", "application/json"]
    argv += ["--key", "welcome-ada", "--max-attempts", "4"]
    argv += ["--custom", "tenant=acme", "--custom", "n=3", "--custom", "ratio=0.5"]
    argv += ["--custom", "vip=true", "--custom", 'zip="01234"']
    assert await run(*argv) == 0
    job_id = capsys.readouterr().out.strip()
    job = await reserve_one(client, queue)
    assert job.ctx.id == job_id
    assert job.payload == sepp.Payload(b'{"to": "ada@example.com"}', "application/json")
    assert job.ctx.priority == sepp.Priority(7) and job.ctx.max_attempts == 4
    assert job.ctx.custom == {"tenant": "acme", "n": 3, "ratio": 0.5, "vip": True, "zip": "01234"}
    assert type(job.ctx.custom["n"]) is int and type(job.ctx.custom["vip"]) is bool
    # The same key again: the existing job's id, marked as deduplicated.
    assert await run(*argv) == 0
    assert capsys.readouterr().out.strip() == f"{job_id} deduplicated"


async def test_enqueue_payload_file_and_delay(
    server: SeppTestServer, client: sepp.SeppClient, tmp_path: Path
) -> None:
    queue = unique_queue()
    body = tmp_path / "body.bin"
    body.write_bytes(bytes(range(256)))
    argv = ["enqueue", queue, "blob", "--addr", server.addr, "--payload-file", str(body)]
    assert await run(*argv, "--delay", "60") == 0
    assert server.counts(queue).scheduled == 1
    assert await run(*argv) == 0
    job = await reserve_one(client, queue)
    assert job.payload == sepp.Payload(bytes(range(256)), "application/octet-stream")
    assert job.ctx.scheduled_at is None


async def test_a_rejected_job_is_exit_1(
    server: SeppTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = unique_queue()
    assert await run("enqueue", queue, "t", "--addr", server.addr, "--delay", "1e8") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err).startswith("error: job rejected: scheduled_at")
    assert server.counts(queue).scheduled == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--payload-file", "/nonexistent/body"], "cannot read --payload-file"),
        (["--encoding", "text/plain"], "--encoding needs --payload"),
        (["--rejected", "r.jsonl"], "--rejected goes with --jsonl"),
        (["--jsonl", "x.jsonl", "--priority", "3"], "--priority: with --jsonl"),
        (["--payload", "a", "--payload-file", "b"], "not allowed with argument"),
    ],
)
async def test_enqueue_usage_errors(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on the address: each error is found before connecting.
    addr = f"127.0.0.1:{free_port()}"
    assert await run("enqueue", "q", "t", "--addr", addr, *extra) == 2
    assert message in one_line(capsys.readouterr().err)


async def test_enqueue_without_job_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run("enqueue", "q") == 2
    assert "JOB_TYPE is required" in one_line(capsys.readouterr().err)


# -- enqueue: JSON lines --------------------------------------------------------------


def write_lines(path: Path, *lines: Any) -> Path:
    """Lines as given (str) or as JSON (anything else)."""
    text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    path.write_text("\n".join(text) + "\n")
    return path


async def test_jsonl_line_format(
    server: SeppTestServer,
    client: sepp.SeppClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue, other = unique_queue(), unique_queue()
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    path = write_lines(
        tmp_path / "jobs.jsonl",
        {"payload": "plain text", "priority": 9, "idempotency_key": "k1"},
        {"job_type": "json", "payload": {"a": [1, 2]}, "custom": {"n": 1, "f": 2.5, "b": False}},
        {"payload_base64": base64.b64encode(b"\x00\xff").decode(), "encoding": "image/x"},
        {"max_attempts": 2, "trace_context": {"traceparent": TRACEPARENT, "tracestate": "a=b"}},
        {"queue": other, "payload": None, "encoding": None},
        {"delay": 3600},
        {"scheduled_at": later.isoformat().replace("+00:00", "Z")},
        {"job_type": "replayed", "job_id": "x", "cause": "rejected", "final_attempt": 3},
    )
    argv = ["enqueue", queue, "default_type", "--jsonl", str(path), "--addr", server.addr]
    assert await run(*argv) == 0
    assert capsys.readouterr().out.splitlines() == ["8 accepted, 0 rejected, 0 malformed"]
    assert server.counts(queue).ready == 5 and server.counts(queue).scheduled == 2
    jobs = await client.reserve(sepp.ReserveOptions([queue], 30, 1.0, max_jobs=10))
    assert jobs is not None
    by_type = {job.ctx.job_type: job for job in jobs}
    first = jobs[0]  # priority 9 is served first
    assert first.ctx.job_type == "default_type" and first.ctx.priority.value == 9
    assert first.payload == sepp.Payload(b"plain text", "text/plain")
    assert by_type["json"].payload == sepp.Payload(b'{"a":[1,2]}', "application/json")
    assert by_type["json"].ctx.custom == {"n": 1, "f": 2.5, "b": False}
    assert {job.payload for job in jobs} >= {sepp.Payload(b"\x00\xff", "image/x")}
    traced = [job for job in jobs if job.ctx.trace_context is not None]
    assert len(traced) == 1 and traced[0].ctx.max_attempts == 2
    assert traced[0].ctx.trace_context == sepp.TraceContext(TRACEPARENT, "a=b")
    assert "replayed" in by_type
    assert server.counts(other).ready == 1


async def test_jsonl_problems_are_reported_with_line_numbers(
    server: SeppTestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = unique_queue()
    path = write_lines(
        tmp_path / "jobs.jsonl",
        {"job_type": "ok"},
        '{"job_type": "broken"',
        "",
        {"job_type": "ok", "priorty": 3},
        "[1, 2]",
        {"job_type": "far", "delay": 1e9},
        {"job_type": "ok", "custom": {"big": 2**64}},
        {"job_type": "ok", "payload": "a", "payload_base64": "YQ=="},
        {"job_type": "ok"},
    )
    (tmp_path / "raw.bin").write_bytes(b'{"job_type": "\xff"}\n')
    rejected = tmp_path / "rejected.jsonl"
    argv = ["enqueue", queue, "--jsonl", str(path), "--rejected", str(rejected)]
    assert await run(*argv, "--addr", server.addr) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 accepted, 1 rejected, 5 malformed; 1 blank line(s) skipped"
    assert out[1].startswith("  line 2: malformed: invalid JSON: ")  # the text varies by VM
    assert out[2] == "  line 4: malformed: unknown key(s): priorty"
    assert out[3] == "  line 5: malformed: expected a JSON object, got list"
    assert out[4].startswith("  line 6: rejected: ScheduledTooFar: scheduled_at")
    assert out[5].startswith("  line 7: malformed: custom['big']")
    assert out[6] == "  line 8: malformed: give payload or payload_base64, not both"
    assert out[7] == "rejections by reason: ScheduledTooFar 1"
    assert out[8] == f"6 line(s) not enqueued written to {rejected}"
    # Every line not enqueued, verbatim and in order: fix them and replay the file.
    source = path.read_text().splitlines()
    assert rejected.read_text().splitlines() == [source[i - 1] for i in (2, 4, 5, 6, 7, 8)]
    assert server.counts(queue).ready == 2
    # A line that is not UTF-8 is malformed too.
    argv = ["enqueue", queue, "--jsonl", str(tmp_path / "raw.bin"), "--addr", server.addr]
    assert await run(*argv) == 1
    assert "line 1: malformed: not UTF-8 (byte 15)" in capsys.readouterr().out


async def test_jsonl_missing_file_is_exit_2(
    server: SeppTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run("enqueue", "q", "--jsonl", "/nonexistent.jsonl", "--addr", server.addr) == 2
    assert one_line(capsys.readouterr().err) == (
        "error: cannot read /nonexistent.jsonl: No such file or directory"
    )


async def test_jsonl_goes_in_batches_of_the_server_maximum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sizes: list[int] = []
    async with SeppTestServer(max_enqueue_batch=7) as server:
        original = server.state.enqueue_batch

        def record(jobs: Any) -> Any:
            sizes.append(len(jobs))
            return original(jobs)

        monkeypatch.setattr(server.state, "enqueue_batch", record)
        # A malformed line in the middle does not take a job's place in a batch.
        lines: list[Any] = [{"job_type": "t", "payload": str(i)} for i in range(30)]
        lines.insert(10, "oops")
        path = write_lines(tmp_path / "jobs.jsonl", *lines)
        argv = ["enqueue", "q", "--jsonl", str(path), "--addr", server.addr]
        assert await run(*argv) == 1
        assert capsys.readouterr().out.startswith("30 accepted, 0 rejected, 1 malformed")
        assert sizes == [7, 7, 7, 7, 2]
        assert server.counts("q").ready == 30


async def test_jsonl_from_stdin(
    server: SeppTestServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = b'{"payload": "1"}\n{"payload": "2"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert await run("enqueue", "q", "t", "--jsonl", "-", "--addr", server.addr) == 0
    assert capsys.readouterr().out.strip() == "2 accepted, 0 rejected, 0 malformed"
    assert server.counts("q").ready == 2


async def test_jsonl_a_failed_call_leaves_nothing_silently_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with SeppTestServer(max_enqueue_batch=4) as server:
        original = server.state.enqueue_batch
        calls = []

        def fail_second(jobs: Any) -> Any:
            calls.append(len(jobs))
            if len(calls) == 2:
                raise GRPCError(Status.UNAVAILABLE, "going away")
            return original(jobs)

        monkeypatch.setattr(server.state, "enqueue_batch", fail_second)
        path = write_lines(tmp_path / "jobs.jsonl", *({"payload": str(i)} for i in range(10)))
        rejected = tmp_path / "rejected.jsonl"
        argv = ["enqueue", "q", "t", "--jsonl", str(path), "--rejected", str(rejected)]
        assert await run(*argv, "--addr", server.addr) == 2
        captured = capsys.readouterr()
        out = captured.out.splitlines()
        assert out[0] == "4 accepted, 0 rejected, 0 malformed, 6 not sent"
        assert out[1] == "not sent from line 5 on: TransportError: going away"
        assert one_line(captured.err) == "error: TransportError: going away"
        assert rejected.read_text().splitlines() == path.read_text().splitlines()[4:]
        assert calls == [4, 4] and server.counts("q").ready == 4


async def test_progress_bar_only_on_a_terminal(
    server: SeppTestServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", *({"payload": str(i)} for i in range(50)))
    argv = ["enqueue", "q", "t", "--jsonl", str(path), "--addr", server.addr]
    assert await run(*argv) == 0
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert await run(*argv) == 0
    drawn = terminal.getvalue()
    assert drawn.startswith("\r[") and drawn.endswith("\n")
    assert "50/50 100%" in drawn and "lines/s" in drawn and "ETA 0:00" in drawn
    assert capsys.readouterr().out.strip() == "50 accepted, 0 rejected, 0 malformed"


def test_progress_bar_text() -> None:
    bar = common.ProgressBar(io.StringIO(), 1000)
    expected = "[######------------------] 250/1,000  25%  125 lines/s  ETA 0:06"
    assert bar.render(250, 2.0) == expected
    assert bar.render(0, 0.0).endswith("0 lines/s  ETA --:--")
    assert common.ProgressBar(io.StringIO(), None).render(500, 2.0) == "500 lines  250 lines/s"
    assert not bar.enabled  # a StringIO is no terminal
    assert common.clock(3725) == "1:02:05" and common.clock(59.6) == "1:00"


# -- drain-dead-letters ---------------------------------------------------------------


async def test_drain_refuses_without_yes_on_a_terminal(
    server: SeppTestServer,
    client: sepp.SeppClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = unique_queue()
    await dead_letter(client, queue, 2)
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    assert await run("drain-dead-letters", "--addr", server.addr) == 2
    assert "pass --yes" in one_line(capsys.readouterr().err)
    assert server.counts(queue).dead == 2 and terminal.getvalue() == ""
    assert await run("drain-dead-letters", "--addr", server.addr, "--yes") == 0
    assert len(terminal.getvalue().splitlines()) == 2
    assert server.counts(queue).dead == 0


async def test_drain_writes_json_lines_that_replay(
    server: SeppTestServer,
    client: sepp.SeppClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue, other = unique_queue(), unique_queue()
    await dead_letter(client, queue, 3)
    await dead_letter(client, other, 1)
    # --max and --queue narrow what is drained (to stdout, which needs --yes).
    argv = ["drain-dead-letters", "--addr", server.addr, "--queue", queue, "--max", "2", "--yes"]
    assert await run(*argv) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert captured.err.strip() == "drained 2 dead-letter record(s)"
    assert [r["queue"] for r in records] == [queue, queue]
    first = records[0]
    assert base64.b64decode(first["payload_base64"]) == b"body 0"
    assert first["encoding"] == "text/x" and first["cause"] == "rejected"
    assert first["last_reason"] == "broken" and first["final_attempt"] == 1
    assert first["failed_at"].endswith("Z") and first["job_type"] == "t"
    out = tmp_path / "dead.jsonl"
    out.write_text("kept from an earlier drain\n")
    # Into a file, without a terminal: --out is enough.
    argv = ["drain-dead-letters", "--addr", server.addr, "--out", str(out)]
    assert await run(*argv) == 0
    assert capsys.readouterr().err.strip() == f"drained 2 dead-letter record(s) into {out}"
    lines = out.read_text().splitlines()
    assert lines[0] == "kept from an earlier drain" and len(lines) == 3  # appended
    out.write_text("\n".join(lines[1:]) + "\n")
    # The drained lines carry their own queues: replayed as new jobs.
    assert await run("enqueue", "ignored", "--jsonl", str(out), "--addr", server.addr) == 0
    assert server.counts(queue).ready == 1 and server.counts(other).ready == 1
    job = await reserve_one(client, other)
    assert job.payload == sepp.Payload(b"body 0", "text/x") and job.ctx.attempt == 1


async def test_drain_says_when_retention_is_off(capsys: pytest.CaptureFixture[str]) -> None:
    async with SeppTestServer() as server:
        assert await run("drain-dead-letters", "--addr", server.addr, "--yes") == 0
        assert "retention is off" in capsys.readouterr().err


# -- worker ---------------------------------------------------------------------------

WORKER_MODULE = """
import asyncio
import sepp_lite as sepp

handled = []


def _worker(client):
    worker = sepp.Worker(client, [{queue!r}], lease_duration=10)

    @worker.handler("t")
    async def handle(payload, ctx):
        handled.append(payload.data.decode())

    return worker


def make_worker(client):
    return _worker(client)


async def make_worker_async(client):
    await asyncio.sleep(0)
    return _worker(client)


async def own_client():
    # A factory without parameters connects by itself (and owns its client).
    return _worker(await sepp.SeppClient.connect({addr!r}))


def not_a_worker(client):
    return 42


def broken():
    raise RuntimeError("cannot build the worker")


def negative_backoff(client):
    return sepp.Worker(client, [{queue!r}], lease_duration=10, reserve_error_backoff=-5)


NOT_CALLABLE = 3
"""


@pytest.fixture
def worker_module(
    server: SeppTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    """``(module name, queue)``: a module in a temp dir, importable with --app-dir."""
    queue = unique_queue()
    name = f"cli_worker_{queue.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(WORKER_MODULE.format(queue=queue, addr=server.addr))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds --app-dir to it
    yield name, queue
    sys.modules.pop(name, None)


@pytest.mark.parametrize("factory", ["make_worker", "make_worker_async", "own_client"])
async def test_worker_runs_a_factory_from_a_module(
    factory: str,
    server: SeppTestServer,
    client: sepp.SeppClient,
    worker_module: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, queue = worker_module
    for body in (b"a", b"b"):
        await client.enqueue(sepp.EnqueueRequest(queue, "t", payload=sepp.Payload(body, "x")))
    argv = ["worker", f"{name}:{factory}", "--app-dir", str(tmp_path), "--until-idle"]
    assert await run(*argv, "--addr", server.addr) == 0
    assert sorted(sys.modules[name].handled) == ["a", "b"]
    assert server.counts(queue).ready == 0 and server.counts(queue).in_flight == 0
    err = capsys.readouterr().err
    assert "started: queues=" in err and "stopped" in err


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{name}:not_a_worker", "returned 'int', not a sepp_lite.Worker"),
        ("{name}:broken", "raised RuntimeError: cannot build the worker"),
        (
            "{name}:negative_backoff",  # a duration in seconds, not "-1 day, 23:59:55"
            "raised ValueError: reserve_error_backoff must not be negative, got -5 s",
        ),
        ("{name}:NOT_CALLABLE", "is 'int', not a Worker or a factory"),
        ("{name}:missing", "has no attribute 'missing'"),
        ("no_such_module_here:make", "cannot import 'no_such_module_here'"),
        ("{name}", "expected MODULE:OBJECT"),
    ],
)
async def test_worker_bad_targets_are_exit_2(
    target: str,
    message: str,
    server: SeppTestServer,
    worker_module: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = target.format(name=worker_module[0])
    argv = ["worker", spec, "--app-dir", str(tmp_path), "--addr", server.addr]
    assert await run(*argv) == 2
    assert message in last_line(capsys.readouterr().err)


async def test_worker_unknown_type_delay_sets_the_wait_of_jobs_it_has_no_handler_for(
    server: SeppTestServer,
    client: sepp.SeppClient,
    worker_module: tuple[str, str],
    tmp_path: Path,
) -> None:
    name, queue = worker_module
    stray = await client.enqueue(sepp.EnqueueRequest(queue, "stray"))
    argv = ["worker", f"{name}:make_worker", "--app-dir", str(tmp_path), "--until-idle"]
    assert await run(*argv, "--addr", server.addr, "--unknown-type-delay", "7.5") == 0
    job = server.state.job(stray.job_id)
    assert job is not None and job.state == "scheduled" and job.attempt == 2
    assert job.due_ms is not None and 5_000 < job.due_ms - server.clock.now_ms() <= 7_500


async def test_worker_that_cannot_connect_is_exit_2(
    worker_module: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{worker_module[0]}:make_worker"
    addr = f"127.0.0.1:{free_port()}"
    argv = ["worker", spec, "--app-dir", str(tmp_path), "--addr", addr]
    assert await run(*argv, "--wait-for-server", "0") == 2  # 0: no waiting for it
    error = last_line(capsys.readouterr().err)
    assert error.startswith("error: cannot connect to the sepp server")


# -- one answer per mistake: names and sizes are usage errors in every command -----------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["enqueue", "a/b", "t"],
            "sepp-lite enqueue: error: argument QUEUE: queue name 'a/b' must not contain '/'",
        ),
        (
            ["enqueue", "", "t"],
            "sepp-lite enqueue: error: argument QUEUE: queue name '' must not be empty",
        ),
        (
            ["enqueue", "..", "t", "--jsonl", "-"],
            """sepp-lite enqueue: error: argument QUEUE: queue name '..' must not be "." or ".."\
""",
        ),
        (
            ["enqueue", "q", ""],
            "sepp-lite enqueue: error: argument JOB_TYPE: the job type must not be empty",
        ),
        (
            ["drain-dead-letters", "--queue", "a/b", "--yes"],
            "sepp-lite drain-dead-letters: error: argument --queue: queue name 'a/b' must "
            "not contain '/'",
        ),
        (
            ["drain-dead-letters", "--queue", "x\ty", "--yes"],
            "sepp-lite drain-dead-letters: error: argument --queue: queue name 'x\\ty' must "
            "not contain control characters",
        ),
    ],
)
async def test_a_bad_name_is_a_usage_error_in_every_command(
    argv: list[str], message: str, server: SeppTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: drain --queue a/b was an internal error (exit 1) and enqueue a/b t went to
    # the server (a rejection, exit 1), while enqueue "" t was a usage error.
    calls = 0

    async def count() -> None:
        nonlocal calls
        calls += 1

    for method in ("EnqueueBatch", "DrainDeadLetters", "GetServerInfo"):
        server.before_call(method, count)
    assert await run(*argv, "--addr", server.addr) == 2
    assert one_line(capsys.readouterr().err) == f"{message} (see sepp-lite {argv[0]} --help)"
    assert calls == 0


@pytest.mark.parametrize("size", [2 * 1024 * 1024, 20 * 1024 * 1024], ids=["2MB", "20MB"])
async def test_a_payload_over_the_limit_is_one_usage_error_whatever_its_size(
    size: int, server: SeppTestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: 2 MB was a rejection (PayloadTooLarge), 20 MB an OUT_OF_RANGE status.
    body = tmp_path / "body.bin"
    body.write_bytes(b"x" * size)
    queue = unique_queue()
    argv = ["enqueue", queue, "t", "--payload-file", str(body), "--addr", server.addr]
    assert await run(*argv) == 2
    assert one_line(capsys.readouterr().err) == (
        f"error: the payload is {size:,} bytes, over the server's max_payload_bytes (1,048,576)"
    )
    assert server.counts(queue).ready == 0


async def test_names_over_the_servers_limits_are_usage_errors(
    server: SeppTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = "q" * 600
    assert await run("enqueue", queue, "t", "--addr", server.addr) == 2
    assert one_line(capsys.readouterr().err) == (
        "error: the queue name is 600 bytes, over the server's max_queue_name_bytes (512)"
    )
    argv = ["enqueue", "q", "t" * 300, "--addr", server.addr]
    assert await run(*argv) == 2
    assert "the job type is 300 bytes, over the server's max_job_type_bytes (256)" in (
        one_line(capsys.readouterr().err)
    )
    assert await run("enqueue", "q", "t", "--key", "k" * 257, "--addr", server.addr) == 2
    assert "max_idempotency_key_bytes (256)" in one_line(capsys.readouterr().err)


async def test_jsonl_lines_get_the_same_answers(
    server: SeppTestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = unique_queue()
    path = write_lines(
        tmp_path / "jobs.jsonl",
        {"queue": "a/b"},
        {"payload_base64": base64.b64encode(b"x" * 2_000_000).decode()},
        {"queue": "q" * 600},
        {},
    )
    assert await run("enqueue", queue, "t", "--jsonl", str(path), "--addr", server.addr) == 1
    assert capsys.readouterr().out.splitlines() == [
        "1 accepted, 0 rejected, 3 malformed",
        "  line 1: malformed: queue name 'a/b' must not contain '/'",
        "  line 2: malformed: the payload is 2,000,000 bytes, over the server's "
        "max_payload_bytes (1,048,576)",
        "  line 3: malformed: the queue name is 600 bytes, over the server's "
        "max_queue_name_bytes (512)",
    ]
    assert server.counts(queue).ready == 1


# -- the drain's confirmation, requeue ---------------------------------------------------


async def test_drain_without_a_terminal_needs_out_or_yes(
    server: SeppTestServer, client: sepp.SeppClient, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: in a pipe, a cron job or CI the drain ran unguarded.
    queue = unique_queue()
    await dead_letter(client, queue, 2)
    assert await run("drain-dead-letters", "--addr", server.addr, "--queue", queue) == 2
    assert one_line(capsys.readouterr().err) == (
        "error: draining removes the dead letters from the server for good; without a "
        "terminal, pass --out FILE to append them to a file, or --yes to write them to stdout"
    )
    assert server.counts(queue).dead == 2


async def test_drain_calls_grow_from_one_record_to_the_batch(
    server: SeppTestServer, client: sepp.SeppClient, tmp_path: Path
) -> None:
    asked: list[int] = []
    real = sepp.SeppClient.drain_dead_letters

    async def recording(self: sepp.SeppClient, queue: Any = None, max_records: int = 1) -> Any:
        asked.append(max_records)
        return await real(self, queue, max_records)

    queue = unique_queue()
    await dead_letter(client, queue, 12)
    out = tmp_path / "dead.jsonl"
    argv = ["drain-dead-letters", "--addr", server.addr, "--queue", queue, "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sepp.SeppClient, "drain_dead_letters", recording)
        assert await run(*argv, "--batch", "4") == 0
    # 1 + 2 + 4 + 4 + 1 = 12, then an empty answer ends it.
    assert asked == [1, 2, 4, 4, 4, 4]
    assert len(out.read_text().splitlines()) == 12


async def test_requeue_replays_records_as_new_jobs(
    server: SeppTestServer,
    client: sepp.SeppClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = unique_queue()
    await client.enqueue(
        sepp.EnqueueRequest(
            queue,
            "t",
            payload=sepp.Payload(b"\x00body", "application/x"),
            priority=7,
            max_attempts=5,
            custom={"tenant": "acme", "n": 3},
            trace_context=sepp.TraceContext(TRACEPARENT),
        )
    )
    job = await reserve_one(client, queue)
    assert await client.nack(job.ctx, sepp.RetryDirective.DEAD_LETTER, "broken")
    archive = tmp_path / "dead.jsonl"
    assert await run("drain-dead-letters", "--addr", server.addr, "--out", str(archive)) == 0
    [record] = [json.loads(line) for line in archive.read_text().splitlines()]
    # A line without job_id and key (written by hand), and one with its own key.
    write_lines(
        tmp_path / "more.jsonl",
        {"queue": queue, "job_type": "u"},
        {"queue": queue, "job_type": "v", "idempotency_key": "mine", "job_id": "x"},
        {"queue": queue},
    )
    more = tmp_path / "more.jsonl"
    with archive.open("a") as fh:
        fh.write(more.read_text())
    capsys.readouterr()
    assert await run("requeue-dead-letters", str(archive), "--addr", server.addr) == 1
    assert capsys.readouterr().out.splitlines() == [
        "3 accepted, 0 rejected, 1 malformed",
        "  line 4: malformed: no job_type (a dead-letter record names its queue and job type)",
        "1 job(s) had no job_id and no idempotency_key: running this file again would "
        "enqueue them again",
    ]
    replayed = await reserve_one(client, queue)
    assert replayed.ctx.id != record["job_id"]
    assert replayed.payload == sepp.Payload(b"\x00body", "application/x")
    assert replayed.ctx.priority == sepp.Priority(7) and replayed.ctx.max_attempts == 5
    assert replayed.ctx.attempt == 1  # a new job: its attempts count from 1 again
    assert replayed.ctx.custom == {"tenant": "acme", "n": 3}
    assert replayed.ctx.trace_context == sepp.TraceContext(TRACEPARENT)
    # Again: the record and the keyed line are deduplicated, the keyless line is not.
    assert await run("requeue-dead-letters", str(archive), "--addr", server.addr) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "3 accepted (2 deduplicated), 0 rejected, 1 malformed"
    )
    assert server.counts(queue).ready == 3  # u twice, v once (the record's job is reserved)


# -- output helpers, errors in words -------------------------------------------------------


def test_reader_gone_tells_a_pipe_without_reader() -> None:
    read_end, write_end = os.pipe()
    try:
        assert not common.reader_gone(write_end)
        os.close(read_end)
        read_end = -1
        assert common.reader_gone(write_end)
    finally:
        os.close(write_end)
        if read_end != -1:
            os.close(read_end)


def test_a_regular_file_never_has_a_gone_reader(tmp_path: Path) -> None:
    with open(tmp_path / "f", "wb") as fh:
        assert not common.reader_gone(fh.fileno()) and stat.S_ISREG(common.file_mode(fh.fileno()))


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
        (
            OSError(errno.ENETUNREACH, "Network is unreachable"),
            "the network is unreachable (this machine has no route to it)",
        ),
        (
            OSError(errno.EHOSTUNREACH, "No route to host"),
            "the host is unreachable (it is down, or no route leads to it)",
        ),
        (
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            "cannot resolve the host name: no such host (the name is not known to DNS)",
        ),
        (
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
            "cannot resolve the host name: the name could not be resolved now (is DNS reachable?)",
        ),
        (
            OSError(
                "Multiple exceptions: [Errno 111] Connect call failed ('::1', 1, 0, 0), "
                "[Errno 111] Connect call failed ('127.0.0.1', 1)"
            ),
            "connection refused",
        ),
    ],
)
def test_network_errors_in_words(error: OSError, words: str) -> None:
    assert describe_connect_failure(error) == (words, None)


async def test_an_unreachable_network_is_said_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    # Linux refuses a TCP connect to a multicast address with ENETUNREACH at once.
    assert await run("info", "--addr", "224.0.0.1:50051", "--timeout", "5") == 2
    err = one_line(capsys.readouterr().err)
    assert err == (
        "error: cannot connect to the sepp server at 224.0.0.1:50051: the network is "
        "unreachable (this machine has no route to it)"
    )
