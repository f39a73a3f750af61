"""``sepp-lite worker MODULE:TASKS`` and ``sepp-lite enqueue --tasks``, as real processes
against the in-process server: a Tasks registry as the worker's target (a subset of its
queues, its concurrency, the job types on the start line), and a task's input given on
the command line, checked against the task's type before anything is sent."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from sepp_lite import ReserveOptions
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import connected, unique_queue

pytestmark = pytest.mark.timeout(90)

MODULE = """
from dataclasses import dataclass
from pathlib import Path

import sepp_lite as sepp

tasks = sepp.Tasks(queue={first!r})


@dataclass
class Welcome:
    to: str
    name: str = ""


@tasks.task(max_attempts=4)
async def send_welcome(msg: Welcome, ctx: sepp.JobCtx) -> None:
    Path({marks!r}, "welcome-" + msg.to).write_text(str(ctx.attempt))


@tasks.task(queue={second!r})
async def send_report(title: str) -> None:
    Path({marks!r}, "report-" + title).write_text("done")


worker_instead = None
"""


async def sepp_lite(*args: str) -> tuple[int, str, str]:
    """``python -m sepp_lite args`` as a child process, run to its end."""
    env = {k: v for k, v in os.environ.items() if k not in ("SEPP_ADDR", "SEPP_API_KEY")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sepp_lite",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def app(tmp_path: Path) -> tuple[Path, str, str]:
    first, second = unique_queue(), unique_queue()
    (tmp_path / "marks").mkdir()
    source = MODULE.format(first=first, second=second, marks=str(tmp_path / "marks"))
    (tmp_path / "app.py").write_text(source)
    return tmp_path, first, second


async def test_worker_serves_a_subset_of_the_tasks_queues(
    server: SeppTestServer, app: tuple[Path, str, str]
) -> None:
    directory, first, second = app
    common = ["--addr", server.addr, "--app-dir", str(directory)]
    code, out, err = await sepp_lite(
        "enqueue", *common, "--tasks", "app:tasks", "send_welcome", '{"to": "ada"}'
    )
    assert code == 0, err
    code, _, err = await sepp_lite(
        "enqueue", *common, "--tasks", "app:tasks", "send_report", "weekly"
    )
    assert code == 0, err
    code, _, err = await sepp_lite(
        "worker", "app:tasks", *common, "--queues", first, "--concurrency", "3", "--until-idle"
    )
    assert code == 0, err
    assert f" started: queues={first} job types=send_welcome " in err
    assert "max_in_flight=3" in err
    assert sorted(os.listdir(directory / "marks")) == ["welcome-ada"]
    assert server.counts(second).ready == 1 and server.counts(first).ready == 0
    code, _, err = await sepp_lite("worker", "app:tasks", *common, "--until-idle")
    assert code == 0, err
    assert f" started: queues={first},{second} job types=send_welcome,send_report " in err
    assert sorted(os.listdir(directory / "marks")) == ["report-weekly", "welcome-ada"]


async def test_worker_options_for_tasks_are_checked(
    server: SeppTestServer, app: tuple[Path, str, str]
) -> None:
    directory, _, _ = app
    common = ["--addr", server.addr, "--app-dir", str(directory)]
    code, _, err = await sepp_lite("worker", "app:tasks", *common, "--queues", "nowhere")
    assert code == 2 and "--queues: no task of app:tasks uses nowhere" in err, err
    code, _, err = await sepp_lite("worker", "app:worker_instead", *common, "--concurrency", "2")
    assert code == 2 and "--queues and --concurrency go with a sepp_lite.Tasks target" in err


async def test_enqueue_checks_a_tasks_input_and_sends_its_canonical_payload(
    server: SeppTestServer, app: tuple[Path, str, str]
) -> None:
    directory, first, _ = app
    common = ["--addr", server.addr, "--app-dir", str(directory), "--tasks", "app:tasks"]
    code, out, err = await sepp_lite(
        "enqueue", *common, "send_welcome", '{"to": "ada", "name": "Ada"}', "--priority", "7"
    )
    assert code == 0, err
    job_id = out.strip()
    async with connected(server.addr) as client:
        jobs = await client.reserve(ReserveOptions([first], 30, 0))
    assert jobs is not None
    [job] = jobs
    assert job.ctx.id == job_id and job.ctx.job_type == "send_welcome"
    assert (job.ctx.priority.value, job.ctx.max_attempts) == (7, 4)
    assert job.payload is not None and job.payload.encoding == "application/json"
    assert json.loads(job.payload.data) == {"to": "ada", "name": "Ada"}

    code, _, err = await sepp_lite("enqueue", *common, "send_welcome", '{"name": 1}')
    assert code == 2
    assert err.strip() == "error: input does not fit: send_welcome: msg.to: missing"
    code, _, err = await sepp_lite("enqueue", *common, "send_welcom", "{}")
    assert code == 2
    assert "has no task 'send_welcom' (its job types: send_welcome, send_report)" in err
    code, _, err = await sepp_lite("enqueue", *common, "send_welcome", "{}", "--encoding", "x")
    assert code == 2 and "--encoding does not go with --tasks" in err
    assert server.counts(first).ready == 0 and server.counts(first).in_flight == 1
