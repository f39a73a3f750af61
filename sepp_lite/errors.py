"""The error tree, and the one function that maps transport failures onto it.

::

    SeppError
    ├── ClientError                    the call failed as a whole (transport or protocol)
    │   ├── ConnectError               connect() could not reach the server
    │   ├── InvalidApiKeyError         the key cannot be sent as a header value
    │   ├── TransportError             UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED,
    │   │                              refused or lost connections, TLS failures
    │   ├── UnauthenticatedError       UNAUTHENTICATED, PERMISSION_DENIED
    │   ├── OverloadedError            RESOURCE_EXHAUSTED
    │   ├── InvalidRequestError        INVALID_ARGUMENT
    │   ├── ServerInternalError        INTERNAL, DATA_LOSS, UNKNOWN
    │   ├── UnexpectedStatusError      any other status
    │   │   └── RequestTooLargeError   OUT_OF_RANGE: a request over the server's message
    │   │                              limit (16 MiB), found before it is sent
    │   ├── EmptyBatchError            an enqueue with no jobs (raised before any RPC)
    │   ├── BatchResultCountMismatchError
    │   ├── MalformedResponseError     the server broke the wire contract
    │   │   ├── DecodeError            ... with bytes that do not decode
    │   │   └── ResponseTooLargeError  ... with a message over the receive limit
    │   ├── MalformedJobError
    │   └── MalformedServerInfoError
    ├── JobConversionError             one reserved job could not be read (it is skipped)
    ├── ServerInfoError
    ├── JobRejectedError               enqueue() of one job was refused (see .rejection)
    ├── BatchValidationError           enqueue_atomic() refused the batch (see .errors)
    ├── LeaseError                     the lease is no longer ours
    │   ├── JobNotFoundError           NOT_FOUND from ack/nack/extend
    │   └── AttemptMismatchError       FAILED_PRECONDITION from ack/nack/extend
    ├── ReserveError
    │   └── UnknownQueuesError         FAILED_PRECONDITION from reserve (strict mode)
    └── DuplicateHandlerError          (worker)

Per-job refusals are values, not exceptions: :class:`JobRejection` and its variants come
back inside ``enqueue_batch`` results (they are defined in ``sepp_lite._rejections``,
which this module imports on the first use of one of their names). ``HandlerError``
(worker) is deliberately not a ``SeppError``. Every :class:`ClientError` carries
``code`` (a :class:`Status`: the gRPC status, or the status a connection-level failure
stands for) and ``ambiguous`` (the request may have been applied even though the call
failed), which is what the retry policy decides on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

from sepp_lite._status import CallFailure, ResponseTooLarge, Status, retry_hint

if TYPE_CHECKING:
    from sepp_lite._rejections import (
        CustomEntriesTooMany,
        CustomKeyTooLong,
        CustomMapTooLarge,
        EncodingNotAllowed,
        IdempotencyKeyTooLong,
        InvalidRequest,
        JobRejection,
        JobTypeNameTooLong,
        JobTypeNotAllowed,
        JobValidationError,
        PayloadTooLarge,
        QueueClosing,
        QueueFull,
        QueueNameTooLong,
        ScheduledTooFar,
        UnknownQueue,
        UnknownRejection,
    )

__all__ = [
    "AttemptMismatchError",
    "BatchResultCountMismatchError",
    "BatchValidationError",
    "ClientError",
    "ConnectError",
    "CustomEntriesTooMany",
    "CustomKeyTooLong",
    "CustomMapTooLarge",
    "DecodeError",
    "EmptyBatchError",
    "EncodingNotAllowed",
    "IdempotencyKeyTooLong",
    "InvalidApiKeyError",
    "InvalidRequest",
    "InvalidRequestError",
    "JobConversionError",
    "JobNotFoundError",
    "JobRejectedError",
    "JobRejection",
    "JobTypeNameTooLong",
    "JobTypeNotAllowed",
    "JobValidationError",
    "LeaseError",
    "MalformedJobError",
    "MalformedResponseError",
    "MalformedServerInfoError",
    "OverloadedError",
    "PayloadTooLarge",
    "QueueClosing",
    "QueueFull",
    "QueueNameTooLong",
    "RequestTooLargeError",
    "ReserveError",
    "ResponseTooLargeError",
    "ScheduledTooFar",
    "SeppError",
    "ServerInfoError",
    "ServerInternalError",
    "Status",
    "TransportError",
    "UnauthenticatedError",
    "UnexpectedStatusError",
    "UnknownQueue",
    "UnknownQueuesError",
    "UnknownRejection",
]


def __getattr__(name: str) -> Any:
    # The JobRejection values live in sepp_lite._rejections, imported on the first use
    # of one of them (its docstring says why).
    if name not in _REJECTIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from sepp_lite import _rejections

    values = {each: getattr(_rejections, each) for each in _REJECTIONS}
    globals().update(values)
    return values[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | _REJECTIONS)


class SeppError(Exception):
    """The root of every error sepp_lite raises."""


class ClientError(SeppError):
    """A call that failed as a whole: transport, status or protocol trouble."""

    code: Optional[Status] = None
    """The gRPC status behind the error, when there is one."""
    ambiguous: bool = False
    """True when the server may have applied the request although the call failed."""
    retry_after: Optional[float] = None
    """Seconds until the client will try to connect again, when it is backing off after
    failed connection attempts (calls fail at once until then)."""


class ConnectError(ClientError):
    """``connect()`` could not reach the server within its connect timeout.

    ``reason`` says why; ``server_uses_tls`` is True when a plaintext connect met a
    TLS server, False when a TLS connect met a plaintext one, None otherwise."""

    def __init__(self, addr: str, reason: str, *, server_uses_tls: Optional[bool] = None) -> None:
        self.addr = addr
        self.reason = reason
        self.server_uses_tls = server_uses_tls
        super().__init__(f"cannot connect to the sepp server at {addr}: {reason}")


class InvalidApiKeyError(ClientError):
    """The API key is not printable ASCII without CR/LF, so it cannot be a header."""

    def __init__(self) -> None:
        super().__init__("the API key must be printable ASCII without CR or LF")


class TransportError(ClientError):
    """The connection or the call's deadline failed; retrying may succeed."""


