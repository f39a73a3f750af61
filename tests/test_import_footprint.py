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
    # An ASCII host name is checked without the idna codec (and what it loads).
    assert not (after_connect - at_import) & {"stringprep", "unicodedata"}, after_connect


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
import sepp_lite.monitor, sepp_lite.sync, sepp_lite.cli._supervisor
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


_LAZY_SCRIPT = """
import sys
import sepp_lite
lazy = ("sepp_lite._rejections", "sepp_lite._codec.job_rejection", "sepp_lite.worker",
        "sepp_lite.shutdown")
print(",".join(name for name in lazy if name in sys.modules))
from sepp_lite import *
from sepp_lite.errors import *
from sepp_lite import errors
missing = [n for n in sepp_lite.__all__ + errors.__all__ if n not in globals()]
assert not missing, missing
assert set(sepp_lite.__all__) <= set(dir(sepp_lite)) and set(errors.__all__) <= set(dir(errors))
assert sepp_lite.UnknownQueue is errors.UnknownQueue is UnknownQueue
assert isinstance(QueueFull("q", 3), errors.JobRejection)
import pickle
assert pickle.loads(pickle.dumps(QueueFull("q", 3))) == QueueFull("q", 3)
assert sepp_lite.Worker.__module__ == "sepp_lite.worker"
for module, name in ((sepp_lite, "NoSuchThing"), (errors, "NoSuchError")):
    try:
        getattr(module, name)
    except AttributeError as error:
        assert name in str(error)
    else:
        raise AssertionError(name)
print(",".join(name for name in lazy if name in sys.modules))
"""


def test_the_worker_and_the_rejection_values_load_on_first_use() -> None:
    # Their dataclasses are most of what `import sepp_lite` cost (see _rejections.py).
    out = subprocess.run(
        [sys.executable, "-c", _LAZY_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    at_import, after_use = out.stdout.split("\n")[:2]
    assert at_import == ""
    assert after_use.split(",") == [
        "sepp_lite._rejections",
        "sepp_lite.worker",
        "sepp_lite.shutdown",
    ]
