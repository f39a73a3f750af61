"""``QueueState.totals()``: the server's own running counts, which the fault and soak
tests compare with what the clients saw. Driven directly with a ManualClock."""

from __future__ import annotations

import pytest

from sepp_lite.testing import QueueState, RpcError
from tests.server_helpers import enqueue_ids, job, lease_req, make_state, reserve_req

ZERO = {
    "enqueued": 0,
    "deduplicated": 0,
    "delivered": 0,
    "acked": 0,
    "nacked": 0,
    "dead_lettered": 0,
    "lease_expired": 0,
}


def reserve(state: QueueState, lease: float = 10.0, max_jobs: int = 10) -> list:
    return state.reserve_once(
        state.prepare_reserve(reserve_req("q", lease=lease, max_jobs=max_jobs))
    )


def changed(state: QueueState) -> dict[str, int]:
    return {name: value for name, value in state.totals().items() if value}


def test_a_new_state_counts_nothing() -> None:
    state, _ = make_state()
    assert state.totals() == ZERO


def test_enqueue_counts_new_jobs_and_deduplicated_ones_apart() -> None:
    state, _ = make_state()
    enqueue_ids(state, job(idempotency_key="a"), job(idempotency_key="b"), job())
    assert changed(state) == {"enqueued": 3}
    results = state.enqueue_batch([job(idempotency_key="a"), job(idempotency_key="c")])
    assert [r[1] for r in results] == [True, False]  # type: ignore[index]
    atomic = state.enqueue_atomic([job(idempotency_key="b"), job(idempotency_key="d")])
    assert atomic.acks is not None and [dedup for _, dedup in atomic.acks] == [True, False]
    assert changed(state) == {"enqueued": 5, "deduplicated": 2}


def test_rejected_and_refused_enqueues_count_nothing() -> None:
    state, _ = make_state(strict_queues=True)
    assert state.enqueue_batch([job("undeclared")])[0] is not None
    assert state.enqueue_atomic([job("undeclared")]).acks is None
    with pytest.raises(RpcError):
        state.enqueue_batch([])
    assert state.totals() == ZERO


def test_deliveries_acks_nacks_and_dead_letters() -> None:
    state, _ = make_state()
    ids = enqueue_ids(state, *(job(max_attempts=2) for _ in range(4)))
    delivered = reserve(state)
    assert len(delivered) == 4
    state.ack(lease_req(ids[0], 1))
    assert state.nack(lease_req(ids[1], 1)) == (ids[1], False)  # retried now
    assert state.nack(lease_req(ids[2], 1, retry=("dead_letter",))) == (ids[2], True)
    assert changed(state) == {
        "enqueued": 4,
        "delivered": 4,
        "acked": 1,
        "nacked": 2,
        "dead_lettered": 1,
    }
    [(record, attempt, _)] = reserve(state)
    assert (record.id, attempt) == (ids[1], 2)
    assert state.nack(lease_req(ids[1], 2)) == (ids[1], True)  # its last attempt
    assert changed(state)["dead_lettered"] == 2
    assert changed(state)["nacked"] == 3
    assert changed(state)["delivered"] == 5


def test_failed_lease_calls_count_nothing() -> None:
    state, _ = make_state()
    [job_id] = enqueue_ids(state, job())
    reserve(state)
    before = state.totals()
    for call in (state.ack, state.nack):
        with pytest.raises(RpcError):
            call(lease_req(job_id, 2))  # attempt mismatch
    state.ack(lease_req(job_id, 1))
    with pytest.raises(RpcError):
        state.ack(lease_req(job_id, 1))  # not found any more
    assert state.totals() == {**before, "acked": 1}


def test_lease_expiries_count_whether_the_job_is_retried_or_dead_lettered() -> None:
    state, clock = make_state()
    [job_id] = enqueue_ids(state, job(max_attempts=2))
    reserve(state, lease=1)
    clock.advance(1.5)  # attempt 1 lapses: back to ready
    assert changed(state) == {"enqueued": 1, "delivered": 1, "lease_expired": 1}
    [(_, attempt, _)] = reserve(state, lease=1)
    assert attempt == 2
    clock.advance(1.5)  # the last attempt lapses: dead-lettered
    assert changed(state) == {
        "enqueued": 1,
        "delivered": 2,
        "lease_expired": 2,
        "dead_lettered": 1,
    }
    assert state.job(job_id) is None


def test_an_extended_lease_does_not_expire() -> None:
    state, clock = make_state()
    [job_id] = enqueue_ids(state, job())
    reserve(state, lease=1)
    clock.advance(0.8)
    state.extend(lease_req(job_id, 1, lease_duration=(5, 0)))
    clock.advance(1.0)
    assert state.totals()["lease_expired"] == 0
    assert state.totals() == state.totals()  # reading does not change them


def test_totals_is_a_copy() -> None:
    state, _ = make_state()
    totals = state.totals()
    totals["acked"] = 99
    assert state.totals()["acked"] == 0
