"""An in-process sepp server for tests: the real server's semantics (queues, leases,
retries, dead letters, idempotency, auth, TLS) on real sockets, with an optional
manual clock so time-based behaviour needs no waiting.

    async with SeppTestServer(strict_queues=True, queues=[QueueConfig("a")]) as server:
        ...  # connect to server.addr

``python -m sepp_lite.testing`` runs it as a standalone server.
"""

from __future__ import annotations

from sepp_lite.testing._clock import Clock, ManualClock, RealClock
from sepp_lite.testing._config import ConfigError, Limits, QueueConfig, ServerConfig
from sepp_lite.testing._server import SeppTestServer
from sepp_lite.testing._state import JobView, QueueCounts, QueueState, RpcError

__all__ = [
    "Clock",
    "ConfigError",
    "JobView",
    "Limits",
    "ManualClock",
    "QueueConfig",
    "QueueCounts",
    "QueueState",
    "RealClock",
    "RpcError",
    "SeppTestServer",
    "ServerConfig",
]
