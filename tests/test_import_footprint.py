"""``import sepp_lite`` and ``SeppClient.connect`` load none of grpclib, h2, multidict or
betterproto: the client speaks HTTP/2 itself; those serve the test server, the raw
layer and ``from_channel`` only."""

from __future__ import annotations

import subprocess
import sys

from tests.client_helpers import sepp_server

HEAVY = ("grpclib", "h2", "multidict", "betterproto", "hyperframe")

_SCRIPT = """
import asyncio, sys
import sepp_lite
loaded = {name.split(".")[0] for name in sys.modules}
async def main(addr):
    async with await sepp_lite.SeppClient.connect(addr) as client:
        await client.get_server_info()
asyncio.run(main(sys.argv[1]))
after = {name.split(".")[0] for name in sys.modules}
print(",".join(sorted(loaded)) + "|" + ",".join(sorted(after)))
"""


async def test_import_and_connect_load_no_grpclib_h2_multidict_or_betterproto() -> None:
    async with sepp_server() as server:
        # Another process: this one has the test server (grpclib) loaded already.
        process = await asyncio_run(sys.executable, "-c", _SCRIPT, server.addr)
    at_import, after_connect = (set(part.split(",")) for part in process.split("|"))
    assert "sepp_lite" in at_import and "hpack" in after_connect
    assert not at_import & set(HEAVY)
    assert not after_connect & set(HEAVY), after_connect & set(HEAVY)


async def asyncio_run(*argv: str) -> str:
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


_CLI_SCRIPT = """
import contextlib, io, sys
from sepp_lite.cli import main
import sepp_lite.monitor, sepp_lite.sync, sepp_lite._supervisor
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(["info", "--json", "--addr", sys.argv[1]])
    except SystemExit as exit:
        code = exit.code
assert code in (0, None), code
print(",".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


async def test_the_command_a_worker_process_and_the_sync_client_load_none_of_them() -> None:
    # `sepp-lite worker` builds every command's parser, `serve`'s included: the test
    # server's options come without the test server.
    async with sepp_server() as server:
        loaded = set((await asyncio_run(sys.executable, "-c", _CLI_SCRIPT, server.addr)).split(","))
    assert "sepp_lite" in loaded and "hpack" in loaded
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
