"""Waiting for a sepp server that cannot be reached yet, written once.

Three things start before their server may be up and wait for it: a Worker's start-up
handshake (``GetServerInfo``, then its options clamped to the server's limits), the
``sepp-lite worker`` command (connecting, and building the user's worker) and the
periodic scheduler (each of its calls, for as long as it takes). They all go through
:func:`until_reachable`: one loop, one backoff (grpc's connection backoff, 1 s growing
1.6 times up to 120 s and jittered, never sooner than the client says it can connect
again) and one WARNING line per attempt, ``waiting for the sepp server (attempt 3, 3 s
of 60 s): ...; next attempt in 2.6 s``. A refusal no retry can fix is raised at once;
when the wait is over, the caller's own error says so ("gave up waiting for the sepp
server ...").
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable
from datetime import timedelta
from typing import Callable, NamedTuple, Optional, TypeVar

from sepp_lite import _log
from sepp_lite._retry import is_permanent, is_unreachable
from sepp_lite._time import seconds_text
from sepp_lite._wire.transport import ReconnectBackoff
from sepp_lite.errors import ClientError, SeppError
from sepp_lite.types import ReserveOptions, ServerInfo, checked_reserve_options

__all__ = [
    "StartOptions",
    "Stopped",
    "clamped",
    "error_text",
    "start_info",
    "until_reachable",
]

logger = _log.logger()

T = TypeVar("T")

# The transport's own words for its connect backoff, which a waiting line replaces with
# the one delay it really waits.
_RETRY_HINT = re.compile(r"; next attempt in [0-9.]+ s$")


class Stopped(Exception):
    """Raised by a ``pause`` of :func:`until_reachable` to stop waiting (a Worker's
    shutdown came first)."""


def error_text(error: BaseException) -> str:
    """``error``'s message without the transport's own "next attempt" hint."""
    return _RETRY_HINT.sub("", str(error))


def _reached_later(error: Exception) -> bool:
    return isinstance(error, SeppError) and is_unreachable(error)


async def _sleep(delay: float) -> None:
    await asyncio.sleep(delay)


async def until_reachable(
    call: Callable[[], Awaitable[T]],
    wait: float,
    *,
    setting: str = "",
    gave_up: Callable[[str], BaseException] = TimeoutError,
    text: Callable[[Exception], str] = error_text,
    retried: Callable[[Exception], bool] = _reached_later,
    pause: Callable[[float], Awaitable[None]] = _sleep,
) -> T:
    """``call()``'s result, called again while it fails with an error ``retried``
    accepts (by default: the server could not be reached), for at most ``wait`` seconds
    (``math.inf``: for as long as it takes; 0 or less: not at all, the error as it
    came), with one WARNING line per attempt saying ``text(error)``. Any other error is
    raised at once; when the wait is over, ``gave_up(message)`` is raised from the last
    error, the message naming ``setting`` (the option that set the wait). ``pause``
    waits out a delay; it raises :class:`Stopped` to stop waiting."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    backoff = ReconnectBackoff()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except Exception as error:
            if wait <= 0 or not retried(error):
                raise
            waited = loop.time() - started
            left = wait - waited
            if left <= 0:
                raise gave_up(
                    f"gave up waiting for the sepp server after {attempt} attempt(s) in "
                    f"{waited:.0f} s ({setting}): {text(error)}"
                ) from error
            # Never sooner than the client will connect again: a call before then
            # would fail at once.
            after = error.retry_after if isinstance(error, ClientError) else None
            delay = min(max(backoff.next(), after or 0.0), left)
            bound = "" if math.isinf(wait) else f" of {wait:g} s"
            logger.warning(
                "waiting for the sepp server (attempt %d, %.0f s%s): %s; next attempt in %.1f s",
                attempt,
                waited,
                bound,
                text(error),
                delay,
            )
            await pause(delay)


# -- a Worker's start ------------------------------------------------------------------


class StartOptions(NamedTuple):
    """What a Worker takes from the server at start: the options it reserves with, the
    first delay of a job of a type it has no handler for, and the longest such delay."""

    reserve: ReserveOptions
    unknown_delay: float
    unknown_delay_cap: float


async def start_info(
    call: Callable[[], Awaitable[ServerInfo]],
    wait: float,
    gave_up: Callable[[str], BaseException],
    pause: Callable[[float], Awaitable[None]],
) -> Optional[ServerInfo]:
    """A Worker's ``GetServerInfo`` (``call``) at start, asked until the server answers,
    at most ``wait`` seconds while it cannot be reached; None when it answered with an
    error retries cannot fix but the reserves may not meet (an old server without the
    call), or when ``pause`` raised :class:`Stopped`. Raises a refusal no retry can fix
    at once, and ``gave_up``'s error once the wait is over."""
    try:
        return await until_reachable(
            call, wait, setting=f"wait_for_server={wait:g} s", gave_up=gave_up, pause=pause
        )
    except Stopped:
        return None
    except SeppError as error:
        if is_permanent(error) or is_unreachable(error):
            raise  # a wrong key or the like: no reserve could succeed either
        logger.warning("could not read the server's limits (%s); using the options as given", error)
        return None


def clamped(start: StartOptions, info: ServerInfo) -> StartOptions:
    """``start`` within the server's limits (``info``), with one WARNING line naming
    what changed; the same ``reserve`` options when none of them did."""
    opts, changes = start.reserve, []
    max_jobs, lease, wait = opts.max_jobs, opts.lease_duration, opts.wait_timeout
    if max_jobs is not None and info.max_reserve_batch and max_jobs > info.max_reserve_batch:
        changes.append(f"max_jobs {max_jobs} -> {info.max_reserve_batch}")
        max_jobs = info.max_reserve_batch
    if info.max_lease_duration and lease > info.max_lease_duration:
        changes.append(f"lease {seconds_text(lease)} -> {seconds_text(info.max_lease_duration)}")
        lease = info.max_lease_duration
    if info.max_wait_timeout and wait > info.max_wait_timeout:
        changes.append(f"wait {seconds_text(wait)} -> {seconds_text(info.max_wait_timeout)}")
        wait = info.max_wait_timeout
    if changes:
        opts = checked_reserve_options(opts.queues, lease, wait, opts.worker_id, max_jobs)
    delay, cap = start.unknown_delay, start.unknown_delay_cap
    # The server shortens a nack's delay to its max_schedule_horizon (a queue may have a
    # shorter one, which only that queue's nack can meet).
    horizon = info.max_schedule_horizon.total_seconds()
    if horizon > 0:
        cap = min(cap, horizon)
        if delay > horizon:
            changes.append(
                f"unknown_type_delay {seconds_text(timedelta(seconds=delay))} -> "
                f"{seconds_text(info.max_schedule_horizon)}"
            )
            delay = horizon
    if changes:
        logger.warning(
            "clamped to the server's limits: %s (the server would clamp them on every "
            "call; ask for no more than it allows to silence this)",
            ", ".join(changes),
        )
    return StartOptions(opts, delay, cap)
