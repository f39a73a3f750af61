"""The lease handle bound to every reserved job (``JobCtx._lease``)."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Callable, Optional

from sepp_lite._time import Duration, as_timedelta, datetime_to_ms

ExtendCall = Callable[[str, int, timedelta, Optional[str]], Awaitable[datetime]]
"""``(job_id, attempt, lease_duration, worker_id) -> new expiry``: the client's extend."""


class Lease:
    """One delivery's lease (its job id and attempt): who holds it, until when as far as
    we know, how to extend it, and whether it was released. ``known_expiry_ms`` follows
    every extension made through this handle (``JobCtx.extend`` and the worker's
    auto-extend), not ``SeppClient.extend``.

    ``released`` turns True once an ack or nack of this delivery was answered, or found
    that the lease is gone (NOT_FOUND, attempt mismatch), whoever sent it: the handler
    through any client, or the worker. The worker then settles nothing more for it."""

    __slots__ = ("_attempt", "_extend", "_job_id", "_known_expiry_ms", "_worker_id", "released")

    def __init__(
        self,
        extend: ExtendCall,
        job_id: str,
        attempt: int,
        lease_expires_at: datetime,
        worker_id: str | None,
    ) -> None:
        self._extend = extend
        self._job_id = job_id
        self._attempt = attempt
        self._worker_id = worker_id
        self._known_expiry_ms = datetime_to_ms(lease_expires_at)
        self.released = False

    @property
    def worker_id(self) -> str | None:
        return self._worker_id

    @property
    def known_expiry_ms(self) -> int:
        return self._known_expiry_ms

    async def extend(self, by: Duration) -> datetime:
        """Extend the lease to ``by`` from now; return (and remember) the new expiry."""
        lease = as_timedelta(by, "extension", positive=True)
        expiry = await self._extend(self._job_id, self._attempt, lease, self._worker_id)
        self._known_expiry_ms = datetime_to_ms(expiry)
        return expiry

    def __repr__(self) -> str:
        return (
            f"Lease(job_id={self._job_id!r}, attempt={self._attempt}, "
            f"worker_id={self._worker_id!r})"
        )
