"""The pytest plugin, tested the way pytest plugins are: ``pytester`` runs small user
test files in fresh pytest processes (the plugin comes in through its installed
``pytest11`` entry point), with pytest-asyncio in auto and strict mode, without
pytest-asyncio, and against an external server process (``--sepp-addr``)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sepp_lite
from sepp_lite.sync import SeppClient
from tests.doc_examples import start_server, stop

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(180)

USER_TESTS = """
from pathlib import Path
from typing import Optional

import pytest

import sepp_lite as sepp
from sepp_lite.testing import QueueConfig

USED = Path(__file__).with_name("queues-used.txt")


def remember(queue: str) -> None:
    with USED.open("a") as out:
        out.write(queue + "\\n")


def test_the_sync_client_enqueues(sepp_sync_client, sepp_queue):
    sepp_sync_client.enqueue(sepp.EnqueueRequest(sepp_queue, "left-behind"))
    remember(sepp_queue)


def test_each_test_has_a_queue_of_its_own(sepp_sync_client, sepp_queue):
    opts = sepp.ReserveOptions([sepp_queue], 30, wait_timeout=0)
    assert sepp_sync_client.reserve(opts) is None
    remember(sepp_queue)


def test_the_in_process_server_can_be_inspected(sepp_server, sepp_sync_client, sepp_queue):
    sepp_sync_client.enqueue(sepp.EnqueueRequest(sepp_queue, "t"))
    assert sepp_server.counts(sepp_queue).ready == 1


@pytest.mark.sepp_server(strict_queues=True, queues=[QueueConfig("declared")])
def test_a_marker_configures_the_server(sepp_server, sepp_sync_client):
    sepp_sync_client.enqueue(sepp.EnqueueRequest("declared", "t"))
    with pytest.raises(sepp.JobRejectedError):
        sepp_sync_client.enqueue(sepp.EnqueueRequest("undeclared", "t"))


MARK
async def test_a_handler_runs_until_the_queue_is_drained(sepp_client, sepp_queue, sepp_drain):
    await sepp_client.enqueue(
        sepp.EnqueueRequest(sepp_queue, "greet", payload=sepp.Payload(b"ada", "text/plain"))
    )
    worker = sepp.Worker(sepp_client, [sepp_queue], lease_duration=30)
    seen = []

    @worker.handler("greet")
    async def greet(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        seen.append(payload.data)

    await sepp_drain(worker)
    assert seen == [b"ada"]


MARK
async def test_the_manual_clock_skips_retry_delays(sepp_client, sepp_clock, sepp_queue, sepp_drain):
    started = sepp_clock.now_ms()
    await sepp_client.enqueue(sepp.EnqueueRequest(sepp_queue, "flaky"))
    worker = sepp.Worker(sepp_client, [sepp_queue], lease_duration=30)
    attempts = []

    @worker.handler("flaky")
    async def flaky(payload: Optional[sepp.Payload], ctx: sepp.JobCtx) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise sepp.HandlerError.retry_after("try again in an hour", 3600)

    await sepp_drain(worker)
    assert attempts == [1, 2]
    assert sepp_clock.now_ms() - started >= 3_600_000
"""

INI = """
[pytest]
asyncio_mode = {mode}
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""


def user_tests(pytester: pytest.Pytester, mark: str = "") -> None:
    pytester.makepyfile(test_user=USER_TESTS.replace("MARK\n", f"{mark}\n"))


def test_the_entry_point_registers_the_plugin() -> None:
    everything = importlib.metadata.entry_points()
    if hasattr(everything, "select"):
        group = everything.select(group="pytest11")
    else:  # Python 3.9: a dict of groups
        group = everything.get("pytest11", [])  # type: ignore[attr-defined]
    found = [entry.value for entry in group if entry.name == "sepp_lite"]
    assert found == ["_sepp_lite_pytestplugin"]


def test_this_suite_runs_with_the_plugin_loaded(pytestconfig: pytest.Config) -> None:
    plugin = pytestconfig.pluginmanager.get_plugin("sepp_lite")
    assert plugin is not None and plugin.__name__ == "_sepp_lite_pytestplugin"


def test_importing_the_plugin_loads_no_sepp_lite() -> None:
    code = (
        "import sys, _sepp_lite_pytestplugin\n"
        "heavy = ('sepp_lite', 'grpclib', 'h2', 'betterproto', 'multidict')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("mode", "mark"), [("auto", ""), ("strict", "@pytest.mark.asyncio")])
def test_every_fixture_in_pytest_asyncio_mode(
    pytester: pytest.Pytester, mode: str, mark: str
) -> None:
    pytester.makeini(INI.format(mode=mode))
    user_tests(pytester, mark)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


def test_the_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="strict"))
    result = pytester.runpytest_subprocess("--fixtures", "-p", "no:cacheprovider")
    for name in ("sepp_server", "sepp_clock", "sepp_addr", "sepp_queue", "sepp_client",
                 "sepp_sync_client", "sepp_drain", "sepp_connect_kwargs"):  # fmt: skip
        result.stdout.fnmatch_lines([f"{name}*"])


