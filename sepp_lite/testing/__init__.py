"""An in-process sepp server for tests: the real server's semantics (queues, leases,
retries, dead letters, idempotency, auth, TLS) on real sockets, with an optional
manual clock so time-based behaviour needs no waiting.

    async with SeppTestServer(strict_queues=True, queues=[QueueConfig("a")]) as server:
        ...  # connect to server.addr

``server.before_call(method, hook)`` awaits ``hook()`` before each call to one RPC, so
a test can hold a call open while its client waits for the answer.

``SeppServerThread`` runs it on a thread of its own (for synchronous tests and the
blocking client), ``run_until_drained`` runs a worker until nothing is left, and the
pytest plugin (fixtures ``sepp_server``, ``sepp_client``, ...; see docs/testing.md) wraps
it all. ``python -m sepp_lite.testing`` runs the server as a standalone process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sepp_lite.testing._clock import Clock, ManualClock, RealClock
from sepp_lite.testing._config import ConfigError, Limits, QueueConfig, ServerConfig
from sepp_lite.testing._state import Backlog, JobView, QueueCounts, QueueState, RpcError

if TYPE_CHECKING:
    from sepp_lite.testing._drain import run_until_drained
    from sepp_lite.testing._server import SeppTestServer
    from sepp_lite.testing._thread import SeppServerThread, ServerClock

# What puts the server behind grpclib loads on first use, so that `sepp-lite worker`,
# which parses `serve`'s options too, and a plain `import sepp_lite.testing._config`
# never load grpclib, h2 or betterproto.
_LAZY = {
    "SeppTestServer": "sepp_lite.testing._server",
    "SeppServerThread": "sepp_lite.testing._thread",
    "ServerClock": "sepp_lite.testing._thread",
    "run_until_drained": "sepp_lite.testing._drain",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Backlog",
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
    "SeppServerThread",
    "SeppTestServer",
    "ServerClock",
    "ServerConfig",
    "run_until_drained",
]
