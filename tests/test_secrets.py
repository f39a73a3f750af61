"""API keys stay secret, and TLS verifies the server.

One session with an API key goes through successes, per-job rejections, lease errors,
a worker with failing handlers, auth failures, retries, a dropped connection, a
deadline, a refused connection and a failed TLS handshake, with every logger of every
library at DEBUG and OpenTelemetry recording spans. The key (in clear, in its
``Bearer`` form, and Huffman-coded as HPACK would put it on the wire) must appear in
no log record of the client, no repr, no exception (chained causes included) and no
span attribute or event. The servers run on another thread, so that the records of
the test's own thread are the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import ssl
import threading
import traceback
from collections.abc import Iterator
from typing import Any, Optional

import pytest
from grpclib.exceptions import GRPCError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

import sepp_lite as sepp
from sepp_lite import _otel
from sepp_lite._wire.transport import tls_context
from sepp_lite.errors import Status
from sepp_lite.testing import QueueConfig, SeppTestServer
from tests.client_helpers import DROP, HANG, ScriptedServer, free_port, server_info_bytes
from tests.fault_helpers import LogCapture, ServerThread
from tests.pki import CA, authority, server_pem

pytestmark = pytest.mark.timeout(60)

# Short keys on purpose: a header block then stays small enough for a size-based
# redaction rule to let it through.
KEY = "sk-Zq8x3N1"
WRONG = "sk-Wr0ng7Y"
LIBRARIES = ["sepp_lite", "grpclib", "h2", "hpack", "asyncio", "opentelemetry", "trustme"]


def secret_forms(secret: str) -> list[bytes]:
    """The ways a key can show up: in clear, as the header value, and that value
    Huffman-coded (how HPACK sends it, and how a header block would show it)."""
    header = f"Bearer {secret}".encode()
    huffman = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode(header)
    return [secret.encode(), header, huffman]


FORMS = secret_forms(KEY) + secret_forms(WRONG)


def leaks(text: str, raw: Any = None) -> bool:
    """Whether ``text`` (or the bytes of ``raw``) holds any form of either key."""
    found = any(form.decode("latin-1") in text for form in FORMS)
    found = found or any(repr(form)[2:-1] in text for form in FORMS)
    found = found or any(form.hex() in text for form in FORMS)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        found = found or any(form in bytes(raw) for form in FORMS)
    return found


def record_leaks(capture: LogCapture, record: logging.LogRecord) -> bool:
    args = record.args if isinstance(record.args, tuple) else (record.args,)
    return leaks(capture.text(record)) or any(leaks("", arg) for arg in args)


def exception_text(error: BaseException) -> str:
    parts = ["".join(traceback.format_exception(type(error), error, error.__traceback__))]
    seen: set[int] = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current), repr(current.args), repr(vars(current))]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def test_the_search_finds_every_form_of_the_key() -> None:
    # Guards every "no leak" assertion below.
    block = b"\x83\x86\x1f\x08\x90" + secret_forms(KEY)[2] + b"\xbe"
    assert leaks(f"Encoded header block to {block!r}")
    assert leaks("", block)
    assert leaks(f"authorization: Bearer {KEY}")
    assert leaks(repr(GRPCError(Status.UNAUTHENTICATED, WRONG)))
    assert not leaks("Bearer <redacted> sk-")


# -- the session ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki() -> tuple[CA, dict[str, bytes]]:
    return authority("secrets")[0], server_pem("secrets")


@pytest.fixture(params=["traced", "untraced"])
def spans(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Optional[Any]]:
    """The OpenTelemetry spans of the test, when the SDK is installed (the shared
    providers of tests/otel_helpers.py); None otherwise. "untraced" turns tracing off:
    without trace headers a call's header block is small, which matters to what a
    log record shows of it."""
    if request.param == "untraced":
        monkeypatch.setattr(_otel, "AVAILABLE", False)
    if not _otel.AVAILABLE:
        yield None
        return
    try:
        from tests.otel_helpers import telemetry
    except ImportError:  # the API without the SDK
        yield None
        return
    with telemetry().capture() as state:
        yield state


async def session(
    plain: str, tls: str, scripted: str, ca: bytes, raised: list[BaseException], seen: list[Any]
) -> None:
    """Everything a client does with a key, good and bad; exceptions go to ``raised``
    and objects whose repr is checked to ``seen``."""

    async def expect(call: Any, error: type[BaseException]) -> None:
        try:
            await call
        except error as exc:
            raised.append(exc)
        else:
            raise AssertionError(f"expected {error.__name__}")

    queue = "secrets"
    async with await sepp.SeppClient.connect(plain, api_key=KEY) as client:
        seen.append(client)
        info = await client.get_server_info()
        seen.append(info)
        await client.enqueue(sepp.EnqueueRequest(queue, "ok", payload=sepp.Payload(b"x", "raw")))
        await client.enqueue_batch([sepp.EnqueueRequest(queue, "fail") for _ in range(2)])
        too_big = sepp.EnqueueRequest("tiny", "t", payload=sepp.Payload(b"x" * 64, "raw"))
        await expect(client.enqueue(too_big), sepp.JobRejectedError)
        await expect(client.enqueue_atomic([too_big]), sepp.BatchValidationError)
        jobs = await client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0, max_jobs=1))
        assert jobs is not None
        seen += [jobs[0], jobs[0].ctx, jobs[0].ctx.lease]
        await jobs[0].ctx.extend(30)
        await client.ack(jobs[0].ctx)
        await expect(client.ack(jobs[0].ctx), sepp.JobNotFoundError)
        await expect(client.nack(jobs[0].ctx), sepp.JobNotFoundError)
        worker = sepp.Worker(client, [queue], 10, max_in_flight=2)
        seen.append(worker)

        @worker.handler("ok")
        async def ok(payload: object, ctx: sepp.JobCtx) -> None:
            pass

        @worker.handler("fail")
        async def fail(payload: object, ctx: sepp.JobCtx) -> None:
            if ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
            raise sepp.HandlerError.permanent("second attempt gives up")

        await asyncio.wait_for(worker.run(until_idle=True), 20)
        assert await client.drain_dead_letters(queue, max_records=5)
    async with await sepp.SeppClient.connect(plain, api_key=WRONG) as wrong:
        seen.append(wrong)
        await expect(wrong.get_server_info(), sepp.UnauthenticatedError)
        await expect(wrong.enqueue(sepp.EnqueueRequest(queue, "t")), sepp.UnauthenticatedError)
    async with await sepp.SeppClient.connect(localhost(tls), api_key=KEY, tls_ca_cert=ca) as c:
        await c.get_server_info()
    await expect(sepp.SeppClient.connect(localhost(tls), api_key=KEY, tls=True), sepp.ConnectError)
    await expect(
        sepp.SeppClient.connect(f"127.0.0.1:{free_port()}", api_key=KEY), sepp.ConnectError
    )
    await expect(sepp.SeppClient.connect(plain, api_key=KEY + "\n"), sepp.InvalidApiKeyError)
    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    seen.append(policy)
    async with await sepp.SeppClient.connect(
        scripted, api_key=KEY, retry_policy=policy, rpc_timeout=0.5
    ) as retrying:
        await retrying.get_server_info()  # two UNAVAILABLE, then an answer
        await expect(retrying.enqueue(sepp.EnqueueRequest("q", "t")), sepp.TransportError)
        await expect(retrying.drain_dead_letters(max_records=1), sepp.TransportError)


@contextlib.contextmanager
def json_lines() -> Iterator[io.StringIO]:
    """Every record as ``sepp_lite.JsonLogFormatter`` writes it, for the block."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(sepp.JsonLogFormatter())
    logging.getLogger().addHandler(handler)
    try:
        yield out
    finally:
        logging.getLogger().removeHandler(handler)


