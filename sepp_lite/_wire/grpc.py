"""gRPC's rules for a unary call over HTTP/2 (gRPC's PROTOCOL-HTTP2.md), for both
transports: the client's own HTTP/2 connection (``transport``) and the grpclib
adapter behind ``SeppClient.from_channel`` (``grpclib_transport``).

- the request message's framing (:func:`frame`) and ``grpc-timeout`` values
  (:func:`timeout_value`);
- reading an answer (:class:`Reader`): the head (HTTP status, content-type, a
  trailers-only answer), exactly one uncompressed response message within the receive
  limit, the trailers' ``grpc-status`` and percent-encoded ``grpc-message``;
- what an HTTP/2 stream failure means for the call (:func:`failure_of`): its status,
  and whether the server may have processed it.

Every failure comes out as a :class:`~sepp_lite._status.CallFailure`. The HTTP/2
layer (``http2``) knows none of this, as grpclib keeps its h2 glue (protocol.py)
apart from message framing (stream.py), deadlines (metadata.py) and statuses.
"""

from __future__ import annotations

from typing import Optional, Union

from sepp_lite._status import CallFailure, ResponseTooLarge, Status, status_of
from sepp_lite._wire.http2 import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    INADEQUATE_SECURITY,
    Failed,
    Outcome,
    ResponseHeaders,
    StreamFailure,
)

# HTTP statuses of answers without grpc-status, as gRPC's http-grpc-status-mapping says.
HTTP_STATUS = {
    b"400": Status.INTERNAL,
    b"401": Status.UNAUTHENTICATED,
    b"403": Status.PERMISSION_DENIED,
    b"404": Status.UNIMPLEMENTED,
    b"429": Status.UNAVAILABLE,
    b"502": Status.UNAVAILABLE,
    b"503": Status.UNAVAILABLE,
    b"504": Status.UNAVAILABLE,
}

# RST_STREAM codes as PROTOCOL-HTTP2 maps them (REFUSED_STREAM: not processed, UNAVAILABLE;
# any other code: INTERNAL).
_RESET_STATUS = {
    CANCEL: Status.CANCELLED,
    ENHANCE_YOUR_CALM: Status.RESOURCE_EXHAUSTED,
    INADEQUATE_SECURITY: Status.PERMISSION_DENIED,
}

_PREFIX = 5  # the compressed flag and the message length


def length_prefixed(message: bytes) -> bytes:
    """``message`` as a gRPC length-prefixed message, uncompressed."""
    return b"\0" + len(message).to_bytes(4, "big") + message


