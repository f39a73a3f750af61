"""SeppClient connection handling over real sockets: addresses, connect failures and
timeouts, lifetime, user-agent, auth, TLS and keepalive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Iterator
from typing import Callable

import pytest
from grpclib.client import Channel

from sepp_lite import (
    ConnectError,
    InvalidApiKeyError,
    JobNotFoundError,
    RetryPolicy,
    SeppClient,
    TransportError,
    UnauthenticatedError,
    __version__,
)
from sepp_lite._wire.transport import Target, parse_address
from sepp_lite.types import RetryDirective, ServerInfo
from tests.client_helpers import (
    FreezableProxy,
    ScriptedServer,
    SilentServer,
    all_text,
    connected,
    elapsed,
    free_port,
    hand_ctx,
    job,
    opts,
    sepp_server,
    text_job,
    unique_queue,
)
from tests.pki import ca_pem, server_context, server_pem

KEY = "k1-SECRET-4f2a"

# -- addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("localhost:50051", Target("localhost", 50051)),
        ("127.0.0.1:1", Target("127.0.0.1", 1)),
        ("http://localhost:50051", Target("localhost", 50051, tls=False)),
        ("https://sepp.example.com:8443", Target("sepp.example.com", 8443, tls=True)),
        ("https://sepp.example.com", Target("sepp.example.com", 443, tls=True)),
        ("[::1]:50051", Target("::1", 50051)),
        ("http://[::1]:7/", Target("::1", 7)),
        ("https://[2001:db8::1]:9", Target("2001:db8::1", 9, tls=True)),
        ("dns:///queue.internal:65535", Target("queue.internal", 65535)),
    ],
)
def test_parse_address_forms(addr: str, expected: Target) -> None:
    assert parse_address(addr) == expected


def test_target_renders_ipv6_in_brackets() -> None:
    assert str(parse_address("[::1]:50051")) == "[::1]:50051"
    assert str(parse_address("http://localhost:80")) == "localhost:80"


@pytest.mark.parametrize(
    "addr",
    [
        "",
        ":50051",
        "http://",
        "localhost:0",
        "localhost:65536",
        "localhost:-1",
        "localhost:port",
        "localhost:80/path",
        "HTTP://localhost:80",
        "[]:50051",
        "[::1",
        "[::1]50051",
    ],
)
def test_parse_address_rejects_malformed(addr: str) -> None:
    with pytest.raises(ValueError, match="cannot parse the address"):
        parse_address(addr)


async def test_connect_rejects_malformed_address_before_connecting() -> None:
    duration, result = await elapsed(SeppClient.connect("localhost:notaport"))
    assert isinstance(result, ValueError)
    assert "localhost:notaport" in str(result)
    assert duration < 0.5


@pytest.mark.parametrize(
    "options",
    [
        {"keepalive_time": 0},
        {"keepalive_timeout": -1.0},
        {"connect_timeout": 0},
        {"rpc_timeout": -5},
        {"max_receive_message_bytes": 0},
        {"max_receive_message_bytes": True},
    ],
)
async def test_connect_rejects_bad_options_before_connecting(options: dict[str, object]) -> None:
    # Nothing listens on the port: a ConnectError would mean a connection was tried.
    with pytest.raises(ValueError):
        await SeppClient.connect(f"127.0.0.1:{free_port()}", **options)  # type: ignore[arg-type]


# -- connect failures ----------------------------------------------------------------


async def test_connect_to_closed_port_is_refused_quickly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sepp_lite")
    addr = f"127.0.0.1:{free_port()}"
    duration, result = await elapsed(SeppClient.connect(addr))
    assert isinstance(result, ConnectError)
    assert result.reason == "connection refused"
    assert result.addr == addr
    assert str(result) == f"cannot connect to the sepp server at {addr}: connection refused"
    assert isinstance(result.__cause__, ConnectionRefusedError)
    assert duration < 1.0
    # Raised, so not also logged above DEBUG (the caller decides what to tell).
    records = [r for r in caplog.records if r.name == "sepp_lite"]
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert addr in records[0].getMessage()
    assert "connection refused" in records[0].getMessage()


async def test_connect_to_unresolvable_host_fails() -> None:
    duration, result = await elapsed(SeppClient.connect("nonexistent.invalid:1", connect_timeout=3))
    assert isinstance(result, ConnectError)
    assert result.addr == "nonexistent.invalid:1"
    assert "cannot resolve the host name" in result.reason or result.reason == "timed out"
    assert duration < 3.5


@contextlib.contextmanager
def unaccepting_listener() -> Iterator[int]:
    """A port whose accept queue is full: further SYNs are dropped, connects hang."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            fillers.append(filler)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_connect_timeout_gives_connect_error() -> None:
    with unaccepting_listener() as port:
        await asyncio.sleep(0.05)
        duration, result = await elapsed(
            SeppClient.connect(f"127.0.0.1:{port}", connect_timeout=0.3)
        )
    assert isinstance(result, ConnectError)
    assert result.reason == "timed out"
    assert 0.25 <= duration < 1.0


