"""What the server takes in one call, decided once for every sender.

Every sender of EnqueueBatch calls asks the same questions of the server: how large a
request it reads, how many jobs and bytes to put in one call (before ``GetServerInfo``
has answered, and after), and whether one job fits its advertised limits. The client and
its coalescer, the periodic scheduler and the command line's JSON-lines import all take
the answers from here; the command line only puts a rejection into words. The wire band
takes its default receive limit from here too, which is why this module stands in the
bottom band and imports no encoder: a sender measures its jobs itself (the codec's
``sent_size``) and hands the sizes in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from sepp_lite import errors

if TYPE_CHECKING:
    from sepp_lite.types import EnqueueRequest, ServerInfo

__all__ = [
    "DEFAULT_BATCH_JOBS",
    "MAX_BATCH_BYTES",
    "MAX_MESSAGE_BYTES",
    "BatchLimits",
    "fit_batches",
    "job_rejection",
    "sent_size",
]

T = TypeVar("T")

# The largest message the server decodes: its limits.max_message_bytes, 16 MiB unless
# configured, which GetServerInfo does not report. A larger request is refused whole
# (OUT_OF_RANGE) before anything in it is read, so a sender refuses it before sending.
# It is also the client's default receive limit (a full reserve answer fits).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# What a batch of jobs may come to: the message limit less room for the gRPC and HTTP/2
# framing, used until a server refuses less.
MAX_BATCH_BYTES = MAX_MESSAGE_BYTES - 1024
# The spec's default max_enqueue_batch, used until the server has said its own.
DEFAULT_BATCH_JOBS = 256
# Room for the trace context the client adds to a job that carries none, when the job
# was measured without it: a traceparent, and a tracestate of up to W3C's advised 512
# characters, with their tags and lengths.
_TRACE_ROOM = 600


class BatchLimits:
    """How many jobs, and how many bytes of them, one EnqueueBatch call carries."""

    __slots__ = ("jobs", "size")

    def __init__(self, jobs: int = DEFAULT_BATCH_JOBS, size: int = MAX_BATCH_BYTES) -> None:
        self.jobs = jobs
        self.size = size

    @classmethod
    def of(cls, info: Optional[ServerInfo]) -> BatchLimits:
        """The limits by the server's answer to GetServerInfo (the defaults before it)."""
        if info is None:
            return cls()
        return cls(max(1, info.max_enqueue_batch))

    def __repr__(self) -> str:
        return f"BatchLimits(jobs={self.jobs}, size={self.size})"

    def fits(self, jobs: int, size: int, part: int) -> bool:
        """Whether a job of ``part`` bytes may join a batch of ``jobs`` jobs and
        ``size`` bytes. A job always fits an empty batch: it is never split."""
        return not jobs or (jobs < self.jobs and size + part <= self.size)

    def full(self, jobs: int, size: int) -> bool:
        """Whether a batch of ``jobs`` jobs and ``size`` bytes should go out now."""
        return jobs >= self.jobs or size >= self.size


def sent_size(job: EnqueueRequest, encoded: int) -> int:
    """The bytes ``job`` (``encoded`` bytes as a request alone, without an injected
    trace context) may take in an EnqueueBatch call the client makes: with room for the
    trace context the client adds to a job that carries none."""
    return encoded if job.trace_context is not None else encoded + _TRACE_ROOM


def fit_batches(jobs: Sequence[T], limits: BatchLimits, size: Callable[[T], int]) -> list[list[T]]:
    """``jobs``, in order, cut into the fewest batches that each fit ``limits``: by
    count, and by bytes as ``size`` measures a job in a call (:func:`sent_size` for an
    ``EnqueueRequest`` sent through the client). A job over the byte limit goes alone
    (the client refuses it, or the server does)."""
    batches: list[list[T]] = []
    batch: list[T] = []
    total = 0
    for job in jobs:
        part = size(job)
        if not limits.fits(len(batch), total, part):
            batches.append(batch)
            batch, total = [], 0
        batch.append(job)
        total += part
    if batch:
        batches.append(batch)
    return batches


def job_rejection(
    job: EnqueueRequest,
    info: Optional[ServerInfo],
    *,
    size: Optional[int] = None,
    names: bool = True,
) -> Optional[errors.JobRejection]:
    """The rejection the server would answer ``job`` with for its size, or None.

    By the global limits the server advertised (``info``; none before it answered):
    the queue name, job type and idempotency key (unless ``names`` is false) and the
    payload. Then, given ``size`` (the job's request alone, in bytes), the message
    limit, which the server enforces before it reads anything: a job with a payload
    gets the ``PayloadTooLarge`` of the largest payload it could have carried, one
    without gets ``InvalidRequest`` saying so. (A queue may be configured with other
    limits than the global ones; the client's ``check_payload_limit=False`` is for
    that.)"""
    body = job.payload
    if info is not None:
        if names:
            for rejection, actual, limit in (
                (errors.QueueNameTooLong, len(job.queue.encode()), info.max_queue_name_bytes),
                (errors.JobTypeNameTooLong, len(job.job_type.encode()), info.max_job_type_bytes),
                (
                    errors.IdempotencyKeyTooLong,
                    len((job.idempotency_key or "").encode()),
                    info.max_idempotency_key_bytes,
                ),
            ):
                if limit and actual > limit:
                    return rejection(limit, actual)
        limit = info.max_payload_bytes
        if body is not None and limit and len(body.data) > limit:
            return errors.PayloadTooLarge(limit, len(body.data))
    if size is None or size <= MAX_MESSAGE_BYTES:
        return None
    if body is None:
        return errors.InvalidRequest(
            f"the job is {size:,} bytes encoded, over the {MAX_MESSAGE_BYTES:,} bytes a "
            "request may carry"
        )
    # The largest payload this job could have carried, the rest as it is.
    return errors.PayloadTooLarge(MAX_MESSAGE_BYTES - (size - len(body.data)), len(body.data))
