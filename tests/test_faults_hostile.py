"""Hostile bytes from the server.

* Every message decoder the client calls is fuzzed in ``test_codec_fuzz.py``; this
  module checks that list is complete, and fuzzes what sits in front of the decoders:
  the HTTP/2 response itself (status and content-type headers, grpc-status and
  grpc-message, the 5-byte length prefix, truncated or extra bytes, resets, GOAWAY,
  a dropped connection). Every such answer must end the call with a SeppError, or
  an answer, before its deadline: never another exception and never a hang.
* A Worker whose reserve gets a garbage answer logs it, backs off and goes on; jobs
  the client cannot read inside an otherwise good batch are skipped with a warning
  and the rest are processed.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import pkgutil
import random
import re
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sepp_lite
from sepp_lite import (
    ClientError,
    EnqueueAck,
    ResponseTooLargeError,
    SeppClient,
    SeppError,
    ServerInternalError,
    TransportError,
    Worker,
    _codec,
)
from sepp_lite._codec.enqueue import decode_enqueue_batch_request, encode_enqueue_batch_response
from sepp_lite._codec.job import encode_reserve_response
from sepp_lite._codec.lease import (
    decode_ack_request,
    decode_nack_request,
    encode_ack_response,
    encode_nack_response,
)
from sepp_lite._status import CallFailure
from sepp_lite._wire.grpc import grpc_message, grpc_status, head_problem
from sepp_lite._wire.http2 import parse_fields
from sepp_lite.errors import Status
from tests import test_codec_fuzz
from tests.client_helpers import (
    JOB_ID,
    connected,
    hand_ctx,
    job,
    job_record,
    opts,
    reserve_reply,
    server_info_bytes,
    until,
    worker_running,
)
from tests.fault_helpers import (
    Abort,
    Action,
    Close,
    Data,
    GoAway,
    Hang,
    Headers,
    Raw,
    RawH2Server,
    RawRequest,
    Reset,
    Sleep,
    grpc_ok,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
RPC_TIMEOUT = 1.0

# -- the decoder list is complete ------------------------------------------------------


def _response_decoders() -> dict[str, Callable[[bytes], object]]:
    """Every ``decode_*_response`` function the codec defines (the client's decoders,
    by the codec's naming scheme)."""
    found = {}
    for info in pkgutil.iter_modules(_codec.__path__):
        module = importlib.import_module(f"{_codec.__name__}.{info.name}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if (
                re.fullmatch(r"decode_\w+_response", name)
                and function.__module__ == module.__name__
            ):
                found[name] = function
    return found


def test_every_decoder_the_client_calls_is_fuzzed() -> None:
    fuzzed = {target.decode for target in test_codec_fuzz.TARGETS.values()}
    used: set[str] = set()
    for module in ("client.py", "worker.py", "_lease.py", "_wire/transport.py", "_otel.py"):
        source = (ROOT / "sepp_lite" / module).read_text()
        used.update(re.findall(r"\b(decode_\w+_response)\(", source))
    assert used == {
        "decode_enqueue_batch_response",
        "decode_enqueue_atomic_response",
        "decode_reserve_response",
        "decode_ack_response",
        "decode_nack_response",
        "decode_extend_response",
        "decode_get_server_info_response",
        "decode_drain_dead_letters_response",
    }
    decoders = _response_decoders()
    missing = [name for name in sorted(used) if decoders[name] not in fuzzed]
    assert missing == []
    # And the client calls every response decoder the codec has.
    assert set(decoders) == used


# -- the status and header decoders ----------------------------------------------------

_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=12)
_header_names = st.sampled_from(
    [":status", "content-type", "grpc-status", "grpc-message", "x-other", ""]
)
_header_values = _text | st.sampled_from(
    ["200", "0", "14", "99", "-1", "1_0", " 3", "application/grpc", "%", "%zz", "%C3%28", "%00"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(headers=st.lists(st.tuples(_header_names, _header_values), max_size=6))
def test_status_and_header_decoders_only_return_values(headers: list[tuple[str, str]]) -> None:
    fields = [(name.encode("utf-8"), value.encode("utf-8")) for name, value in headers]
    response = parse_fields(fields)
    assert grpc_status(response) is None or isinstance(grpc_status(response), Status)
    assert isinstance(grpc_message(response), str)
    problem = head_problem(response)
    assert problem is None or isinstance(problem, CallFailure)
    if problem is not None:
        assert isinstance(problem.status, Status)


# -- hostile HTTP/2 answers ------------------------------------------------------------


def _frame(message: bytes, flag: int = 0, size: Optional[int] = None) -> bytes:
    return bytes([flag]) + (len(message) if size is None else size).to_bytes(4, "big") + message


def _trailers(status: bytes = b"0", **extra: bytes) -> Headers:
    return Headers([(b"grpc-status", status), *((k.encode(), v) for k, v in extra.items())], True)


CASES: dict[str, tuple[list[Action], type[SeppError], Optional[Status]]] = {
    "ends inside the length prefix": (
        [Headers(OK_HEADERS), Data(b"\x00\x00\x00"), _trailers()],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "ends inside the message": (
        [Headers(OK_HEADERS), Data(_frame(b"abc", size=16)), _trailers()],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "compressed flag": (
        [Headers(OK_HEADERS), Data(_frame(b"\x0a\x00", flag=1)), _trailers()],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "declared size over the receive limit": (
        [Headers(OK_HEADERS), Data(_frame(b"", size=0xFFFFFFFF)), _trailers()],
        ResponseTooLargeError,
        None,
    ),
    "HTTP 503": ([Headers([(b":status", b"503")], True)], TransportError, Status.UNAVAILABLE),
    "HTTP 200 without content-type": (
        [Headers([(b":status", b"200")], True)],
        ServerInternalError,
        Status.UNKNOWN,
    ),
    "text/html": (
        [Headers([(b":status", b"200"), (b"content-type", b"text/html")]), Data(b"<html>", True)],
        ServerInternalError,
        Status.UNKNOWN,
    ),
    "grpc-status not a number": (
        [Headers([*OK_HEADERS, (b"grpc-status", b"abc")], True)],
        ServerInternalError,
        Status.UNKNOWN,
    ),
    "grpc-status out of range": (
        [Headers([*OK_HEADERS, (b"grpc-status", b"99")], True)],
        ServerInternalError,
        Status.UNKNOWN,
    ),
    "OK without a message": (
        [Headers([*OK_HEADERS, (b"grpc-status", b"0")], True)],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "message, then trailers without grpc-status": (
        [Headers(OK_HEADERS), Data(_frame(b"")), Headers([(b"x-other", b"1")], True)],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "undecodable message": (
        [Headers(OK_HEADERS), Data(_frame(b"\x0a\xff\xff\xff\xff\x0f")), _trailers()],
        sepp_lite.DecodeError,
        None,
    ),
    # RST_STREAM(INTERNAL_ERROR) is INTERNAL, as gRPC's PROTOCOL-HTTP2 maps it.
    "reset mid-message": (
        [Headers(OK_HEADERS), Data(_frame(b"abc", size=40)), Reset(2)],
        ServerInternalError,
        Status.INTERNAL,
    ),
    # "HTTP/1.1 ..." read as a frame header announces 4.7 MB: over our frame limit,
    # a connection error at once (the whole frame is never waited for).
    "bytes that are not HTTP/2 on a connection kept open": (
        [Raw(b"HTTP/1.1 400 Bad Request\r\n\r\n"), Hang()],
        TransportError,
        Status.UNAVAILABLE,
    ),
    "GOAWAY mid-message": (
        [Headers(OK_HEADERS), Data(_frame(b"abc", size=40)), GoAway(2)],
        TransportError,
        Status.UNAVAILABLE,
    ),
    "connection reset mid-message": (
        [Headers(OK_HEADERS), Data(_frame(b"abc", size=40)), Abort()],
        TransportError,
        Status.UNAVAILABLE,
    ),
    "connection closed before any answer": ([Close()], TransportError, Status.UNAVAILABLE),
    "a stream ended without trailers": (
        [Headers(OK_HEADERS), Data(_frame(server_info_bytes()), end=True)],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "a second response message": (
        [Headers(OK_HEADERS), Data(_frame(b"") + _frame(b"")), _trailers()],
        ServerInternalError,
        Status.INTERNAL,
    ),
    "bytes that are not HTTP/2, then a close": (
        [Raw(b"HTTP/1.1 400 Bad Request\r\n\r\n"), Close()],
        TransportError,
        Status.UNAVAILABLE,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_hostile_answer_is_a_specific_error_before_the_deadline(case: str) -> None:
    actions, expected, code = CASES[case]
    async with RawH2Server(lambda request: actions) as server:
        async with connected(server.addr, rpc_timeout=RPC_TIMEOUT) as client:
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(SeppError) as info:
                await client.get_server_info()
            took = loop.time() - start
            assert type(info.value) is expected, repr(info.value)
            if code is not None:
                assert isinstance(info.value, ClientError) and info.value.code is code
            assert took < 0.5, f"{case} took {took:.2f} s"
            # The client is still usable: the next call (reconnecting if need be) works.
            server.responder = lambda request: grpc_ok(server_info_bytes())
            assert (await client.get_server_info()).version == "0.1.0"


def _random_answer(rng: random.Random) -> list[Action]:
    """An answer assembled from pieces that are each valid, broken or hostile."""
    status = rng.choice([b"200"] * 6 + [b"404", b"503", b"abc", b""])
    headers = [(b":status", status)] if status else []
    kind = rng.choice([b"application/grpc"] * 5 + [b"application/grpc+proto", b"text/plain"])
    headers.append((b"content-type", kind))
    if rng.random() < 0.2:  # trailers-only
        code = rng.choice([b"0", b"1", b"5", b"9", b"14", b"16", b"99", b"x", b"-3", b"2" * 30])
        message = bytes(rng.randrange(0x20, 0x7F) for _ in range(rng.randrange(8)))
        headers += [(b"grpc-status", code), (b"grpc-message", message)]
        return [Headers(headers, True)]
    actions: list[Action] = [Headers(headers)]
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(24)))
    if rng.random() < 0.5:
        body = rng.choice([server_info_bytes(), encode_reserve_response([]), b""])
    framed = _frame(body, flag=rng.choice([0] * 8 + [1, 7]))
    if rng.random() < 0.3:
        framed = framed[: rng.randrange(len(framed) + 1)]
    if rng.random() < 0.2:
        framed += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    cut = rng.randrange(len(framed) + 1)
    for piece in (framed[:cut], framed[cut:]):
        if piece:
            actions.append(Data(piece))
    ending = rng.random()
    if ending < 0.65:
        code = rng.choice([b"0"] * 4 + [b"13", b"14", b"abc"])
        actions.append(_trailers(code, **{"grpc-message": b"%E2%82%AC%zz"}))
    elif ending < 0.75:
        actions.append(Reset(rng.choice([0, 2, 7, 8])))
    elif ending < 0.85:
        actions.append(rng.choice([Abort(), Close(), GoAway(rng.choice([0, 1, 2]))]))
    else:
        actions += [Sleep(0.01), _trailers()]
    return actions


CALLS: list[Callable[[SeppClient], Awaitable[Any]]] = [
    lambda c: c.get_server_info(),
    lambda c: c.enqueue(job("q")),
    lambda c: c.enqueue_atomic([job("q"), job("q")]),
    lambda c: c.reserve(opts("q", max_jobs=2)),
    lambda c: c.ack(hand_ctx()),
    lambda c: c.nack(hand_ctx()),
    lambda c: c.extend(hand_ctx(), 5),
    lambda c: c.drain_dead_letters(max_records=3),
]


async def test_random_hostile_answers_never_escape_the_error_tree() -> None:
    rng = random.Random(20240229)
    answer: list[Action] = []
    outcomes: Counter[str] = Counter()
    unsent = 0
    async with RawH2Server(lambda request: answer) as server:
        async with connected(server.addr, rpc_timeout=RPC_TIMEOUT) as client:
            loop = asyncio.get_running_loop()
            for number in range(240):
                answer[:] = _random_answer(rng)
                before, start = len(server.requests), loop.time()
                try:
                    result = await CALLS[number % len(CALLS)](client)
                except SeppError as error:
                    result = error
                except Exception as error:
                    raise AssertionError(
                        f"answer {answer!r} raised {type(error).__name__}: {error}"
                    ) from error
                took = loop.time() - start
                assert took < RPC_TIMEOUT + 0.5, (answer, took)
                outcomes[type(result).__name__] += 1
                if len(server.requests) == before:
                    # The previous answer closed the connection while this call was
                    # being sent: a lost connection, nothing else.
                    unsent += 1
                    assert isinstance(result, TransportError), result
                    assert result.code is Status.UNAVAILABLE
    # A call the server refused (RST_STREAM REFUSED_STREAM) or never processed (above
    # a GOAWAY's last stream id) is sent again, at most 3 more times.
    assert 240 <= len(server.requests) + unsent <= 240 * 4
    assert unsent < 40
    # The mix really reached the error paths and the success paths.
    assert outcomes["TransportError"] >= 20
    assert outcomes["ServerInternalError"] >= 20
    assert sum(outcomes.values()) == 240
    assert len(outcomes) >= 5, outcomes


# -- the worker --------------------------------------------------------------------------

OTHER_ID = "7f2d2e0b-2222-4333-8444-555566667777"
THIRD_ID = "8a3e3f0c-3333-4444-8555-666677778888"
LATER_ID = "9b4f4a1d-4444-4555-8666-777788889999"

GARBAGE: dict[str, list[Action]] = {
    "undecodable message": [
        Headers(OK_HEADERS),
        Data(_frame(b"\x0a\x05\x0a\x03\xff\xfe")),
        _trailers(),
    ],
    "truncated frame": [Headers(OK_HEADERS), Data(_frame(b"\x0a\x02", size=99)), _trailers()],
    "connection reset": [Headers(OK_HEADERS), Abort()],
    "HTTP 502": [Headers([(b":status", b"502")], True)],
}


class FakeQueue:
    """Answers a worker: reserve plays ``batches`` (then empty), ack/nack record."""

    def __init__(self, first: list[Action], batches: list[bytes]) -> None:
        self.first: Optional[list[Action]] = first
        self.batches = batches
        self.acked: list[str] = []
        self.nacked: list[str] = []

    def __call__(self, request: RawRequest) -> list[Action]:
        body = request.body[5:]
        method = request.path.rsplit("/", 1)[-1]
        if method == "GetServerInfo":
            return grpc_ok(server_info_bytes())
        if method == "Reserve":
            if self.first is not None:
                first, self.first = self.first, None
                return first
            if self.batches:
                return grpc_ok(self.batches.pop(0))
            return [Sleep(0.05), *grpc_ok(encode_reserve_response([]))]
        if method == "Ack":
            job_id = decode_ack_request(body).job_id
            self.acked.append(job_id)
            return grpc_ok(encode_ack_response(job_id))
        if method == "Nack":
            job_id = decode_nack_request(body).job_id
            self.nacked.append(job_id)
            return grpc_ok(encode_nack_response(job_id, False))
        return [Hang()]


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
async def test_worker_survives_a_garbage_reserve_and_skips_malformed_jobs(
    garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    batch = reserve_reply(
        job_record(JOB_ID, job_type="t"),
        job_record(OTHER_ID, priority=12),  # malformed: skipped with a warning
        job_record(THIRD_ID, job_type="t"),
    )
    later = reserve_reply(job_record(LATER_ID, job_type="t"))
    queue = FakeQueue(GARBAGE[garbage], [batch, later])
    handled: list[str] = []
    async with RawH2Server(queue) as server, connected(server.addr, rpc_timeout=2) as client:
        worker = Worker(client, ["q"], 30, wait_timeout=1, reserve_error_backoff=0.05)

        @worker.handler("t")
        async def handler(payload: object, ctx: sepp_lite.JobCtx) -> None:
            handled.append(ctx.id)

        async with worker_running(worker, 10) as task:
            await until(lambda: len(queue.acked) == 3 or task.done(), timeout=10)
            assert not task.done(), task
            worker.shutdown_handle().shutdown()
            await asyncio.wait_for(task, 5)
    assert sorted(handled) == sorted([JOB_ID, THIRD_ID, LATER_ID])
    assert sorted(queue.acked) == sorted(handled)
    assert queue.nacked == []
    messages = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    failed = [m for m in messages if m.startswith("reserve failed")]
    assert len(failed) == 1, messages
    skipped = [m for m in messages if "malformed job" in m]
    assert len(skipped) == 1 and OTHER_ID in skipped[0] and "priority 12" in skipped[0]


async def test_enqueue_survives_the_hostile_cases_with_a_retry_policy() -> None:
    # A keyed enqueue retried through a reset stream (ENHANCE_YOUR_CALM, i.e.
    # RESOURCE_EXHAUSTED) and a GOAWAY with an error code lands once.
    plays: list[list[Action]] = [
        [Headers(OK_HEADERS), Reset(11)],
        [GoAway(2), Hang()],
    ]

    def responder(request: RawRequest) -> list[Action]:
        if plays:
            return plays.pop(0)
        jobs = decode_enqueue_batch_request(request.body[5:])
        return grpc_ok(encode_enqueue_batch_response([(OTHER_ID, False) for _ in jobs]))

    policy = sepp_lite.RetryPolicy(max_attempts=4, initial_backoff=0.01, jitter=False)
    async with RawH2Server(responder) as server:
        async with connected(server.addr, retry_policy=policy, rpc_timeout=3) as client:
            ack = await client.enqueue(job("q", idempotency_key="k1"))
    assert ack == EnqueueAck(OTHER_ID, False)
    assert len(server.requests) == 3
    assert server.connections == 2  # the GOAWAY closed the first connection
