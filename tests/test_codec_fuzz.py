"""Every codec decoder on hostile input: it returns normally or raises ``DecodeError``
(``MalformedServerInfoError`` too for GetServerInfo), never anything else, and quickly.

Inputs: random bytes; valid messages mutated at the byte level (bit flips, truncation,
insertions, deletions, splices of malformed fields); valid messages with malformed fields
placed inside nested messages (lengths re-framed, so the damage is deep, not at the
edge); invalid UTF-8 in string fields (must be a ``DecodeError``); every truncation of a
few rich messages; and large inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

import pytest
from betterproto.lib.google.protobuf import Empty
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sepp_lite import errors
from sepp_lite._codec.dead_letters import (
    decode_drain_dead_letters_request,
    decode_drain_dead_letters_response,
)
from sepp_lite._codec.enqueue import (
    decode_enqueue_atomic_response,
    decode_enqueue_batch_request,
    decode_enqueue_batch_response,
)
from sepp_lite._codec.job import decode_reserve_request, decode_reserve_response
from sepp_lite._codec.lease import (
    decode_ack_request,
    decode_ack_response,
    decode_extend_request,
    decode_extend_response,
    decode_nack_request,
    decode_nack_response,
)
from sepp_lite._codec.server_info import decode_get_server_info_response
from sepp_lite._proto.sepp import v1 as pb
from tests import strategies as s
from tests import wire_edit

TIME_LIMIT = 1.0  # seconds of CPU per decode call


class Target(NamedTuple):
    decode: Callable[[bytes], object]
    message: str  # the sepp.v1 message the decoder reads
    allowed: tuple[type[BaseException], ...]


_DECODE = (errors.DecodeError,)
_DECODERS: list[tuple[Callable[[bytes], object], str]] = [
    (decode_reserve_response, "ReserveResponse"),
    (decode_enqueue_batch_response, "EnqueueBatchResponse"),
    (decode_enqueue_atomic_response, "EnqueueAtomicResponse"),
    (decode_ack_response, "AckResponse"),
    (decode_nack_response, "NackResponse"),
    (decode_extend_response, "ExtendResponse"),
    (decode_drain_dead_letters_response, "DrainDeadLettersResponse"),
    (decode_get_server_info_response, "GetServerInfoResponse"),
    (decode_enqueue_batch_request, "EnqueueBatchRequest"),
    (decode_reserve_request, "ReserveRequest"),
    (decode_ack_request, "AckRequest"),
    (decode_nack_request, "NackRequest"),
    (decode_extend_request, "ExtendRequest"),
    (decode_drain_dead_letters_request, "DrainDeadLettersRequest"),
]
# Every decoder by its name; GetServerInfoResponse may also be malformed as a ServerInfo.
TARGETS: dict[str, Target] = {
    decode.__name__: Target(
        decode,
        message,
        (errors.DecodeError, errors.MalformedServerInfoError)
        if message == "GetServerInfoResponse"
        else _DECODE,
    )
    for decode, message in _DECODERS
}
NAMES = sorted(TARGETS)

RANDOM = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
MUTATED = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
FEW = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


def run(name: str, data: bytes) -> BaseException | None:
    """Decode ``data``; return the allowed exception it raised, or None. Fail on any other
    exception and on a slow decode."""
    target = TARGETS[name]
    # CPU time, not wall time: what a quadratic decoder burns, whatever else the
    # machine is running (a loaded CI machine stretched a 0.25 s decode past 1 s).
    start = time.process_time()
    try:
        target.decode(data)
    except target.allowed as exc:
        outcome: BaseException | None = exc
    except Exception as exc:
        raise AssertionError(f"{name} raised {type(exc).__name__}: {exc} on {data!r}") from exc
    else:
        outcome = None
    elapsed = time.process_time() - start
    assert elapsed < TIME_LIMIT, f"{name} took {elapsed:.2f}s on {len(data)} bytes"
    return outcome


# ---------------------------------------------------------------------------------------
# Random bytes


@pytest.mark.parametrize("name", NAMES)
@RANDOM
@given(data=st.binary(max_size=300))
def test_random_bytes(name: str, data: bytes) -> None:
    run(name, data)


@pytest.mark.parametrize("name", NAMES)
@FEW
@given(fields=st.lists(wire_edit.nasty_fields() | wire_edit.unknown_fields, max_size=6))
def test_random_field_sequences(name: str, fields: list[bytes]) -> None:
    # Field-shaped garbage gets further into the decoders than uniform random bytes.
    run(name, b"".join(fields))


# ---------------------------------------------------------------------------------------
# Mutated valid messages


@st.composite
def _mutate(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    kind = draw(st.integers(0, 6))
    pos = draw(st.integers(0, len(buf)))
    if kind == 0 and buf:  # flip a bit
        index = min(pos, len(buf) - 1)
        buf[index] ^= 1 << draw(st.integers(0, 7))
    elif kind == 1:  # truncate
        del buf[pos:]
    elif kind == 2:  # insert random bytes
        buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    elif kind == 3:  # delete a range
        del buf[pos : pos + draw(st.integers(1, 8))]
    elif kind == 4:  # splice a malformed field
        buf[pos:pos] = draw(wire_edit.nasty_fields())
    elif kind == 5 and buf:  # set a continuation bit or a huge byte
        index = min(pos, len(buf) - 1)
        buf[index] = draw(st.sampled_from([0x80, 0xFF, 0x00, 0x7F]))
    else:  # duplicate a range (repeated fields, oneofs set twice)
        buf[pos:pos] = buf[pos : pos + draw(st.integers(1, 16))]
    return bytes(buf)


@pytest.mark.parametrize("name", NAMES)
@MUTATED
@given(data=st.data())
def test_mutated_valid_messages(name: str, data: st.DataObject) -> None:
    raw = data.draw(s.MESSAGE_BYTES[TARGETS[name].message], label="valid")
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        raw = data.draw(_mutate(raw), label="mutated")
    run(name, raw)


@pytest.mark.parametrize("name", NAMES)
@MUTATED
@given(data=st.data())
def test_malformed_fields_inside_nested_messages(name: str, data: st.DataObject) -> None:
    message = TARGETS[name].message
    raw = data.draw(s.MESSAGE_BYTES[message], label="valid")
    run(name, wire_edit.with_nasty_fields(data.draw, raw, message))


@pytest.mark.parametrize("name", NAMES)
@FEW
@given(data=st.data())
def test_invalid_utf8_in_a_string_field_is_a_decode_error(name: str, data: st.DataObject) -> None:
    message = TARGETS[name].message
    raw = data.draw(s.MESSAGE_BYTES[message], label="valid")
    count = wire_edit.string_field_count(raw, message)
    assume(count > 0)
    index = data.draw(st.integers(0, count - 1), label="string field")
    corrupted = wire_edit.with_invalid_utf8(data.draw, raw, message, index)
    # proto3 strings must be valid UTF-8: protobuf refuses the whole message, and every
    # decoder here reads every string field of what it decodes.
    assert isinstance(run(name, corrupted), errors.DecodeError)


# ---------------------------------------------------------------------------------------
# Every truncation of rich messages

_TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_WHEN = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
_CUSTOM = {
    "s": pb.PrimitiveValue(string_value="värde"),
    "d": pb.PrimitiveValue(double_value=-0.0),
    "i": pb.PrimitiveValue(int_value=-(2**63)),
    "b": pb.PrimitiveValue(bool_value=True),
}


def _rich_job() -> pb.Job:
    return pb.Job(
        id="job-1",
        job_type="email",
        payload=pb.Payload(b"\x00\x01body", "json"),
        priority=7,
        trace_context=pb.TraceContext(_TP, "k=v"),
        enqueued_at=_WHEN,
        attempt=300,
        max_attempts=2**32 - 1,
        lease_expires_at=_WHEN + timedelta(seconds=30),
        custom=dict(_CUSTOM),
        scheduled_at=_WHEN,
        queue="emails",
    )


def _rich_info() -> bytes:
    info = pb.GetServerInfoResponse(
        "1.2.3", ["v1", "v2"], _WHEN, True, ["json", "msgpack"], 2**40, 64, 2**33, 128, 255
    )
    info.max_schedule_horizon = timedelta(days=30)
    info.max_wait_timeout = timedelta(seconds=30, microseconds=5)
    info.max_lease_duration = timedelta(hours=1)
    info.strict_queues = info.dead_letter_retention_enabled = True
    return bytes(info)


def _rich_rejections() -> list[pb.JobResult]:
    rejections = [
        errors.CustomKeyTooLong("ключ", 64, 2**40),
        errors.ScheduledTooFar(timedelta(days=7), _WHEN),
        errors.EncodingNotAllowed("xml", ["json", "msgpack"]),
        errors.QueueFull("q", 2**63),
    ]
    results = [s.job_result_to_pb(r) for r in rejections]
    return [pb.JobResult(success=pb.EnqueueResponse("job-9", True)), *results]


RICH: dict[str, bytes] = {
    "ReserveResponse": bytes(pb.ReserveResponse([_rich_job(), _rich_job()])),
    "EnqueueBatchResponse": bytes(pb.EnqueueBatchResponse(_rich_rejections())),
    "EnqueueAtomicResponse": bytes(
        pb.EnqueueAtomicResponse(
            rejection=pb.BatchValidationFailure(
                [pb.JobValidationError(3, r.rejection) for r in _rich_rejections()[1:]]
            )
        )
    ),
    "AckResponse": bytes(pb.AckResponse("job-1")),
    "NackResponse": bytes(pb.NackResponse("job-1", True)),
    "ExtendResponse": bytes(pb.ExtendResponse("job-1", _WHEN)),
    "DrainDeadLettersResponse": bytes(
        pb.DrainDeadLettersResponse([pb.DeadLetterRecord(_rich_job(), 2, _WHEN, 5, "boom")])
    ),
    "GetServerInfoResponse": _rich_info(),
    "EnqueueBatchRequest": bytes(
        pb.EnqueueBatchRequest(
            [
                pb.EnqueueRequest(
                    "emails",
                    "email",
                    pb.Payload(b"body", "json"),
                    "key-1",
                    9,
                    5,
                    pb.TraceContext(_TP, ""),
                    dict(_CUSTOM),
                    _WHEN,
                )
            ]
        )
    ),
    "ReserveRequest": bytes(
        pb.ReserveRequest(["a", "b"], timedelta(seconds=30), timedelta(minutes=5), "w-1", 10)
    ),
    "AckRequest": bytes(pb.AckRequest("job-1", 300, "w-1")),
    "NackRequest": bytes(
        pb.NackRequest("job-1", 3, "boom", pb.NackRetry(delay=timedelta(seconds=1.5)), "w")
    ),
    "ExtendRequest": bytes(pb.ExtendRequest("job-1", 3, timedelta(seconds=90), "w-1")),
    "DrainDeadLettersRequest": bytes(pb.DrainDeadLettersRequest("emails", 100)),
}


@pytest.mark.parametrize("name", NAMES)
def test_every_truncation_of_a_rich_message(name: str) -> None:
    full = RICH[TARGETS[name].message]
    assert run(name, full) is None  # the untouched message decodes
    for size in range(len(full)):
        run(name, full[:size])


def test_nack_request_with_empty_strategies_truncated() -> None:
    for retry in (pb.NackRetry(default=Empty()), pb.NackRetry(dead_letter=Empty())):
        full = bytes(pb.NackRequest("job-1", 1, None, retry, None))
        for size in range(len(full) + 1):
            run("decode_nack_request", full[:size])


def _reachable(message: str) -> list[str]:
    """``message`` and every message type nested in it (map entries included)."""
    seen: list[str] = []
    pending = [wire_edit.full_name(message)]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.append(name)
            pending += [f.child for f in wire_edit.schema(name).values() if f.child]
    return seen


_ANY_VALUE = {
    wire_edit.VARINT: b"\x01",
    wire_edit.I64: bytes(8),
    wire_edit.LEN: b"\x01x",
    wire_edit.I32: bytes(4),
}


def _with_field(inside: str, number: int, wire_type: int) -> wire_edit.Edit:
    extra = wire_edit.tag(number, wire_type) + _ANY_VALUE[wire_type]

    def edit(draw: wire_edit.Draw, message: str, fields: list[bytes]) -> list[bytes]:
        return [*fields, extra] if message == inside else fields

    return edit


@pytest.mark.parametrize("name", NAMES)
def test_every_known_field_number_with_every_wire_type(name: str) -> None:
    # Appended after the real fields (so it is the "last" occurrence) in every message of
    # the type, at whatever depth the rich message holds one.
    message = TARGETS[name].message
    for inside in _reachable(message):
        for number in sorted(wire_edit.schema(inside)):
            for wire_type in _ANY_VALUE:
                edit = _with_field(inside, number, wire_type)
                run(name, wire_edit.rewrite(lambda _: None, RICH[message], message, edit))


# ---------------------------------------------------------------------------------------
# Large inputs

_MANY_UNKNOWN = wire_edit.tag(500, wire_edit.VARINT) + b"\x01"
LARGE: dict[str, bytes] = {
    "many_unknown_varints": _MANY_UNKNOWN * 40_000,
    "many_empty_fields": wire_edit.len_field(1, b"") * 10_000,
    "huge_declared_length": wire_edit.tag(1, wire_edit.LEN)
    + wire_edit.uvarint(2**62)
    + bytes(2**20),
    "one_large_string": wire_edit.len_field(1, b"x" * 2**18),
    "long_varint_run": wire_edit.tag(2, wire_edit.VARINT) + b"\xff" * 200_000,
}


@pytest.mark.parametrize("case", sorted(LARGE))
@pytest.mark.parametrize("name", NAMES)
def test_large_inputs_finish_quickly(name: str, case: str) -> None:
    run(name, LARGE[case])


def test_many_valid_jobs_decode_quickly() -> None:
    data = bytes(pb.ReserveResponse([_rich_job() for _ in range(2_000)]))
    assert run("decode_reserve_response", data) is None
    jobs, problems = decode_reserve_response(data)
    assert (len(jobs), problems) == (2_000, [])