class UnauthenticatedError(ClientError):
    """The server refused the credentials (missing or wrong API key)."""


class OverloadedError(ClientError):
    """The server is shedding load (RESOURCE_EXHAUSTED); back off and retry."""


class InvalidRequestError(ClientError):
    """The server found the request malformed (INVALID_ARGUMENT)."""


class ServerInternalError(ClientError):
    """The server failed internally (INTERNAL, DATA_LOSS or UNKNOWN)."""


class UnexpectedStatusError(ClientError):
    """A status this client has no more specific error for."""

    def __init__(self, code: Status, message: str) -> None:
        self.code = code
        self.status_message = message
        super().__init__(f"the server answered {code.name}: {message}")


class RequestTooLargeError(UnexpectedStatusError):
    """A request over the largest message the server decodes (16 MiB, its
    ``max_message_bytes``), which it refuses whole with OUT_OF_RANGE. The client finds
    it before sending (then ``size`` and ``limit`` are set); a server configured with
    a lower limit answers it. A job whose payload alone is too large is not this
    error: it gets the :class:`PayloadTooLarge` rejection, as the server's own
    payload limit gives; this is the batch of jobs that fit one by one but not
    together (split it), or another call carrying too much."""

    def __init__(
        self, message: str, *, size: Optional[int] = None, limit: Optional[int] = None
    ) -> None:
        super().__init__(Status.OUT_OF_RANGE, message)
        self.size = size
        self.limit = limit
        self.ambiguous = False
        if size is not None:  # found here, not an answer of the server
            self.args = (message,)

    @classmethod
    def before_sending(cls, method: str, size: int, limit: int) -> RequestTooLargeError:
        """The error for a ``method`` request of ``size`` bytes found over ``limit``."""
        text = (
            f"the {method} request is {size:,} bytes, over the {limit:,}-byte message "
            "limit of the server; nothing was sent"
        )
        if method.startswith("Enqueue"):
            text += " (each job fits on its own: send them in smaller batches)"
        return cls(text, size=size, limit=limit)


class EmptyBatchError(ClientError):
    """An enqueue was called without jobs; nothing was sent."""

    def __init__(self) -> None:
        super().__init__("empty batch: an enqueue needs at least one job")


class BatchResultCountMismatchError(ClientError):
    """The server answered a batch with a different number of results."""

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"sent {expected} jobs but the server returned {got} results")


class MalformedResponseError(ClientError):
    """The server's answer breaks the wire contract."""


class DecodeError(MalformedResponseError):
    """Bytes that are not a valid encoding of the expected message."""


class ResponseTooLargeError(MalformedResponseError):
    """A response over the client's receive limit (``max_receive_message_bytes``)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"response of {size} bytes exceeds max_receive_message_bytes ({limit}); "
            "jobs it leased stay leased until their leases expire"
        )


class MalformedJobError(ClientError):
    """A job that could not be decoded (see :class:`JobConversionError`)."""

    def __init__(self, cause: JobConversionError) -> None:
        self.cause = cause
        super().__init__(f"the server returned a malformed job: {cause}")


class MalformedServerInfoError(ClientError):
    """A server-info answer that could not be decoded."""

    def __init__(self, cause: ServerInfoError) -> None:
        self.cause = cause
        super().__init__(f"the server returned malformed server info: {cause}")


class JobConversionError(SeppError):
    """One job (or dead-letter record) in an answer could not be read; it is skipped."""


class ServerInfoError(SeppError):
    """A server-info answer could not be read (see :class:`MalformedServerInfoError`)."""


class JobRejectedError(SeppError):
    """``enqueue()`` of a single job was refused; ``rejection`` says why."""

    def __init__(self, rejection: JobRejection) -> None:
        self.rejection = rejection
        super().__init__(f"job rejected: {rejection}")


class BatchValidationError(SeppError):
    """``enqueue_atomic()`` wrote nothing because these jobs were refused."""

    def __init__(self, errors: list[JobValidationError]) -> None:
        self.errors = errors
        text = f"atomic batch refused: {len(errors)} job(s) failed validation"
        if errors:
            shown = "; ".join(f"job {e.index}: {e.rejection}" for e in errors[:3])
            more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
            text += f" ({shown}{more})"
        super().__init__(text)


class LeaseError(SeppError):
    """Ack, nack or extend found that this delivery no longer holds the lease."""


class JobNotFoundError(LeaseError):
    """No such in-flight job: acked already, lease expired, or dead-lettered."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "the job is not in flight (acked, expired or unknown)")


