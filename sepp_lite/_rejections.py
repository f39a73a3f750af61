"""The values of a refused job: :class:`JobRejection` and its variants, and
:class:`JobValidationError` (one refused job of an atomic batch).

They are public as ``sepp_lite.errors.*``; ``errors`` imports this module on the first
use of one of its names. Their 16 frozen dataclasses were about a quarter of the time
``import sepp_lite`` adds to asyncio's (``dataclass()`` compiles six methods for each),
and a producer whose jobs are all accepted, or a worker, never needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sepp_lite._time import seconds_text


class JobRejection:
    """Why the server refused one job: a value inside ``enqueue_batch`` results.

    All variants but :class:`QueueFull` and :class:`QueueClosing` are deterministic:
    sending the same job to the same server gets the same answer.
    """

    @property
    def message(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class UnknownQueue(JobRejection):
    """Strict mode, and the queue is not declared."""

    queue: str

    @property
    def message(self) -> str:
        return f"queue {self.queue!r} is not declared and the server is in strict mode"


@dataclass(frozen=True)
class PayloadTooLarge(JobRejection):
    """The payload is over the queue's ``max_payload_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"payload of {self.actual} bytes is over the limit of {self.limit}"


@dataclass(frozen=True)
class EncodingNotAllowed(JobRejection):
    """The payload's encoding is not on the queue's allow-list."""

    encoding: str
    allowed: list[str]

    @property
    def message(self) -> str:
        return f"encoding {self.encoding!r} is not allowed (allowed: {self.allowed})"


@dataclass(frozen=True)
class JobTypeNotAllowed(JobRejection):
    """The job type is not on the queue's allow-list."""

    job_type: str
    allowed: list[str]

    @property
    def message(self) -> str:
        return f"job type {self.job_type!r} is not allowed (allowed: {self.allowed})"


@dataclass(frozen=True)
class CustomEntriesTooMany(JobRejection):
    """More custom entries than ``max_custom_entries``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"{self.actual} custom entries, over the limit of {self.limit}"


@dataclass(frozen=True)
class CustomMapTooLarge(JobRejection):
    """The custom map is over ``max_custom_total_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"custom map of {self.actual} bytes is over the limit of {self.limit}"


@dataclass(frozen=True)
class CustomKeyTooLong(JobRejection):
    """A custom key is over ``max_custom_key_bytes``."""

    key: str
    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"custom key {self.key!r} has {self.actual} bytes, over the limit of {self.limit}"


@dataclass(frozen=True)
class QueueNameTooLong(JobRejection):
    """The queue name is over ``max_queue_name_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"queue name has {self.actual} bytes, over the limit of {self.limit}"


@dataclass(frozen=True)
class JobTypeNameTooLong(JobRejection):
    """The job type is over ``max_job_type_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"job type has {self.actual} bytes, over the limit of {self.limit}"


@dataclass(frozen=True)
class IdempotencyKeyTooLong(JobRejection):
    """The idempotency key is over ``max_idempotency_key_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"idempotency key has {self.actual} bytes, over the limit of {self.limit}"


@dataclass(frozen=True)
class ScheduledTooFar(JobRejection):
    """``scheduled_at`` (``actual``) is further out than the schedule ``horizon``."""

    horizon: timedelta
    actual: datetime

    @property
    def message(self) -> str:
        horizon = seconds_text(self.horizon)
        return f"scheduled_at {self.actual.isoformat()} is past the horizon of {horizon}"


@dataclass(frozen=True)
class InvalidRequest(JobRejection):
    """The job failed the server's structural checks; ``detail`` says which."""

    detail: str

    @property
    def message(self) -> str:
        return f"invalid job: {self.detail}"


@dataclass(frozen=True)
class QueueFull(JobRejection):
    """The queue is at ``max_queue_depth``; clears as the queue drains."""

    queue: str
    limit: int

    @property
    def message(self) -> str:
        return f"queue {self.queue!r} is full ({self.limit} jobs)"


@dataclass(frozen=True)
class QueueClosing(JobRejection):
    """The queue is being deleted and takes no new jobs."""

    queue: str

    @property
    def message(self) -> str:
        return f"queue {self.queue!r} is being deleted"


@dataclass(frozen=True)
class UnknownRejection(JobRejection):
    """A rejection this client does not know (a newer server, or no reason set)."""

    @property
    def message(self) -> str:
        return "rejected for a reason this client does not know"


@dataclass(frozen=True)
class JobValidationError:
    """One refused job of an atomic batch, by its zero-based index in the request."""

    index: int
    rejection: JobRejection