async def test_silent_peer_fails_within_the_short_timeouts() -> None:
    async with SilentServer() as silent:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises((ConnectError, TransportError)) as info:
            async with connected(
                f"127.0.0.1:{silent.port}", connect_timeout=0.4, rpc_timeout=0.4
            ) as client:
                await client.get_server_info()
        duration = loop.time() - start
        assert silent.connections == 1
    assert duration < 1.5
    if isinstance(info.value, TransportError):
        assert info.value.code is not None and info.value.code.name == "DEADLINE_EXCEEDED"


# -- lifetime and identity -----------------------------------------------------------


async def test_async_with_closes_and_calls_after_close_raise() -> None:
    async with sepp_server() as server:
        async with connected(server.addr) as client:
            assert isinstance(await client.get_server_info(), ServerInfo)
        with pytest.raises(RuntimeError, match="closed"):
            await client.get_server_info()
        with pytest.raises(RuntimeError, match="closed"):
            await client.enqueue(job(unique_queue()))
        with pytest.raises(RuntimeError, match="closed"):
            await client.reserve(opts(unique_queue()))
        await client.close()  # closing twice is harmless


async def test_close_then_call_raises_runtime_error() -> None:
    async with sepp_server() as server:
        client = await SeppClient.connect(server.addr)
        await client.close()
        with pytest.raises(RuntimeError):
            await client.drain_dead_letters(max_records=3)


async def test_repr_shows_address_and_flags_never_the_key() -> None:
    async with sepp_server(api_keys=[KEY]) as server:
        async with connected(server.addr, api_key=KEY) as client:
            text = repr(client)
            assert server.addr in text
            assert "auth=True" in text
            assert "tls=False" in text
            assert KEY not in text
            assert KEY not in str(client)


async def test_user_agent_starts_with_sepp_lite_version() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        await client.get_server_info()
        await client.enqueue(job("q"))
        assert len(server.calls) == 2
        for call in server.calls:
            assert call.user_agent is not None
            assert call.user_agent.startswith(f"sepp-lite/{__version__}")
            # the prefix is followed by grpclib's own product token
            assert call.user_agent.split(" ")[0] == f"sepp-lite/{__version__}"


async def test_from_channel_sends_no_auth_and_works() -> None:
    async with ScriptedServer() as server:
        channel = Channel("127.0.0.1", server.port)
        client = SeppClient.from_channel(channel)
        try:
            await client.get_server_info()
        finally:
            await client.close()
        assert server.calls[0].header("authorization") == []


# -- auth ----------------------------------------------------------------------------


async def test_right_key_works_on_every_rpc() -> None:
    queue = unique_queue("auth")
    async with sepp_server(api_keys=[KEY, "other"], dead_letter_retention_ms=60_000) as server:
        async with connected(server.addr, api_key=KEY) as client:
            assert (await client.get_server_info()).version == "0.1.0"
            await client.enqueue(text_job(queue))
            assert len(await client.enqueue_batch([job(queue), job(queue)])) == 2
            assert len(await client.enqueue_atomic([job(queue)])) == 1
            jobs = await client.reserve(opts(queue, max_jobs=4))
            assert jobs is not None and len(jobs) == 4
            await client.extend(jobs[0].ctx, 40)
            await client.ack(jobs[0].ctx)
            assert await client.nack(jobs[1].ctx) is False
            assert await client.nack(jobs[2].ctx, RetryDirective.DEAD_LETTER) is True
            drained = await client.drain_dead_letters(queue)
            assert [record.job_id for record in drained] == [jobs[2].ctx.id]
            assert server.counts(queue) == (1, 0, 1, 0)


