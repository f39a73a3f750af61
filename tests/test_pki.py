"""tests/pki.py: the certificates the TLS tests use verify, whether trustme or the
``openssl`` command line made them."""

from __future__ import annotations

import importlib.util
import ssl

import pytest

from tests import pki

HOSTS = ("localhost", "127.0.0.1")


def handshake(trusted: pki.Authority, served: pki.Authority, server_hostname: str) -> None:
    """A whole TLS handshake in memory: a client trusting ``trusted``'s CA, verifying
    strictly, against a server presenting ``served``'s leaf. Raises what the client
    raises when verification fails."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.configure_cert(server_context)
    client_context = ssl.create_default_context()
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    trusted.configure_trust(client_context)
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(to_client, to_server, server_hostname=server_hostname)
    server = server_context.wrap_bio(to_server, to_client, server_side=True)
    pending = [client, server]
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                continue
            pending.remove(end)
        if not pending:
            return
    raise AssertionError(f"the handshake did not finish: {pending}")


def test_openssl_fallback_makes_a_chain_that_verifies() -> None:
    made = pki.issue_with_openssl("fallback", HOSTS)
    for host in HOSTS:
        handshake(made, made, host)
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(made, made, "other.test")
    another = pki.issue_with_openssl("another", HOSTS)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(another, made, "localhost")
    assert made.ca_pem != another.ca_pem


def test_openssl_fallback_names_only_the_hosts_asked_for() -> None:
    made = pki.issue_with_openssl("localhost-only", pki.LOCALHOST)
    handshake(made, made, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(made, made, "127.0.0.1")


def test_trustme_is_the_first_choice() -> None:
    has_trustme = importlib.util.find_spec("trustme") is not None
    assert pki.BACKEND == ("trustme" if has_trustme else "openssl")
    made = pki.authority()
    handshake(made, made, "localhost")
    assert pki.authority("test") is made and pki.authority("other") is not made
