"""``sepp-lite`` as a child process, for the tests that run the real command
(``test_cli_process.py``, ``test_cli_drain.py``)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Optional

PIPE = asyncio.subprocess.PIPE

# `python -m sepp_lite`, with Ctrl-C's default handler even when this test run was started
# with SIGINT ignored, as a background job of a shell without job control is (nohup ...
# &): children inherit that, and Python then rightly leaves SIGINT ignored.
_AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('sepp_lite', run_name='__main__', alter_sys=True)"
)


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment without the CLI's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("SEPP_ADDR", "SEPP_API_KEY")}
    env.update(extra)
    return env


@asynccontextmanager
async def started(
    *args: str, stdin: Optional[int] = None, stdout: int = PIPE, stderr: int = PIPE
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m sepp_lite args`` as a child process, killed if still running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _AS_FROM_A_TERMINAL,
        *args,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=child_env(),
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


async def sepp_lite(*args: str, stdin: Optional[bytes] = None) -> tuple[int, str, str]:
    """Run ``sepp-lite args`` to its end, ``stdin`` its input; ``(exit status, stdout,
    stderr)``."""
    async with started(*args, stdin=None if stdin is None else PIPE) as proc:
        out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
