"""Certificates for the TLS tests: an authority per name, each with one leaf
certificate, in the forms the tests' servers and clients take.

The leaf names ``localhost`` only, unless ``hosts`` says more: several tests check
that connecting to ``127.0.0.1`` without ``tls_domain`` fails verification.

trustme makes them where it can be imported. It needs ``cryptography``, which has no
wheel for some interpreters (free-threaded CPython 3.13): there the ``openssl``
command line makes the same CA and leaf, so the TLS tests run there too.
"""

from __future__ import annotations

import functools
import ipaddress
import secrets
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:
    import trustme
except ImportError:  # no cryptography wheel for this interpreter
    trustme = None

LOCALHOST = ("localhost",)
BACKEND = "trustme" if trustme is not None else "openssl"


@dataclass(frozen=True)
class Authority:
    """A CA and one leaf it signed, all PEM."""

    ca_pem: bytes
    chain_pem: bytes  # the leaf, then any intermediates (none here)
    key_pem: bytes  # the leaf's private key

    def configure_trust(self, context: ssl.SSLContext) -> None:
        """Make ``context`` trust this CA."""
        context.load_verify_locations(cadata=self.ca_pem.decode("ascii"))

    def configure_cert(self, context: ssl.SSLContext) -> None:
        """Make ``context`` present the leaf (``ssl`` loads a chain from files only)."""
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp, "chain.pem"), Path(tmp, "key.pem")
            cert.write_bytes(self.chain_pem)
            key.write_bytes(self.key_pem)
            context.load_cert_chain(cert, key)


def authority(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> Authority:
    """The CA called ``name`` (another name, another CA) and its leaf for ``hosts``."""
    return _issue(name, hosts)  # positional: one cache entry, however it was called


@functools.cache
def _issue(name: str, hosts: tuple[str, ...]) -> Authority:
    if trustme is not None:
        return issue_with_trustme(hosts)
    return issue_with_openssl(name, hosts)


def issue_with_trustme(hosts: tuple[str, ...]) -> Authority:
    """A new CA and leaf from trustme (the first choice)."""
    assert trustme is not None
    ca = trustme.CA()
    leaf = ca.issue_cert(*hosts)
    return Authority(
        ca_pem=ca.cert_pem.bytes(),
        chain_pem=b"".join(pem.bytes() for pem in leaf.cert_chain_pems),
        key_pem=leaf.private_key_pem.bytes(),
    )


# What trustme puts in its certificates, as OpenSSL configuration: a CA that signs
# leaves only (pathlen 0), and a leaf for TLS servers and clients. Python 3.13's default
# contexts verify strictly (VERIFY_X509_STRICT), which wants the key identifiers and
# the critical flags.
_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
O = sepp_lite tests
OU = {name}
CN = {cn}
[ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, digitalSignature, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = {names}
"""
_NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
_DAYS = ("-days", "3650")


def issue_with_openssl(name: str, hosts: tuple[str, ...]) -> Authority:
    """A new CA and leaf made by the ``openssl`` command line (when trustme is missing)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the TLS tests need trustme or the openssl command; neither is here")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        names = _alt_names(hosts)
        (d / "ca.cnf").write_text(_CONFIG.format(name=name, cn="sepp_lite test CA", names=names))
        (d / "leaf.cnf").write_text(_CONFIG.format(name=name, cn=hosts[0], names=names))
        # fmt: off
        _run(openssl, "req", "-x509", "-config", d / "ca.cnf", "-extensions", "ca", *_NEW_KEY,
             "-keyout", d / "ca.key", "-out", d / "ca.pem", *_DAYS)
        _run(openssl, "req", "-new", "-config", d / "leaf.cnf", *_NEW_KEY,
             "-keyout", d / "leaf.key", "-out", d / "leaf.csr")
        _run(openssl, "x509", "-req", "-in", d / "leaf.csr", "-CA", d / "ca.pem",
             "-CAkey", d / "ca.key", "-set_serial", f"0x{secrets.randbits(63):x}",
             "-extfile", d / "leaf.cnf", "-extensions", "leaf", "-out", d / "leaf.pem", *_DAYS)
        # fmt: on
        return Authority(
            ca_pem=(d / "ca.pem").read_bytes(),
            chain_pem=(d / "leaf.pem").read_bytes(),
            key_pem=(d / "leaf.key").read_bytes(),
        )


def _alt_names(hosts: tuple[str, ...]) -> str:
    def one(host: str) -> str:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"DNS:{host}"
        return f"IP:{host}"

    return ", ".join(one(host) for host in hosts)


def _run(*argv: object) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl failed ({done.returncode}): {done.stderr.strip()}")


def ca_pem(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> bytes:
    """The CA's certificate, as ``connect(tls_ca_cert=...)`` takes it."""
    return authority(name, hosts).ca_pem


def server_pem(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> dict[str, bytes]:
    """The leaf's chain and key, as ``SeppTestServer(tls_cert=..., tls_key=...)``."""
    leaf = authority(name, hosts)
    return {"tls_cert": leaf.chain_pem, "tls_key": leaf.key_pem}


def server_context(name: str = "test", hosts: tuple[str, ...] = LOCALHOST) -> ssl.SSLContext:
    """A server-side context with the leaf, offering ALPN h2."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority(name, hosts).configure_cert(context)
    context.set_alpn_protocols(["h2"])
    return context
