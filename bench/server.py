"""Throughput of the in-process test server (sepp_lite.testing) over real sockets.

The server runs in a subprocess (``python -m sepp_lite.testing --port 0``), so its
CPU time and the client's are measured separately. The client is grpclib with raw
bytes from the hand-written client codec, so little client overhead is added.

Measured: EnqueueBatch of 256 jobs (jobs/s) and reserve(max_jobs=1) + ack cycles
(cycles/s), each with one caller and with several concurrent callers on one channel.
Target: >= 2,000 reserve+ack cycles/s on CPython. Run: ``python bench/server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import interpreter
from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.encoding.base import CodecBase

from sepp_lite._codec.enqueue import encode_enqueue_batch_request
from sepp_lite._codec.job import decode_reserve_response, encode_reserve_request
from sepp_lite._codec.lease import encode_ack_request
from sepp_lite.types import EnqueueRequest, Payload, ReserveOptions

ROOT = Path(__file__).resolve().parent.parent
SERVICE = "/sepp.v1.QueueService/"
READY = re.compile(r"addr=([\d.]+):(\d+)")


class RawCodec(CodecBase):
    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU of a process from /proc (Linux), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, command: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        match = READY.search(self.proc.stdout.readline())
        if match is None:
            self.proc.kill()
            raise RuntimeError("the server did not start")
        self.host, self.port = match[1], int(match[2])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=10)


async def measure(
    name: str,
    server: Server,
    workers: int,
    seconds: float,
    step: Callable[[], Any],
    per_step: int,
) -> dict[str, Any]:
    """Run ``step`` in ``workers`` concurrent loops for ``seconds``; report rates."""
    done = 0
    stop_at = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await step()
            done += per_step

    server_cpu = cpu_seconds(server.proc.pid)
    client_cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(workers)))
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    server_after = cpu_seconds(server.proc.pid)
    server_used = None if server_cpu is None or server_after is None else server_after - server_cpu
    result = {
        "name": name,
        "workers": workers,
        "ops": done,
        "seconds": round(elapsed, 3),
        "per_second": round(done / elapsed),
        "client_cpu_s": round(client_cpu, 3),
        "server_cpu_s": None if server_used is None else round(server_used, 3),
        "server_cpu_us_per_op": None if server_used is None else round(server_used / done * 1e6, 1),
    }
    server_text = "n/a" if server_used is None else f"{server_used:.2f} s"
    print(
        f"{name:<28} workers={workers:<2} {result['per_second']:>8,}/s   "
        f"client CPU {client_cpu:.2f} s, server CPU {server_text} "
        f"({result['server_cpu_us_per_op']} us/op) over {elapsed:.2f} s",
        flush=True,
    )
    return result


SEPP_SERVER = ["-m", "sepp_lite.testing", "--port", "0", "--log-level", "error"]
ECHO_SERVER = [__file__, "--echo-server"]


async def serve_echo() -> None:
    """A bare grpclib server answering every call with its request: the floor that
    grpclib and h2 alone cost on this machine."""
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server as GrpcServer

    async def echo(stream: Any) -> None:
        await stream.send_message(await stream.recv_message())

    class Echo:
        def __mapping__(self) -> dict[str, Handler]:
            return {
                SERVICE + name: Handler(echo, Cardinality.UNARY_UNARY, bytes, bytes)
                for name in ("Reserve", "Ack")
            }

    server = GrpcServer([Echo()], codec=RawCodec())
    # proto must be IPPROTO_TCP: grpclib sets TCP_NODELAY only on such sockets.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    await server.start(sock=sock)
    print(f"addr=127.0.0.1:{sock.getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


async def run_baseline(seconds: float, concurrency: int) -> list[dict[str, Any]]:
    server = Server(ECHO_SERVER)
    results = []
    try:
        async with Channel(server.host, server.port, codec=RawCodec()) as channel:
            reserve = UnaryUnaryMethod(channel, SERVICE + "Reserve", bytes, bytes)
            ack = UnaryUnaryMethod(channel, SERVICE + "Ack", bytes, bytes)
            body = encode_ack_request("6f1c1f0e-4c1f-4d55-9a0e-1d3b2c4e5f60", 1, None)

            async def cycle() -> None:
                await reserve(body, timeout=30)
                await ack(body, timeout=30)

            await cycle()
            for workers in (1, concurrency):
                results.append(
                    await measure("grpclib echo, 2 calls", server, workers, seconds, cycle, 1)
                )
    finally:
        server.stop()
    return results


async def run(seconds: float, concurrency: int) -> list[dict[str, Any]]:
    server = Server(SEPP_SERVER)
    results = []
    try:
        async with Channel(server.host, server.port, codec=RawCodec()) as channel:

            def method(rpc: str) -> UnaryUnaryMethod[bytes, bytes]:
                return UnaryUnaryMethod(channel, SERVICE + rpc, bytes, bytes)

            enqueue, reserve, ack = method("EnqueueBatch"), method("Reserve"), method("Ack")
            jobs = [
                EnqueueRequest("bench", "work", payload=Payload(bytes(range(256)), "raw"))
                for _ in range(256)
            ]
            batch = encode_enqueue_batch_request(jobs)

            async def enqueue_step() -> None:
                await enqueue(batch, timeout=30)

            reserve_body = encode_reserve_request(
                ReserveOptions(["bench"], timedelta(seconds=60), timedelta(0))
            )

            async def cycle() -> None:
                found, problems = decode_reserve_response(await reserve(reserve_body, timeout=30))
                assert not problems and len(found) == 1, "the queue ran dry"
                ctx = found[0].ctx
                await ack(encode_ack_request(ctx.id, ctx.attempt, None), timeout=30)

            await enqueue_step()  # warm up both sides
            await cycle()
            for workers in (1, concurrency):
                results.append(
                    await measure(
                        "enqueue (256/batch) jobs", server, workers, seconds, enqueue_step, 256
                    )
                )
            for workers in (1, concurrency):
                results.append(
                    await measure("reserve+ack cycles", server, workers, seconds, cycle, 1)
                )
    finally:
        server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    parser.add_argument(
        "--baseline", action="store_true", help="also measure a bare grpclib echo server"
    )
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(serve_echo())
        return
    print(f"sepp_lite.testing server bench on {interpreter()} (server in a subprocess)")
    results = asyncio.run(run(args.seconds, args.concurrency))
    if args.baseline:
        results += asyncio.run(run_baseline(args.seconds, args.concurrency))
    if args.json:
        Path(args.json).write_text(json.dumps({"interpreter": interpreter(), "results": results}))


if __name__ == "__main__":
    main()
