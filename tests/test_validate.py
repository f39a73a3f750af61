"""Each value is checked once, where it enters (``sepp_lite._validate``'s rules, applied by
``types``, the client and the Worker): reserve options are checked at construction and
again when sent only if a field changed since, and a Worker checks its options when it is
built, not on every poll.

The errors and messages themselves are ``test_client_validation.py``'s and
``test_bad_input.py``'s; this module holds what makes them run once.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import pickle
from datetime import timedelta
from typing import Any, Callable

import pytest

import sepp_lite as sepp
from sepp_lite import _validate
from sepp_lite._codec.job import decode_reserve_request, encode_reserve_request
from sepp_lite.testing import SeppTestServer
from sepp_lite.types import ReserveOptions, checked_reserve_options, reserve_request
from tests.client_helpers import ScriptedServer, connected, opts, unique_queue

pytestmark = pytest.mark.timeout(60)


class Encoder:
    """``encode_reserve_request``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, options: ReserveOptions) -> bytes:
        self.calls += 1
        return encode_reserve_request(options)


def sent_queues(request: bytes) -> list[str]:
    return decode_reserve_request(request).queues


# -- reserve options: checked and encoded once per value ------------------------------


def test_unchanged_options_are_neither_checked_nor_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = opts("a", "b", wait=5, worker_id="w", max_jobs=3)
    checks = count_checks(monkeypatch)
    encode = Encoder()
    first = reserve_request(options, encode)
    assert reserve_request(options, encode) is first
    assert reserve_request(options, encode) is first
    assert (encode.calls, checks()) == (1, 0)
    assert first == encode_reserve_request(options)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda o: setattr(o, "max_jobs", 0), "max_jobs must be an int of at least 1"),
        (lambda o: setattr(o, "max_jobs", True), "max_jobs must be an int of at least 1"),
        (lambda o: o.queues.append("a/b"), r"queue name at index 2 \('a/b'\) must not"),
        (lambda o: o.queues.__setitem__(0, ""), "queue name at index 0"),
        (lambda o: o.queues.clear(), "at least one queue"),
        (lambda o: setattr(o, "wait_timeout", -1.0), "wait_timeout must not be negative"),
        (lambda o: setattr(o, "worker_id", ""), "worker_id must be a non-empty str"),
    ],
    ids=[
        "max_jobs",
        "max_jobs-bool",
        "queue-appended",
        "queue-replaced",
        "queues-cleared",
        "wait",
        "worker_id",
    ],  # fmt: skip
)
def test_a_change_after_sending_is_checked_when_sent_again(
    change: Callable[[ReserveOptions], None], match: str
) -> None:
    # Changed in place too: the list of queues is the user's, and mutable.
    options = opts("a", "b", wait=5, max_jobs=1)
    reserve_request(options, encode_reserve_request)
    change(options)
    with pytest.raises(ValueError, match=match):
        reserve_request(options, encode_reserve_request)


def test_a_valid_change_is_normalised_and_sent() -> None:
    options = opts("a", wait=5)
    before = reserve_request(options, encode_reserve_request)
    options.queues[0] = "b"
    assert sent_queues(reserve_request(options, encode_reserve_request)) == ["b"]
    options.wait_timeout = 2.5  # type: ignore[assignment]
    options.queues = ("c", "d")  # type: ignore[assignment]
    after = reserve_request(options, encode_reserve_request)
    # Normalised in place, as at construction.
    assert options.wait_timeout == timedelta(seconds=2.5) and options.queues == ["c", "d"]
    assert decode_reserve_request(after).wait_timeout == (2, 500_000_000)
    assert sent_queues(after) == ["c", "d"] and before != after
    # The same value in a new object: checked again, the same bytes.
    options.wait_timeout = timedelta(seconds=2.5)
    assert reserve_request(options, encode_reserve_request) == after


