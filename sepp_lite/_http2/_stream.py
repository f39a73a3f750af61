"""One unary call's stream: what it still has to send, and the answer as it arrives."""

from __future__ import annotations

import asyncio
from typing import Optional, Union

from sepp_lite._http2._headers import Response
from sepp_lite._status import CallFailure, Status
from sepp_lite.errors import ResponseTooLargeError

# HTTP statuses of answers without grpc-status, as gRPC's http-grpc-status-mapping says.
_HTTP_STATUS = {
    b"400": Status.INTERNAL,
    b"401": Status.UNAUTHENTICATED,
    b"403": Status.PERMISSION_DENIED,
    b"404": Status.UNIMPLEMENTED,
    b"429": Status.UNAVAILABLE,
    b"502": Status.UNAVAILABLE,
    b"503": Status.UNAVAILABLE,
    b"504": Status.UNAVAILABLE,
}

Failure = Union[CallFailure, ResponseTooLargeError]
Outcome = Union[None, bytes, Failure]
"""What a frame did to a call: nothing final yet, its answer, or its failure."""


class Stream:
    """Send and receive state of one stream; the caller awaits ``future``."""

    __slots__ = (
        "chunks",
        "expected",
        "future",
        "head",
        "id",
        "max_receive",
        "pending",
        "received",
        "recv_window",
        "send_window",
        "sent_end",
    )

    def __init__(
        self,
        stream_id: int,
        future: asyncio.Future[bytes],
        send_window: int,
        recv_window: int,
        max_receive: int,
    ) -> None:
        self.id = stream_id
        self.future = future
        self.send_window = send_window  # may go negative after a SETTINGS change
        self.recv_window = recv_window
        self.max_receive = max_receive
        self.pending: Optional[memoryview] = None  # request bytes waiting for window
        self.sent_end = False  # END_STREAM went out: our half is closed
        self.head: Optional[Response] = None  # the response headers, once they came
        self.chunks: list[bytes] = []  # the response body as it arrived
        self.received = 0
        self.expected = -1  # 5 + the message length, once the prefix is known

    def on_headers(self, response: Response, end_stream: bool) -> Outcome:
        """Take a header block: the response head, a trailers-only answer, or the
        trailers (``end_stream``). Returns the call's result when this ends it."""
        if self.head is None:
            if response.http_status is not None and response.http_status[:1] == b"1":
                if end_stream:
                    return CallFailure(
                        Status.INTERNAL, "the stream ended on an informational answer"
                    )
                return None  # an informational answer: the real one follows
            self.head = response
            if not end_stream:
                return head_problem(response)
            if response.grpc_status is None:
                return head_problem(response) or _no_status()
            return self.finish(response)  # trailers-only: its grpc-status speaks
        if not end_stream:
            return CallFailure(
                Status.INTERNAL, "the server sent trailers without ending the stream"
            )
        return self.finish(response)

    def on_data(self, payload: bytes) -> Optional[Failure]:
        """Take a DATA payload (padding removed); the receive limit is checked as soon
        as the message's length prefix is complete, before its body is kept."""
        if self.head is None:
            return CallFailure(Status.INTERNAL, "the server sent data before its headers")
        if self.expected < 0:
            if self.received + len(payload) < 5:
                self.chunks.append(payload)
                self.received += len(payload)
                return None
            problem = self._read_prefix((b"".join(self.chunks) + payload[:5])[:5])
            if problem is not None:
                return problem
        if self.received + len(payload) > self.expected:
            return CallFailure(Status.INTERNAL, "the server sent more than one response message")
        self.chunks.append(payload)
        self.received += len(payload)
        return None

    def _read_prefix(self, prefix: bytes) -> Optional[Failure]:
        if prefix[0]:
            return CallFailure(Status.INTERNAL, "compressed responses are not supported")
        size = int.from_bytes(prefix[1:5], "big")
        if size > self.max_receive:
            return ResponseTooLargeError(size, self.max_receive)
        self.expected = 5 + size
        return None

    def finish(self, trailers: Optional[Response]) -> Union[bytes, Failure]:
        """The call's result once the stream ended (``trailers`` None: it ended on DATA)."""
        if trailers is None or trailers.grpc_status is None:
            return _no_status()
        if trailers.grpc_status is not Status.OK:
            return CallFailure(trailers.grpc_status, trailers.grpc_message)
        if self.received == 0:
            return CallFailure(Status.INTERNAL, "the server sent no response message")
        if self.received < self.expected or self.expected < 0:
            return CallFailure(Status.INTERNAL, "the response ended inside a message")
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return body[5:]


def head_problem(response: Response) -> Optional[CallFailure]:
    """Why response headers are not a gRPC answer, or None."""
    http_status = response.http_status
    if http_status != b"200":
        if response.grpc_status is not None:
            return None  # a trailers-only answer: its grpc-status speaks
        status = _HTTP_STATUS.get(http_status or b"", Status.UNKNOWN)
        shown = http_status.decode("ascii", "replace") if http_status else "none"
        return CallFailure(status, f"HTTP status {shown}")
    content_type = response.content_type
    if content_type is None or not content_type.startswith(b"application/grpc"):
        kind = repr(content_type.decode("ascii", "replace")) if content_type else "none"
        return CallFailure(Status.UNKNOWN, f"unexpected content-type {kind}")
    return None


def _no_status() -> CallFailure:
    return CallFailure(Status.INTERNAL, "the response ended without a grpc-status")