@pytest.mark.parametrize(
    ("api_key", "message"),
    [("wrong-key", "invalid API key"), (None, "missing API key")],
)
async def test_wrong_or_missing_key_is_unauthenticated_on_every_rpc(
    api_key: str | None, message: str
) -> None:
    queue = unique_queue("auth")
    async with sepp_server(api_keys=[KEY]) as server:
        async with connected(server.addr, api_key=api_key) as client:
            calls: list[Callable[[], Awaitable[object]]] = [
                client.get_server_info,
                lambda: client.enqueue(job(queue)),
                lambda: client.enqueue_batch([job(queue)]),
                lambda: client.enqueue_atomic([job(queue)]),
                lambda: client.reserve(opts(queue)),
                lambda: client.ack(hand_ctx(queue)),
                lambda: client.nack(hand_ctx(queue)),
                lambda: client.extend(hand_ctx(queue), 10),
                lambda: client.drain_dead_letters(queue),
            ]
            for call in calls:
                with pytest.raises(UnauthenticatedError, match=message) as info:
                    await call()
                assert info.value.code is not None
                assert info.value.code.name == "UNAUTHENTICATED"
                assert KEY not in all_text(info.value)
        assert server.counts(queue) == (0, 0, 0, 0)


async def test_bearer_header_sent_once_on_every_call() -> None:
    async with ScriptedServer() as server, connected(server.addr, api_key=KEY) as client:
        await client.get_server_info()
        await client.enqueue(job("q"))
        await client.reserve(opts("q"))
        await client.drain_dead_letters()
        assert len(server.calls) == 4
        for call in server.calls:
            assert call.header("authorization") == [f"Bearer {KEY}"]


async def test_no_key_sends_no_authorization_header() -> None:
    async with ScriptedServer() as server, connected(server.addr) as client:
        await client.get_server_info()
        assert server.calls[0].header("authorization") == []


@pytest.mark.parametrize("bad_key", ["a\nb", "a\rb", "é", "", "\x01key", "key\x7f", "tab\tkey"])
async def test_invalid_api_key_fails_before_connecting(bad_key: str) -> None:
    # Nothing listens on the port: a ConnectError would mean the key was checked late.
    duration, result = await elapsed(
        SeppClient.connect(f"127.0.0.1:{free_port()}", api_key=bad_key)
    )
    assert isinstance(result, InvalidApiKeyError)
    assert duration < 0.5
    if bad_key:
        assert bad_key not in str(result)


def _client_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sepp_lite" and r.levelno == level]


@pytest.mark.parametrize("scheme", ["", "http://"])
async def test_one_warning_when_key_travels_without_tls(
    caplog: pytest.LogCaptureFixture, scheme: str
) -> None:
    caplog.set_level(logging.INFO, logger="sepp_lite")
    async with sepp_server(api_keys=[KEY]) as server:
        async with connected(scheme + server.addr, api_key=KEY) as client:
            await client.get_server_info()
            await client.get_server_info()
            await client.reserve(opts(unique_queue()))
    warnings = _client_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "plaintext" in warnings[0].getMessage()
    infos = [r.getMessage() for r in _client_records(caplog, logging.INFO)]
    assert any("tls=False" in m and "auth=True" in m for m in infos)


async def test_no_warning_without_a_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sepp_lite")
    async with sepp_server() as server, connected(server.addr) as client:
        await client.get_server_info()
    assert _client_records(caplog, logging.WARNING) == []
    infos = [r.getMessage() for r in _client_records(caplog, logging.INFO)]
    assert any("tls=False" in m and "auth=False" in m for m in infos)


async def _session_with_failures(addr: str, scripted_addr: str) -> list[BaseException]:
    """Successful and failing calls, a refused connect and retries, all with the key;
    returns the exceptions raised."""
    raised: list[BaseException] = []
    queue = unique_queue("logs")
    async with connected(addr, api_key=KEY) as client:
        await client.get_server_info()
        await client.enqueue(job(queue))
        jobs = await client.reserve(opts(queue))
        assert jobs is not None
        await client.ack(jobs[0].ctx)
        with pytest.raises(JobNotFoundError) as lease:
            await client.ack(jobs[0].ctx)
        raised.append(lease.value)
    async with connected(addr, api_key=KEY + "-wrong") as client:
        with pytest.raises(UnauthenticatedError) as auth:
            await client.get_server_info()
        raised.append(auth.value)
    with pytest.raises(ConnectError) as refused:
        await SeppClient.connect(f"127.0.0.1:{free_port()}", api_key=KEY)
    raised.append(refused.value)
    policy = RetryPolicy(max_attempts=2, initial_backoff=0.001, jitter=False)  # type: ignore[arg-type]
    async with connected(scripted_addr, api_key=KEY, retry_policy=policy) as client:
        with pytest.raises(TransportError) as retried:
            await client.get_server_info()
        raised.append(retried.value)
        raised.append(RuntimeError(repr(client)))
    return raised


def _leaks(record: logging.LogRecord) -> bool:
    text = record.getMessage() + (record.exc_text or "") + repr(record.args)
    if record.exc_info and record.exc_info[1] is not None:
        text += all_text(record.exc_info[1])
    return KEY in text


