"""The connection goes away: a graceful GOAWAY or an abrupt close in the middle of a
call (of every RPC), a refused connection, a name that does not resolve, a TLS
handshake that fails (wrong CA, wrong host name, a certificate that changed while the
client was connected, plaintext against TLS). Each gives a fast, specific error; the
retryable ones are retried by a policy and the next call reconnects.

(``test_client_connect.py`` and ``test_client_errors.py`` cover the basic forms of
these; this module adds the GOAWAY, every RPC, time bounds, and mid-session TLS.)
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Callable

import pytest

import sepp_lite as sepp
from sepp_lite import ConnectError, SeppClient, TransportError
from sepp_lite._codec.dead_letters import encode_drain_dead_letters_response
from sepp_lite._codec.enqueue import decode_enqueue_batch_request, encode_enqueue_batch_response
from sepp_lite._codec.job import encode_reserve_response
from sepp_lite._retry import is_retryable
from sepp_lite.errors import Status
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import (
    FreezableProxy,
    connected,
    elapsed,
    free_port,
    hand_ctx,
    job,
    once_reconnected,
    opts,
    sepp_server,
    server_info_bytes,
    unique_queue,
    until,
)
from tests.fault_helpers import (
    Abort,
    Action,
    Close,
    Data,
    GoAway,
    Hang,
    Headers,
    RawH2Server,
    RawRequest,
    RestartableServer,
    grpc_ok,
)
from tests.pki import ca_pem, server_pem

pytestmark = pytest.mark.timeout(60)

FAST = 0.5  # seconds: "at once", with room for a loaded machine

RPCS: dict[str, Callable[[SeppClient], Awaitable[Any]]] = {
    "EnqueueBatch": lambda c: c.enqueue(job("q")),
    "EnqueueAtomic": lambda c: c.enqueue_atomic([job("q")]),
    "Reserve": lambda c: c.reserve(opts("q", wait=5)),
    "Ack": lambda c: c.ack(hand_ctx()),
    "Nack": lambda c: c.nack(hand_ctx()),
    "Extend": lambda c: c.extend(hand_ctx(), 10),
    "DrainDeadLetters": lambda c: c.drain_dead_letters(max_records=1),
    "GetServerInfo": lambda c: c.get_server_info(),
}


def valid_answer(request: RawRequest) -> list[Action]:
    method = request.path.rsplit("/", 1)[-1]
    body = request.body[5:]
    if method == "GetServerInfo":
        return grpc_ok(server_info_bytes())
    if method == "EnqueueBatch":
        jobs = decode_enqueue_batch_request(body)
        return grpc_ok(encode_enqueue_batch_response([("a" * 8, False) for _ in jobs]))
    if method == "Reserve":
        return grpc_ok(encode_reserve_response([]))
    return grpc_ok(encode_drain_dead_letters_response([]))


# -- GOAWAY ----------------------------------------------------------------------------


# Not conftest.py's server: these tests crash and restart it.
@pytest.fixture
async def server() -> AsyncIterator[RestartableServer]:
    async with RestartableServer() as srv_:
        yield srv_


async def test_a_graceful_goaway_leaves_calls_in_flight_running(
    server: RestartableServer,
) -> None:
    # GOAWAY(2^31-1), NO_ERROR: the server will finish what it has; the client fails
    # nothing and sends new calls on a new connection. (grpclib's server cannot send
    # the answers after its own GOAWAY, so the polls are cancelled at the end; the
    # scripted-peer tests check that answers after a GOAWAY reach their callers.)
    queue = unique_queue("goaway")
    async with connected(server.addr, rpc_timeout=20) as client:
        polls = [asyncio.ensure_future(client.reserve(opts(queue, wait=15))) for _ in range(3)]
        await until(lambda: server.state.waiter_count == 3)
        assert server.goaway() == 1  # one connection, three streams on it
        await asyncio.sleep(0.3)
        assert not any(poll.done() for poll in polls)
        assert (await client.get_server_info()).version == "0.1.0"
        assert server.connections == 2 and client.connections_opened == 2
        for poll in polls:
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)


async def test_streams_above_a_goaway_are_sent_again_without_a_retry_policy() -> None:
    # GOAWAY(last_stream_id=0): the server processed nothing, so even a keyless enqueue
    # is sent again on a new connection (as grpc's transparent retry), and succeeds.
    plays: list[list[Action]] = [[GoAway(0, last_stream_id=0), Hang()]]

    def responder(request: RawRequest) -> list[Action]:
        return plays.pop(0) if plays else valid_answer(request)

    async with RawH2Server(responder) as raw:
        async with connected(raw.addr, rpc_timeout=5) as client:
            took, result = await elapsed(client.enqueue(job("q")))
    assert isinstance(result, sepp.EnqueueAck), result
    assert took < FAST
    assert (len(raw.requests), raw.connections) == (2, 2)


# -- an abrupt close in the middle of every RPC ---------------------------------------

ABRUPT: dict[str, list[Action]] = {
    "before any answer": [Abort()],
    "after the headers": [
        Headers([(b":status", b"200"), (b"content-type", b"application/grpc")]),
        Abort(),
    ],
    "inside the message": [
        Headers([(b":status", b"200"), (b"content-type", b"application/grpc")]),
        Data(b"\x00\x00\x00\x00\x30" + b"\x0a" * 10),
        Abort(),
    ],
    "with a FIN, before any answer": [Close()],
}


@pytest.mark.parametrize("where", sorted(ABRUPT))
@pytest.mark.parametrize("rpc", sorted(RPCS))
async def test_abrupt_close_mid_call_is_a_clear_retryable_error(rpc: str, where: str) -> None:
    plays = [ABRUPT[where]]

    def responder(request: RawRequest) -> list[Action]:
        return plays.pop(0) if plays else valid_answer(request)

    async with RawH2Server(responder) as raw, connected(raw.addr, rpc_timeout=10) as client:
        took, result = await elapsed(RPCS[rpc](client))
        assert took < FAST
        assert isinstance(result, TransportError), result
        assert result.code is Status.UNAVAILABLE
        assert result.ambiguous is True  # the request had reached the server
        assert is_retryable(result) and not is_retryable(result, all_keyed=False)
        assert "connection lost" in str(result)
        await client.get_server_info()  # the next call reconnects
    assert raw.connections == 2
    assert [r.path.rsplit("/", 1)[-1] for r in raw.requests] == [rpc, "GetServerInfo"]


# -- refused, unresolvable ------------------------------------------------------------


async def test_refused_connections_fail_fast_at_connect_and_on_calls() -> None:
    took, result = await elapsed(SeppClient.connect(f"127.0.0.1:{free_port()}"))
    assert isinstance(result, ConnectError) and result.reason == "connection refused"
    assert took < FAST
    patient = sepp.RetryPolicy(max_attempts=100, initial_backoff=0.05, multiplier=1.0, jitter=False)
    async with (
        RestartableServer() as server,
        connected(server.addr, rpc_timeout=10) as plain,
        connected(server.addr, rpc_timeout=0.6, retry_policy=patient) as retrying,
    ):
        await plain.get_server_info()
        await retrying.get_server_info()
        await server.crash()
        for rpc, call in RPCS.items():
            took, result = await elapsed(call(plain))
            assert took < FAST, rpc
            assert isinstance(result, TransportError), (rpc, result)
            assert result.code is Status.UNAVAILABLE
            assert result.ambiguous is False  # nothing was sent: safe to retry
            assert isinstance(result.__cause__, ConnectionRefusedError)
        # With a policy, refusals are retried within the call's one deadline.
        took, result = await elapsed(retrying.get_server_info())
        assert isinstance(result, TransportError) and result.code is Status.UNAVAILABLE
        assert 0.45 < took < 0.8
        await server.start()
        # The next attempt waits out the reconnect backoff (about 1 s, then growing).
        assert (await once_reconnected(retrying.get_server_info)).version == "0.1.0"


async def test_a_name_that_does_not_resolve_fails_fast_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The resolver's answer is simulated (no DNS query leaves the machine).
    loop = asyncio.get_running_loop()

    async def no_such_name(host: object, *args: object, **kwargs: object) -> Any:
        if host == "sepp.does-not-exist.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return await real(host, *args, **kwargs)

    real = loop.getaddrinfo
    monkeypatch.setattr(loop, "getaddrinfo", no_such_name)
    took, result = await elapsed(SeppClient.connect("sepp.does-not-exist.test:50051"))
    assert isinstance(result, ConnectError), result
    assert result.reason == (
        "cannot resolve the host name: no such host (the name is not known to DNS)"
    )
    assert isinstance(result.__cause__, socket.gaierror)
    assert took < FAST


# -- TLS -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"tls_ca_cert": "other"}, "certificate verification failed"),
        ({"tls_ca_cert": "right", "tls_domain": "sepp.example"}, "Hostname mismatch"),
        ({"tls": True}, "certificate verification failed"),
    ],
    ids=["wrong-ca", "wrong-host-name", "system-roots"],
)
async def test_tls_handshake_failures_are_fast_and_specific(
    options: dict[str, Any], reason: str
) -> None:
    if "tls_ca_cert" in options:
        options = {**options, "tls_ca_cert": ca_pem(options["tls_ca_cert"])}
    async with sepp_server(**server_pem("right")) as server:
        took, result = await elapsed(SeppClient.connect(f"localhost:{server.port}", **options))
    assert isinstance(result, ConnectError), result
    assert reason in result.reason, result.reason
    assert isinstance(result.__cause__, ssl.SSLCertVerificationError)
    assert took < FAST


async def test_a_certificate_that_changes_mid_session_fails_the_next_call_for_good() -> None:
    # Connected and verified; the server comes back on the same port with a
    # certificate from another CA. The next call's handshake fails: a TLS failure,
    # which no policy retries (retrying cannot heal it).
    policy = sepp.RetryPolicy(max_attempts=50, initial_backoff=0.01, jitter=False)
    first = SeppTestServer(**server_pem("right"))
    await first.start()
    second = SeppTestServer(port=first.port, **server_pem("other"))
    try:
        async with FreezableProxy(first.host, first.port) as proxy:
            async with connected(
                f"localhost:{proxy.port}",
                tls_ca_cert=ca_pem("right"),
                retry_policy=policy,
                rpc_timeout=5,
            ) as client:
                await client.get_server_info()
                await first.stop()
                await second.start()
                took, result = await elapsed(client.get_server_info())
                assert isinstance(result, TransportError), result
                assert result.code is None and not is_retryable(result)
                assert "TLS certificate verification failed" in str(result)
                assert isinstance(result.__cause__, ssl.SSLCertVerificationError)
                assert took < FAST
                assert proxy.connections == 2  # one handshake for the call: not retried
    finally:
        await first.stop()
        await second.stop()


async def test_plaintext_client_against_a_tls_server_fails_fast() -> None:
    async with sepp_server(**server_pem("right")) as server:
        took, result = await elapsed(
            SeppClient.connect(f"localhost:{server.port}", connect_timeout=10)
        )
    assert isinstance(result, sepp.ConnectError), result
    assert result.server_uses_tls is True and "the server uses TLS" in result.reason
    assert took < FAST
