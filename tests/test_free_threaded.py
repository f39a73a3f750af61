"""On a free-threaded CPython (3.13t) the GIL stays off with sepp_lite in use.

CPython turns the GIL back on when it loads a C extension that has not declared it
can run without one, and warns (RuntimeWarning) when it does. sepp_lite is pure
Python, but what it imports is not all pure: each check runs in a fresh interpreter
(what the suite imported before cannot hide or cause it), with that warning an error,
and reads ``sys._is_gil_enabled()`` at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

pytestmark = [
    pytest.mark.skipif(
        not sysconfig.get_config_var("Py_GIL_DISABLED"),
        reason="needs a free-threaded CPython build (3.13t): this one always has the GIL",
    ),
    pytest.mark.timeout(60),
]

CALL = """
import asyncio

import sepp_lite as sepp
from sepp_lite.testing import SeppTestServer


async def main():
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            ack = await client.enqueue(sepp.EnqueueRequest(queue="q", job_type="t"))
            assert ack.job_id
            assert (await client.get_server_info()).version


asyncio.run(main())
"""


PROBE = "\nimport sys\nprint(sys._is_gil_enabled())"


def gil_after(code: str, **env: str) -> bool:
    """Whether the GIL is on after a fresh interpreter ran ``code``."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code + PROBE],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    return {"False": False, "True": True}[done.stdout.strip().splitlines()[-1]]


@pytest.mark.parametrize(
    "module", ["sepp_lite", "sepp_lite.sync", "sepp_lite.tasks", "sepp_lite.testing"]
)
def test_the_gil_stays_off_after_import(module: str) -> None:
    assert gil_after(f"import {module}") is False


def test_the_gil_stays_off_after_connect_and_calls() -> None:
    assert gil_after(CALL) is False


def test_the_check_sees_a_gil_that_is_on() -> None:
    # The same probe, with the GIL forced on: it reads the interpreter's real state.
    assert gil_after("import sepp_lite", PYTHON_GIL="1") is True
