"""Workflows (``task.then``, ``task.map``) on the in-process server over real sockets:
values handed from step to step, what the jobs carry, the hand-off's idempotency key
(a second hand-off of the same step deduplicates), a worker without the next step's
task, a value that does not fit, and how a long map is cut into calls."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import sepp_lite as sepp
from sepp_lite import JobCtx
from sepp_lite.cli import main
from sepp_lite.sync import SeppClient as SyncSeppClient
from sepp_lite.tasks import Backoff, Chain, Tasks
from sepp_lite.tasks._workflow import (
    ROOT_KEY,
    WORKFLOW_KEY,
    HandOff,
    Step,
    Where,
    hand_off_key,
    split,
    where_of,
)
from sepp_lite.testing import SeppServerThread, SeppTestServer, run_until_drained
from tests.cli_helpers import sepp_lite
from tests.client_helpers import unique_queue

pytestmark = pytest.mark.timeout(60)


@dataclass
class Url:
    href: str


@dataclass
class Page:
    href: str
    text: str


@dataclass
class Summary:
    href: str
    words: int


def pipeline(queue: str, seen: list[tuple[str, Any, JobCtx]]) -> tuple[Tasks, Chain[Url, None]]:
    tasks = Tasks(queue=queue)

    @tasks.task
    async def fetch(msg: Url, ctx: JobCtx) -> Page:
        seen.append(("fetch", msg, ctx))
        return Page(msg.href, "a b c")

    @tasks.task
    async def summarise(msg: Page, ctx: JobCtx) -> Summary:
        seen.append(("summarise", msg, ctx))
        return Summary(msg.href, len(msg.text.split()))

    @tasks.task
    async def store(msg: Summary, ctx: JobCtx) -> None:
        seen.append(("store", msg, ctx))

    return tasks, fetch.then(summarise).then(store)


async def test_a_chain_hands_each_value_on_and_each_job_carries_the_workflow(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    seen: list[tuple[str, Any, JobCtx]] = []
    tasks, chain = pipeline(queue, seen)
    ack = await chain.enqueue(client, Url("https://example.org"))
    await run_until_drained(tasks.worker(client), server)
    assert [(name, value) for name, value, _ in seen] == [
        ("fetch", Url("https://example.org")),
        ("summarise", Page("https://example.org", "a b c")),
        ("store", Summary("https://example.org", 3)),
    ]
    ctxs = [ctx for _, _, ctx in seen]
    assert ctxs[0].id == ack.job_id
    roots = {ctx.custom[ROOT_KEY] for ctx in ctxs}
    assert len(roots) == 1
    [root] = roots
    assert json.loads(str(ctxs[0].custom[WORKFLOW_KEY])) == {
        "v": 1,
        "at": 0,
        "branch": [],
        "steps": [{"type": "summarise", "queue": queue}, {"type": "store", "queue": queue}],
    }
    # Chain.steps is that format too: plain JSON, no private type in the public API.
    assert chain.steps == json.loads(str(ctxs[0].custom[WORKFLOW_KEY]))["steps"]
    assert json.loads(str(ctxs[2].custom[WORKFLOW_KEY])) == {
        "v": 1,
        "at": 2,
        "branch": [],
        "steps": [],
    }
    for at in (1, 2):
        record = server.state.dedup_record(queue, f"wf:{root}:{at}")
        assert record is not None and record[0] == ctxs[at].id


async def test_a_second_hand_off_of_one_step_deduplicates_into_the_first(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks, chain = pipeline(queue, [])
    await chain.enqueue(client, Url("u"))
    jobs = await client.reserve(sepp.ReserveOptions([queue], timedelta(seconds=30), timedelta(0)))
    assert jobs is not None
    [job] = jobs
    hand_off = HandOff(client, lambda job_type, value: tasks[job_type].codec)
    await hand_off(Page("u", "x"), job.ctx)
    await hand_off(Page("u", "x"), job.ctx)  # the step delivered again
    assert server.state.counts(queue).ready == 1  # one job of summarise waits, not two
    assert server.state.totals()["enqueued"] == 2


async def test_map_hands_each_element_to_its_own_job_with_its_index_in_the_key(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    tasks = Tasks(queue=queue)
    handled: list[tuple[int, str]] = []

    @tasks.task
    async def split_words(text: str) -> list[str]:
        return text.split()

    @tasks.task
    async def shout(word: str) -> str:
        return word.upper()

    @tasks.task
    async def keep(word: str, ctx: JobCtx) -> None:
        where = where_of(ctx.custom)
        assert where is not None
        handled.append((where.branch[0], word))

    fan = split_words.map(shout.then(keep))
    await fan.enqueue(client, "a b c", root="r1")
    await run_until_drained(tasks.worker(client), server)
    assert sorted(handled) == [(0, "A"), (1, "B"), (2, "C")]
    for index in range(3):
        assert server.state.dedup_record(queue, f"wf:r1:1:{index}") is not None
        assert server.state.dedup_record(queue, f"wf:r1:2:{index}") is not None


async def test_a_map_longer_than_the_servers_batch_goes_out_in_several_atomic_calls() -> None:
    async with SeppTestServer(max_enqueue_batch=4) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            queue = unique_queue()
            tasks = Tasks(queue=queue)
            seen: list[int] = []

            @tasks.task
            async def count(n: int) -> list[int]:
                return list(range(n))

            @tasks.task
            async def keep(n: int) -> None:
                seen.append(n)

            calls_before = server.state.totals()
            await count.map(keep).enqueue(client, 10, root="r")
            await run_until_drained(tasks.worker(client), server)
            assert sorted(seen) == list(range(10))
            totals = server.state.totals()
            assert totals["enqueued"] - calls_before["enqueued"] == 11


async def test_a_worker_without_the_next_steps_task_still_enqueues_it(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    first, second = unique_queue(), unique_queue()
    producer = Tasks()
    seen: list[Page] = []

    @producer.task(queue=first)
    async def fetch(msg: Url) -> Page:
        return Page(msg.href, "t")

    @producer.task(queue=second)
    async def store(msg: Page) -> None:
        seen.append(msg)

    await fetch.then(store).enqueue(client, Url("u"))
    only_fetch = Tasks()
    only_fetch.task(queue=first)(fetch.fn)  # the same function, without store
    await run_until_drained(only_fetch.worker(client), server)
    assert server.state.counts(second).ready == 1
    await run_until_drained(producer.worker(client, queues=[second]), server)
    assert seen == [Page("u", "t")]


async def test_a_value_that_does_not_fit_the_next_step_dead_letters_the_step() -> None:
    async with SeppTestServer(dead_letter_retention_ms=600_000) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            queue = unique_queue()
            tasks = Tasks(queue=queue, max_attempts=3)

            @tasks.task
            async def fetch(msg: Url) -> Page:
                return "not a page"  # type: ignore[return-value]

            @tasks.task
            async def store(msg: Page) -> None: ...

            await fetch.then(store).enqueue(client, Url("u"))
            await run_until_drained(tasks.worker(client), server)
            [record] = await client.drain_dead_letters(queue, 10)
            assert record.job_type == "fetch" and record.final_attempt == 1
            assert "workflow: the value for store does not fit" in (record.last_reason or "")
            assert WORKFLOW_KEY in record.custom and ROOT_KEY in record.custom


async def test_middleware_sees_and_passes_on_the_value(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    seen: list[tuple[str, Any, JobCtx]] = []
    tasks, chain = pipeline(queue, seen)
    values: list[Any] = []

    @tasks.middleware
    async def record(call_next: Any, value: Any, ctx: JobCtx) -> Any:
        result = await call_next(value, ctx)
        values.append(result)
        return result

    await chain.enqueue(client, Url("u"))
    await run_until_drained(tasks.worker(client), server)
    assert values == [Page("u", "a b c"), Summary("u", 3), None]


def request(index: int, size: int) -> sepp.EnqueueRequest:
    return sepp.EnqueueRequest(
        "q", "t", sepp.Payload(b"x" * size, "text/plain"), idempotency_key=f"wf:r:1:{index}"
    )


def test_a_long_map_is_cut_by_job_count_and_by_bytes_the_same_way_every_time() -> None:
    requests = [request(i, 100) for i in range(600)]
    parts = split(requests, 256, 8 * 1024 * 1024)
    assert [len(part) for part in parts] == [256, 256, 88]
    assert [r for part in parts for r in part] == requests
    big = [request(i, 3 * 1024 * 1024) for i in range(5)]
    assert [len(part) for part in split(big, 256, 8 * 1024 * 1024)] == [2, 2, 1]
    assert split(big, 256, 1024) == [[r] for r in big]  # a job over the limit goes alone


def test_the_entries_read_back_and_malformed_ones_are_refused() -> None:
    where = Where("r", 2, (3, 1), (Step("a", "q", fan=True, priority=5),))
    assert where_of(where.entries()) == where
    assert hand_off_key(where) == "wf:r:2:3.1"
    assert where_of({}) is None
    for custom in (
        {WORKFLOW_KEY: "{", ROOT_KEY: "r"},
        {WORKFLOW_KEY: '{"v": 2, "at": 0, "branch": [], "steps": []}', ROOT_KEY: "r"},
        {WORKFLOW_KEY: '{"v": 1, "at": 0, "branch": [], "steps": [{}]}', ROOT_KEY: "r"},
        {WORKFLOW_KEY: '{"v": 1, "at": 0, "branch": [], "steps": []}'},
    ):
        with pytest.raises(ValueError):
            where_of(custom)


# -- a dead-lettered step, and the dedup window --------------------------------------


async def test_a_requeued_dead_letter_continues_its_workflow_and_hands_off_once(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "dead.jsonl"
    async with SeppTestServer(dead_letter_retention_ms=600_000) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            queue = unique_queue()
            seen: list[tuple[str, Any, JobCtx]] = []
            tasks, chain = pipeline(queue, seen)
            broken = Tasks(queue=queue, max_attempts=1)  # summarise fails: the bug

            @broken.task(job_type="summarise")
            async def summarise(msg: Page) -> Summary:
                raise RuntimeError("a bug")

            broken.task(job_type="fetch")(tasks["fetch"].fn)
            await chain.enqueue(client, Url("u"))
            await run_until_drained(broken.worker(client), server)
            assert server.counts(queue).dead == 1
            code, _, err = await sepp_lite(
                "drain-dead-letters", "--addr", server.addr, "--out", str(archive)
            )
            assert code == 0, err
            [line] = archive.read_text().splitlines()
            record = json.loads(line)
            root = record["custom"][ROOT_KEY]
            argv = ["requeue-dead-letters", str(archive), "--addr", server.addr]
            assert await sepp_lite(*argv) == (0, "1 accepted, 0 rejected, 0 malformed\n", "")
            await run_until_drained(tasks.worker(client), server)  # the bug fixed
            # Replayed again as a job of its own (no requeue key): its hand-off
            # deduplicates into the store job the first replay made.
            again = sepp.EnqueueRequest(
                queue, "summarise", sepp.Payload(b'{"href":"u","text":"a b"}', "application/json")
            )
            again.custom = {k: v for k, v in record["custom"].items()}
            await client.enqueue(again)
            await run_until_drained(tasks.worker(client), server)
    names = [(name, ctx.custom[ROOT_KEY]) for name, _, ctx in seen]
    assert names == [("fetch", root), ("summarise", root), ("store", root), ("summarise", root)]
    stored = server.state.dedup_record(queue, f"wf:{root}:2")
    assert stored is not None and stored[0] == seen[2][2].id


def test_a_step_whose_retries_may_outlast_the_dedup_window_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = Tasks(queue="q")

    @tasks.task(retry=Backoff(initial=3600, max=12 * 3600), max_attempts=6)
    async def slow(msg: str) -> str:
        return msg

    @tasks.task(retry=Backoff(initial=1, max=60), max_attempts=5)
    async def quick(msg: str) -> None: ...

    with caplog.at_level(logging.WARNING, logger="sepp_lite"):
        slow.then(quick)
    [record] = [r for r in caplog.records if "dedup window" in r.getMessage()]
    assert record.getMessage().startswith("workflow step slow: its retries may take 97200 s")


async def test_the_command_line_lists_a_modules_workflows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = f"flows_{unique_queue().replace('-', '_')}"  # imported in this process
    (tmp_path / f"{module}.py").write_text(
        "from sepp_lite.tasks import Tasks\n"
        "tasks = Tasks(queue='flows')\n"
        "@tasks.task\n"
        "async def split(text: str) -> list[str]: return text.split()\n"
        "@tasks.task(queue='words')\n"
        "async def keep(word: str) -> None: ...\n"
        "fan = split.map(keep)\n"
    )

    async def sepp_lite(*argv: str) -> int:
        return await asyncio.to_thread(main, [*argv, "--app-dir", str(tmp_path)])

    assert await sepp_lite("workflows", module) == 0
    assert capsys.readouterr().out == "fan:\n  1. split (flows)\n  2. map keep (words)\n"
    assert await sepp_lite("workflows", f"{module}:fan", "--json") == 0
    assert json.loads(capsys.readouterr().out) == [
        {
            "name": "fan",
            "steps": [
                {"type": "split", "queue": "flows"},
                {"type": "keep", "queue": "words", "map": True},
            ],
        }
    ]
    assert await sepp_lite("workflows", f"{module}:tasks") == 2
    assert "'Tasks', not a sepp_lite.tasks.Chain" in capsys.readouterr().err


def test_a_task_type_with_only_its_input_still_means_any_output_at_run_time() -> None:
    assert sepp.Task[bytes] == sepp.Task[bytes, Any]  # evaluated annotations of old code
    assert sepp.Task[Url, Page] != sepp.Task[Url, Any]


def test_the_sync_client_starts_workflows_one_and_many() -> None:
    queue = unique_queue()
    _, chain = pipeline(queue, [])
    with SeppServerThread() as server, SyncSeppClient.connect(server.addr) as client:
        ack = chain.enqueue(client, Url("a"), priority=7)
        assert isinstance(ack, sepp.EnqueueAck)
        results = chain.enqueue_many(client, [Url("b"), Url("c")])
        assert [type(r) for r in results] == [sepp.EnqueueAck, sepp.EnqueueAck]
        assert server.counts(queue).ready == 3
        jobs = client.reserve(
            sepp.ReserveOptions([queue], timedelta(seconds=30), timedelta(0), max_jobs=3)
        )
        assert jobs is not None
        roots = {job.ctx.custom[ROOT_KEY] for job in jobs}
        assert len(roots) == 3  # each workflow its own root
        assert jobs[0].ctx.priority.value == 7 and jobs[0].ctx.id == ack.job_id
