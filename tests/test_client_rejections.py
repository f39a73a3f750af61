"""Rejections are values, ids are UUIDs, queue names follow one rule.

- A payload over the server's advertised limit is not sent, and comes back as the
  very ``PayloadTooLarge`` the server gives (checked against the server's own answer
  and against sepp-py's), in its place; the other jobs go out.
- A reserved job whose id is not a UUID is skipped with one WARNING, like the other
  malformed jobs; a dead-letter record with such an id is kept, with a WARNING.
- ``drain_dead_letters`` refuses the queue names ``reserve`` refuses.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sepp_lite as sepp
from sepp_lite._codec.dead_letters import DeadLetterOut, encode_drain_dead_letters_response
from sepp_lite._codec.lease import decode_ack_request
from sepp_lite.client import _jobs_with_uuids, _not_uuid
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import (
    JOB_ID,
    NO_SEPP_PY,
    ScriptedServer,
    connected,
    job_record,
    opts,
    reserve_reply,
    server_info_bytes,
    unique_queue,
)

pytestmark = pytest.mark.timeout(30)

LIMIT = 64


def small(queue: str) -> sepp.EnqueueRequest:
    return sepp.EnqueueRequest(queue, "t", payload=sepp.Payload(b"x" * LIMIT, "raw"))


def big(queue: str, **fields: Any) -> sepp.EnqueueRequest:
    return sepp.EnqueueRequest(
        queue, "t", payload=sepp.Payload(b"x" * (LIMIT + 1), "raw"), **fields
    )


@pytest.fixture
def server_options() -> dict[str, Any]:
    """conftest.py's ``server`` with a small payload limit (and no dead-letter retention)."""
    return {"max_payload_bytes": LIMIT}


async def informed_client(server: SeppTestServer, **options: Any) -> sepp.SeppClient:
    client = await sepp.SeppClient.connect(server.addr, **options)
    await client.get_server_info()  # what a Worker does at start
    return client


# -- payloads over the limit ------------------------------------------------------------


async def test_batch_returns_the_servers_rejection_in_place_and_sends_the_rest(
    server: SeppTestServer,
) -> None:
    queue = unique_queue()
    checked = await informed_client(server)
    unchecked = await informed_client(server, check_payload_limit=False)
    try:
        local = await checked.enqueue_batch([small(queue), big(queue), small(queue)])
        assert server.counts(queue).ready == 2  # the big job was not sent
        remote = await unchecked.enqueue_batch([small(queue), big(queue), small(queue)])
    finally:
        await checked.close()
        await unchecked.close()
    assert [type(r) for r in local] == [sepp.EnqueueAck, sepp.PayloadTooLarge, sepp.EnqueueAck]
    assert local[1] == remote[1] == sepp.PayloadTooLarge(limit=LIMIT, actual=LIMIT + 1)
    assert local[1].message == "payload of 65 bytes is over the limit of 64"


async def test_sepp_py_gets_the_same_values(server: SeppTestServer) -> None:
    seppy = pytest.importorskip("sepp", reason=NO_SEPP_PY)
    queue = unique_queue()
    official = await seppy.SeppClient.connect(server.addr)
    try:
        await official.get_server_info()
        theirs = await official.enqueue_batch(
            [
                seppy.EnqueueRequest(queue, "t", payload=seppy.Payload(b"x", "raw")),
                seppy.EnqueueRequest(queue, "t", payload=seppy.Payload(b"x" * (LIMIT + 1), "raw")),
            ]
        )
    finally:
        await official.close()
    client = await informed_client(server)
    try:
        ours = await client.enqueue_batch([small(queue), big(queue)])
    finally:
        await client.close()
    assert [type(r).__name__ for r in theirs] == [type(r).__name__ for r in ours]
    assert (theirs[1].limit, theirs[1].actual) == (ours[1].limit, ours[1].actual)


async def test_enqueue_raises_job_rejected_with_that_value(server: SeppTestServer) -> None:
    queue = unique_queue()
    client = await informed_client(server)
    try:
        with pytest.raises(sepp.JobRejectedError) as info:
            await client.enqueue(big(queue))
    finally:
        await client.close()
    assert info.value.rejection == sepp.PayloadTooLarge(LIMIT, LIMIT + 1)
    assert server.counts(queue).ready == 0


async def test_atomic_reports_the_servers_validation_failure_by_index(
    server: SeppTestServer,
) -> None:
    queue = unique_queue()
    checked = await informed_client(server)
    unchecked = await informed_client(server, check_payload_limit=False)
    try:
        with pytest.raises(sepp.BatchValidationError) as local:
            await checked.enqueue_atomic([small(queue), big(queue)])
        with pytest.raises(sepp.BatchValidationError) as remote:
            await unchecked.enqueue_atomic([small(queue), big(queue)])
    finally:
        await checked.close()
        await unchecked.close()
    assert local.value.errors == remote.value.errors
    assert local.value.errors == [sepp.JobValidationError(1, sepp.PayloadTooLarge(64, 65))]
    assert "job 1: payload of 65 bytes is over the limit of 64" in str(local.value)
    assert server.counts(queue).ready == 0


async def test_nothing_is_sent_when_every_job_is_over_the_limit() -> None:
    async with ScriptedServer() as scripted:
        scripted.script("GetServerInfo", server_info_bytes(max_payload_bytes=LIMIT))
        async with connected(scripted.addr) as client:
            await client.get_server_info()
            results = await client.enqueue_batch([big("q"), big("q")])
            with pytest.raises(sepp.BatchValidationError):
                await client.enqueue_atomic([big("q")])
            # A job with a value that cannot be sent still raises, refused or not.
            with pytest.raises(TypeError, match="custom"):
                await client.enqueue_batch([big("q", custom={"k": None}), small("q")])
            with pytest.raises(TypeError, match="custom"):
                await client.enqueue_atomic([big("q", custom={"k": None})])
    assert results == [sepp.PayloadTooLarge(LIMIT, LIMIT + 1)] * 2
    assert [call.method for call in scripted.calls] == ["GetServerInfo"]


