"""Shared fixtures.

Wire-facing client tests run over both client transports: the default one
(``SeppClient.connect``) and a grpclib ``Channel`` wrapped by ``SeppClient.from_channel``.
A module opts in with ``pytestmark = pytest.mark.both_transports``; then each of its
tests that makes its client with ``client_helpers.connected()`` runs once per transport
(ids ``[connect]`` and ``[from_channel]``), except those marked ``connect_only``: they
pass options only ``connect()`` takes (an API key, TLS, keepalive, a receive limit), test
the default transport's own behaviour (its reconnect backoff), or test what lies above
the transport (the retry decision's many cases).
Tests that call ``SeppClient.connect`` themselves are about connecting and run once.

The ``server`` and ``client`` fixtures are the ones most modules share: an in-process
server with dead-letter retention on, and a client connected to it with
``client_helpers.connected()`` (so in a ``both_transports`` module a test that asks for
``client`` runs over both transports too). A module that needs the server configured
otherwise overrides ``server_options``; one that needs another kind of server
overrides ``server``; either says why.

No test calls ``asyncio.run`` in the test's own thread (run ``sepp-lite``'s ``main()`` in
a thread, a coroutine with ``client_helpers.run_on_own_loop``): on Python 3.9,
pytest-asyncio (1.2, its last release for 3.9) keeps an event loop of its own set in
that thread between tests, which ``asyncio.run`` would replace and then unset, leaving
it unclosed for the garbage collector to report in whichever later test it runs.
"""

from __future__ import annotations

import os
import sys

# grpcio (the reference server and sepp-py in some tests) registers fork handlers; the
# tests start processes only by fork+exec, which needs none, and on CPython 3.9's older
# grpcio a handler once aborted a worker subprocess between fork and exec ("skipping
# fork() handlers", then SIGABRT). Read by grpc when it is imported, so set first.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
from collections.abc import AsyncIterator, Iterator
from types import CodeType
from typing import Any

import pytest

from sepp_lite import SeppClient
from sepp_lite.testing import SeppTestServer
from tests import client_helpers
from tests.deprecations import sepp_lite_deprecations_are_errors


def _names_used(code: CodeType) -> set[str]:
    """Global names a function's code (nested functions included) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names_used(const)
    return names


def pytest_configure(config: pytest.Config) -> None:
    if sys.implementation.name == "pypy":
        # PyPy's GC finalizes objects whenever it runs, so the ResourceWarning of an
        # unclosed socket or event loop surfaces in whichever later test triggers a
        # collection, not in the one that leaked it. CPython (reference counting) reports
        # each in the test that leaked it, and there `filterwarnings = error` holds.
        config.addinivalue_line("filterwarnings", "ignore::ResourceWarning")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with sepp_lite_deprecations_are_errors():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with sepp_lite_deprecations_are_errors():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with sepp_lite_deprecations_are_errors():
        yield


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    definition = metafunc.definition
    if definition.get_closest_marker("both_transports") is None:
        return
    if definition.get_closest_marker("connect_only") is not None:
        return
    uses_client = "client" in metafunc.fixturenames
    if not uses_client and "connected" not in _names_used(metafunc.function.__code__):
        return
    metafunc.parametrize("client_transport", client_helpers.TRANSPORTS, indirect=True)


@pytest.fixture(autouse=True)
def client_transport(request: pytest.FixtureRequest) -> Any:
    """The transport ``connected()`` uses in this test ("connect" unless the test was
    parametrized over both)."""
    name = getattr(request, "param", "connect")
    if name != "connect":
        request.getfixturevalue("monkeypatch").setattr(client_helpers, "transport", name)
    return name


@pytest.fixture
def server_options() -> dict[str, Any]:
    """``SeppTestServer``'s arguments for the ``server`` fixture: dead-letter retention
    on, so dead letters can be drained. A module overrides this fixture for another
    configuration."""
    return {"dead_letter_retention_ms": 600_000}


@pytest.fixture
async def server(server_options: dict[str, Any]) -> AsyncIterator[SeppTestServer]:
    """An in-process server (configured by ``server_options``), stopped after the test."""
    async with SeppTestServer(**server_options) as srv:
        yield srv


@pytest.fixture
async def client(server: SeppTestServer) -> AsyncIterator[SeppClient]:
    """A client of ``server``, made by ``client_helpers.connected()`` (on the test's
    transport), closed after the test."""
    async with client_helpers.connected(server.addr) as c:
        yield c
