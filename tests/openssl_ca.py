"""The part of trustme's API the TLS tests use, made with the ``openssl`` command.

tests/pki.py takes it where trustme cannot be installed: trustme needs cryptography,
which has no wheel for a new interpreter ABI (PyPy 8's ``pypy311_pp80``) and would
need Rust to build. Like trustme's, the certificates pass Python's strict X.509
verification (3.13+): key usages, subject and authority key identifiers, names in
subjectAltName only.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

AVAILABLE = shutil.which("openssl") is not None


class Blob:
    """PEM data, as trustme hands it out."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def bytes(self) -> bytes:
        return self._data


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _san(hosts: tuple[str, ...]) -> str:
    names = []
    for host in hosts:
        try:
            names.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            names.append(f"DNS:{host}")
    return ",".join(names)


class LeafCert:
    def __init__(self, cert: bytes, chain: list[bytes], key: bytes) -> None:
        self.cert_chain_pems = [Blob(cert), *map(Blob, chain)]
        self.private_key_pem = Blob(key)

    def configure_cert(self, context: ssl.SSLContext) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(b"".join(blob.bytes() for blob in self.cert_chain_pems))
            key.write_bytes(self.private_key_pem.bytes())
            context.load_cert_chain(cert, key)


class CA:
    """A self-signed authority (EC P-256), made in a temporary directory."""

    _count = 0

    def __init__(self) -> None:
        CA._count += 1
        with tempfile.TemporaryDirectory() as tmp:
            _openssl(
                Path(tmp),
                "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
                "-subj", f"/O=sepp_lite tests/CN=test CA {CA._count}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                "-addext", "subjectKeyIdentifier=hash",
            )  # fmt: skip
            self._key = Path(tmp, "ca.key").read_bytes()
            self.cert_pem = Blob(Path(tmp, "ca.pem").read_bytes())

    def issue_cert(self, *hosts: str) -> LeafCert:
        """A leaf for these names (DNS names or IP addresses), signed by this CA."""
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            Path(tmp, "ca.key").write_bytes(self._key)
            Path(tmp, "ca.pem").write_bytes(self.cert_pem.bytes())
            Path(tmp, "leaf.ext").write_text(
                f"subjectAltName=critical,{_san(hosts)}\n"
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth,clientAuth\n"
                "subjectKeyIdentifier=hash\n"
                "authorityKeyIdentifier=keyid:always\n"
            )
            _openssl(
                cwd,
                "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/O=sepp_lite tests",
            )  # fmt: skip
            _openssl(
                cwd,
                "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
                "-days", "365", "-extfile", "leaf.ext", "-out", "leaf.pem",
            )  # fmt: skip
            return LeafCert(
                Path(tmp, "leaf.pem").read_bytes(),
                [],  # as trustme's: the leaf, then intermediates (none here), no root
                Path(tmp, "leaf.key").read_bytes(),
            )

    def configure_trust(self, context: ssl.SSLContext) -> None:
        context.load_verify_locations(cadata=self.cert_pem.bytes().decode("ascii"))