async def test_api_key_never_logged_by_client_or_grpclib(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from grpclib.exceptions import GRPCError

    from sepp_lite.errors import Status

    caplog.set_level(logging.DEBUG)
    async with sepp_server(api_keys=[KEY]) as server, ScriptedServer() as scripted:
        scripted.script("GetServerInfo", *[GRPCError(Status.UNAVAILABLE, "down")] * 2)
        raised = await _session_with_failures(server.addr, scripted.addr)
    assert len(raised) == 5
    assert [all_text(exc) for exc in raised if KEY in all_text(exc)] == []
    # hpack (the HTTP/2 header codec) is checked separately below.
    records = [r for r in caplog.records if not r.name.startswith("hpack")]
    assert any(r.name == "sepp_lite" and "retrying" in r.getMessage() for r in records)
    assert [r.getMessage() for r in records if _leaks(r)] == []


async def test_api_key_not_logged_when_client_encodes_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With DEBUG logging on, the client's own header encoding (hpack) must not print the
    key: a sensitive (never-indexed) authorization header is logged redacted. Records of
    hpack *decoding* come from the in-process server reading the request, and are
    excluded."""
    caplog.set_level(logging.DEBUG)
    async with sepp_server(api_keys=[KEY]) as server:
        async with connected(server.addr, api_key=KEY) as client:
            await client.get_server_info()
    encoder = [
        r
        for r in caplog.records
        if r.name.startswith("hpack") and not r.getMessage().startswith("Decod")
    ]
    assert encoder, "expected hpack DEBUG records"
    assert [r.getMessage() for r in encoder if _leaks(r)] == []


# -- TLS -----------------------------------------------------------------------------


async def test_tls_with_custom_ca() -> None:
    async with sepp_server(**server_pem()) as server:
        async with connected(f"localhost:{server.port}", tls_ca_cert=ca_pem()) as client:
            assert "tls=True" in repr(client)
            assert (await client.get_server_info()).version == "0.1.0"


async def test_https_scheme_turns_tls_on() -> None:
    async with sepp_server(**server_pem()) as server:
        async with connected(f"https://localhost:{server.port}", tls_ca_cert=ca_pem()) as client:
            await client.enqueue(job(unique_queue()))
            assert "tls=True" in repr(client)
    async with sepp_server() as plain:
        # https:// against a plaintext server: the TLS handshake fails at connect.
        with pytest.raises(ConnectError, match="TLS"):
            await SeppClient.connect(f"https://localhost:{plain.port}", tls_ca_cert=ca_pem())


async def test_tls_domain_override_when_connecting_by_ip() -> None:
    async with sepp_server(**server_pem()) as server:
        async with connected(
            f"127.0.0.1:{server.port}", tls_ca_cert=ca_pem(), tls_domain="localhost"
        ) as client:
            assert (await client.get_server_info()).version == "0.1.0"


async def test_tls_by_ip_without_override_fails_verification() -> None:
    async with sepp_server(**server_pem()) as server:
        with pytest.raises(ConnectError) as info:
            await SeppClient.connect(f"127.0.0.1:{server.port}", tls_ca_cert=ca_pem())
    assert "certificate verification failed" in info.value.reason


async def test_tls_wrong_host_name_fails() -> None:
    async with sepp_server(**server_pem()) as server:
        with pytest.raises(ConnectError) as info:
            await SeppClient.connect(
                f"127.0.0.1:{server.port}", tls_ca_cert=ca_pem(), tls_domain="wrong.example"
            )
    assert "certificate verification failed" in info.value.reason
    assert "wrong.example" in info.value.reason


@pytest.mark.parametrize("how", ["https", "tls=True"])
async def test_tls_with_system_roots_rejects_private_ca(how: str) -> None:
    async with sepp_server(**server_pem()) as server:
        if how == "https":
            attempt = SeppClient.connect(f"https://localhost:{server.port}")
        else:
            attempt = SeppClient.connect(f"localhost:{server.port}", tls=True)
        duration, result = await elapsed(attempt)
    assert isinstance(result, ConnectError)
    assert "certificate verification failed" in result.reason
    assert duration < 2.0


@pytest.mark.parametrize(
    "options",
    [{"tls": True}, {"tls_ca_cert": "CA"}, {"tls_domain": "localhost"}],
    ids=["tls", "tls_ca_cert", "tls_domain"],
)
async def test_tls_options_turn_tls_on(options: dict[str, object]) -> None:
    if options.get("tls_ca_cert") == "CA":
        options = {"tls_ca_cert": ca_pem()}
    async with sepp_server() as plain:
        # A TLS handshake against a plaintext server fails at connect.
        with pytest.raises(ConnectError, match="TLS"):
            await SeppClient.connect(f"localhost:{plain.port}", **options)  # type: ignore[arg-type]
        async with connected(f"localhost:{plain.port}") as client:
            assert "tls=False" in repr(client)


async def test_tls_with_own_ssl_context() -> None:
    context = ssl.create_default_context(cadata=ca_pem().decode())
    async with sepp_server(**server_pem(), api_keys=[KEY]) as server:
        async with connected(
            f"localhost:{server.port}", credentials=context, api_key=KEY
        ) as client:
            assert (await client.get_server_info()).version == "0.1.0"
            assert "tls=True" in repr(client)


async def offered_alpn(**connect: object) -> object:
    """What a TLS server (ALPN h2) agreed with the client in the handshake: "h2" when
    the client offered it, None when it offered nothing."""
    chosen: list[object] = []
    context = server_context()

    async def handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chosen.append(writer.get_extra_info("ssl_object").selected_alpn_protocol())
        writer.close()

    server = await asyncio.start_server(handshake, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectError):
            await SeppClient.connect(f"localhost:{port}", connect_timeout=5, **connect)  # type: ignore[arg-type]
    finally:
        server.close()
        await server.wait_closed()
    assert len(chosen) == 1
    return chosen[0]


async def test_every_tls_connect_offers_alpn_h2() -> None:
    context = ssl.create_default_context(cadata=ca_pem().decode())
    assert await offered_alpn(tls_ca_cert=ca_pem()) == "h2"
    assert await offered_alpn(credentials=context) == "h2"


async def test_no_key_warning_with_tls(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sepp_lite")
    async with sepp_server(**server_pem(), api_keys=[KEY]) as server:
        async with connected(
            f"localhost:{server.port}", tls_ca_cert=ca_pem(), api_key=KEY
        ) as client:
            await client.get_server_info()
    assert _client_records(caplog, logging.WARNING) == []
    infos = [r.getMessage() for r in _client_records(caplog, logging.INFO)]
    assert any("tls=True" in m and "auth=True" in m for m in infos)


# -- keepalive -----------------------------------------------------------------------


async def test_keepalive_fails_in_flight_reserve_on_frozen_peer() -> None:
    queue = unique_queue("ka")
    async with sepp_server() as server, FreezableProxy(server.host, server.port) as proxy:
        async with connected(proxy.addr, keepalive_time=0.3, keepalive_timeout=0.3) as client:
            assert await client.reserve(opts(queue)) is None
            reserve = asyncio.ensure_future(elapsed(client.reserve(opts(queue, wait=20))))
            await asyncio.sleep(0.05)
            proxy.freeze()
            duration, result = await asyncio.wait_for(reserve, 5)
            assert isinstance(result, TransportError), result
            assert duration < 2.0
            proxy.resume()
            await client.enqueue(job(queue))
            jobs = await client.reserve(opts(queue))
            assert jobs is not None and jobs[0].ctx.queue == queue
            assert proxy.connections == 2


async def test_keepalive_detects_frozen_peer_while_idle() -> None:
    async with sepp_server() as server, FreezableProxy(server.host, server.port) as proxy:
        async with connected(proxy.addr, keepalive_time=0.2, keepalive_timeout=0.2) as client:
            await client.get_server_info()
            assert proxy.connections == 1
            proxy.freeze()
            await asyncio.sleep(0.9)
            proxy.resume()
            # The idle connection was dropped by the ping timeout: this call reconnects.
            await client.get_server_info()
            assert proxy.connections == 2


async def test_idle_connection_survives_with_answered_pings() -> None:
    async with sepp_server() as server, FreezableProxy(server.host, server.port) as proxy:
        async with connected(proxy.addr, keepalive_time=0.1, keepalive_timeout=0.3) as client:
            await client.get_server_info()
            await asyncio.sleep(0.5)
            await client.get_server_info()
            assert proxy.connections == 1


@pytest.mark.parametrize(
    ("addr", "host"),
    [("bücher.example:50051", "xn--bcher-kva.example"), ("Sepp.Example:1", "Sepp.Example")],
)
def test_host_names_are_sent_in_their_idna_form(addr: str, host: str) -> None:
    assert parse_address(addr).host == host


@pytest.mark.parametrize("addr", ["bad..host:1", f"{'a' * 64}.example:1", ".:1"])
def test_host_names_that_cannot_exist_are_refused_clearly(addr: str) -> None:
    with pytest.raises(ValueError, match="invalid host name"):
        parse_address(addr)
