"""The lease handle bound to every reserved job (``JobCtx.lease``).

The seam between the client and the worker: ``SeppClient.reserve`` makes one
:class:`Lease` per delivery and attaches it with :func:`sepp_lite.types.bind_lease`;
the client's ack and nack mark it released; the worker reads it through
``JobCtx.lease`` (its known expiry for the lease keeper, ``released`` to settle at most
once) and extends it. A lease extends through :class:`LeaseExtender`, which the client
implements with :meth:`SeppClient.extend_lease <sepp_lite.client.SeppClient.extend_lease>`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime
from typing import Protocol

from sepp_lite._time import Duration, datetime_to_ms


class LeaseExtender(Protocol):
    """What a :class:`Lease` needs from the client: the Extend call for one delivery."""

    def extend_lease(
        self, job_id: str, attempt: int, extension: Duration, worker_id: str | None
    ) -> Awaitable[datetime]:
        """Extend the lease of delivery ``attempt`` of ``job_id`` to ``extension`` from
        now; return the new expiry."""


class Lease:
    """One delivery's lease (its job id and attempt): who holds it, until when as far as
    we know, how to extend it, and whether it was released. ``known_expiry_ms`` follows
    every extension made through this handle (``JobCtx.extend`` and the worker's
    auto-extend), not ``SeppClient.extend``.

    ``released`` turns True once an ack or nack of this delivery was answered, or found
    that the lease is gone (NOT_FOUND, attempt mismatch), whoever sent it: the handler
    through any client, or the worker. The worker then settles nothing more for it."""

    __slots__ = (
        "_attempt",
        "_client",
        "_job_id",
        "_known_expiry_ms",
        "_released",
        "_settling",
        "_worker_id",
    )

    def __init__(
        self,
        client: LeaseExtender,
        job_id: str,
        attempt: int,
        expires_at_ms: int,
        worker_id: str | None,
    ) -> None:
        self._client = client
        self._job_id = job_id
        self._attempt = attempt
        self._worker_id = worker_id
        self._known_expiry_ms = expires_at_ms
        self._released = False
        self._settling = 0  # acks and nacks of this delivery on their way

    @property
    def worker_id(self) -> str | None:
        """The worker id the delivery was reserved with (sent with every ack, nack and
        extend of it), or None."""
        return self._worker_id

    @property
    def known_expiry_ms(self) -> int:
        """The lease's expiry as last granted through this handle, in ms since the
        epoch."""
        return self._known_expiry_ms

    @property
    def released(self) -> bool:
        """Whether this delivery was settled or its lease found gone (see the class)."""
        return self._released

    def mark_released(self) -> None:
        """Record that the lease is no longer held: settled, or lost."""
        self._released = True

    @property
    def settling(self) -> bool:
        """Whether an ack or nack of this delivery is on its way: the worker's lease
        keeper does not extend a lease whose fate the answer decides."""
        return self._settling > 0

    def settle_started(self) -> None:
        self._settling += 1

    def settle_ended(self) -> None:
        self._settling -= 1

    async def extend(self, by: Duration) -> datetime:
        """Extend the lease to ``by`` from now; return (and remember) the new expiry."""
        expiry = await self._client.extend_lease(self._job_id, self._attempt, by, self._worker_id)
        self._known_expiry_ms = datetime_to_ms(expiry)
        return expiry

    def __repr__(self) -> str:
        return (
            f"Lease(job_id={self._job_id!r}, attempt={self._attempt}, "
            f"worker_id={self._worker_id!r})"
        )
