"""Sizes, checked by the client before it sends, over real sockets: a payload too large
is the server's PayloadTooLarge whatever its size (2 MB or 20 MB), a batch whose jobs
fit one by one but not together is one RequestTooLargeError, and nothing over the
server's message limit is sent (the server counts the calls that reach it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

import sepp_lite as sepp
from sepp_lite import errors
from sepp_lite.testing import Limits, SeppTestServer
from tests.client_helpers import unique_queue

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024


class Counted:
    """A server whose EnqueueBatch, EnqueueAtomic and Nack calls are counted as they
    reach it. Its message limit is raised to 64 MiB: a request the client should not
    have sent would reach it and count."""

    def __init__(self, server: SeppTestServer) -> None:
        self.server = server
        self.calls = 0
        for method in ("EnqueueBatch", "EnqueueAtomic", "Nack"):
            server.before_call(method, self._count)

    async def _count(self) -> None:
        self.calls += 1


@pytest.fixture
async def counted() -> AsyncIterator[Counted]:
    async with SeppTestServer(limits=Limits(max_message_bytes=64 * MiB)) as server:
        yield Counted(server)


def job(queue: str, size: int = 0) -> sepp.EnqueueRequest:
    payload = sepp.Payload(b"x" * size, "application/octet-stream") if size else None
    return sepp.EnqueueRequest(queue, "t", payload=payload)


@pytest.mark.parametrize("knows_limits", [False, True], ids=["fresh", "after-server-info"])
async def test_a_payload_too_large_is_one_error_whatever_its_size(
    counted: Counted, knows_limits: bool
) -> None:
    queue = unique_queue()
    async with await sepp.SeppClient.connect(counted.server.addr) as client:
        if knows_limits:
            await client.get_server_info()
        with pytest.raises(sepp.JobRejectedError) as two:
            await client.enqueue(job(queue, 2 * MiB))
        sent = counted.calls
        assert sent == (0 if knows_limits else 1)  # the server's own refusal, or the same
        with pytest.raises(sepp.JobRejectedError) as twenty:
            await client.enqueue(job(queue, 20 * MiB))
        assert counted.calls == sent  # nothing was sent
        for info, size in ((two, 2 * MiB), (twenty, 20 * MiB)):
            rejection = info.value.rejection
            assert isinstance(rejection, errors.PayloadTooLarge)
            assert rejection.actual == size and rejection.limit < size
        # In a batch: the one refused, the others sent.
        results = await client.enqueue_batch([job(queue), job(queue, 20 * MiB), job(queue)])
        assert [type(r).__name__ for r in results] == [
            "EnqueueAck",
            "PayloadTooLarge",
            "EnqueueAck",
        ]
        assert counted.calls == sent + 1
        assert counted.server.counts(queue).ready == 2


async def test_the_default_server_refuses_a_20_mb_payload_as_a_2_mb_one(
    server: SeppTestServer, client: sepp.SeppClient
) -> None:
    queue = unique_queue()
    for size in (2 * MiB, 20 * MiB):
        with pytest.raises(sepp.JobRejectedError) as info:
            await client.enqueue(job(queue, size))
        assert isinstance(info.value.rejection, errors.PayloadTooLarge)
    with pytest.raises(sepp.BatchValidationError) as atomic:
        await client.enqueue_atomic([job(queue), job(queue, 20 * MiB)])
    [refused] = atomic.value.errors
    assert refused.index == 1 and isinstance(refused.rejection, errors.PayloadTooLarge)
    assert server.counts(queue) == (0, 0, 0, 0)


async def test_a_batch_over_the_message_limit_is_one_error_and_nothing_is_sent(
    counted: Counted,
) -> None:
    queue = unique_queue()
    # Each payload is under the server's 1 MiB payload limit; together, 20 MiB.
    batch = [job(queue, MiB - 1024) for _ in range(20)]
    async with await sepp.SeppClient.connect(counted.server.addr) as client:
        for call in (client.enqueue_batch, client.enqueue_atomic):
            with pytest.raises(sepp.RequestTooLargeError) as info:
                await call(batch)
            error = info.value
            assert error.limit == 16 * MiB and error.size is not None and error.size > error.limit
            assert str(error).startswith(f"the {call.__name__.title().replace('_', '')}")
            assert error.code is sepp.errors.Status.OUT_OF_RANGE and not error.ambiguous
            assert "send them in smaller batches" in str(error)
            assert isinstance(error, sepp.UnexpectedStatusError)  # what the server gave
        assert counted.calls == 0
        # Half of it goes through.
        assert len(await client.enqueue_batch(batch[:10])) == 10
    assert counted.server.counts(queue).ready == 10


async def test_any_call_over_the_limit_is_refused_before_sending(counted: Counted) -> None:
    queue = unique_queue()
    async with await sepp.SeppClient.connect(counted.server.addr) as client:
        await client.enqueue(job(queue))
        lease = timedelta(seconds=30)
        [reserved] = await client.reserve(sepp.ReserveOptions([queue], lease)) or []
        sent = counted.calls
        with pytest.raises(sepp.RequestTooLargeError, match="^the Nack request is"):
            await client.nack(reserved.ctx, reason="x" * (17 * MiB))
        assert counted.calls == sent
        await client.nack(reserved.ctx, reason="short")  # the lease was untouched
        assert counted.calls == sent + 1


async def test_a_server_with_a_lower_message_limit_answers_the_same_error() -> None:
    limits = Limits(max_message_bytes=MiB, max_payload_bytes=512 * 1024)
    async with SeppTestServer(limits=limits) as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            queue = unique_queue()
            with pytest.raises(sepp.RequestTooLargeError) as info:
                await client.enqueue_batch([job(queue, 400 * 1024) for _ in range(3)])
    assert "decoded message length too large" in str(info.value)
    assert info.value.size is None  # found by the server, not before sending
