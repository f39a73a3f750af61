"""gRPC status codes, and the one exception a transport raises for a failed call.

Both transports (the client's own HTTP/2 connection and the grpclib adapter behind
``SeppClient.from_channel``) describe every failure as a :class:`CallFailure`;
the client turns it into the error tree with ``errors.map_failure``. Nothing here
imports a transport.
"""

from __future__ import annotations

import enum
from typing import Optional


class Status(enum.IntEnum):
    """gRPC status codes: grpc's names and numbers."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def status_of(code: int) -> Status:
    """The status for a numeric code; codes grpc does not define are UNKNOWN."""
    try:
        return Status(code)
    except ValueError:
        return Status.UNKNOWN


class CallFailure(Exception):
    """One call failed, as the transport saw it: the one exception a transport's
    ``unary`` raises for a failed call (``errors.map_failure`` turns it into a
    :class:`~sepp_lite.errors.SeppError`).

    ``status`` is the gRPC status (from the server's trailers, or the status a
    transport-level failure stands for; None when none fits, as for a TLS failure).
    ``local`` marks failures of the connection or the deadline rather than answers of
    the server. ``ambiguous`` says the server
    may have applied the request; ``None`` leaves that to the status.
    ``not_processed`` marks a call the server never handed to its application (a
    stream above a GOAWAY's last stream id, REFUSED_STREAM, a call that never got a
    stream): it is safe to send again anywhere. ``retry_after`` is set when the
    transport will not try to connect again before that many seconds; ``backing_off``
    when the call failed at once for that reason (its error then says when the next
    attempt is, in :func:`retry_hint`'s words). A failure made
    from another exception (a socket or TLS error, grpclib's) has it as ``__cause__``.
    """

    def __init__(
        self,
        status: Optional[Status],
        message: str,
        *,
        local: bool = False,
        ambiguous: Optional[bool] = None,
        not_processed: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.local = local
        self.ambiguous = ambiguous
        self.not_processed = not_processed
        self.retry_after: Optional[float] = None  # a connect backoff's wait, in seconds
        self.backing_off = False  # failed at once, during the connect backoff


def retry_hint(seconds: float) -> str:
    """The end of a failure's message when the transport waits out its connect backoff:
    when it tries again (``errors.map_failure`` writes it)."""
    return f"; next attempt in {seconds:.1f} s"


class ResponseTooLarge(CallFailure):
    """A response message over the client's receive limit (declared ``size`` bytes
    against ``limit``): ``errors.ResponseTooLargeError``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(None, f"a response of {size} bytes is over the limit of {limit}")
        self.size = size
        self.limit = limit