WITHOUT_ASYNCIO = """
from datetime import timedelta

import pytest

import sepp_lite as sepp


def test_pytest_asyncio_is_not_there():
    with pytest.raises(ImportError):
        import pytest_asyncio  # noqa: F401


def test_the_sync_fixtures_work(sepp_sync_client, sepp_server, sepp_clock, sepp_queue):
    due = sepp_clock.now() + timedelta(seconds=60)
    sepp_sync_client.enqueue(sepp.EnqueueRequest(sepp_queue, "t", scheduled_at=due))
    assert sepp_server.counts(sepp_queue).scheduled == 1
    sepp_clock.advance(60)
    assert sepp_server.counts(sepp_queue).ready == 1


def test_the_async_client_says_what_it_needs(sepp_client):
    pass
"""


def test_without_pytest_asyncio_the_sync_fixtures_still_work(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As if pytest-asyncio were not installed: its plugin is off and its import fails.
    stub = tmp_path / "stubs" / "pytest_asyncio"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('pytest-asyncio is not installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(stub.parent))
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    pytester.makepyfile(test_user=WITHOUT_ASYNCIO)
    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*sepp_client fixture is async and needs pytest-asyncio*"])


SYNC_AND_ASYNC = """
import pytest

import sepp_lite as sepp


def test_a_plain_def_test_asks_for_the_async_client(sepp_client):
    pass


MARK
async def test_an_async_test_gets_it(sepp_client, sepp_queue):
    await sepp_client.enqueue(sepp.EnqueueRequest(sepp_queue, "t"))
"""


@pytest.mark.parametrize(("mode", "mark"), [("auto", ""), ("strict", "@pytest.mark.asyncio")])
def test_a_sync_test_asking_for_sepp_client_is_told_to_use_sepp_sync_client(
    pytester: pytest.Pytester, mode: str, mark: str
) -> None:
    pytester.makeini(INI.format(mode=mode))
    pytester.makepyfile(test_user=SYNC_AND_ASYNC.replace("MARK\n", f"{mark}\n"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_a_plain_def_test_asks_for_the_async_client is a plain 'def' test and "
            "sepp_client is an async client*ask for sepp_sync_client*"
        ]
    )


DEAD_LETTERS = """
import pytest

import sepp_lite as sepp


def dead_letter_one(client, queue):
    client.enqueue(sepp.EnqueueRequest(queue, "doomed", max_attempts=1))
    [job] = client.reserve(sepp.ReserveOptions([queue], 30, wait_timeout=0))
    client.nack(job.ctx, sepp.RetryDirective.dead_letter(), "broken for good")


def test_a_dead_letter_is_kept_by_default(sepp_server, sepp_sync_client, sepp_queue):
    dead_letter_one(sepp_sync_client, sepp_queue)
    assert sepp_server.counts(sepp_queue).dead == 1
    [record] = sepp_sync_client.drain_dead_letters(sepp_queue)
    assert (record.job_type, record.last_reason) == ("doomed", "broken for good")


def test_still_kept_a_week_later(sepp_server, sepp_clock, sepp_sync_client, sepp_queue):
    dead_letter_one(sepp_sync_client, sepp_queue)
    sepp_clock.advance(7 * 24 * 3600)
    assert sepp_server.counts(sepp_queue).dead == 1


@pytest.mark.sepp_server(dead_letter_retention_ms=0)
def test_a_test_can_turn_retention_off(sepp_server, sepp_sync_client, sepp_queue):
    dead_letter_one(sepp_sync_client, sepp_queue)
    assert sepp_server.counts(sepp_queue).dead == 0
    assert sepp_sync_client.drain_dead_letters(sepp_queue) == []
"""


def test_the_fixture_server_keeps_dead_letters_unless_told_not_to(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini(INI.format(mode="strict"))
    pytester.makepyfile(test_user=DEAD_LETTERS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


@pytest.fixture
def external_server() -> Iterator[str]:
    """A server in a process of its own (stopped by its PID), as CI's real one would be."""
    proc, port = start_server()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def test_sepp_addr_runs_the_same_tests_against_an_external_server(
    pytester: pytest.Pytester, external_server: str
) -> None:
    pytester.makeini(INI.format(mode="auto"))
    user_tests(pytester)
    result = pytester.runpytest_subprocess(
        "--sepp-addr", external_server, "-p", "no:cacheprovider", "-rs"
    )
    result.assert_outcomes(passed=3, skipped=3)
    result.stdout.fnmatch_lines(
        [
            f"*sepp_lite: the sepp fixtures use the server at {external_server}*",
            "SKIPPED*sepp_server needs the in-process sepp server; this run uses "
            f"--sepp-addr {external_server}",
            "SKIPPED*sepp_clock needs the in-process sepp server; this run uses "
            f"--sepp-addr {external_server}",
        ]
    )
    left, checked = (pytester.path / "queues-used.txt").read_text().split()
    assert left != checked  # one queue per test
    with SeppClient.connect(external_server) as client:  # what the run left behind is there
        options = sepp_lite.ReserveOptions([left, checked], 30, wait_timeout=0, max_jobs=5)
        jobs = client.reserve(options) or []
    assert [(job.ctx.queue, job.ctx.job_type) for job in jobs] == [(left, "left-behind")]


def test_a_malformed_sepp_addr_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="strict"))
    result = pytester.runpytest_subprocess(
        "--sepp-addr", "127.0.0.1:notaport", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--sepp-addr:*"])


def test_the_plugin_can_be_turned_off(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="strict"))
    pytester.makepyfile(test_user="def test_x(sepp_queue):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:sepp_lite", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'sepp_queue' not found*"])