def localhost(addr: str) -> str:
    return "localhost:" + addr.rsplit(":", 1)[1]


async def test_the_key_appears_in_no_log_repr_exception_or_span(
    pki: tuple[CA, dict[str, bytes]], spans: Optional[Any]
) -> None:
    ca, pem = pki
    raised: list[BaseException] = []
    seen: list[Any] = []
    capture = LogCapture(LIBRARIES)
    asyncio.get_running_loop().set_debug(True)  # asyncio's own DEBUG records too
    try:
        with ServerThread() as thread:
            try:
                plain = await thread.enter(
                    lambda: SeppTestServer(
                        api_keys=[KEY],
                        dead_letter_retention_ms=60_000,
                        queues=[QueueConfig("tiny", max_payload_bytes=8)],
                    )
                )
                tls = await thread.enter(lambda: SeppTestServer(api_keys=[KEY], **pem))
                scripted = await thread.enter(ScriptedServer)
                scripted.script(
                    "GetServerInfo",
                    GRPCError(Status.UNAVAILABLE, "busy"),
                    GRPCError(Status.UNAVAILABLE, "busy"),
                    server_info_bytes(),
                )
                scripted.script("EnqueueBatch", DROP)
                scripted.script("DrainDeadLetters", HANG)
                with capture.installed(), json_lines() as written:
                    await session(
                        plain.addr, tls.addr, scripted.addr, ca.cert_pem.bytes(), raised, seen
                    )
            finally:
                await thread.aclose()
    finally:
        asyncio.get_running_loop().set_debug(False)

    me = threading.get_ident()
    mine = [r for r in capture.records if r.thread == me]
    # The capture really saw the libraries at work on the client's side.
    names = {r.name.split(".")[0] for r in mine}
    assert {"sepp_lite", "hpack", "asyncio"} <= names, names
    assert any("retrying GetServerInfo" in r.getMessage() for r in mine)
    # The client encodes its own header blocks and decodes the server's with hpack.
    assert any(r.name.startswith("hpack") and r.msg.startswith("Decod") for r in mine)
    assert [r.getMessage() for r in mine if record_leaks(capture, r)] == []
    # The in-process servers log through the same filter (they see the keys too).
    theirs = [r for r in capture.records if r.thread != me]
    assert theirs and [r.getMessage() for r in theirs if record_leaks(capture, r)] == []
    # The same records as JSON lines, formatted as they were emitted (the jobs' too).
    lines = written.getvalue().splitlines()
    assert len(lines) == len(capture.records)
    assert any('"job_id": ' in line for line in lines)
    assert [line for line in lines if leaks(line)] == []

    kinds = {type(error).__name__ for error in raised}
    assert {
        "JobRejectedError",
        "BatchValidationError",
        "JobNotFoundError",
        "UnauthenticatedError",
        "ConnectError",
        "InvalidApiKeyError",
        "TransportError",
    } <= kinds
    assert [exception_text(e) for e in raised if leaks(exception_text(e))] == []

    assert len(seen) >= 8
    assert [repr(obj) for obj in seen if leaks(repr(obj) + str(obj))] == []
    client = seen[0]
    assert repr(client).endswith("tls=False, auth=True)")

    if spans is not None:
        finished = spans.spans()
        assert len(finished) >= 15
        assert any(span.status.status_code.name == "ERROR" for span in finished)
        assert any(span.status.description for span in finished)  # error texts are there
        assert [s.name for s in finished if leaks(s.to_json())] == []