def timeout_value(seconds: float) -> bytes:
    """A ``grpc-timeout`` value (at most 8 digits and a unit), rounded up."""
    millis = max(1, -int(-seconds * 1000 // 1))
    if millis < 100_000_000:
        return b"%dm" % millis
    return b"%dS" % min(-int(-seconds // 1), 99_999_999)


# -- statuses ---------------------------------------------------------------------------

_STATUS_VALUES = {b"%d" % status: status for status in Status}


def grpc_status(response: ResponseHeaders) -> Optional[Status]:
    """The block's ``grpc-status``, None without one; a value grpc cannot read is
    UNKNOWN."""
    value = response.fields.get(b"grpc-status")
    if value is None:
        return None
    status = _STATUS_VALUES.get(value)
    if status is not None:
        return status
    return status_of(int(value)) if value.isdigit() and len(value) < 10 else Status.UNKNOWN


def grpc_message(response: ResponseHeaders) -> str:
    """``grpc-message``: percent-encoded UTF-8 (PROTOCOL-HTTP2); a ``%`` not followed
    by two hex digits stays as it is."""
    message = response.fields.get(b"grpc-message", b"")
    if b"%" not in message:
        return message.decode("utf-8", "replace")
    parts = message.split(b"%")
    out = bytearray(parts[0])
    for part in parts[1:]:
        if len(part) >= 2 and part[0] in _HEX and part[1] in _HEX:
            out.append(int(part[:2], 16))
            out += part[2:]
        else:
            out += b"%" + part
    return out.decode("utf-8", "replace")


_HEX = frozenset(b"0123456789abcdefABCDEF")


def head_problem(head: ResponseHeaders) -> Optional[CallFailure]:
    """Why response headers are not a gRPC answer, or None."""
    http_status = head.http_status
    if http_status != b"200":
        if grpc_status(head) is not None:
            return None  # a trailers-only answer: its grpc-status speaks
        status = HTTP_STATUS.get(http_status or b"", Status.UNKNOWN)
        shown = http_status.decode("ascii", "replace") if http_status else "none"
        return CallFailure(status, f"HTTP status {shown}")
    content_type = head.content_type
    if content_type is None or not content_type.startswith(b"application/grpc"):
        kind = repr(content_type.decode("ascii", "replace")) if content_type else "none"
        return CallFailure(Status.UNKNOWN, f"unexpected content-type {kind}")
    return None


# -- the answer ---------------------------------------------------------------------------


class Reader:
    """One unary call's answer, read as it arrives (``http2``'s ``BodyReader``): one
    response message of at most ``limit`` bytes, then trailers with grpc-status OK.

    The limit is checked as soon as the message's length prefix is complete, before
    any of its body is kept: a server cannot make the client buffer more than that."""

    __slots__ = ("chunks", "expected", "limit", "received")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []  # the response body as it arrived
        self.received = 0
        self.expected = -1  # 5 + the message length, once the prefix is known

    def on_head(self, head: ResponseHeaders, end_stream: bool) -> Outcome:
        if not end_stream:
            return head_problem(head)
        if grpc_status(head) is None:
            return head_problem(head) or _no_status()
        return self.finish(head)  # trailers-only: its grpc-status speaks

    def on_data(self, payload: bytes) -> Optional[CallFailure]:
        if self.expected < 0:
            if self.received + len(payload) < _PREFIX:
                self.chunks.append(payload)
                self.received += len(payload)
                return None
            problem = self._read_prefix((b"".join(self.chunks) + payload[:_PREFIX])[:_PREFIX])
            if problem is not None:
                return problem
        if self.received + len(payload) > self.expected:
            return CallFailure(Status.INTERNAL, "the server sent more than one response message")
        self.chunks.append(payload)
        self.received += len(payload)
        return None

    def _read_prefix(self, prefix: bytes) -> Optional[CallFailure]:
        if prefix[0]:
            return CallFailure(Status.INTERNAL, "compressed responses are not supported")
        size = int.from_bytes(prefix[1:_PREFIX], "big")
        if size > self.limit:
            return ResponseTooLarge(size, self.limit)
        self.expected = _PREFIX + size
        return None

    def finish(self, trailers: Optional[ResponseHeaders]) -> Union[bytes, CallFailure]:
        """The call's result once the answer ended (``trailers`` None: without any)."""
        status = None if trailers is None else grpc_status(trailers)
        if status is None or trailers is None:
            return _no_status()
        if status is not Status.OK:
            return CallFailure(status, grpc_message(trailers))
        if self.received == 0:
            return CallFailure(Status.INTERNAL, "the server sent no response message")
        if self.received < self.expected or self.expected < 0:
            return CallFailure(Status.INTERNAL, "the response ended inside a message")
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return body[_PREFIX:]


def _no_status() -> CallFailure:
    return CallFailure(Status.INTERNAL, "the response ended without a grpc-status")


# -- failures -----------------------------------------------------------------------------


def unprocessed_call(message: str) -> CallFailure:
    """A call the server never processed: UNAVAILABLE, safe to repeat."""
    return CallFailure(Status.UNAVAILABLE, message, local=True, ambiguous=False, not_processed=True)


def lost_call(message: str) -> CallFailure:
    """A call whose connection failed while the server may have been working on it."""
    return CallFailure(Status.UNAVAILABLE, message, local=True, ambiguous=True)


def failure_of(exc: StreamFailure) -> CallFailure:
    """An HTTP/2 stream's failure as the call's."""
    how, message = exc.how, exc.message
    if how is Failed.REFUSED:
        return unprocessed_call(message)
    if how is Failed.LOST:
        return lost_call(message)
    if how is Failed.RESET:
        return CallFailure(_RESET_STATUS.get(exc.code or 0, Status.INTERNAL), message)
    if how is Failed.DEADLINE:
        # Sent, it may have been applied; still waiting for a stream, it was not.
        return CallFailure(Status.DEADLINE_EXCEEDED, message, local=True, ambiguous=exc.sent)
    if how is Failed.UNSENDABLE:
        return CallFailure(Status.INTERNAL, message, local=True, ambiguous=False)
    return CallFailure(Status.INTERNAL, message)  # the server broke HTTP/2's rules
