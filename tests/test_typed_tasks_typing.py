"""What mypy --strict says about typed tasks: a task's input type comes from its
function, so enqueueing anything else is a type error, and enqueue's result type
follows the client (awaitable with the async one, the ack with the sync one).

One mypy run checks every snippet: those marked ``ok`` must have no error, and each
line marked ``# E`` in the others must have one (and no other line may)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the lint extra")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = """\
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
import sepp_lite as sepp
from sepp_lite.sync import SeppClient as SyncClient
from sepp_lite.tasks import Backoff, Tasks

tasks = sepp.Tasks(queue="emails")

@dataclass
class Welcome:
    to: str
    name: str = ""

@tasks.task(max_attempts=5, timeout=30, retry=Backoff(initial=1))
async def send_welcome(msg: Welcome, ctx: sepp.JobCtx) -> None: ...

@tasks.task
async def count(n: int) -> None: ...

@tasks.task(job_type="maybe")
async def maybe(value: Optional[str]) -> None: ...
"""

SNIPPETS = {
    "ok_async": """
async def produce(client: sepp.SeppClient) -> str:
    ack: sepp.EnqueueAck = await send_welcome.enqueue(client, Welcome(to="a"), delay=60)
    await count.enqueue(client, 3, priority=5, idempotency_key="k")
    await maybe.enqueue(client, None)
    results = await send_welcome.enqueue_many(client, [Welcome("a"), Welcome("b")])
    for result in results:
        if isinstance(result, sepp.EnqueueAck):
            return result.job_id
    return ack.job_id
""",
    "ok_sync": """
def produce(client: SyncClient) -> str:
    ack = send_welcome.enqueue(client, Welcome(to="a"))
    reveal_type(ack)  # N: EnqueueAck
    return ack.job_id
""",
    "ok_worker": """
async def run(client: sepp.SeppClient) -> None:
    worker: sepp.Worker = tasks.worker(client, max_in_flight=32)
    await worker.run()
    request: sepp.EnqueueRequest = send_welcome.request(Welcome("a"))
    await send_welcome(Welcome("a"), None)
""",
    "bad_input": """
async def produce(client: sepp.SeppClient) -> None:
    await send_welcome.enqueue(client, "oops")  # E
    await count.enqueue(client, "3")  # E
    await maybe.enqueue(client, 1)  # E
    await send_welcome.enqueue_many(client, [Welcome("a"), 1])  # E
""",
    "bad_sync_await": """
async def produce(client: SyncClient) -> None:
    await send_welcome.enqueue(client, Welcome("a"))  # E
""",
    "bad_option": """
async def produce(client: sepp.SeppClient) -> None:
    await send_welcome.enqueue(client, Welcome("a"), delay="soon")  # E
    await send_welcome.enqueue(client, Welcome("a"), queue="other")  # E
""",
    "ok_plain_def": """
@tasks.task
def blocking(msg: Welcome, ctx: sepp.JobCtx) -> None: ...

async def produce(client: sepp.SeppClient) -> None:
    await blocking.enqueue(client, Welcome("a"))
""",
    "bad_plain_def_input": """
@tasks.task
def blocking(msg: Welcome) -> None: ...

async def produce(client: sepp.SeppClient) -> None:
    await blocking.enqueue(client, 3)  # E
""",
    "bad_task_shape": """
@tasks.task  # E
async def three(a: int, ctx: sepp.JobCtx, c: int) -> None: ...
""",
    "bad_two_inputs": """
@tasks.task  # E
async def add(x: int, y: int) -> None: ...

@tasks.task(max_attempts=3)  # E
async def add_later(x: int, y: int) -> None: ...

@tasks.task  # E
def blocking_add(x: int, y: str) -> None: ...

@tasks.task  # E
async def keyword(x: int, *, y: int) -> None: ...
""",
    "bad_periodic_input": """
@tasks.periodic(every=60)  # E
async def tick(when: int) -> None: ...

@tasks.periodic(every=60)  # E
async def tick_two(ctx: sepp.JobCtx, extra: int) -> None: ...
""",
    "ok_task_shapes": """
