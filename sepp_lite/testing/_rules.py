"""The in-process server's request rules: what makes a request invalid, and what makes
the server refuse a job, as functions of the decoded request and the limits.

Each returns the problem, a message for INVALID_ARGUMENT or a ``JobRejection`` value,
or ``None``: the first one wins, in the real server's order (its src/validate.rs and
limit checks; src/pb.rs for how it reads wire values). ``QueueState`` (``_state.py``)
raises or answers with what they return, and keeps what needs its state: strict mode's
declared queues, dedup records, queue depths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Optional

from sepp_lite import errors
from sepp_lite._codec.enqueue import EnqueueIn
from sepp_lite._codec.job import ReserveIn
from sepp_lite._codec.job_rejection import RawScheduledTooFar
from sepp_lite._codec.lease import LeaseIn
from sepp_lite._time import ms_to_datetime
from sepp_lite.testing._config import EffectiveLimits, Limits
from sepp_lite.testing._names import queue_name_error, rust_debug
from sepp_lite.testing._siphash import retry_jitter_hash

__all__ = [
    "I64_MAX",
    "batch_error",
    "drain_error",
    "duration_ms",
    "extend_error",
    "fence_error",
    "is_uuid",
    "job_error",
    "limit_rejection",
    "nack_error",
    "policy_delay_ms",
    "reserve_error",
    "reserve_limit_error",
    "timestamp_ms",
    "utf8_len",
]

_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
_I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
_HEX = frozenset("0123456789abcdefABCDEF")


# ---------------------------------------------------------------------------------------
# Wire-value conversions (src/pb.rs)


def timestamp_ms(seconds: int, nanos: int) -> int:
    """A Timestamp as ms: normalised, floored, saturating like the server's i64."""
    ms = (seconds * 1_000_000_000 + nanos) // 1_000_000
    return min(max(ms, _I64_MIN), I64_MAX)


