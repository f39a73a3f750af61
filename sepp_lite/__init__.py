"""sepp_lite: a pure-Python asyncio client for the sepp job queue.

The API is sepp-py 0.1.0's, so code written for the official client runs after
``import sepp_lite as sepp``; durations also accept float seconds. See README.md and
the documentation site (docs/).
"""

from __future__ import annotations

import importlib
import typing

from sepp_lite._log import JsonLogFormatter
from sepp_lite._version import __version__
from sepp_lite.client import SeppClient
from sepp_lite.errors import (
    AttemptMismatchError,
    BatchResultCountMismatchError,
    BatchValidationError,
    ClientError,
    ConnectError,
    DecodeError,
    EmptyBatchError,
    InvalidApiKeyError,
    InvalidRequestError,
    JobConversionError,
    JobNotFoundError,
    JobRejectedError,
    LeaseError,
    MalformedJobError,
    MalformedResponseError,
    MalformedServerInfoError,
    OverloadedError,
    RequestTooLargeError,
    ReserveError,
    ResponseTooLargeError,
    SeppError,
    ServerInfoError,
    ServerInternalError,
    TransportError,
    UnauthenticatedError,
    UnexpectedStatusError,
    UnknownQueuesError,
)
from sepp_lite.types import (
    DeadLetterCause,
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobCtx,
    Payload,
    Primitive,
    Priority,
    PriorityOutOfRangeError,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    ServerInfo,
    TraceContext,
    TraceContextError,
)

if typing.TYPE_CHECKING:
    # What _LAZY below loads on first use, for type checkers.
    from sepp_lite._observe import WorkerObserver
    from sepp_lite._scheduler import PeriodicJob, PeriodicScheduler, periodic_slot
    from sepp_lite.errors import *  # noqa: F403
    from sepp_lite.shutdown import ShutdownHandle, shutdown_on_signals
    from sepp_lite.tasks import Task, Tasks
    from sepp_lite.worker import DuplicateHandlerError, HandlerError, Worker

__all__ = [
    "AttemptMismatchError",
    "BatchResultCountMismatchError",
    "BatchValidationError",
    "ClientError",
    "ConnectError",
    "CustomEntriesTooMany",
    "CustomKeyTooLong",
    "CustomMapTooLarge",
    "DeadLetterCause",
    "DeadLetterRecord",
    "DecodeError",
    "DuplicateHandlerError",
    "EmptyBatchError",
    "EncodingNotAllowed",
    "EnqueueAck",
    "EnqueueRequest",
    "HandlerError",
    "IdempotencyKeyTooLong",
    "InvalidApiKeyError",
    "InvalidRequest",
    "InvalidRequestError",
    "Job",
    "JobConversionError",
    "JobCtx",
    "JobNotFoundError",
    "JobRejectedError",
    "JobRejection",
    "JobTypeNameTooLong",
    "JobTypeNotAllowed",
    "JobValidationError",
    "JsonLogFormatter",
    "LeaseError",
    "MalformedJobError",
    "MalformedResponseError",
    "MalformedServerInfoError",
    "OverloadedError",
    "Payload",
    "PayloadTooLarge",
    "PeriodicJob",
    "PeriodicScheduler",
    "Primitive",
    "Priority",
    "PriorityOutOfRangeError",
    "QueueClosing",
    "QueueFull",
    "QueueNameTooLong",
    "RequestTooLargeError",
    "ReserveError",
    "ReserveOptions",
    "ResponseTooLargeError",
    "RetryDirective",
    "RetryPolicy",
    "ScheduledTooFar",
    "SeppClient",
    "SeppError",
    "ServerInfo",
    "ServerInfoError",
    "ServerInternalError",
    "ShutdownHandle",
    "Task",
    "Tasks",
    "TraceContext",
    "TraceContextError",
    "TransportError",
    "UnauthenticatedError",
    "UnexpectedStatusError",
    "UnknownQueue",
    "UnknownQueuesError",
    "UnknownRejection",
    "Worker",
    "WorkerObserver",
    "__version__",
    "periodic_slot",
    "shutdown_on_signals",
]

# Loaded on first use, so ``import sepp_lite`` does not pay for what only some programs
# need: the Worker, typed tasks, and the rejection values (sepp_lite/_rejections.py says why).
_LAZY = dict.fromkeys(("DuplicateHandlerError", "HandlerError", "Worker"), "sepp_lite.worker")
_LAZY["WorkerObserver"] = "sepp_lite._observe"
_LAZY.update(dict.fromkeys(("ShutdownHandle", "shutdown_on_signals"), "sepp_lite.shutdown"))
_LAZY.update(dict.fromkeys(("Task", "Tasks"), "sepp_lite.tasks"))
_LAZY.update(
    dict.fromkeys(("PeriodicJob", "PeriodicScheduler", "periodic_slot"), "sepp_lite._scheduler")
)
_LAZY.update(dict.fromkeys(set(__all__) - set(globals()) - set(_LAZY), "sepp_lite.errors"))


def __getattr__(name: str) -> typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
