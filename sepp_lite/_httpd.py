"""A tiny HTTP/1.1 server for the health and metrics endpoints, on asyncio.

It answers ``GET`` and ``HEAD`` of a fixed set of paths, one request per connection
(``Connection: close``), which is all Kubernetes probes and Prometheus scrapes need.
Everything is bounded: the request head (line and headers) to 8 KiB, the time to read
it and to write the answer, and the number of connections served at once, so a slow
or hostile client cannot hold it. :class:`ThreadedHttpServer` runs it on its own
event loop in a thread (``_loop_thread.LoopThread``), so that it still answers while
the worker's loop is blocked (which is what ``/livez`` must be able to say).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Callable, NamedTuple, Optional

from sepp_lite._loop_thread import LoopThread

logger = logging.getLogger("sepp_lite.monitor")

__all__ = ["HttpServer", "Response", "Route", "ThreadedHttpServer", "parse_listen_address"]

MAX_HEAD_BYTES = 8 * 1024  # request line plus headers
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}
TEXT = "text/plain; charset=utf-8"


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = TEXT


Route = Callable[[str], Response]
"""Called with the request's ``Accept`` header (``""`` when absent)."""


def parse_listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (every interface) as ``(host, port)``;
    ``ValueError`` otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. [::1]:9464, not {text!r}")
    return host, int(port_text)


def _head(status: int, content_type: str, length: int) -> bytes:
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")


def _plain(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode())


class HttpServer:
    """Serves ``routes`` (path -> :data:`Route`) on the loop it is started on."""

    def __init__(
        self, routes: Mapping[str, Route], *, read_timeout: float = READ_TIMEOUT_S
    ) -> None:
        self._routes = dict(routes)
        self._read_timeout = read_timeout
        self._server: Optional[asyncio.AbstractServer] = None
        self._connections = 0
        self.host = ""
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see :attr:`port`).
        Raises ``OSError`` when the address cannot be bound."""
        self._server = await asyncio.start_server(
            self._serve, host or None, port, limit=MAX_HEAD_BYTES, reuse_address=True
        )
        bound = self._server.sockets[0].getsockname()
        self.host, self.port = (host or bound[0]), bound[1]

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), WRITE_TIMEOUT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > MAX_CONNECTIONS:
                return  # closed without an answer: the client retries later
            response, head_only = await self._answer(reader)
            body = b"" if head_only else response.body
            writer.write(_head(response.status, response.content_type, len(response.body)))
            writer.write(body)
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            pass  # the client went away or stalled: nothing to tell it
        finally:
            self._connections -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout)
        except asyncio.LimitOverrunError:
            return _plain(431, "request head over 8 KiB"), False
        except asyncio.IncompleteReadError as error:
            if not error.partial:
                raise ConnectionResetError from None  # connected and left: no answer
            return _plain(400, "incomplete request"), False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _plain(400, "not an HTTP/1.x request line"), False
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return _plain(405, "only GET and HEAD"), False
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return _plain(404, "endpoints: " + " ".join(sorted(self._routes))), method == "HEAD"
        return self._call(route, _header(lines[1:], "accept")), method == "HEAD"

    @staticmethod
    def _call(route: Route, accept: str) -> Response:
        try:
            return route(accept)
        except Exception:
            logger.exception("an endpoint failed")
            return _plain(500, "internal error (logged)")


def _header(lines: list[str], name: str) -> str:
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return ""


class ThreadedHttpServer:
    """An :class:`HttpServer` on its own event loop in a daemon thread (a
    :class:`~sepp_lite._loop_thread.LoopThread`), started and closed from another
    event loop, which goes on running meanwhile."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self._http = HttpServer(routes)
        self._portal: Optional[LoopThread] = None

    @property
    def host(self) -> str:
        return self._http.host

    @property
    def port(self) -> int:
        return self._http.port

    async def start(self, host: str, port: int) -> None:
        """Start the thread and listen; ``OSError`` when the address cannot be bound."""
        portal = LoopThread("sepp-lite-http")
        try:
            await portal.run_from_loop(self._http.start(host, port))
        except BaseException:
            await portal.stop_from_loop()
            raise
        self._portal = portal

    async def close(self) -> None:
        """Stop listening, cancel the connections still being served, and end the
        thread (waits at most a few seconds for each)."""
        portal, self._portal = self._portal, None
        if portal is None:
            return
        try:
            with contextlib.suppress(RuntimeError):  # the loop ended already
                await portal.run_from_loop(self._http.close())
        finally:
            await portal.stop_from_loop()
