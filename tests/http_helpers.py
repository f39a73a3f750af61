"""A minimal HTTP/1.1 client for the health endpoints (real sockets, no library), the
parsing of a Prometheus exposition, and polling helpers for the monitor's tests."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: str


def parse_answer(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(status, headers, body.decode())


async def get(url: str, *, method: str = "GET", accept: str = "", timeout: float = 10.0) -> Answer:
    """One request (``Connection: close``), read to the end."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(parts.hostname, parts.port), timeout
    )
    try:
        extra = f"Accept: {accept}\r\n" if accept else ""
        request = f"{method} {parts.path or '/'} HTTP/1.1\r\nHost: x\r\n{extra}\r\n"
        writer.write(request.encode())
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return parse_answer(raw)


def get_blocking(url: str, timeout: float = 10.0) -> Answer:
    """The same from a plain thread (for when the test's own loop is blocked)."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(f"GET {parts.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return parse_answer(b"".join(chunks))


async def wait_for_status(
    url: str, status: int, *, timeout: float = 20.0, says: str = ""
) -> Answer:
    """Poll ``url`` (state with no event to wait on) until it answers ``status`` with a
    body containing ``says``; the answer."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    last: Optional[Answer] = None
    while loop.time() < end:
        last = await get(url)
        if last.status == status and says in last.body:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not answer {status} {says!r} in {timeout} s; last: {last}")


def samples(exposition: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def sample_names(exposition: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(exposition) for s in f.samples}
