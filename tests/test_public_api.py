"""The package root: a sorted, complete ``__all__`` that contains every name of sepp-py
0.1.0's root with the same signatures, so ``import sepp_lite as sepp`` just works."""

from __future__ import annotations
import __future__

import dataclasses
import inspect
import types

import pytest

import sepp_lite
from tests.client_helpers import NO_SEPP_PY

# sepp-py 0.1.0's root __all__ (spec/public-api.md), pinned here so the check runs even
# where sepp-py cannot be installed (PyPy, Python 3.9).
SEPP_PY_ROOT = """
__version__ SeppClient RetryPolicy RetryDirective Worker HandlerError ShutdownHandle
DuplicateHandlerError Payload Primitive Priority PriorityOutOfRangeError TraceContext
TraceContextError EnqueueRequest EnqueueAck Job JobCtx ReserveOptions ServerInfo
DeadLetterCause DeadLetterRecord SeppError ClientError ConnectError InvalidApiKeyError
TransportError UnauthenticatedError OverloadedError InvalidRequestError ServerInternalError
UnexpectedStatusError EmptyBatchError BatchResultCountMismatchError MalformedResponseError
MalformedJobError MalformedServerInfoError JobConversionError ServerInfoError
JobRejectedError BatchValidationError LeaseError JobNotFoundError AttemptMismatchError
ReserveError UnknownQueuesError JobRejection JobValidationError UnknownQueue PayloadTooLarge
EncodingNotAllowed JobTypeNotAllowed CustomEntriesTooMany CustomMapTooLarge CustomKeyTooLong
QueueNameTooLong JobTypeNameTooLong IdempotencyKeyTooLong ScheduledTooFar InvalidRequest
QueueFull QueueClosing UnknownRejection
""".split()

COALESCING = ("coalesce_enqueues", "max_enqueue_batches_in_flight", "max_enqueues_waiting")

# Keyword-only parameters sepp_lite adds (all optional); everything else must match.
ADDED = {
    "SeppClient.__init__": {"max_receive_message_bytes", "check_payload_limit", *COALESCING},
    "SeppClient.connect": {
        "keepalive_time",
        "keepalive_timeout",
        "check_payload_limit",
        *COALESCING,
    },
    "Worker.__init__": {
        "shutdown_timeout",
        "sync_threads",
        "wait_for_server",
        "unknown_type_delay",
    },
    "Worker.run": {"until_idle"},
    "ConnectError.__init__": {"server_uses_tls"},
}


def test_all_is_sorted_and_complete() -> None:
    assert sepp_lite.__all__ == sorted(sepp_lite.__all__)
    # dir(), not vars(): the Worker and the rejection values load on first use.
    public = {
        name
        for name in dir(sepp_lite)
        if not name.startswith("_")
        and not isinstance(getattr(sepp_lite, name), (types.ModuleType, __future__._Feature))
    }
    assert public | {"__version__"} == set(sepp_lite.__all__)


def test_every_sepp_py_root_name_exists() -> None:
    assert len(SEPP_PY_ROOT) == 63
    missing = [name for name in SEPP_PY_ROOT if not hasattr(sepp_lite, name)]
    assert missing == []


def test_error_tree_matches_sepp_py() -> None:
    errors = sepp_lite
    client_errors = [
        "ConnectError", "InvalidApiKeyError", "TransportError", "UnauthenticatedError",
        "OverloadedError", "InvalidRequestError", "ServerInternalError", "UnexpectedStatusError",
        "EmptyBatchError", "BatchResultCountMismatchError", "MalformedResponseError",
        "MalformedJobError", "MalformedServerInfoError",
    ]  # fmt: skip
    for name in client_errors:
        assert issubclass(getattr(errors, name), errors.ClientError), name
    for name in ["JobConversionError", "ServerInfoError", "JobRejectedError",
                 "BatchValidationError", "LeaseError", "ReserveError", "ClientError",
                 "DuplicateHandlerError"]:  # fmt: skip
        assert issubclass(getattr(errors, name), errors.SeppError), name
    assert issubclass(errors.JobNotFoundError, errors.LeaseError)
    assert issubclass(errors.AttemptMismatchError, errors.LeaseError)
    assert issubclass(errors.UnknownQueuesError, errors.ReserveError)
    assert issubclass(errors.PriorityOutOfRangeError, ValueError)
    assert issubclass(errors.TraceContextError, ValueError)
    assert not issubclass(errors.HandlerError, errors.SeppError)


def _parameters(obj: object) -> list[inspect.Parameter]:
    return list(inspect.signature(obj).parameters.values())  # type: ignore[arg-type]


def _same(ours: object, theirs: object) -> bool:
    """Equal values; instances of the two libraries' same-named dataclasses compare by
    their fields."""
    if dataclasses.is_dataclass(theirs) and not isinstance(theirs, type):
        return type(ours).__name__ == type(theirs).__name__ and dataclasses.astuple(
            ours  # type: ignore[arg-type]
        ) == dataclasses.astuple(theirs)
    return ours == theirs


def _compare(name: str, ours: object, theirs: object) -> None:
    mine = {p.name: p for p in _parameters(ours)}
    official = _parameters(theirs)
    for param in official:
        assert param.name in mine, f"{name}: missing parameter {param.name}"
        assert mine[param.name].kind == param.kind, f"{name}({param.name}) kind"
        if param.default is not inspect.Parameter.empty:
            assert _same(mine[param.name].default, param.default), f"{name}({param.name})"
    extra = set(mine) - {p.name for p in official}
    assert extra <= ADDED.get(name, set()), f"{name}: unexpected extra parameters {extra}"
    for added in extra:
        assert mine[added].kind is inspect.Parameter.KEYWORD_ONLY
        assert mine[added].default is not inspect.Parameter.empty
    assert [p.name for p in _parameters(ours) if p.name in {q.name for q in official}] == [
        p.name for p in official
    ], f"{name}: parameter order"


def test_signatures_match_sepp_py() -> None:
    sepp = pytest.importorskip("sepp", reason=NO_SEPP_PY)
    assert sorted(sepp.__all__) == sorted(SEPP_PY_ROOT)
    for name in SEPP_PY_ROOT:
        theirs, ours = getattr(sepp, name), getattr(sepp_lite, name)
        if inspect.isclass(theirs):
            assert inspect.isclass(ours), name
            if dataclasses.is_dataclass(theirs):
                assert [f.name for f in dataclasses.fields(theirs)] == [
                    f.name for f in dataclasses.fields(ours)
                ], name
            _compare(f"{name}.__init__", ours.__init__, theirs.__init__)
            for attr, member in vars(theirs).items():
                if attr.startswith("_") or not callable(member):
                    continue
                target = getattr(ours, attr, None)
                assert target is not None, f"{name}.{attr}"
                _compare(f"{name}.{attr}", getattr(ours, attr), getattr(theirs, attr))
    for name in ("DEFAULT", "DEAD_LETTER"):
        assert (
            getattr(sepp.RetryDirective, name).kind == getattr(sepp_lite.RetryDirective, name).kind
        )
    assert [m.value for m in sepp.DeadLetterCause] == [m.value for m in sepp_lite.DeadLetterCause]
    assert [p.value for p in (sepp.Priority.MIN, sepp.Priority.MAX)] == [0, 9]
    assert sepp_lite.Priority.MIN.value == 0 and sepp_lite.Priority.MAX.value == 9