@tasks.task
async def optional_ctx(msg: Welcome, ctx: Optional[sepp.JobCtx] = None) -> None: ...

@tasks.task
async def with_flag(msg: Welcome, ctx: sepp.JobCtx, *, dry_run: bool = False) -> None: ...

class Mailer:
    async def send(self, msg: Welcome, ctx: sepp.JobCtx) -> None: ...

send = tasks.task(Mailer().send)

@tasks.periodic(every=60)
async def sweep(ctx: sepp.JobCtx) -> None: ...

@tasks.periodic(every=60, job_type="beat")
def beat() -> None: ...

async def produce(client: sepp.SeppClient) -> None:
    await optional_ctx.enqueue(client, Welcome("a"))
    await with_flag.enqueue(client, Welcome("b"))
    await send.enqueue(client, Welcome("c"))
    sweep_type: sepp.Task[bytes] = sweep
""",
    "ok_workflow": """
from sepp_lite.tasks import Chain

@dataclass
class Page:
    text: str

@tasks.task
async def fetch(msg: Welcome, ctx: sepp.JobCtx) -> Page:
    raise NotImplementedError

@tasks.task
async def words(msg: Page) -> list[str]:
    raise NotImplementedError

@tasks.task
def shout(word: str) -> str:
    raise NotImplementedError

@tasks.task
async def keep(word: str) -> None: ...

pipeline: Chain[Welcome, None] = fetch.then(words).map(shout).then(keep)
branch: Chain[Page, None] = words.map(shout.then(keep))
typed: sepp.Task[Welcome, Page] = fetch

async def produce(client: sepp.SeppClient) -> str:
    ack = await pipeline.enqueue(client, Welcome("a"))
    await fetch.then(branch).enqueue(client, Welcome("b"), priority=3, root="r", delay=5)
    return ack.job_id

def produce_sync(client: SyncClient) -> str:
    return pipeline.enqueue(client, Welcome("a")).job_id
""",
    "bad_workflow": """
@dataclass
class Page:
    text: str

@dataclass
class Summary:
    words: int

@tasks.task
async def fetch(msg: Welcome) -> Page:
    raise NotImplementedError

@tasks.task
async def split(msg: Page) -> list[Welcome]:
    raise NotImplementedError

@tasks.task
async def summarise(msg: Page) -> Summary:
    raise NotImplementedError

@tasks.task
async def store(msg: Summary) -> None: ...

fetch.then(store)  # E
split.map(summarise)  # E
fetch.map(summarise)  # E
fetch.then(summarise).then(fetch)  # E
fetch.then(summarise.then(store)).then(store)  # E

async def produce(client: sepp.SeppClient) -> None:
    await fetch.then(summarise).enqueue(client, Page("x"))  # E
    await fetch.then(summarise).enqueue(client, Welcome("a"), queue="q")  # E
""",
}


def test_mypy_strict_on_typed_task_snippets(tmp_path: Path) -> None:
    for name, body in SNIPPETS.items():
        (tmp_path / f"{name}.py").write_text(PRELUDE + body)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            os.devnull,
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--python-version",
            "3.10",
            *sorted(str(tmp_path / f"{name}.py") for name in SNIPPETS),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=280,
    )
    errors: dict[str, set[int]] = {name: set() for name in SNIPPETS}
    notes: dict[str, list[str]] = {name: [] for name in SNIPPETS}
    for line in done.stdout.splitlines():
        match = re.match(r"(\w+)\.py:(\d+): (error|note): (.*)", line)
        if match:
            file, number, kind, text = match.groups()
            (errors[file].add(int(number)) if kind == "error" else notes[file].append(text))
    offset = PRELUDE.count("\n")
    for name, body in SNIPPETS.items():
        marked = {
            offset + index + 1 for index, text in enumerate(body.splitlines()) if "# E" in text
        }
        assert errors[name] == marked, f"{name}: errors on lines {errors[name]}\n{done.stdout}"
    assert any('"sepp_lite.types.EnqueueAck"' in note for note in notes["ok_sync"]), done.stdout
