"""The one retry loop: backoff delays from a RetryPolicy, one deadline for all attempts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from typing import Callable, TypeVar

from sepp_lite import _otel
from sepp_lite.errors import ClientError, SeppError, is_retryable
from sepp_lite.types import RetryPolicy

T = TypeVar("T")
logger = _otel.logger()


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
) -> T:
    """Run ``attempt`` until it succeeds, fails for good, the policy's attempts are used,
    or the next backoff would end past ``deadline_at`` (an event-loop time shared by
    every attempt). ``all_keyed`` is False for an enqueue with a job that has
    no idempotency key: then calls the server may have applied are not repeated."""
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
