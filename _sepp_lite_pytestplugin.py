"""sepp_lite's pytest plugin: fixtures for testing producers and handlers against the
in-process sepp server, or against a real one with ``pytest --sepp-addr HOST:PORT``.

Installing sepp_lite registers it (entry point ``pytest11``, plugin name
``sepp_lite``; ``-p no:sepp_lite`` turns it off). The fixtures are described in
docs/testing.md ("The pytest fixtures") and by ``pytest --fixtures``.

This module sits outside the ``sepp_lite`` package on purpose (as hypothesis's plugin
does): pytest imports every installed plugin at start, and importing ``sepp_lite``
costs about as much as importing pytest. Until a test asks for one of the fixtures,
this module has loaded only pytest, the standard library and, when installed,
pytest-asyncio (which pytest loads anyway).
"""

from __future__ import annotations

import inspect
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional

import pytest

try:
    import pytest_asyncio
except ImportError:  # the sync fixtures work without it
    pytest_asyncio = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from sepp_lite import SeppClient
    from sepp_lite.sync import SeppClient as SyncSeppClient
    from sepp_lite.testing import SeppServerThread, ServerClock
    from sepp_lite.worker import Worker

Drain = Callable[..., Awaitable[None]]

# How long the fixture server keeps dead letters unless a test says otherwise
# (``@pytest.mark.sepp_server(dead_letter_retention_ms=0)`` keeps none, as the real
# server's default does): 30 days of the server's clock, longer than a test moves a
# manual clock, so ``counts(queue).dead`` and ``drain_dead_letters`` see every job a
# test dead-letters.
DEAD_LETTER_RETENTION_MS = 30 * 24 * 3600 * 1000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sepp_lite", "sepp_lite fixtures")
    group.addoption(
        "--sepp-addr",
        metavar="HOST:PORT",
        default=None,
        help="point the sepp fixtures at this sepp server instead of a fresh in-process "
        "one per test (queue names from sepp_queue stay unique; tests that need "
        "sepp_server or sepp_clock are skipped)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sepp_server(**options): SeppTestServer keyword arguments for this test's "
        "in-process sepp server (strict_queues=True, queues=[...], ...); ignored with "
        "--sepp-addr",
    )
    addr = _external_addr(config)
    if addr is not None:
        from sepp_lite._wire.transport import parse_address

        try:
            parse_address(addr)
        except ValueError as exc:
            raise pytest.UsageError(f"--sepp-addr: {exc}") from None


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    addr = _external_addr(config)
    return None if addr is None else f"sepp_lite: the sepp fixtures use the server at {addr}"


def _external_addr(config: pytest.Config) -> Optional[str]:
    addr: Optional[str] = config.getoption("--sepp-addr", None)
    return addr


def _needs_in_process(fixture: str, addr: str) -> str:
    return f"{fixture} needs the in-process sepp server; this run uses --sepp-addr {addr}"


@pytest.fixture
def sepp_server(request: pytest.FixtureRequest) -> Iterator[SeppServerThread]:
    """A fresh in-process sepp server on 127.0.0.1, serving from a thread of its own
    (a ``sepp_lite.testing.SeppServerThread``): ``.addr``, ``.counts(queue)``,
    ``.backlog()``, ``.clock``. Configure it with ``@pytest.mark.sepp_server(...)``.
    It keeps dead letters for 30 days of its clock (``dead_letter_retention_ms=0`` in
    the marker keeps none; a marker's ``config=`` is taken as it is). Its clock is
    manual when the test also asks for ``sepp_clock``. Skipped with ``--sepp-addr``."""
    addr = _external_addr(request.config)
    if addr is not None:
        pytest.skip(_needs_in_process("sepp_server", addr))
    from sepp_lite.testing import ManualClock, SeppServerThread

    options: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers("sepp_server"))):
        options.update(marker.kwargs)  # the closest marker wins
    if "config" not in options:
        options.setdefault("dead_letter_retention_ms", DEAD_LETTER_RETENTION_MS)
    if "sepp_clock" in request.fixturenames:
        options.setdefault("clock", ManualClock())
    with SeppServerThread(**options) as server:
        yield server


@pytest.fixture
def sepp_clock(request: pytest.FixtureRequest) -> ServerClock:
    """The in-process server's manual clock: ``sepp_clock.advance(60)`` runs the lease
    expiries, schedules and retry delays that fall due. Asking for it makes the
    server's time stand still until advanced. Skipped with ``--sepp-addr``."""
    addr = _external_addr(request.config)
    if addr is not None:
        pytest.skip(_needs_in_process("sepp_clock", addr))
    server: SeppServerThread = request.getfixturevalue("sepp_server")
    if not server.clock.manual:
        raise pytest.UsageError(
            "sepp_clock: the test's server has another clock (given by a sepp_server marker, "
            "or the server was made before sepp_clock was asked for)"
        )
    return server.clock


