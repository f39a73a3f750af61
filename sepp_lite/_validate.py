"""The rules of what the client sends, in one place: small functions of plain values
that raise ``TypeError``/``ValueError`` with the message users see, return the value
normalised, or say what is wrong with it. (Not here: the Worker's stricter rules for its
own arguments, the address and API-key checks of the transport, and the argument type
checks at the top of ``reserve`` and ``nack``.)

Who applies them, each value once where it enters:

* the dataclasses of :mod:`sepp_lite.types`, from ``__post_init__`` (what sepp-py checks
  at construction), and the checks ``types`` makes of a request when it is sent (the
  dataclasses are mutable: ``check_enqueue_request``, and ``reserve_request``, which
  checks options again only when a field changed since they were checked);
* :class:`~sepp_lite.worker.Worker`, for its own arguments;
* :class:`~sepp_lite.client.SeppClient`, for the arguments of its calls and
  ``connect``;
* the CLI and the in-process server, for the queue names they read.

The encoders in :mod:`sepp_lite._codec` assume checked input. They keep only guards
against values that would otherwise go out as some other value without a word (an int
outside uint32 or int64, a negative duration, payload data that ``bytes()`` would
misread), and those guards call the functions here, so the rule and its message stay
one.

This module knows no class of :mod:`sepp_lite.types` (which imports it) and raises none
of its errors: a rule a value class enforces with its own error (a priority, a trace
context) is a predicate here, and the class raises.
"""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Optional

from sepp_lite._time import as_timedelta

__all__ = [
    "custom_map",
    "custom_value_type_error",
    "drain_arguments",
    "duration",
    "int64",
    "is_control",
    "is_priority",
    "job_type",
    "max_attempts",
    "max_jobs",
    "non_negative_wire_duration",
    "payload_data",
    "queue",
    "queue_name_error",
    "queue_names",
    "receive_limit",
    "retry_directive",
    "retry_policy",
    "ssl_context",
    "trace_context_problem",
    "traceparent_problem",
    "uint32",
    "worker_id",
]

UINT32_MAX = 0xFFFF_FFFF
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# ---------------------------------------------------------------------------------------
# Integers and durations


def uint32(value: object, name: str) -> int:
    """``value`` as a uint32 field; ``ValueError`` for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT32_MAX:
        raise ValueError(f"{name} must be an int from 0 to {UINT32_MAX}, got {value!r}")
    return value


# A job's max_attempts where it is given as an option (a task's, the command line's): the
# server refuses 0 ("max_attempts must be >= 1"). The client itself sends any uint32, as
# sepp-py does, and leaves 0 to the server's rejection.
MAX_ATTEMPTS = (1, UINT32_MAX)


def max_attempts(value: object) -> int:
    """``max_attempts`` given as an option: an int from 1 to ``UINT32_MAX``
    (``TypeError`` for another type, bools included; ``ValueError`` out of range)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_attempts must be an int, got {type(value).__name__}")
    low, high = MAX_ATTEMPTS
    if not low <= value <= high:
        raise ValueError(f"max_attempts must be from {low} to {high}, got {value}")
    return value


def int64(value: int, name: str) -> int:
    """``value`` (an int) as an int64 field; ``ValueError`` outside that range."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} must fit in a signed 64-bit integer, got {value!r}")
    return value


duration = as_timedelta
"""A duration argument (``timedelta`` or seconds) as a ``timedelta``; ``TypeError`` or
``ValueError`` naming the argument (the rule is :func:`sepp_lite._time.as_timedelta`,
which the worker and the monitor use too)."""


def non_negative_wire_duration(td: timedelta) -> timedelta:
    """The encoders' guard for a Duration field: never negative."""
    if td < timedelta(0):
        raise ValueError(f"durations sent to the server must not be negative, got {td}")
    return td


# ---------------------------------------------------------------------------------------
# Names


