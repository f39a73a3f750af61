"""tests/openssl_ca.py, trustme's stand-in where cryptography has no wheel: its
certificates pass the default (strict) verification of a client, for the names they
were issued for only, and only with their own authority."""

from __future__ import annotations

import ssl

import pytest

from tests import openssl_ca

pytestmark = pytest.mark.skipif(not openssl_ca.AVAILABLE, reason="no openssl command")


def handshake(ca: openssl_ca.CA, leaf: openssl_ca.LeafCert, name: str) -> None:
    """A TLS handshake in memory: a default client context trusting ``ca`` against a
    server with ``leaf``, the client asking for ``name``."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    client = client_context.wrap_bio(pipes[0], pipes[1], server_hostname=name)
    server = server_context.wrap_bio(pipes[2], pipes[3], server_side=True)
    done = {client: False, server: False}
    for _ in range(10):
        for side in (client, server):
            if not done[side]:
                try:
                    side.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        pipes[2].write(pipes[1].read())  # client to server
        pipes[0].write(pipes[3].read())  # server to client
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


@pytest.fixture(scope="module")
def ca() -> openssl_ca.CA:
    return openssl_ca.CA()


@pytest.fixture(scope="module")
def leaf(ca: openssl_ca.CA) -> openssl_ca.LeafCert:
    return ca.issue_cert("localhost", "127.0.0.1")


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1"])
def test_a_leaf_verifies_for_its_names(ca, leaf, name):
    handshake(ca, leaf, name)


def test_another_name_fails(ca, leaf):
    with pytest.raises(ssl.SSLCertVerificationError, match="match|mismatch"):
        handshake(ca, leaf, "other.test")


def test_another_authority_fails(leaf):
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(openssl_ca.CA(), leaf, "localhost")


def test_the_chain_is_the_leaf_and_the_key_is_pem(leaf):
    assert len(leaf.cert_chain_pems) == 1
    assert leaf.cert_chain_pems[0].bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY-----" in leaf.private_key_pem.bytes()
