"""Time conversions at the API boundary: durations given as ``timedelta`` or float
seconds, UTC datetimes, and the integer milliseconds the server counts in."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Union

Duration = Union[timedelta, float, int]
"""A duration as the API accepts it: a ``timedelta`` or a number of seconds."""

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)


def as_timedelta(value: Duration, name: str, *, positive: bool = False) -> timedelta:
    """Normalise a duration argument; raise ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if value != value:  # NaN compares unequal to itself
            raise ValueError(f"{name} must be a number of seconds, got NaN")
        try:
            result = timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"{name} is out of range: {value!r}") from None
    else:
        raise TypeError(
            f"{name} must be a timedelta or a number of seconds, got {type(value).__name__}"
        )
    if result < timedelta(0):
        raise ValueError(f"{name} must not be negative, got {seconds_text(result)}")
    if positive and result <= timedelta(0):
        raise ValueError(f"{name} must be greater than zero, got {seconds_text(result)}")
    return result


def seconds_text(span: timedelta) -> str:
    """``span`` as people write it in messages: ``-5 s``, ``0.25 s``, ``2592000 s``
    (``str(timedelta)`` shows -5 s as ``-1 day, 23:59:55``)."""
    seconds = f"{span.total_seconds():.6f}".rstrip("0").rstrip(".")
    return f"{seconds} s"


def as_utc(dt: datetime) -> datetime:
    """Naive datetimes are read as UTC, as sepp-py does."""
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt


def datetime_to_ms(dt: datetime) -> int:
    """Milliseconds since the epoch, floored (integer arithmetic, no float rounding)."""
    return (as_utc(dt) - EPOCH) // _ONE_MS


def ms_to_datetime(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def now_ms() -> int:
    return time.time_ns() // 1_000_000
