"""The bench's default server: grpcio's C core speaking HTTP/2 (as the real sepp server's
hyper does, frames coalesced and cheap), in front of the in-process server's state
machine (``tests/grpcio_server.py``). Runs until SIGTERM.

    python bench/grpcio_server.py --port 50051
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.grpcio_server import GrpcioServer


async def main(port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with GrpcioServer(port=port) as server:
        print(f"queue server listening addr=127.0.0.1:{server.port}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(main(parser.parse_args().port))