def is_control(char: str) -> bool:
    """Unicode general category Cc, as Rust's ``char::is_control``."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F


# Producers repeat a handful of queue names; checking each once per name is enough.
@functools.lru_cache(maxsize=4096)
def queue_name_error(name: str) -> Optional[str]:
    """Why ``name`` is not a valid queue name (the message tail after the field name),
    or ``None`` when it is valid. The server's rule: the client checks reserve and drain
    names with it, and the in-process server declared names and request names."""
    if not name:
        return "must not be empty"
    if name in (".", ".."):
        return 'must not be "." or ".."'
    if "/" in name:
        return "must not contain '/'"
    if any(is_control(c) for c in name):
        return "must not contain control characters"
    return None


def queue(value: object) -> None:
    """An ``EnqueueRequest.queue`` at construction."""
    if not isinstance(value, str) or not value:
        raise ValueError("queue must be a non-empty str")


def job_type(value: object) -> None:
    """An ``EnqueueRequest.job_type`` at construction."""
    if not isinstance(value, str) or not value:
        raise ValueError("job_type must be a non-empty str")


def queue_names(queues: Iterable[str]) -> list[str]:
    """``ReserveOptions.queues`` as a list: at least one, each a valid queue name (the
    server would refuse the whole reserve)."""
    if isinstance(queues, str):
        raise TypeError("queues must be a sequence of queue names, not a str")
    names = list(queues)
    if not names:
        raise ValueError("queues must name at least one queue")
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ValueError(f"queue name at index {index} must be a non-empty str")
        problem = queue_name_error(name)
        if problem is not None:
            raise ValueError(f"queue name at index {index} ({name!r}) {problem}")
    return names


def worker_id(value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError("worker_id must be a non-empty str when set")


def max_jobs(value: object) -> None:
    if value is not None and (type(value) is not int or not 1 <= value <= UINT32_MAX):
        raise ValueError(f"max_jobs must be an int of at least 1, got {value!r}")


def drain_arguments(queue: object, max_records: object) -> None:
    """``drain_dead_letters(queue, max_records)``; a queue name the server refuses is
    reported here, as reserve does."""
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 0:
        raise ValueError(f"max_records must be an int >= 0, got {max_records!r}")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ValueError("queue must be a non-empty str or None")
    bad_name = None if queue is None else queue_name_error(queue)
    if bad_name is not None:
        raise ValueError(f"queue {queue!r} {bad_name}")


# ---------------------------------------------------------------------------------------
# Priority, trace context, retries


def is_priority(value: object) -> bool:
    """Whether ``value`` is a priority's value: an int from 0 to 9 (not a bool).
    ``Priority`` raises its ``PriorityOutOfRangeError`` when it is not."""
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= 9


_TRACEPARENT = re.compile(r"[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}")
_TRACEPARENT_PARTS = (("version", 2), ("trace_id", 32), ("span_id", 16), ("flags", 2))
_HEX = frozenset("0123456789abcdefABCDEF")


def traceparent_problem(traceparent: object) -> str | None:
    """Why ``traceparent`` is invalid, or ``None`` when it is valid."""
    if not isinstance(traceparent, str):
        return f"traceparent must be a str, got {type(traceparent).__name__}"
    if _TRACEPARENT.fullmatch(traceparent):
        if traceparent[3:35].strip("0") == "":
            return "trace_id must not be all zeros"
        if traceparent[36:52].strip("0") == "":
            return "span_id must not be all zeros"
        return None
    parts = traceparent.split("-")
    if len(parts) != 4:
        return f"expected 4 fields separated by '-', got {len(parts)}"
    for (name, size), part in zip(_TRACEPARENT_PARTS, parts):
        if len(part) != size or not _HEX.issuperset(part):
            return f"{name} must be {size} hex characters, got {part!r}"
    return "malformed"  # pragma: no cover - the regex and the split agree


def trace_context_problem(traceparent: object, tracestate: object) -> str | None:
    """What is wrong with a ``TraceContext``'s fields (the message of the
    ``TraceContextError`` it raises), or ``None`` when they are valid."""
    problem = traceparent_problem(traceparent)
    if problem is not None:
        return f"invalid traceparent: {problem}"
    if tracestate is not None and not isinstance(tracestate, str):
        return "tracestate must be a str or None"
    return None


DIRECTIVE_KINDS = ("default", "after", "dead_letter")


def retry_directive(kind: object, delay: object) -> Optional[timedelta]:
    """A ``RetryDirective``'s fields; returns its delay as a ``timedelta``."""
    if kind not in DIRECTIVE_KINDS:
        raise ValueError(f"kind must be one of {DIRECTIVE_KINDS}, got {kind!r}")
    if kind == "after":
        if delay is None:
            raise ValueError("an 'after' directive needs a delay")
        return as_timedelta(delay, "delay")  # type: ignore[arg-type]
    if delay is not None:
        raise ValueError(f"a {kind!r} directive takes no delay")
    return None


def retry_policy(
    max_attempts: Any, multiplier: Any, initial_backoff: Any, max_backoff: Any
) -> tuple[int, float, timedelta, timedelta]:
    """A ``RetryPolicy``'s fields, normalised: ``max_attempts`` below 1 and
    ``multiplier`` below 1.0 are raised to those floors; backoffs must not be
    negative."""
    return (
        max(1, int(max_attempts)),
        max(1.0, float(multiplier)),
        as_timedelta(initial_backoff, "initial_backoff"),
        as_timedelta(max_backoff, "max_backoff"),
    )


# ---------------------------------------------------------------------------------------
# Enqueue: payload data, custom values, the size of a request


def payload_data(data: object) -> None:
    """``Payload.data``: bytes, or a bytearray or memoryview (sent as their bytes)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload.data must be bytes, got {type(data).__name__}")


def custom_value_type_error(key: object, value: object) -> TypeError:
    """The error for a custom value of a type the wire has no member for."""
    return TypeError(f"custom[{key!r}] must be str, int, float or bool, got {type(value).__name__}")


def _custom_entry(key: object, value: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"custom keys must be str, got {type(key).__name__}")
    if isinstance(value, bool) or isinstance(value, (str, float)):
        return
    if not isinstance(value, int):
        raise custom_value_type_error(key, value)
    int64(int(value), f"custom[{key!r}]")


def custom_map(custom: Mapping[str, object]) -> None:
    """A job's custom map: str keys; values str, int (int64), float or bool, or a
    subclass of str, int or float (sent as its base value)."""
    # Producers send a few entries per job, of the exact built-in types: those pass the
    # inline test, and anything else gets the full rule (which raises or accepts it).
    for key, value in custom.items():
        cls = value.__class__
        if key.__class__ is str and (
            cls is str
            or cls is bool
            or cls is float
            or (cls is int and -0x8000_0000_0000_0000 <= value <= 0x7FFF_FFFF_FFFF_FFFF)  # type: ignore[operator]
        ):
            continue
        _custom_entry(key, value)


# ---------------------------------------------------------------------------------------
# Connection options


def receive_limit(value: int | None, default: int) -> int:
    """``max_receive_message_bytes``: ``default`` when ``None``, else a positive int."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"max_receive_message_bytes must be a positive int, got {value!r}")
    return value


def ssl_context(value: object, name: str) -> None:
    if not isinstance(value, ssl.SSLContext):
        raise TypeError(f"{name} must be an ssl.SSLContext")