def duration_ms(value: Optional[tuple[int, int]]) -> int:
    """A Duration as ms: negative clamps to 0, sub-ms truncated; absent = 0."""
    if value is None:
        return 0
    total = value[0] * 1_000_000_000 + value[1]
    return min(max(total, 0) // 1_000_000, _U64_MAX)


def _total_nanos(value: tuple[int, int]) -> int:
    return value[0] * 1_000_000_000 + value[1]


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


# ---------------------------------------------------------------------------------------
# Request validation (src/validate.rs): the first failure wins.


def _payload_error(payload: Optional[tuple[bytes, str]]) -> Optional[str]:
    if payload is None:
        return None
    if not payload[0]:
        return "payload.data must not be empty"
    if not payload[1]:
        return "payload.encoding must not be empty"
    return None


def _custom_error(custom: Mapping[str, object]) -> Optional[str]:
    for key in sorted(custom):
        if not key:
            return "custom key must not be empty"
        if custom[key] is None:
            return f"custom[{key}] must set a value"
    return None


def job_error(job: EnqueueIn) -> Optional[str]:
    why = queue_name_error(job.queue)
    if why is not None:
        return f"queue {why}"
    if not job.job_type:
        return "job_type must not be empty"
    payload = _payload_error(job.payload)
    if payload is not None:
        return payload
    if job.idempotency_key == "":
        return "idempotency_key must not be empty"
    if job.priority is not None and job.priority > 9:
        return "priority must be <= 9"
    if job.max_attempts == 0:
        return "max_attempts must be >= 1"
    if job.trace is not None and not job.trace[0]:
        return "trace_context.traceparent must not be empty"
    return _custom_error(job.custom)


def reserve_error(req: ReserveIn) -> Optional[str]:
    if not req.queues:
        return "queues must contain at least 1 item"
    for queue in req.queues:
        why = queue_name_error(queue)
        if why is not None:
            return f"queues item {why}"
    if req.wait_timeout is not None and _total_nanos(req.wait_timeout) < 0:
        return "wait_timeout must not be negative"
    lease = _lease_error(req.lease_duration)
    if lease is not None:
        return lease
    if req.worker_id == "":
        return "worker_id must not be empty"
    if req.max_jobs == 0:
        return "max_jobs must be >= 1"
    return None


def _lease_error(lease: Optional[tuple[int, int]]) -> Optional[str]:
    if lease is None:
        return "lease_duration is required"
    if _total_nanos(lease) <= 0:
        return "lease_duration must be greater than 0"
    return None


def is_uuid(text: str) -> bool:
    """The canonical hyphenated UUID form, either case (``string.uuid``)."""
    if len(text) != 36:
        return False
    for index, char in enumerate(text):
        if index in (8, 13, 18, 23):
            if char != "-":
                return False
        elif char not in _HEX:
            return False
    return True


def fence_error(req: LeaseIn) -> Optional[str]:
    if not is_uuid(req.job_id):
        return "job_id must be a UUID"
    if req.attempt < 1:
        return "attempt must be >= 1"
    return None


def nack_error(req: LeaseIn) -> Optional[str]:
    fence = fence_error(req)
    if fence is not None:
        return fence
    retry = req.retry
    if retry is not None:
        if retry[0] == "unset":
            return "retry strategy is required"
        if retry[0] == "delay" and _total_nanos(retry[1:3]) < 0:  # type: ignore[arg-type]
            return "retry delay must not be negative"
    return None


def extend_error(req: LeaseIn) -> Optional[str]:
    return fence_error(req) or _lease_error(req.lease_duration)


def batch_error(jobs: Sequence[EnqueueIn], limit: int) -> Optional[str]:
    """An EnqueueBatch or EnqueueAtomic that is empty, or longer than ``limit``."""
    if not jobs:
        return "batch must contain at least one job"
    if len(jobs) > limit:
        return f"batch exceeds max_enqueue_batch ({limit})"
    return None


def drain_error(queue: Optional[str], max_records: Optional[int]) -> Optional[str]:
    """A DrainDeadLetters with an empty queue name or a ``max`` below 1."""
    if queue is not None and not queue:
        return "queue must not be empty"
    if max_records is not None and max_records < 1:
        return "max must be >= 1"
    return None


# ---------------------------------------------------------------------------------------
# Limits: what the server refuses of a valid request


def reserve_limit_error(req: ReserveIn, g: Limits) -> Optional[str]:
    """A valid Reserve that asks for more queues, or longer queue names, than ``g``
    allows."""
    if len(req.queues) > g.max_reserve_queues:
        return f"reserve exceeds max_reserve_queues ({g.max_reserve_queues})"
    for name in req.queues:
        if utf8_len(name) > g.max_queue_name_bytes:
            return (
                f"queue name {rust_debug(name)} exceeds max_queue_name_bytes "
                f"({g.max_queue_name_bytes})"
            )
    return None


def limit_rejection(
    job: EnqueueIn, g: Limits, lim: EffectiveLimits, now: int
) -> Optional[errors.JobRejection]:
    """What refuses a valid ``job`` against the global limits ``g`` and its queue's
    ``lim`` at ``now``, in the server's order; ``None`` when it fits."""
    size = utf8_len(job.queue)
    if size > g.max_queue_name_bytes:
        return errors.QueueNameTooLong(g.max_queue_name_bytes, size)
    size = utf8_len(job.job_type)
    if size > g.max_job_type_bytes:
        return errors.JobTypeNameTooLong(g.max_job_type_bytes, size)
    if lim.allowed_job_types is not None and job.job_type not in lim.allowed_job_types:
        return errors.JobTypeNotAllowed(job.job_type, list(lim.allowed_job_types))
    key = job.idempotency_key
    if key is not None and utf8_len(key) > g.max_idempotency_key_bytes:
        return errors.IdempotencyKeyTooLong(g.max_idempotency_key_bytes, utf8_len(key))
    rejection = _payload_limit_error(job, lim) or _custom_limit_error(job.custom, lim)
    if rejection is not None:
        return rejection
    at = job.scheduled_at
    if at is not None and timestamp_ms(*at) > now + lim.max_schedule_horizon_ms:
        return _scheduled_too_far(at[0], at[1], lim.max_schedule_horizon_ms)
    return None


def _payload_limit_error(job: EnqueueIn, lim: EffectiveLimits) -> Optional[errors.JobRejection]:
    if job.payload is None:
        return None
    data, encoding = job.payload
    if len(data) > lim.max_payload_bytes:
        return errors.PayloadTooLarge(lim.max_payload_bytes, len(data))
    if lim.allowed_encodings is not None and encoding not in lim.allowed_encodings:
        return errors.EncodingNotAllowed(encoding, list(lim.allowed_encodings))
    return None


def _custom_limit_error(
    custom: Mapping[str, object], lim: EffectiveLimits
) -> Optional[errors.JobRejection]:
    if len(custom) > lim.max_custom_entries:
        return errors.CustomEntriesTooMany(lim.max_custom_entries, len(custom))
    for key in sorted(custom):
        size = utf8_len(key)
        if size > lim.max_custom_key_bytes:
            return errors.CustomKeyTooLong(key, lim.max_custom_key_bytes, size)
    size = _custom_bytes(custom)
    if size > lim.max_custom_total_bytes:
        return errors.CustomMapTooLarge(lim.max_custom_total_bytes, size)
    return None


def _custom_bytes(custom: Mapping[str, object]) -> int:
    total = 0
    for key, value in custom.items():
        total += utf8_len(key)
        if isinstance(value, str):
            total += utf8_len(value)
        elif isinstance(value, bool):
            total += 1
        else:
            total += 8
    return total


def _scheduled_too_far(seconds: int, nanos: int, horizon_ms: int) -> errors.JobRejection:
    try:
        actual = ms_to_datetime(timestamp_ms(seconds, nanos))
    except OverflowError:  # past year 9999; the wire value is echoed verbatim anyway
        actual = datetime.max.replace(tzinfo=timezone.utc)
    horizon = timedelta(milliseconds=min(horizon_ms, 86_399_999_999_999))
    return RawScheduledTooFar(horizon, actual, wire_actual=(seconds, nanos))


# ---------------------------------------------------------------------------------------
# A queue's retry policy


def policy_delay_ms(lim: EffectiveLimits, attempt: int, job_id: str) -> int:
    """The queue retry policy's delay for a nack without an explicit one."""
    base = lim.retry_delay_ms
    if base == 0:
        return 0
    grown = base
    if lim.retry_backoff == "exponential":
        shift = max(attempt - 1, 0)
        grown = _U64_MAX if shift >= 64 else min(base << shift, _U64_MAX)
    capped = min(grown, lim.retry_delay_max_ms, lim.max_schedule_horizon_ms)
    return capped - retry_jitter_hash(job_id, attempt) % (capped // 4 + 1)