@pytest.fixture
def sepp_addr(request: pytest.FixtureRequest) -> str:
    """The address the sepp fixtures connect to: the in-process server's, or
    ``--sepp-addr``."""
    addr = _external_addr(request.config)
    if addr is not None:
        return addr
    server: SeppServerThread = request.getfixturevalue("sepp_server")
    return server.addr


@pytest.fixture
def sepp_connect_kwargs() -> dict[str, Any]:
    """Keyword arguments of ``connect()`` for ``sepp_client`` and ``sepp_sync_client``
    (none by default): override this fixture to add ``api_key``, TLS options, ..."""
    return {}


@pytest.fixture
def sepp_queue(request: pytest.FixtureRequest) -> str:
    """A queue name of this test's own (its name and a random suffix), so tests can
    share one real server (``--sepp-addr``) without seeing each other's jobs."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")[:48]
    return f"{name or 'test'}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sepp_sync_client(
    sepp_addr: str, sepp_connect_kwargs: dict[str, Any]
) -> Iterator[SyncSeppClient]:
    """A blocking ``sepp_lite.sync.SeppClient`` connected to ``sepp_addr``; closed
    after the test. Needs no pytest-asyncio."""
    from sepp_lite.sync import SeppClient as Blocking

    with Blocking.connect(sepp_addr, **sepp_connect_kwargs) as client:
        yield client


def _refuse_sync_test(request: pytest.FixtureRequest) -> None:
    """A plain ``def`` test would get a client bound to an event loop that is not
    running while the test runs: every call on it would hang or fail later."""
    test = getattr(request.node, "function", None)
    if test is None or inspect.iscoroutinefunction(inspect.unwrap(test)):
        return
    pytest.fail(
        f"{request.node.name} is a plain 'def' test and sepp_client is an async client "
        "(its calls must be awaited on the test's event loop): ask for sepp_sync_client, "
        "the blocking client, or make the test 'async def'",
        pytrace=False,
    )


async def _connected_client(addr: str, kwargs: dict[str, Any]) -> AsyncIterator[SeppClient]:
    from sepp_lite import SeppClient as Async

    async with await Async.connect(addr, **kwargs) as client:
        yield client


if pytest_asyncio is not None:

    @pytest_asyncio.fixture
    async def sepp_client(
        request: pytest.FixtureRequest, sepp_addr: str, sepp_connect_kwargs: dict[str, Any]
    ) -> AsyncIterator[SeppClient]:
        """An async ``sepp_lite.SeppClient`` connected to ``sepp_addr``, for ``async
        def`` tests (needs pytest-asyncio; strict and auto mode); closed after the
        test. A plain ``def`` test gets an error naming ``sepp_sync_client``."""
        _refuse_sync_test(request)
        async for client in _connected_client(sepp_addr, sepp_connect_kwargs):
            yield client

else:

    @pytest.fixture
    def sepp_client() -> None:
        """An async ``sepp_lite.SeppClient``: needs pytest-asyncio, not installed."""
        pytest.fail(
            "the sepp_client fixture is async and needs pytest-asyncio "
            "(pip install pytest-asyncio); sepp_sync_client works without it",
            pytrace=False,
        )


@pytest.fixture
def sepp_drain(request: pytest.FixtureRequest) -> Drain:
    """``await sepp_drain(worker, timeout=30.0)`` runs ``worker`` until its queues
    hold nothing ready, in flight or scheduled (moving a manual clock over retry
    delays), then stops it: ``sepp_lite.testing.run_until_drained`` on the in-process
    server. With ``--sepp-addr`` the client cannot see scheduled jobs: it runs
    ``worker.run(until_idle=True)`` (queues empty, nothing in flight) instead."""
    if _external_addr(request.config) is not None:
        return _until_idle
    server: SeppServerThread = request.getfixturevalue("sepp_server")
    from sepp_lite.testing import run_until_drained

    async def drain(worker: Worker, *, timeout: float = 30.0) -> None:
        await run_until_drained(worker, server, timeout=timeout)

    return drain


async def _until_idle(worker: Worker, *, timeout: float = 30.0) -> None:
    import asyncio

    await asyncio.wait_for(worker.run(until_idle=True), timeout)
