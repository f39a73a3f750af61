"""Certificates for the TLS tests: a trustme authority per name, each with one leaf
certificate, in the forms the tests' servers and clients take. Where trustme cannot be
installed (PyPy 8: its cryptography has no wheel there), the ``openssl`` command makes
them (tests/openssl_ca.py); ``CA`` is the authority class in use.

The leaf names ``localhost`` only, unless ``hosts`` says more: several tests check
that connecting to ``127.0.0.1`` without ``tls_domain`` fails verification.
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trustme
else:
    try:
        import trustme
    except ImportError:  # no cryptography wheel for this interpreter
        from tests import openssl_ca as trustme

CA = trustme.CA

LOCALHOST = ("localhost",)


def authority(
    name: str = "test", hosts: tuple[str, ...] = LOCALHOST
) -> tuple[trustme.CA, trustme.LeafCert]:
    """The CA called ``name`` (another name, another CA) and its leaf for ``hosts``."""
    return _issue(name, hosts)  # positional: one cache entry, however it was called


@functools.cache
def _issue(name: str, hosts: tuple[str, ...]) -> tuple[trustme.CA, trustme.LeafCert]:
    ca = CA()
    return ca, ca.issue_cert(*hosts)


def ca_pem(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> bytes:
    """The CA's certificate, as ``connect(tls_ca_cert=...)`` takes it."""
    return authority(name, hosts)[0].cert_pem.bytes()


def server_pem(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> dict[str, bytes]:
    """The leaf's chain and key, as ``SeppTestServer(tls_cert=..., tls_key=...)``."""
    leaf = authority(name, hosts)[1]
    return {
        "tls_cert": b"".join(pem.bytes() for pem in leaf.cert_chain_pems),
        "tls_key": leaf.private_key_pem.bytes(),
    }


def server_context(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> ssl.SSLContext:
    """A server-side context with the leaf, offering ALPN h2."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority(name, hosts)[1].configure_cert(context)
    context.set_alpn_protocols(["h2"])
    return context