def test_copies_and_pickles_are_checked_on_their_own() -> None:
    options = opts("a", wait=5)
    reserve_request(options, encode_reserve_request)
    for twin in (
        copy.copy(options),
        copy.deepcopy(options),
        pickle.loads(pickle.dumps(options)),
        pickle.loads(pickle.dumps(options, protocol=0)),
        dataclasses.replace(options),
    ):
        assert twin == options
        assert reserve_request(twin, encode_reserve_request) == encode_reserve_request(options)
        twin.max_jobs = 0
        with pytest.raises(ValueError, match="max_jobs"):
            reserve_request(twin, encode_reserve_request)
    assert reserve_request(options, encode_reserve_request) == encode_reserve_request(options)


def test_a_subclass_that_skips_the_checks_is_checked_on_every_send() -> None:
    # What the client did before it kept a record: run the options' own __post_init__.
    seen = []

    @dataclasses.dataclass
    class Logged(ReserveOptions):
        def __post_init__(self) -> None:
            seen.append(self.max_jobs)

    options = Logged(["a"], timedelta(seconds=30), max_jobs=2)
    reserve_request(options, encode_reserve_request)
    reserve_request(options, encode_reserve_request)
    assert seen == [2, 2, 2]


def test_checked_reserve_options_are_reserve_options() -> None:
    built = checked_reserve_options(["a", "b"], timedelta(seconds=9), None, "w", 4)
    made = ReserveOptions(["a", "b"], timedelta(seconds=9), worker_id="w", max_jobs=4)
    # Every field is set (asdict reads them all): a field added to ReserveOptions and
    # not to checked_reserve_options fails here.
    assert dataclasses.asdict(built) == dataclasses.asdict(made) and built == made
    assert repr(built) == repr(made)
    assert reserve_request(built, encode_reserve_request) == encode_reserve_request(made)


def count_checks(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the calls of ReserveOptions' checks (its __post_init__, and the queue-name
    rule every check of reserve options runs) from now on."""
    calls = 0
    post_init = ReserveOptions.__post_init__
    queue_names = _validate.queue_names

    def counted(rule: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return rule(*args)

        return run

    monkeypatch.setattr(ReserveOptions, "__post_init__", counted(post_init))
    monkeypatch.setattr(_validate, "queue_names", counted(queue_names))
    return lambda: calls


# -- through the client ---------------------------------------------------------------


async def test_reserve_checks_options_changed_in_place_before_any_rpc() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        options = opts("a")
        assert await client.reserve(options) is None
        options.queues.append("a/b")
        with pytest.raises(ValueError, match="must not contain '/'"):
            await client.reserve(options)
        options.queues[1] = "b"
        assert await client.reserve(options) is None
        assert [sent_queues(call.request) for call in server.calls_to("Reserve")] == [
            ["a"],
            ["a", "b"],
        ]


# -- the Worker ------------------------------------------------------------------------


async def test_a_worker_checks_its_options_once_not_on_every_poll(
    server: SeppTestServer, client: sepp.SeppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = unique_queue()
    await client.enqueue_batch([sepp.EnqueueRequest(queue, "t") for _ in range(12)])
    worker = sepp.Worker(client, [queue], 30, wait_timeout=0.2, max_in_flight=3)
    checks = count_checks(monkeypatch)
    encode = Encoder()
    monkeypatch.setattr("sepp_lite.client.encode_reserve_request", encode)
    polls = 0

    async def count() -> None:
        nonlocal polls
        polls += 1

    server.before_call("Reserve", count)

    @worker.handler("t")
    async def handler(payload: object, ctx: sepp.JobCtx) -> None:
        await asyncio.sleep(0.01)

    await asyncio.wait_for(worker.run(until_idle=True), 30)
    assert server.counts(queue) == (0, 0, 0, 0)
    # Several polls asking for 1 to 3 jobs: one encoding per distinct request, no check.
    assert polls >= 4 and checks() == 0
    assert 1 <= encode.calls <= 3 < polls
