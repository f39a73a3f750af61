"""``python -m sepp_lite.testing`` as a real subprocess: the ready line, calls, and a
clean exit on SIGTERM and SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from sepp_lite._proto.sepp import v1 as pb
from sepp_lite.testing import ConfigError
from sepp_lite.testing._cli import add_serve_arguments, config_from_args

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="POSIX signals are what the CLI is stopped with"
)

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"queue server listening addr=(?P<host>[\d.]+):(?P<port>\d+) ")


class Proc:
    def __init__(self, proc: asyncio.subprocess.Process, line: str) -> None:
        self.proc = proc
        self.line = line
        match = READY.search(line)
        assert match, line
        self.host, self.port = match["host"], int(match["port"])
        self.out = ""
        self.err = ""

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        out, err = await asyncio.wait_for(self.proc.communicate(), 10)
        self.out, self.err = out.decode(), err.decode()
        assert self.proc.returncode is not None
        return self.proc.returncode


@asynccontextmanager
async def cli(*args: str) -> AsyncIterator[Proc]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sepp_lite.testing",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line:
            _, err = await proc.communicate()
            pytest.fail(f"the server exited before listening: {err.decode()}")
        yield Proc(proc, line)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


async def test_serves_and_exits_cleanly_on_sigterm():
    async with cli("--port", "0") as server:
        assert server.host == "127.0.0.1" and server.port > 0
        assert (
            'db_path=:memory: tls="disabled" auth="disabled" strict_queues="disabled" '
            "declared_queues=0" in server.line
        )
        async with Channel(server.host, server.port) as channel:
            stub = pb.QueueServiceStub(channel)
            batch = pb.EnqueueBatchRequest(jobs=[pb.EnqueueRequest(queue="q", job_type="t")])
            [result] = (await stub.enqueue_batch(batch)).results
            reserve = pb.ReserveRequest(queues=["q"], lease_duration=timedelta(seconds=30))
            [job] = (await stub.reserve(reserve)).jobs
            assert job.id == result.success.job_id
        assert await server.stop(signal.SIGTERM) == 0
        assert "queue server stopped" in server.out


async def test_sigint_answers_a_pending_long_poll_empty_and_exits_zero():
    async with cli("--port", "0") as server:
        async with Channel(server.host, server.port) as channel:
            stub = pb.QueueServiceStub(channel)
            request = pb.ReserveRequest(
                queues=["q"],
                lease_duration=timedelta(seconds=30),
                wait_timeout=timedelta(seconds=60),
            )
            await stub.get_server_info(pb.GetServerInfoRequest())  # connected
            poll = asyncio.ensure_future(stub.reserve(request, timeout=20))
            await asyncio.sleep(0.3)  # the poll reaches the server and waits
            assert not poll.done()
            stopping = asyncio.ensure_future(server.stop(signal.SIGINT))
            reply = await asyncio.wait_for(poll, 5)
            assert reply.jobs == []
            assert await stopping == 0
        assert "Traceback" not in server.err


async def test_options_auth_strict_queues_and_retention():
    async with cli(
        "--port", "0", "--api-key", "s3cret-key", "--api-key", "other",
        "--strict-queues", "a,b", "--dead-letter-retention", "60", "--log-level", "info",
    ) as server:  # fmt: skip
        assert 'auth="enabled" strict_queues="enabled" declared_queues=2' in server.line
        async with Channel(server.host, server.port) as channel:
            stub = pb.QueueServiceStub(channel)
            with pytest.raises(GRPCError) as info:
                await stub.get_server_info(pb.GetServerInfoRequest())
            assert info.value.status == Status.UNAUTHENTICATED
            reply = await stub.get_server_info(
                pb.GetServerInfoRequest(), metadata={"authorization": "Bearer s3cret-key"}
            )
            assert (reply.strict_queues, reply.dead_letter_retention_enabled) == (True, True)
        assert await server.stop() == 0
    assert "s3cret-key" not in server.line + server.out + server.err


async def test_config_file(tmp_path: Path):
    config = tmp_path / "sepp.toml"
    config.write_text(
        """
[server]
listen_addr = "127.0.0.1:0"

[auth]
api_keys = [{ name = "worker", key = "k1" }]

[limits]
max_enqueue_batch = 2

[[queues]]
name = "small"
max_queue_depth = 1
"""
    )
    async with cli("--config", str(config)) as server:
        assert 'auth="enabled" strict_queues="disabled" declared_queues=1' in server.line
        auth = {"authorization": "Bearer k1"}
        async with Channel(server.host, server.port) as channel:
            stub = pb.QueueServiceStub(channel)
            jobs = [pb.EnqueueRequest(queue="small", job_type="t")] * 2
            reply = await stub.enqueue_batch(pb.EnqueueBatchRequest(jobs=jobs), metadata=auth)
            assert reply.results[1].rejection.queue_full.limit == 1
            with pytest.raises(GRPCError) as info:
                await stub.enqueue_batch(pb.EnqueueBatchRequest(jobs=jobs * 2), metadata=auth)
            assert info.value.message == "batch exceeds max_enqueue_batch (2)"
        assert await server.stop() == 0


async def test_bad_configuration_exits_with_an_error(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\ndefault_max_attempts = 9\nmax_attempts_ceiling = 3\n")
    cases = [
        (
            ["--config", str(bad)],
            "limits.default_max_attempts: must not exceed max_attempts_ceiling",
        ),
        (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
        (
            ["--config", str(tmp_path / "missing.toml")],
            f"config file not found: {tmp_path}/missing.toml",
        ),
    ]
    for args, message in cases:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sepp_lite.testing", "--port", "0", *args,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert (proc.returncode, out) == (2, b"")
        assert err.decode() == f"error: {message}\n"


def test_serve_arguments_are_reusable(tmp_path: Path):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    config = config_from_args(parser.parse_args([]))
    assert (config.host, config.port, config.api_key_set) == ("127.0.0.1", 50051, None)
    args = parser.parse_args(
        [
            "--host",
            "::1",
            "--port",
            "7",
            "--api-key",
            "k",
            "--strict-queues",
            "--dead-letter-retention",
            "1.5",
        ]
    )
    config = config_from_args(args)
    assert (config.host, config.port, config.api_key_set) == ("::1", 7, frozenset({"k"}))
    assert (config.strict_queues, config.queues, config.dead_letter_retention_ms) == (
        True,
        (),
        1500,
    )
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        config_from_args(parser.parse_args(["--tls-key", "k.pem"]))
    with pytest.raises(ConfigError, match="must not be negative"):
        config_from_args(parser.parse_args(["--dead-letter-retention", "-1"]))


async def test_sepp_lite_serve_config_warns_about_a_typo(tmp_path: Path):
    config = tmp_path / "sepp.toml"
    config.write_text("[storage]\ndead_letter_retenton_ms = 60000\n[server]\nstrict_queue = 1\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sepp_lite",
        "serve",
        "--port",
        "0",
        "--config",
        str(config),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert "queue server listening" in line
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    warnings = [line.split(": ", 1)[1] for line in err.decode().splitlines()]
    assert warnings == [
        "ignoring unknown config key server.strict_queue",
        "ignoring unknown config key storage.dead_letter_retenton_ms",
    ]