async def test_a_key_warns_once_per_plaintext_client(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sepp_lite")
    async with SeppTestServer(api_keys=[KEY]) as server:
        for _ in range(3):
            async with await sepp.SeppClient.connect(server.addr, api_key=KEY) as client:
                for _ in range(4):
                    await client.get_server_info()
        async with await sepp.SeppClient.connect(server.addr) as keyless:
            with pytest.raises(sepp.UnauthenticatedError):
                await keyless.get_server_info()
    warnings = [r.getMessage() for r in caplog.records if r.name == "sepp_lite"]
    assert (
        warnings
        == ["an API key is configured without TLS: it will cross the network in plaintext"] * 3
    )


def test_tls_verifies_the_server_by_default() -> None:
    context = tls_context(None)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    private = tls_context(CA().cert_pem.bytes())
    assert private.verify_mode is ssl.CERT_REQUIRED and private.check_hostname is True


async def test_tls_custom_ca_works_and_wrong_ca_or_name_fail_clearly(
    pki: tuple[CA, dict[str, bytes]],
) -> None:
    ca, pem = pki
    async with SeppTestServer(api_keys=[KEY], **pem) as server:
        addr = f"localhost:{server.port}"
        async with await sepp.SeppClient.connect(
            addr, api_key=KEY, tls_ca_cert=ca.cert_pem.bytes()
        ) as client:
            assert (await client.get_server_info()).version
            assert repr(client).endswith("tls=True, auth=True)")
        failures = {
            "default roots": {"tls": True},
            "another CA": {"tls_ca_cert": CA().cert_pem.bytes()},
            "another name": {"tls_ca_cert": ca.cert_pem.bytes(), "tls_domain": "other.test"},
        }
        for what, options in failures.items():
            with pytest.raises(sepp.ConnectError) as info:
                await sepp.SeppClient.connect(addr, api_key=KEY, **options)
            assert info.value.reason.startswith("TLS certificate verification failed"), what
            assert not leaks(exception_text(info.value)), what
        assert "other.test" in info.value.reason