class AttemptMismatchError(LeaseError):
    """The job was redelivered: this attempt's lease belongs to another delivery now."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "attempt mismatch: the job was redelivered")


class ReserveError(SeppError):
    """A reserve-specific refusal (transport failures are :class:`ClientError`)."""


class UnknownQueuesError(ReserveError):
    """Strict mode, and some requested queues are not declared."""

    def __init__(self, message: str) -> None:
        self.server_message = message
        # sepp says 'queue(s) not declared (strict mode): ["a"]': keep the list, not the
        # same words twice.
        _, strict, names = message.partition("(strict mode): ")
        if strict:
            super().__init__(f"queues not declared on the server (strict mode): {names}")
        else:
            super().__init__(f"queues not declared on the server: {message}")


# The server may have committed a request that failed with one of these (the retry
# decision itself, which reads ``ambiguous``, is ``_retry.is_retryable``).
AMBIGUOUS_CODES = frozenset({Status.DEADLINE_EXCEEDED, Status.ABORTED})

_BY_STATUS: dict[Status, type[ClientError]] = {
    Status.UNAVAILABLE: TransportError,
    Status.DEADLINE_EXCEEDED: TransportError,
    Status.ABORTED: TransportError,
    Status.CANCELLED: TransportError,
    Status.UNAUTHENTICATED: UnauthenticatedError,
    Status.PERMISSION_DENIED: UnauthenticatedError,
    Status.RESOURCE_EXHAUSTED: OverloadedError,
    Status.INVALID_ARGUMENT: InvalidRequestError,
    Status.INTERNAL: ServerInternalError,
    Status.DATA_LOSS: ServerInternalError,
    Status.UNKNOWN: ServerInternalError,
}

CallKind = Literal["generic", "lease", "reserve"]


def _status_error(status: Status, message: str, kind: CallKind) -> SeppError:
    if kind == "lease" and status is Status.NOT_FOUND:
        return JobNotFoundError()
    if kind == "lease" and status is Status.FAILED_PRECONDITION:
        return AttemptMismatchError()
    if kind == "reserve" and status is Status.FAILED_PRECONDITION:
        return UnknownQueuesError(message)
    if status is Status.OUT_OF_RANGE:  # sepp's only use of it: a request too large
        return RequestTooLargeError(message)
    cls = _BY_STATUS.get(status)
    error = UnexpectedStatusError(status, message) if cls is None else cls(message)
    error.code = status
    error.ambiguous = status in AMBIGUOUS_CODES
    return error


def _transport_error(message: str, code: Status | None, ambiguous: bool) -> TransportError:
    error = TransportError(message)
    error.code = code
    error.ambiguous = ambiguous
    return error


def map_failure(
    failure: CallFailure,
    kind: CallKind = "generic",
    where: str = "",
    timeout: Optional[float] = None,
) -> SeppError:
    """The sepp error for a failed call. ``kind`` says what a status means for this
    RPC (NOT_FOUND from a lease RPC is :class:`JobNotFoundError`); ``where`` (the call
    and the address) starts the message of failures that are not the server's answer;
    ``timeout``, the call's deadline in seconds, is named when the deadline passed.

    The only place transport, socket and TLS failures turn into sepp errors: the
    client raises what it returns ``from`` the failure's cause (a socket or TLS
    error, grpclib's exception) or the failure itself.
    """
    if isinstance(failure, ResponseTooLarge):
        return ResponseTooLargeError(failure.size, failure.limit)
    if failure.local or failure.status is None:
        message = failure.message
        if failure.backing_off and failure.retry_after is not None:
            message += retry_hint(failure.retry_after)
        if timeout is not None and failure.local and failure.status is Status.DEADLINE_EXCEEDED:
            message += f" (the call's deadline was {timeout:g} s)"
        ambiguous = (
            failure.status in AMBIGUOUS_CODES if failure.ambiguous is None else failure.ambiguous
        )
        error = _transport_error(
            f"{where}: {message}" if where else message, failure.status, ambiguous
        )
        error.retry_after = failure.retry_after
        return error
    return _status_error(failure.status, failure.message, kind)


# What __all__ names but this module does not define: the JobRejection values.
_REJECTIONS = frozenset(__all__) - set(globals())
