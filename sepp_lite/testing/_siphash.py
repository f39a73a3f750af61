"""SipHash in pure Python, for the retry-jitter hash the server computes with Rust's
``DefaultHasher`` (SipHash-1-3 with zero keys)."""

from __future__ import annotations

__all__ = ["retry_jitter_hash", "siphash"]

_MASK = 0xFFFF_FFFF_FFFF_FFFF


def _rounds(v0: int, v1: int, v2: int, v3: int, count: int) -> tuple[int, int, int, int]:
    for _ in range(count):
        v0 = (v0 + v1) & _MASK
        v1 = ((v1 << 13) | (v1 >> 51)) & _MASK
        v1 ^= v0
        v0 = ((v0 << 32) | (v0 >> 32)) & _MASK
        v2 = (v2 + v3) & _MASK
        v3 = ((v3 << 16) | (v3 >> 48)) & _MASK
        v3 ^= v2
        v0 = (v0 + v3) & _MASK
        v3 = ((v3 << 21) | (v3 >> 43)) & _MASK
        v3 ^= v0
        v2 = (v2 + v1) & _MASK
        v1 = ((v1 << 17) | (v1 >> 47)) & _MASK
        v1 ^= v2
        v2 = ((v2 << 32) | (v2 >> 32)) & _MASK
    return v0, v1, v2, v3


def siphash(data: bytes, k0: int = 0, k1: int = 0, c: int = 1, d: int = 3) -> int:
    """SipHash-c-d of ``data`` under the 64-bit keys ``k0``/``k1`` (defaults: the 1-3
    variant with zero keys, which is what Rust's ``DefaultHasher::new()`` uses)."""
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    whole = len(data) - len(data) % 8
    for pos in range(0, whole, 8):
        m = int.from_bytes(data[pos : pos + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, c)
        v0 ^= m
    m = int.from_bytes(data[whole:], "little") | ((len(data) & 0xFF) << 56)
    v3 ^= m
    v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, c)
    v0 ^= m
    v2 ^= 0xFF
    v0, v1, v2, v3 = _rounds(v0, v1, v2, v3, d)
    return v0 ^ v1 ^ v2 ^ v3


def retry_jitter_hash(job_id: str, attempt: int) -> int:
    """The server's ``retry_jitter_hash``: ``job_id.hash(h); attempt.hash(h)`` with a
    ``DefaultHasher``. Rust hashes a ``str`` as its bytes plus ``0xFF`` and a ``u32`` as
    its 4 little-endian bytes, all into one SipHash stream."""
    return siphash(job_id.encode() + b"\xff" + (attempt & 0xFFFF_FFFF).to_bytes(4, "little"))
