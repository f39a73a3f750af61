"""The one retry loop and the one retry decision.

The loop: backoff delays from a RetryPolicy, one deadline for all attempts. The
decision: which RPCs the policy applies to (:data:`RETRIED_BY_POLICY`), which failures
it tries again (:func:`is_retryable`), which reserve refusals no retry can cure
(:func:`is_permanent`), and the worker's fixed waits between reserves. Whether a failed
call may have been applied (``ClientError.ambiguous``) is set where failures are
mapped, by ``errors.AMBIGUOUS_CODES``: that mapping is ``errors``' and ``errors`` must
not import this module, which imports it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from typing import Callable, Optional, TypeVar

from sepp_lite import _log
from sepp_lite.errors import (
    ClientError,
    ConnectError,
    SeppError,
    Status,
    TransportError,
    UnknownQueuesError,
)
from sepp_lite.types import RetryPolicy

T = TypeVar("T")
# Told of each retry of a call, before its backoff: the delay, and the failure retried.
OnRetry = Callable[[float, SeppError], None]
logger = _log.logger()

RETRYABLE_CODES = frozenset(
    {Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.ABORTED, Status.RESOURCE_EXHAUSTED}
)

# The statuses of a call that found no server to answer it.
UNREACHABLE_CODES = frozenset({Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED})

# Whether the client's RetryPolicy applies to each RPC. A reserve's lost answer would
# strand the jobs it leased (and its long poll is a wait of its own); a drain deletes
# what it returns, so a repeat after a lost answer would lose those records for good.
RETRIED_BY_POLICY: dict[str, bool] = {
    "EnqueueBatch": True,
    "EnqueueAtomic": True,
    "Reserve": False,
    "Ack": True,
    "Nack": True,
    "Extend": True,
    "GetServerInfo": True,
    "DrainDeadLetters": False,
}

# Reserve refusals no retry can cure: a wrong or missing key, a key without the right,
# a request the server finds malformed (a queue name it refuses, say).
PERMANENT_CODES = frozenset(
    {Status.UNAUTHENTICATED, Status.PERMISSION_DENIED, Status.INVALID_ARGUMENT}
)

# The worker's waits between reserves. After a failed reserve it waits its
# reserve_error_backoff (this by default, as sepp-py). An empty reserve answered in
# under EARLY_EMPTY_S (a server shutting down answers at once) is followed by
# EARLY_EMPTY_PAUSE_S, so the poll loop cannot spin.
DEFAULT_RESERVE_ERROR_BACKOFF = timedelta(seconds=1)
# How long a Worker starting up keeps trying to reach a server it cannot reach (a
# compose or Kubernetes start order starts workers and server together).
DEFAULT_WAIT_FOR_SERVER = timedelta(seconds=60)
EARLY_EMPTY_S = 0.1
EARLY_EMPTY_PAUSE_S = 0.25


def is_retryable(error: SeppError, *, all_keyed: bool = True) -> bool:
    """Whether the retry policy may try ``error``'s call again. Without idempotency keys
    on every job, a call the server may have applied is not repeated."""
    if not isinstance(error, ClientError) or error.code not in RETRYABLE_CODES:
        return False
    return all_keyed or not error.ambiguous


def is_permanent(error: SeppError) -> bool:
    """Whether a failed reserve (or the worker's GetServerInfo at start) can never
    succeed as it is: :data:`PERMANENT_CODES`, or a strict server refusing an undeclared
    queue. Anything else may heal, so the worker retries."""
    if isinstance(error, UnknownQueuesError):
        return True
    return getattr(error, "code", None) in PERMANENT_CODES


def is_unreachable(error: SeppError) -> bool:
    """Whether ``error`` says the server could not be reached (no connection, or no
    answer in time), rather than that it answered: what a worker starting up waits
    out."""
    if isinstance(error, ConnectError):
        # A TLS mismatch or a certificate refused is a setting to fix, not a wait.
        return error.server_uses_tls is None and not isinstance(error.__cause__, ssl.SSLError)
    return isinstance(error, TransportError) and error.code in UNREACHABLE_CODES


def backoff_delays(
    policy: RetryPolicy, jitter: Callable[[], float] | None = None
) -> Iterator[float]:
    """Seconds to wait before retry 1, 2, ...: the base starts at ``initial_backoff`` and
    is multiplied (then capped at ``max_backoff``) after each retry, so a first backoff
    above the cap is used once as is, as in sepp-py. With jitter each delay is scaled by
    a factor in [0.5, 1) (``random.random`` unless ``jitter`` is given)."""
    if jitter is None:
        import random  # here, not at import: most clients never retry

        jitter = random.random
    base = policy.initial_backoff.total_seconds()
    cap = policy.max_backoff.total_seconds()
    while True:
        yield base * (0.5 + 0.5 * jitter()) if policy.jitter else base
        base = min(base * policy.multiplier, cap)


async def call_with_retry(
    operation: str,
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    deadline_at: float,
    *,
    all_keyed: bool = True,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_retry: Optional[OnRetry] = None,
) -> T:
    """Run ``attempt`` until it succeeds, fails for good, the policy's attempts are used,
    or the next backoff would end past ``deadline_at`` (an event-loop time shared by
    every attempt). ``all_keyed`` is False for an enqueue with a job that has
    no idempotency key: then calls the server may have applied are not repeated.
    ``on_retry(delay, error)`` is told of each retry before its backoff (the coalescer
    fails then the callers whose deadline comes first)."""
    delays = backoff_delays(policy)
    for number in range(1, policy.max_attempts + 1):
        try:
            return await attempt()
        except SeppError as error:
            if number >= policy.max_attempts or not is_retryable(error, all_keyed=all_keyed):
                raise
            delay = next(delays)
            if asyncio.get_running_loop().time() + delay >= deadline_at:
                raise
            _log_retry(operation, number, error, delay)
            if on_retry is not None:
                on_retry(delay, error)
            await sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def _log_retry(operation: str, number: int, error: SeppError, delay: float) -> None:
    code = error.code.name if isinstance(error, ClientError) and error.code else "-"
    logger.warning(
        "retrying %s after attempt %d failed with %s: %s (next try in %.3f s)",
        operation,
        number,
        code,
        error,
        delay,
    )
