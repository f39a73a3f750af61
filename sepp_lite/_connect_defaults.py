"""The defaults of ``connect``'s options, named once.

``sepp_lite.SeppClient.connect`` (async) and ``sepp_lite.sync.SeppClient.connect``
(blocking) take the same options. Each writes its signature out in full, so that
editors, ``help()`` and type checkers see every option, and takes every default that
is not ``None``/``False``/``True`` from here. ``tests/test_sync.py`` checks that the two
signatures agree parameter by parameter (name, order, kind, default, annotation).
"""

from __future__ import annotations

from datetime import timedelta

from sepp_lite._coalesce import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_WAITING

__all__ = [
    "CONNECT_TIMEOUT",
    "KEEPALIVE_TIME",
    "KEEPALIVE_TIMEOUT",
    "MAX_ENQUEUES_WAITING",
    "MAX_ENQUEUE_BATCHES_IN_FLIGHT",
    "RPC_TIMEOUT",
]

# sepp-py's (spec/public-api.md): the wait for a first connection, and each call's
# deadline when the caller gives none.
CONNECT_TIMEOUT = timedelta(seconds=5)
RPC_TIMEOUT = timedelta(seconds=30)
# HTTP/2 pings, in seconds: sent this often, dropped when unanswered this long (grpc's
# keepalive_time_ms and keepalive_timeout_ms as sepp-py sets them).
KEEPALIVE_TIME = 30.0
KEEPALIVE_TIMEOUT = 10.0
# Coalesced enqueue() calls: the coalescer owns these bounds.
MAX_ENQUEUE_BATCHES_IN_FLIGHT = DEFAULT_MAX_IN_FLIGHT
MAX_ENQUEUES_WAITING = DEFAULT_MAX_WAITING
