"""The in-process server's state machine, driven directly with a ManualClock."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from sepp_lite import errors
from sepp_lite._codec.job_rejection import RawScheduledTooFar
from sepp_lite._time import EPOCH
from sepp_lite.testing import ManualClock, QueueConfig, QueueCounts, RealClock, RpcError
from sepp_lite.testing._rules import is_uuid
from sepp_lite.testing._siphash import retry_jitter_hash, siphash
from sepp_lite.testing._state import Code, QueueState
from tests.server_helpers import (
    START_MS,
    UUID0,
    enqueue_ids,
    job,
    lease_req,
    make_state,
    ms_sn,
    reserve_req,
    sn,
)

LEASE_EXPIRED, ATTEMPTS_EXHAUSTED, REJECTED = 3, 1, 2


def reserve(state: QueueState, *queues: str, **kw: object) -> list:
    return state.reserve_once(state.prepare_reserve(reserve_req(*(queues or ("q",)), **kw)))


def rpc_error(fn, *args) -> RpcError:
    with pytest.raises(RpcError) as info:
        fn(*args)
    return info.value


# -- enqueue, ordering, scheduling -------------------------------------------------------


def test_enqueue_then_reserve_returns_the_stored_job():
    state, clock = make_state()
    custom = {"s": "x", "i": -5, "f": 1.5, "b": True}
    trace = ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v")
    [jid] = enqueue_ids(
        state, job(payload=(b"body", "json"), custom=custom, trace=trace, priority=3)
    )
    assert uuid.UUID(jid).version == 4 and uuid.UUID(jid).variant == uuid.RFC_4122
    assert is_uuid(jid) and str(uuid.UUID(jid)) == jid
    assert state.counts("q") == QueueCounts(1, 0, 0, 0)
    clock.advance_ms(7)
    [(record, attempt, expires)] = reserve(state, lease=30)
    assert (record.id, record.queue, record.job_type) == (jid, "q", "t")
    assert record.payload == (b"body", "json")
    assert (record.custom, record.trace, record.priority) == (custom, trace, 3)
    assert (record.enqueued_ms, record.max_attempts, record.scheduled_at) == (START_MS, 3, None)
    assert (attempt, expires) == (1, START_MS + 7 + 30_000)
    assert state.counts("q") == QueueCounts(0, 0, 1, 0)
    view = state.job(jid)
    assert view is not None and (view.state, view.lease_expires_ms) == ("in_flight", expires)


def test_ready_order_is_priority_then_enqueued_ms_then_job_id():
    state, clock = make_state()
    [low_old] = enqueue_ids(state, job())
    clock.advance_ms(1)
    [high] = enqueue_ids(state, job(priority=9))
    [mid] = enqueue_ids(state, job(priority=5))
    clock.advance_ms(1)
    same_ms = enqueue_ids(state, job(), job(), job(), job())
    [explicit_zero] = enqueue_ids(state, job(priority=0))
    got = [d[0].id for d in reserve(state, max_jobs=50)]
    assert got[:3] == [high, mid, low_old]
    assert got[3:] == sorted([*same_ms, explicit_zero])


def test_reentries_keep_their_original_place():
    state, clock = make_state()
    [first] = enqueue_ids(state, job())
    [(_, attempt, _)] = reserve(state)
    clock.advance_ms(5)
    [second] = enqueue_ids(state, job())
    assert state.nack(lease_req(first, attempt)) == (first, False)
    got = reserve(state, max_jobs=5)
    assert [(d[0].id, d[1]) for d in got] == [(first, 2), (second, 1)]


def test_scheduled_job_waits_until_due_then_joins_in_enqueue_order():
    state, clock = make_state()
    due = START_MS + 5_000
    [later] = enqueue_ids(state, job(scheduled_at=ms_sn(due)))
    view = state.job(later)
    assert view is not None and (view.state, view.due_ms) == ("scheduled", due)
    clock.advance_ms(1)
    [newer] = enqueue_ids(state, job())
    assert state.counts("q") == QueueCounts(1, 1, 0, 0)
    clock.advance_ms(4_998)
    assert state.counts("q") == QueueCounts(1, 1, 0, 0)
    clock.advance_ms(1)  # due <= now: promoted
    assert state.counts("q") == QueueCounts(2, 0, 0, 0)
    got = reserve(state, max_jobs=2)
    assert [d[0].id for d in got] == [later, newer]
    assert got[0][0].scheduled_at == ms_sn(due)


def test_past_or_present_scheduled_at_is_ready_and_kept_verbatim():
    state, _ = make_state()
    past = (123, 456)  # sub-millisecond nanos are echoed as sent
    now = ms_sn(START_MS)
    enqueue_ids(state, job(scheduled_at=past), job(scheduled_at=now))
    assert state.counts("q") == QueueCounts(2, 0, 0, 0)
    assert {d[0].scheduled_at for d in reserve(state, max_jobs=2)} == {past, now}


def test_promotion_happens_lazily_without_timers():
    # A wall clock without a running loop arms no timer: the next operation catches up.
    state, clock = make_state()
    enqueue_ids(state, job(scheduled_at=ms_sn(START_MS + 10)))
    clock._now += 10  # move time without running timers
    assert len(reserve(state)) == 1


# -- reserve -------------------------------------------------------------------------------


def test_reserve_drains_queues_in_request_order_up_to_max_jobs():
    state, _ = make_state()
    a = enqueue_ids(state, job("a"), job("a"))
    b = enqueue_ids(state, job("b"), job("b"))
    got = reserve(state, "b", "missing", "a", max_jobs=3)
    assert [d[0].queue for d in got] == ["b", "b", "a"]
    assert {d[0].id for d in got} == {*b, *a} - {sorted(a)[1]}
    assert [d[0].id for d in reserve(state, "a")] == [sorted(a)[1]]


def test_max_jobs_defaults_to_one_and_is_clamped():
    state, _ = make_state(max_reserve_batch=3)
    enqueue_ids(state, *(job() for _ in range(10)))
    assert len(reserve(state)) == 1
    assert len(reserve(state, max_jobs=100)) == 3
    assert state.prepare_reserve(reserve_req("q", max_jobs=2)).max_jobs == 2


def test_lease_is_clamped_to_the_smallest_cap_and_floored_to_one_ms():
    state, _ = make_state(queues=[QueueConfig("short", max_lease_duration_ms=1_000)])
    plan = state.prepare_reserve
    assert plan(reserve_req("q", lease=600)).lease_ms == 300_000
    assert plan(reserve_req("q", "short", lease=30)).lease_ms == 1_000
    assert plan(reserve_req("q", lease=0.25)).lease_ms == 250
    sub_ms = reserve_req("q")
    sub_ms.lease_duration = (0, 999)
    assert plan(sub_ms).lease_ms == 1


def test_wait_is_clamped_and_unset_means_no_wait():
    state, _ = make_state(max_wait_timeout_ms=2_000)
    assert state.prepare_reserve(reserve_req("q", wait=10)).wait_ms == 2_000
    assert state.prepare_reserve(reserve_req("q", wait=1.5)).wait_ms == 1_500
    assert state.prepare_reserve(reserve_req("q")).wait_ms == 0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"queues": []}, "queues must contain at least 1 item"),
        ({"queues": ["ok", ""]}, "queues item must not be empty"),
        ({"queues": [".."]}, 'queues item must not be "." or ".."'),
        ({"queues": ["a/b"]}, "queues item must not contain '/'"),
        ({"queues": ["a\x7f"]}, "queues item must not contain control characters"),
        ({"wait_timeout": (0, -1)}, "wait_timeout must not be negative"),
        ({"lease_duration": None}, "lease_duration is required"),
        ({"lease_duration": (0, 0)}, "lease_duration must be greater than 0"),
        ({"lease_duration": (1, -1_000_000_000)}, "lease_duration must be greater than 0"),
        ({"worker_id": ""}, "worker_id must not be empty"),
        ({"max_jobs": 0}, "max_jobs must be >= 1"),
        ({"queues": [""], "lease_duration": None}, "queues item must not be empty"),
        ({"lease_duration": None, "worker_id": ""}, "lease_duration is required"),
    ],
)
def test_reserve_validation_messages(kw, message):
    state, _ = make_state()
    req = reserve_req("q")
    for name, value in kw.items():
        setattr(req, name, value)
    err = rpc_error(state.prepare_reserve, req)
    assert (err.code, err.message) == (Code.INVALID_ARGUMENT, message)


def test_reserve_whole_request_errors():
    state, _ = make_state(max_queue_name_bytes=3, strict_queues=True, queues=[QueueConfig("a")])
    err = rpc_error(state.prepare_reserve, reserve_req(*["a"] * 33))
    assert (err.code, err.message) == (
        Code.INVALID_ARGUMENT,
        "reserve exceeds max_reserve_queues (32)",
    )
    err = rpc_error(state.prepare_reserve, reserve_req("a", 'b"\\c'))
    assert err.message == 'queue name "b\\"\\\\c" exceeds max_queue_name_bytes (3)'
    err = rpc_error(state.prepare_reserve, reserve_req("x", "a", 'q"', "x"))
    assert (err.code, err.message) == (
        Code.FAILED_PRECONDITION,
        'queue(s) not declared (strict mode): ["x", "q\\"", "x"]',
    )
    assert state.prepare_reserve(reserve_req("a")).queues == ("a",)


# -- leases, fencing, extend -------------------------------------------------------------


def test_lease_expiry_redelivers_then_dead_letters_on_the_last_attempt():
    state, clock = make_state(dead_letter_retention_ms=60_000)
    [jid] = enqueue_ids(state, job(max_attempts=2))
    [(_, attempt, expires)] = reserve(state, lease=30)
    clock.advance_ms(29_999)
    assert state.counts("q") == QueueCounts(0, 0, 1, 0)
    clock.advance_ms(1)
    view = state.job(jid)
    assert view is not None and (view.state, view.attempt) == ("ready", 2)
    late = rpc_error(state.ack, lease_req(jid, attempt))
    assert (late.code, late.message) == (Code.NOT_FOUND, "job not found")
    [(_, attempt2, _)] = reserve(state, lease=10)
    assert attempt2 == 2
    stale = rpc_error(state.ack, lease_req(jid, 1))
    assert (stale.code, stale.message) == (Code.FAILED_PRECONDITION, "attempt mismatch")
    clock.advance(10)
    assert state.job(jid) is None
    assert state.counts("q") == QueueCounts(0, 0, 0, 1)
    [record] = state.dead_letters()
    assert (record.cause, record.final_attempt, record.last_reason) == (LEASE_EXPIRED, 2, None)
    assert record.failed_ms == expires + 10_000  # swept at the deadline exactly
    assert rpc_error(state.ack, lease_req(jid, 2)).code == Code.NOT_FOUND


def test_ack_deletes_and_fences():
    state, _ = make_state()
    [jid] = enqueue_ids(state, job())
    assert rpc_error(state.ack, lease_req(jid, 1)).code == Code.NOT_FOUND  # still ready
    [(_, attempt, _)] = reserve(state)
    assert rpc_error(state.ack, lease_req(jid.upper(), attempt)).code == Code.NOT_FOUND
    assert rpc_error(state.ack, lease_req(UUID0, 1)).message == "job not found"
    assert rpc_error(state.ack, lease_req(jid, 2)).message == "attempt mismatch"
    assert state.ack(lease_req(jid, attempt, worker_id="w")) == jid
    assert state.counts("q") == QueueCounts(0, 0, 0, 0)
    assert rpc_error(state.ack, lease_req(jid, attempt)).code == Code.NOT_FOUND


@pytest.mark.parametrize(
    ("job_id", "attempt", "extra", "message"),
    [
        ("not-a-uuid", 1, {}, "job_id must be a UUID"),
        (UUID0.replace("-", "x"), 1, {}, "job_id must be a UUID"),
        (UUID0[:-1] + "g", 1, {}, "job_id must be a UUID"),
        (UUID0, 0, {}, "attempt must be >= 1"),
        (UUID0, 1, {"worker_id": ""}, "worker_id must not be empty"),
        ("x", 0, {"worker_id": ""}, "job_id must be a UUID"),
    ],
)
def test_fence_validation_messages(job_id, attempt, extra, message):
    state, _ = make_state()
    for call in (state.ack, state.nack):
        err = rpc_error(call, lease_req(job_id, attempt, **extra))
        assert (err.code, err.message) == (Code.INVALID_ARGUMENT, message)
    err = rpc_error(state.extend, lease_req(job_id, attempt, lease_duration=sn(1), **extra))
    assert err.message == message


def test_lease_request_specific_validation():
    state, _ = make_state()
    nack = state.nack
    assert rpc_error(nack, lease_req(UUID0, 1, retry=("unset",))).message == (
        "retry strategy is required"
    )
    assert rpc_error(nack, lease_req(UUID0, 1, retry=("delay", -1, 0))).message == (
        "retry delay must not be negative"
    )
    assert rpc_error(nack, lease_req(UUID0, 1, retry=("delay", 0, 0))).code == Code.NOT_FOUND
    extend = state.extend
    assert rpc_error(extend, lease_req(UUID0, 1)).message == "lease_duration is required"
    assert rpc_error(extend, lease_req(UUID0, 1, lease_duration=(0, 0))).message == (
        "lease_duration must be greater than 0"
    )
    assert rpc_error(extend, lease_req(UUID0, 1, lease_duration=(0, 1))).message == (
        "job not found"
    )
    upper = UUID0.upper().replace("0000-4", "ABCD-4")
    assert rpc_error(state.ack, lease_req(upper, 1)).code == Code.NOT_FOUND


def test_extend_is_measured_from_now():
    state, clock = make_state()
    [jid] = enqueue_ids(state, job())
    [(_, attempt, first_expiry)] = reserve(state, lease=30)
    clock.advance(10)
    assert state.extend(lease_req(jid, attempt, lease_duration=sn(5))) == (
        jid,
        START_MS + 15_000,
    )
    clock.advance_ms(4_999)
    assert state.counts("q").in_flight == 1
    clock.advance_ms(1)
    assert state.counts("q") == QueueCounts(1, 0, 0, 0)
    assert first_expiry == START_MS + 30_000
    clock.advance(30)  # the old lease's deadline passes without effect
    assert state.counts("q") == QueueCounts(1, 0, 0, 0)


def test_extend_clamps_to_the_jobs_queue_cap_only_when_over_every_cap():
    state, clock = make_state(queues=[QueueConfig("short", max_lease_duration_ms=5_000)])
    [long_job] = enqueue_ids(state, job("q"))
    [short_job] = enqueue_ids(state, job("short"))
    [(_, a1, _)] = reserve(state, "q")
    [(_, a2, _)] = reserve(state, "short")
    now = clock.now_ms()
    assert state.extend(lease_req(long_job, a1, lease_duration=sn(60)))[1] == now + 60_000
    assert state.extend(lease_req(long_job, a1, lease_duration=sn(900)))[1] == now + 300_000
    assert state.extend(lease_req(short_job, a2, lease_duration=sn(60)))[1] == now + 5_000
    assert state.extend(lease_req(short_job, a2, lease_duration=sn(4)))[1] == now + 4_000
    tiny = lease_req(short_job, a2, lease_duration=(0, 10))
    assert state.extend(tiny)[1] == now + 1
    over = rpc_error(state.extend, lease_req(UUID0, 1, lease_duration=sn(60)))
    assert (over.code, over.message) == (Code.NOT_FOUND, "job not found")
    wrong = rpc_error(state.extend, lease_req(short_job, a2 + 1, lease_duration=sn(60)))
    assert (wrong.code, wrong.message) == (Code.FAILED_PRECONDITION, "attempt mismatch")


# -- nack and retry policy -----------------------------------------------------------------


def test_nack_retries_until_attempts_are_exhausted():
    state, _ = make_state(dead_letter_retention_ms=1)
    [jid] = enqueue_ids(state, job(max_attempts=2))
    [(_, attempt, _)] = reserve(state)
    assert state.nack(lease_req(jid, attempt, retry=("default",))) == (jid, False)
    assert state.counts("q") == QueueCounts(1, 0, 0, 0)
    [(_, attempt, _)] = reserve(state)
    assert attempt == 2
    assert state.nack(lease_req(jid, 2, reason="boom")) == (jid, True)
    [record] = state.dead_letters()
    assert (record.cause, record.final_attempt, record.last_reason) == (
        ATTEMPTS_EXHAUSTED,
        2,
        "boom",
    )


def test_nack_dead_letter_directive_and_retention_off():
    state, _ = make_state(dead_letter_retention_ms=60_000)
    [jid] = enqueue_ids(state, job())
    reserve(state)
    assert state.nack(lease_req(jid, 1, retry=("dead_letter",), reason="")) == (jid, True)
    [record] = state.dead_letters()
    assert (record.cause, record.final_attempt, record.last_reason) == (REJECTED, 1, "")

    off, _ = make_state()
    [jid] = enqueue_ids(off, job())
    reserve(off)
    assert off.nack(lease_req(jid, 1, retry=("dead_letter",))) == (jid, True)
    assert off.job(jid) is None and off.dead_letters() == []
    assert off.counts("q") == QueueCounts(0, 0, 0, 0)


def test_nack_with_delay_schedules_and_clamps_to_the_horizon():
    state, clock = make_state(queues=[QueueConfig("h", max_schedule_horizon_ms=10_000)])
    [a] = enqueue_ids(state, job("q"))
    [b] = enqueue_ids(state, job("h"))
    reserve(state, "q")
    reserve(state, "h")
    now = clock.now_ms()
    assert state.nack(lease_req(a, 1, retry=("delay", 60, 500_000))) == (a, False)
    assert state.nack(lease_req(b, 1, retry=("delay", 60, 0))) == (b, False)
    assert state.job(a).due_ms == now + 60_000
    assert state.job(b).due_ms == now + 10_000
    assert state.counts("q") == QueueCounts(0, 1, 0, 0)
    clock.advance(10)
    assert state.counts("h") == QueueCounts(1, 0, 0, 0)
    [(_, attempt, _)] = reserve(state, "h")
    assert attempt == 2


def test_default_retry_policy_with_exponential_backoff_cap_and_jitter():
    queue = QueueConfig(
        "r",
        retry_delay_ms=1_000,
        retry_backoff="exponential",
        retry_delay_max_ms=5_000,
        default_max_attempts=10,
    )
    state, clock = make_state(queues=[queue])
    [jid] = enqueue_ids(state, job("r"))
    for attempt, grown in [(1, 1_000), (2, 2_000), (3, 4_000), (4, 8_000)]:
        [(_, got, _)] = reserve(state, "r")
        assert got == attempt
        now = clock.now_ms()
        capped = min(grown, 5_000)
        expected = capped - retry_jitter_hash(jid, attempt) % (capped // 4 + 1)
        assert capped - capped // 4 <= expected <= capped
        assert state.nack(lease_req(jid, attempt)) == (jid, False)
        assert state.job(jid).due_ms == now + expected
        clock.advance_ms(expected)
    assert state.counts("r") == QueueCounts(1, 0, 0, 0)


def test_retry_policy_cap_includes_the_schedule_horizon_and_none_backoff():
    queue = QueueConfig("r", retry_delay_ms=4_000, max_schedule_horizon_ms=2_000)
    state, clock = make_state(queues=[queue], retry_delay_ms=0)
    [jid] = enqueue_ids(state, job("r"))
    reserve(state, "r")
    state.nack(lease_req(jid, 1))
    assert state.job(jid).due_ms == clock.now_ms() + 2_000 - retry_jitter_hash(jid, 1) % 501
    # Undeclared queues keep the global policy: immediate retry.
    [other] = enqueue_ids(state, job("q"))
    reserve(state, "q")
    state.nack(lease_req(other, 1))
    assert state.job(other).state == "ready"


def test_siphash_matches_known_vectors():
    key0, key1 = 0x0706050403020100, 0x0F0E0D0C0B0A0908
    assert siphash(b"", key0, key1, 2, 4) == 0x726FDB47DD0E0E31
    assert siphash(bytes(range(15)), key0, key1, 2, 4) == 0xA129CA6149BE45E5
    # SipHash-1-3 with zero keys, as Rust's DefaultHasher::new().
    assert siphash(b"") == 0xD1FBA762150C532C
    assert siphash(b"\x00") == 0x68A914128E01E473
    assert siphash(b"siphash") == 0x8264CEECCB16BCBE
    assert siphash(b"digest-sip_hash") == 0xCE31007E34130C0A
    job_id = "6f1c1f0e-4c1f-4d55-9a0e-1d3b2c4e5f60"
    expected = siphash(job_id.encode() + b"\xff" + (7).to_bytes(4, "little"))
    assert retry_jitter_hash(job_id, 7) == expected


# -- dead letters ----------------------------------------------------------------------------


def _dead_letter(state: QueueState, queue: str, **job_fields: object) -> str:
    [jid] = enqueue_ids(state, job(queue, **job_fields))
    [(_, attempt, _)] = reserve(state, queue)
    state.nack(lease_req(jid, attempt, retry=("dead_letter",), reason=f"bad {queue}"))
    return jid


def test_drain_is_oldest_first_destructive_filtered_and_clamped():
    state, clock = make_state(dead_letter_retention_ms=3_600_000, max_reserve_batch=2)
    a1 = _dead_letter(state, "aa")
    clock.advance_ms(1)
    b1 = _dead_letter(state, "b")
    a2 = _dead_letter(state, "aa")  # same ms as b1: the shorter queue name sorts first
    clock.advance_ms(1)
    b2 = _dead_letter(state, "b", payload=(b"p", "raw"))
    assert state.counts("b") == QueueCounts(0, 0, 0, 2)
    [first] = state.drain(None, None)
    assert (first.job.id, first.job.queue, first.failed_ms) == (a1, "aa", START_MS)
    assert [r.job.id for r in state.drain(None, 100)] == [b1, a2]
    assert [r.job.id for r in state.drain("b", 5)] == [b2]
    assert state.drain(None, 5) == []
    assert state.counts("b") == QueueCounts(0, 0, 0, 0)


def test_drain_record_fields():
    state, clock = make_state(dead_letter_retention_ms=60_000)
    custom = {"k": 1}
    jid = _dead_letter(state, "q", payload=(b"p", "raw"), custom=custom, priority=2)
    [record] = state.drain("q", 1)
    assert (record.cause, record.failed_ms, record.final_attempt) == (REJECTED, START_MS, 1)
    assert record.last_reason == "bad q"
    job_record = record.job
    assert (job_record.id, job_record.queue, job_record.payload) == (jid, "q", (b"p", "raw"))
    assert (job_record.custom, job_record.priority) == (custom, 2)


def test_drain_scans_at_most_sweep_limit_records():
    state, _ = make_state(dead_letter_retention_ms=60_000, sweep_limit=2)
    _dead_letter(state, "a")
    _dead_letter(state, "a")
    wanted = _dead_letter(state, "b")
    assert state.drain("b", 10) == []
    assert len(state.drain("a", 10)) == 2
    assert [r.job.id for r in state.drain("b", 10)] == [wanted]


def test_drain_validation_and_retention_off():
    state, _ = make_state()
    assert rpc_error(state.drain, "", None).message == "queue must not be empty"
    assert rpc_error(state.drain, None, 0).message == "max must be >= 1"
    _dead_letter(state, "q")
    assert state.drain(None, 10) == []
    assert state.counts("q") == QueueCounts(0, 0, 0, 0)


def test_dead_letters_expire_after_the_retention():
    state, clock = make_state(dead_letter_retention_ms=10_000)
    _dead_letter(state, "q")
    clock.advance_ms(9_999)
    assert state.counts("q").dead == 1
    clock.advance_ms(1)
    assert state.counts("q").dead == 0
    assert state.drain(None, 10) == []


# -- idempotency ---------------------------------------------------------------------------


def test_dedup_per_queue_within_the_window():
    state, clock = make_state(dedup_window_ms=1_000)
    [original] = enqueue_ids(state, job(idempotency_key="k"))
    [other_queue] = enqueue_ids(state, job("other", idempotency_key="k"))
    assert other_queue != original
    clock.advance_ms(500)
    assert state.enqueue_batch([job(job_type="ignored", idempotency_key="k")]) == [(original, True)]
    clock.advance_ms(499)
    assert state.enqueue_batch([job(idempotency_key="k")]) == [(original, True)]
    clock.advance_ms(1)  # deadline = enqueue + window; hits did not refresh it
    [(fresh, dedup)] = state.enqueue_batch([job(idempotency_key="k")])
    assert (dedup, fresh != original) == (False, True)
    assert state.dedup_record("q", "k") == (fresh, START_MS + 1_000 + 1_000)


def test_dedup_inside_one_batch_and_after_ack():
    state, _ = make_state()
    [(first, dedup1), (second, dedup2)] = state.enqueue_batch(
        [job(idempotency_key="k"), job(idempotency_key="k")]
    )
    assert (first, dedup1, dedup2) == (second, False, True)
    [(_, attempt, _)] = reserve(state)
    state.ack(lease_req(first, attempt))
    assert state.enqueue_batch([job(idempotency_key="k")]) == [(first, True)]
    assert state.counts("q") == QueueCounts(0, 0, 0, 0)


def test_dedup_inside_enqueue_atomic():
    state, _ = make_state()
    result = state.enqueue_atomic([job(idempotency_key="k"), job(), job(idempotency_key="k")])
    assert result.errors is None and result.acks is not None
    (first, d1), (_, d2), (third, d3) = result.acks
    assert (d1, d2, d3, third) == (False, False, True, first)
    assert state.counts("q").ready == 2


def test_invalid_duplicate_is_rejected_not_deduplicated():
    state, _ = make_state()
    enqueue_ids(state, job(idempotency_key="k"))
    [rejection] = state.enqueue_batch([job(idempotency_key="k", priority=10)])
    assert rejection == errors.InvalidRequest("priority must be <= 9")


def test_per_queue_dedup_window():
    state, clock = make_state(queues=[QueueConfig("short", dedup_window_ms=10)])
    [a] = enqueue_ids(state, job("short", idempotency_key="k"))
    [b] = enqueue_ids(state, job("q", idempotency_key="k"))
    clock.advance_ms(10)
    assert state.enqueue_batch([job("short", idempotency_key="k")])[0][0] != a
    assert state.enqueue_batch([job("q", idempotency_key="k")]) == [(b, True)]


# -- validation and limits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"queue": ""}, "queue must not be empty"),
        ({"queue": "."}, 'queue must not be "." or ".."'),
        ({"queue": ".."}, 'queue must not be "." or ".."'),
        ({"queue": "a/b"}, "queue must not contain '/'"),
        ({"queue": "a\nb"}, "queue must not contain control characters"),
        ({"queue": "a\x85"}, "queue must not contain control characters"),
        ({"job_type": ""}, "job_type must not be empty"),
        ({"payload": (b"", "json")}, "payload.data must not be empty"),
        ({"payload": (b"x", "")}, "payload.encoding must not be empty"),
        ({"idempotency_key": ""}, "idempotency_key must not be empty"),
        ({"priority": 10}, "priority must be <= 9"),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"trace": ("", "s")}, "trace_context.traceparent must not be empty"),
        ({"custom": {"": 1, "a": None}}, "custom key must not be empty"),
        ({"custom": {"b": None, "a": None}}, "custom[a] must set a value"),
        # first failure wins
        ({"queue": "", "job_type": ""}, "queue must not be empty"),
        ({"payload": (b"", ""), "priority": 10}, "payload.data must not be empty"),
        ({"max_attempts": 0, "trace": ("", None)}, "max_attempts must be >= 1"),
    ],
)
def test_structural_rejections(fields, message):
    state, _ = make_state()
    req = job()
    for name, value in fields.items():
        setattr(req, name, value)
    assert state.enqueue_batch([req]) == [errors.InvalidRequest(message)]
    assert state.counts("q") == QueueCounts(0, 0, 0, 0)


def test_strict_mode_rejects_undeclared_queues_after_structural_checks():
    state, _ = make_state(strict_queues=True, queues=[QueueConfig("a")])
    results = state.enqueue_batch(
        [job("b", "x" * 300), job("b", priority=10), job("a"), job("a", "x" * 300)]
    )
    assert results[0] == errors.UnknownQueue("b")
    assert results[1] == errors.InvalidRequest("priority must be <= 9")
    assert isinstance(results[2], tuple)
    assert results[3] == errors.JobTypeNameTooLong(256, 300)


def test_limit_rejections_in_the_servers_order():
    queue = QueueConfig(
        "lim",
        max_payload_bytes=4,
        allowed_encodings=["json"],
        allowed_job_types=["t", "u"],
        max_custom_entries=3,
        max_custom_key_bytes=2,
        max_custom_total_bytes=20,
    )
    state, _ = make_state(queues=[queue])
    cases = [
        (job("é" * 257), errors.QueueNameTooLong(512, 514)),
        (job("lim", "ü" * 129, payload=(b"toolong", "x")), errors.JobTypeNameTooLong(256, 258)),
        (job("lim", "v", idempotency_key="k" * 300), errors.JobTypeNotAllowed("v", ["t", "u"])),
        (
            job("lim", idempotency_key="k" * 257, payload=(b"toolong", "x")),
            errors.IdempotencyKeyTooLong(256, 257),
        ),
        (job("lim", payload=(b"12345", "xml")), errors.PayloadTooLarge(4, 5)),
        (job("lim", payload=(b"1234", "xml")), errors.EncodingNotAllowed("xml", ["json"])),
        (
            job("lim", custom={"a": 1, "b": 2, "c": 3, "toolong": 4}),
            errors.CustomEntriesTooMany(3, 4),
        ),
        (job("lim", custom={"zzz": 1, "yyyy": 2}), errors.CustomKeyTooLong("yyyy", 2, 4)),
        (
            job("lim", custom={"ab": "xyzé", "n": 1, "f": 1.5}),
            errors.CustomMapTooLarge(20, 2 + 5 + 1 + 8 + 1 + 8),
        ),
    ]
    for req, expected in cases:
        assert state.enqueue_batch([req]) == [expected], expected
    assert isinstance(state.enqueue_batch([job("lim", custom={"b": True, "i": 1})])[0], tuple)
    assert isinstance(state.enqueue_batch([job("lim", "u", payload=(b"1234", "json"))])[0], tuple)


def test_encoding_allow_list_empty_rejects_every_payload_but_not_payloadless_jobs():
    state, _ = make_state(allowed_encodings=[])
    assert state.enqueue_batch([job(payload=(b"x", "json"))]) == [
        errors.EncodingNotAllowed("json", [])
    ]
    assert isinstance(state.enqueue_batch([job()])[0], tuple)


def test_scheduled_too_far_uses_the_horizon_inclusively_and_echoes_the_timestamp():
    state, _ = make_state(max_schedule_horizon_ms=60_000)
    limit = START_MS + 60_000
    assert isinstance(state.enqueue_batch([job(scheduled_at=ms_sn(limit))])[0], tuple)
    over = (limit // 1000, (limit % 1000) * 1_000_000 + 1_000_001)
    [rejection] = state.enqueue_batch([job(scheduled_at=over)])
    assert isinstance(rejection, RawScheduledTooFar)
    assert rejection.horizon == timedelta(seconds=60)
    assert rejection.wire_actual == over
    assert rejection.actual == EPOCH + timedelta(milliseconds=limit + 1)
    [huge] = state.enqueue_batch([job(scheduled_at=(10**15, 0))])
    assert isinstance(huge, RawScheduledTooFar) and huge.wire_actual == (10**15, 0)


def test_max_attempts_and_priority_defaults_and_ceiling():
    queue = QueueConfig("c", default_max_attempts=7, max_attempts_ceiling=8, default_priority=4)
    state, _ = make_state(queues=[queue])
    enqueue_ids(state, job("q", max_attempts=500), job("c"), job("c", max_attempts=9))
    enqueue_ids(state, job("c", priority=0))
    got = [(d[0].max_attempts, d[0].priority) for d in reserve(state, "q", "c", max_jobs=9)]
    assert (got[0], sorted(got[1:3]), got[3]) == ((100, 0), [(7, 4), (8, 4)], (7, 0))


def test_whole_batch_errors():
    state, _ = make_state(max_enqueue_batch=2)
    for call in (state.enqueue_batch, state.enqueue_atomic):
        err = rpc_error(call, [])
        assert (err.code, err.message) == (
            Code.INVALID_ARGUMENT,
            "batch must contain at least one job",
        )
        err = rpc_error(call, [job(), job(), job()])
        assert err.message == "batch exceeds max_enqueue_batch (2)"
    default, _ = make_state()
    assert rpc_error(default.enqueue_batch, [job()] * 257).message == (
        "batch exceeds max_enqueue_batch (256)"
    )
    assert len(default.enqueue_batch([job()] * 256)) == 256


# -- queue depth -------------------------------------------------------------------------------


def test_queue_full_counts_ready_scheduled_and_in_flight_but_not_dead():
    state, clock = make_state(max_queue_depth=3, dead_letter_retention_ms=60_000)
    results = state.enqueue_batch(
        [job(), job(scheduled_at=ms_sn(START_MS + 9_000)), job(), job(), job("other")]
    )
    assert results[3] == errors.QueueFull("q", 3)
    assert isinstance(results[4], tuple)
    [(jid, attempt, _)] = [(d[0].id, d[1], d[2]) for d in reserve(state)]
    assert state.enqueue_batch([job()]) == [errors.QueueFull("q", 3)]
    state.nack(lease_req(jid, attempt, retry=("dead_letter",)))
    assert state.counts("q") == QueueCounts(1, 1, 0, 1)
    assert isinstance(state.enqueue_batch([job()])[0], tuple)
    assert clock.now_ms() == START_MS


def test_dedup_hits_bypass_queue_full():
    state, _ = make_state(queues=[QueueConfig("q", max_queue_depth=1)])
    [jid] = enqueue_ids(state, job(idempotency_key="k"))
    assert state.enqueue_batch([job(idempotency_key="k"), job()]) == [
        (jid, True),
        errors.QueueFull("q", 1),
    ]


def test_atomic_checks_capacity_up_front_and_writes_nothing():
    state, _ = make_state(queues=[QueueConfig("q", max_queue_depth=2)])
    enqueue_ids(state, job(idempotency_key="k"))
    result = state.enqueue_atomic([job(idempotency_key="k"), job("other"), job()])
    assert result.acks is None
    assert result.errors == [(0, errors.QueueFull("q", 2)), (2, errors.QueueFull("q", 2))]
    assert state.counts("other") == QueueCounts(0, 0, 0, 0)
    assert state.enqueue_atomic([job("other"), job()]).errors is None


def test_atomic_lists_every_invalid_job_and_writes_nothing():
    state, _ = make_state()
    result = state.enqueue_atomic([job(), job(priority=10), job(), job(job_type="")])
    assert result.acks is None
    assert result.errors == [
        (1, errors.InvalidRequest("priority must be <= 9")),
        (3, errors.InvalidRequest("job_type must not be empty")),
    ]
    assert state.counts("q") == QueueCounts(0, 0, 0, 0)


# -- server info -----------------------------------------------------------------------------


def test_server_info_reports_the_global_defaults():
    state, _ = make_state(queues=[QueueConfig("q", max_payload_bytes=10)])
    info = state.server_info()
    assert info.version == "0.1.0"
    assert info.supported_protocol_versions == ["v1"]
    assert info.server_time == datetime.fromtimestamp(START_MS / 1000, timezone.utc)
    assert (info.restricts_encodings, info.allowed_encodings) == (False, [])
    assert (info.max_payload_bytes, info.max_custom_entries) == (1_048_576, 64)
    assert (info.max_custom_total_bytes, info.max_custom_key_bytes) == (16_384, 256)
    assert (info.max_queue_name_bytes, info.max_job_type_bytes) == (512, 256)
    assert info.max_idempotency_key_bytes == 256
    assert info.max_schedule_horizon == timedelta(seconds=2_592_000)
    assert (info.max_enqueue_batch, info.max_reserve_batch, info.max_reserve_queues) == (
        256,
        256,
        32,
    )
    assert info.max_wait_timeout == timedelta(seconds=300)
    assert info.max_lease_duration == timedelta(seconds=300)
    assert (info.strict_queues, info.dead_letter_retention_enabled) == (False, False)
    other, _ = make_state(
        allowed_encodings=["json"], dead_letter_retention_ms=1, strict_queues=True
    )
    info = other.server_info()
    assert (info.restricts_encodings, info.allowed_encodings) == (True, ["json"])
    assert (info.strict_queues, info.dead_letter_retention_enabled) == (True, True)


# -- long poll ---------------------------------------------------------------------------------


async def _started(state: QueueState, req) -> asyncio.Task:
    task = asyncio.ensure_future(state.reserve(req))
    for _ in range(3):
        await asyncio.sleep(0)
    assert state.waiter_count == 1
    return task


async def test_long_poll_wakes_on_enqueue():
    state, _ = make_state()
    task = await _started(state, reserve_req("a", "b", wait=5))
    [jid] = enqueue_ids(state, job("b"))
    [(record, attempt, _)] = await asyncio.wait_for(task, 1)
    assert (record.id, attempt, state.waiter_count) == (jid, 1, 0)


async def test_long_poll_wakes_when_a_scheduled_job_is_due():
    state, clock = make_state()
    enqueue_ids(state, job(scheduled_at=ms_sn(START_MS + 1_500)))
    task = await _started(state, reserve_req("q", wait=5))
    clock.advance_ms(1_499)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance_ms(1)
    assert len(await asyncio.wait_for(task, 1)) == 1


async def test_long_poll_wakes_on_lease_redelivery_and_delayed_nack():
    state, clock = make_state()
    [a, b] = enqueue_ids(state, job(), job())
    reserve(state, lease=1, max_jobs=2)
    state.nack(lease_req(b, 1, retry=("delay", 3, 0)))
    task = await _started(state, reserve_req("q", wait=60))
    clock.advance(1)
    [(record, attempt, _)] = await asyncio.wait_for(task, 1)
    assert (record.id, attempt) == (a, 2)
    task = await _started(state, reserve_req("q", wait=60))
    clock.advance(2)
    [(record, attempt, _)] = await asyncio.wait_for(task, 1)
    assert (record.id, attempt) == (b, 2)


async def test_long_poll_times_out_empty_at_the_clamped_deadline():
    state, clock = make_state(max_wait_timeout_ms=1_000)
    task = await _started(state, reserve_req("q", wait=30))
    clock.advance_ms(999)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance_ms(1)
    assert await asyncio.wait_for(task, 1) == []
    assert state.waiter_count == 0
    assert await state.reserve(reserve_req("q")) == []  # no wait at all


async def test_close_answers_pending_and_new_long_polls_empty():
    state, clock = make_state()
    task = await _started(state, reserve_req("q", wait=60))
    state.close()
    assert await asyncio.wait_for(task, 1) == []
    assert await asyncio.wait_for(state.reserve(reserve_req("q", wait=60)), 1) == []
    enqueue_ids(state, job())
    assert len(await state.reserve(reserve_req("q", wait=60))) == 1
    assert clock.pending_timers() == 0


async def test_cancelled_long_poll_leaves_nothing_behind():
    state, clock = make_state()
    task = await _started(state, reserve_req("a", "a", "b", wait=60))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state.waiter_count == 0
    assert clock.pending_timers() == 0
    assert state.stats()["queues"] == 0


# -- clocks ------------------------------------------------------------------------------------


def test_manual_clock_runs_due_timers_in_order_at_their_deadlines():
    clock = ManualClock(1_000)
    seen: list[tuple[str, int]] = []
    clock.call_at(1_500, lambda: seen.append(("b", clock.now_ms())))
    clock.call_at(1_200, lambda: seen.append(("a", clock.now_ms())))
    cancelled = clock.call_at(1_300, lambda: seen.append(("x", clock.now_ms())))
    clock.call_at(9_000, lambda: seen.append(("late", clock.now_ms())))
    cancelled.cancel()
    clock.advance(0.6)
    assert seen == [("a", 1_200), ("b", 1_500)]
    assert (clock.now_ms(), clock.pending_timers()) == (1_600, 1)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_real_clock_never_goes_backwards(monkeypatch):
    clock = RealClock()
    now = clock.now_ms()
    monkeypatch.setattr("time.time_ns", lambda: (now - 5_000) * 1_000_000)
    assert clock.now_ms() == now
    clock.call_at(now, pytest.fail).cancel()  # no running loop: nothing is armed


async def test_real_clock_timers_run_on_the_loop():
    clock = RealClock()
    fired = asyncio.Event()
    clock.call_at(clock.now_ms() + 20, fired.set)
    await asyncio.wait_for(fired.wait(), 2)
