"""One request's stream: what it still has to send, and its answer as it arrives.

HTTP/2 says in what order an answer comes (informational heads, the head, DATA, the
trailers ending the stream); what the answer means is its reader's business
(:class:`BodyReader`: ``sepp_lite._wire.grpc`` reads gRPC answers). A stream that ends
without an answer ends with a :class:`StreamFailure`, in HTTP/2's terms.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Optional, Protocol, Union

from sepp_lite._wire.http2._headers import ResponseHeaders

Outcome = Union[None, bytes, Exception]
"""What a frame did to a call: nothing final yet, its answer, or its failure."""


class BodyReader(Protocol):
    """Reads one answer as its stream delivers it, in order: the head, the DATA
    payloads, the trailers. Each method returns the call's result (bytes or an
    exception) when that part decides it, else None."""

    def on_head(self, head: ResponseHeaders, end_stream: bool) -> Outcome:
        """The response head; ``end_stream``: it is the whole answer."""

    def on_data(self, payload: bytes) -> Optional[Exception]:
        """A DATA payload (padding removed). A reader refuses a body that is too
        large here, before it keeps it."""

    def finish(self, trailers: Optional[ResponseHeaders]) -> Union[bytes, Exception]:
        """The stream ended: with ``trailers``, or on DATA (None)."""


class Failed(enum.Enum):
    """How a stream ended without an answer."""

    REFUSED = "refused"  # never processed: safe to send again (RFC 9113 §8.7)
    LOST = "lost"  # the connection failed during the call: it may have been processed
    RESET = "reset"  # the peer reset the stream (``code``)
    DEADLINE = "deadline"  # the caller's deadline passed
    PEER_ERROR = "peer error"  # the peer broke HTTP/2's rules on this stream
    UNSENDABLE = "unsendable"  # the request cannot be sent to this peer as it is


class StreamFailure(Exception):
    """A stream that ended without an answer. ``how`` says in which way; ``code`` is
    the RST_STREAM error code (RESET); ``sent`` says whether the request may have
    reached the peer (DEADLINE)."""

    def __init__(
        self, how: Failed, message: str, *, code: Optional[int] = None, sent: bool = True
    ) -> None:
        super().__init__(message)
        self.how = how
        self.message = message
        self.code = code
        self.sent = sent


def not_processed(message: str) -> StreamFailure:
    """A request the peer never processed (GOAWAY past its stream, REFUSED_STREAM, a
    connection closed before the stream opened)."""
    return StreamFailure(Failed.REFUSED, message, sent=False)


def lost(message: str) -> StreamFailure:
    """A request whose connection failed while the peer may have been working on it."""
    return StreamFailure(Failed.LOST, message)


def reset(code: int, message: str) -> StreamFailure:
    return StreamFailure(Failed.RESET, message, code=code)


def deadline(message: str, *, sent: bool) -> StreamFailure:
    return StreamFailure(Failed.DEADLINE, message, sent=sent)


def peer_error(message: str) -> StreamFailure:
    return StreamFailure(Failed.PEER_ERROR, message)


def unsendable(message: str) -> StreamFailure:
    return StreamFailure(Failed.UNSENDABLE, message, sent=False)


class Stream:
    """Send and receive state of one stream; the caller awaits ``future``."""

    __slots__ = (
        "future",
        "head",
        "id",
        "pending",
        "reader",
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
        reader: BodyReader,
    ) -> None:
        self.id = stream_id
        self.future = future
        self.send_window = send_window  # may go negative after a SETTINGS change
        self.recv_window = recv_window
        self.reader = reader
        self.pending: Optional[memoryview] = None  # request bytes waiting for window
        self.sent_end = False  # END_STREAM went out: our half is closed
        self.head: Optional[ResponseHeaders] = None  # the response headers, once they came

    def on_headers(self, response: ResponseHeaders, end_stream: bool) -> Outcome:
        """Take a header block: the response head, a head that is the whole answer, or
        the trailers (``end_stream``). Returns the call's result when this ends it."""
        if self.head is None:
            if response.http_status is not None and response.http_status[:1] == b"1":
                if end_stream:
                    return peer_error("the stream ended on an informational answer")
                return None  # an informational answer: the real one follows
            self.head = response
            return self.reader.on_head(response, end_stream)
        if not end_stream:
            return peer_error("the server sent trailers without ending the stream")
        return self.reader.finish(response)

    def on_data(self, payload: bytes) -> Optional[Exception]:
        """Take a DATA payload (padding removed)."""
        if self.head is None:
            return peer_error("the server sent data before its headers")
        return self.reader.on_data(payload)

    def finish(self, trailers: Optional[ResponseHeaders]) -> Union[bytes, Exception]:
        """The call's result once the stream ended (``trailers`` None: it ended on DATA)."""
        return self.reader.finish(trailers)