# -- ids that are not UUIDs -------------------------------------------------------------


async def test_a_reserved_job_whose_id_is_not_a_uuid_is_skipped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ScriptedServer() as scripted:
        scripted.script(
            "Reserve",
            reserve_reply(job_record("not-a-uuid"), job_record(JOB_ID)),
            reserve_reply(job_record("x" * 100)),
        )
        async with connected(scripted.addr) as client:
            with caplog.at_level(logging.WARNING, "sepp_lite"):
                jobs = await client.reserve(opts("q"))
                only_bad = await client.reserve(opts("q"))
    assert jobs is not None and [job.ctx.id for job in jobs] == [JOB_ID]
    assert only_bad is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "skipping malformed job in reserve response: id 'not-a-uuid' is not a UUID",
        f"skipping malformed job in reserve response: id '{'x' * 64}...' is not a UUID",
    ]


async def test_ids_of_either_case_are_uuids(caplog: pytest.LogCaptureFixture) -> None:
    upper = JOB_ID.upper()
    async with ScriptedServer() as scripted:
        scripted.script("Reserve", reserve_reply(job_record(upper)))
        async with connected(scripted.addr) as client:
            with caplog.at_level(logging.WARNING, "sepp_lite"):
                jobs = await client.reserve(opts("q"))
    assert jobs is not None and jobs[0].ctx.id == upper
    assert caplog.records == []


async def test_a_worker_never_sees_a_job_whose_id_is_not_a_uuid() -> None:
    async with ScriptedServer() as scripted:
        scripted.script("Reserve", reserve_reply(job_record("42"), job_record(JOB_ID)))
        async with connected(scripted.addr) as client:
            worker = sepp.Worker(client, ["q"], 30)
            seen: list[str] = []

            @worker.handler("t")
            async def handler(payload: object, ctx: sepp.JobCtx) -> None:
                seen.append(ctx.id)

            await worker.run(until_idle=True)
    assert seen == [JOB_ID]
    acked = [decode_ack_request(c.request).job_id for c in scripted.calls_to("Ack")]
    assert acked == [JOB_ID]


async def test_a_dead_letter_record_whose_id_is_not_a_uuid_is_kept_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = [
        DeadLetterOut(job_record("legacy-7"), 1, 1_700_000_000_000, 3, "boom"),
        DeadLetterOut(job_record(JOB_ID), 1, 1_700_000_000_000, 3, None),
    ]
    async with ScriptedServer() as scripted:
        scripted.script("DrainDeadLetters", encode_drain_dead_letters_response(records))
        async with connected(scripted.addr) as client:
            with caplog.at_level(logging.WARNING, "sepp_lite"):
                drained = await client.drain_dead_letters("q", 10)
    # Draining deleted them on the server: dropping one here would lose it for good.
    assert [record.job_id for record in drained] == ["legacy-7", JOB_ID]
    assert [r.getMessage() for r in caplog.records] == [
        "dead-letter record with an id that is not a UUID: 'legacy-7' (kept)"
    ]


# -- one queue-name rule ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a/b", "must not contain '/'"),
        (".", 'must not be "." or ".."'),
        ("..", 'must not be "." or ".."'),
        ("tab\there", "must not contain control characters"),
    ],
)
async def test_drain_and_reserve_refuse_the_same_names(
    server: SeppTestServer, name: str, problem: str
) -> None:
    async with connected(server.addr) as client:
        with pytest.raises(ValueError) as drained:
            await client.drain_dead_letters(name)
        with pytest.raises(ValueError) as reserved:
            await client.reserve(opts("ok", name))
    assert str(drained.value) == f"queue {name!r} {problem}"
    assert str(reserved.value) == f"queue name at index 1 ({name!r}) {problem}"


async def test_the_servers_rule_and_the_clients_are_one(server: SeppTestServer) -> None:
    # The same names sent past the client's check (an EnqueueRequest is checked by the
    # server, which answers with a rejection value) get the server's same words.
    async with connected(server.addr) as client:
        results = await client.enqueue_batch([sepp.EnqueueRequest(n, "t") for n in ("a/b", ".")])
    assert [r.message for r in results] == [  # type: ignore[union-attr]
        "invalid job: queue must not contain '/'",
        'invalid job: queue must not be "." or ".."',
    ]


_some_uuid = st.uuids().map(str)
_job_ids = st.lists(
    st.one_of(
        _some_uuid,
        _some_uuid.map(str.upper),
        st.text(max_size=80),
        st.tuples(_some_uuid, _some_uuid).map("\n".join),  # two ids' worth in one
        _some_uuid.map(lambda u: u[:35]),
        _some_uuid.map(lambda u: u + "\n"),
    ),
    max_size=12,
)


@settings(max_examples=400)
@given(_job_ids)
def test_a_reserve_answer_keeps_exactly_the_jobs_whose_id_is_a_uuid(ids: list[str]) -> None:
    # The whole answer is checked in one match first; whatever it lets through must be
    # what checking id by id keeps.
    jobs = [SimpleNamespace(ctx=SimpleNamespace(id=job_id)) for job_id in ids]
    kept = _jobs_with_uuids(jobs)  # type: ignore[arg-type]
    assert [job.ctx.id for job in kept] == [i for i in ids if _not_uuid(i) is None]
