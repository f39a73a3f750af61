"""nginx as a gRPC reverse proxy for tests: Debian's ``nginx`` started in the
foreground with its own prefix, config, pid, temp and log files in a temporary
directory, listening for cleartext HTTP/2 (prior knowledge) on 127.0.0.1 and passing
every call to one upstream gRPC server."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import shutil
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Callable, Optional

from tests.client_helpers import free_port

NGINX = shutil.which("nginx") or next(
    (path for path in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(path, os.X_OK)),
    None,
)
_STOP_TIMEOUT = 10.0


def _user_line() -> str:
    # As root, nginx would run its workers as `nobody`, who cannot write our temp
    # directory; as anyone else the directive is ignored (with a warning), so leave it.
    if os.geteuid() != 0:
        return ""
    user = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.getegid()).gr_name
    return f"user {user} {group};"


def _config(prefix: Path, port: int, upstream: int) -> str:
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # keepalive_requests (1000 by default) also ends a client connection with GOAWAY;
    # it stays at its default, as in a real deploy. The timeouts outlast any long poll
    # (the server caps a wait at 300 s).
    return f"""
{_user_line()}
daemon off;
master_process on;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} notice;
events {{ worker_connections 512; }}
http {{
{temp}
    log_format grpc '$pid $connection $status $upstream_status $sent_trailer_grpc_status';
    access_log {prefix / "access.log"} grpc;
    client_max_body_size 0;
    upstream sepp {{
        server 127.0.0.1:{upstream};
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port} http2;
        location / {{
            grpc_pass grpc://sepp;
            grpc_read_timeout 330s;
            grpc_send_timeout 330s;
        }}
    }}
}}
"""


def _children(pid: int) -> set[int]:
    try:
        return {
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        }
    except OSError:
        return set()


class Nginx:
    """``Nginx(upstream_port, directory)``: start with ``async with``; :meth:`reload`
    and :meth:`quit` run ``nginx -s`` for this instance; leaving the block stops
    whatever is still running (master and workers, by their PIDs)."""

    def __init__(self, upstream: int, directory: Path) -> None:
        assert NGINX is not None
        self.upstream = upstream
        self.prefix = directory
        self.port = free_port()
        self.conf = directory / "nginx.conf"
        self._process: Optional[asyncio.subprocess.Process] = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _args(self, *more: str) -> list[str]:
        assert NGINX is not None
        return [NGINX, "-p", str(self.prefix), "-c", str(self.conf), "-e", self._log, *more]

    @property
    def _log(self) -> str:
        return str(self.prefix / "error.log")

    def workers(self) -> set[int]:
        """The master's children right now (workers of every generation)."""
        assert self._process is not None
        return _children(self._process.pid)

    async def start(self) -> Nginx:
        self.prefix.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(_config(self.prefix, self.port, self.upstream))
        # With -e, nginx writes even its start-up errors to error.log.
        self._process = await asyncio.create_subprocess_exec(
            *self._args(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await self._until(self._listening, "nginx did not start listening")
        return self

    async def _listening(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        return bool(self.workers())

    async def _until(
        self, check: Callable[[], Awaitable[bool]], failure: str, timeout: float = 10.0
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await check():
            assert self._process is not None and self._process.returncode is None, self.log()
            assert loop.time() < deadline, f"{failure}\n{self.log()}"
            await asyncio.sleep(0.02)

    async def signal(self, name: str) -> None:
        """``nginx -s <name>`` for this instance (reload, quit, stop, reopen)."""
        process = await asyncio.create_subprocess_exec(
            *self._args("-s", name),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), _STOP_TIMEOUT)
        assert process.returncode == 0, output.decode(errors="replace")

    async def reload(self) -> None:
        """Reload and wait until a new generation of workers runs (the old ones drain
        their connections in the background)."""
        before = self.workers()
        await self.signal("reload")

        async def fresh() -> bool:
            return bool(self.workers() - before)

        await self._until(fresh, "no new nginx worker after the reload")

    async def quit(self) -> None:
        """``nginx -s quit``: graceful; returns once the master has exited."""
        assert self._process is not None
        await self.signal("quit")
        await asyncio.wait_for(self._process.wait(), _STOP_TIMEOUT + 30)

    def log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def access_log(self) -> list[list[str]]:
        """``[pid, connection, status, upstream status, grpc-status]`` per request."""
        path = self.prefix / "access.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    async def stop(self) -> None:
        """Stop the master (fast shutdown: it waits for its workers before it exits);
        if it does not exit in time, kill its workers, then it."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_TIMEOUT)
        except asyncio.TimeoutError:
            for pid in _children(process.pid):  # still its children, so ours
                os.kill(pid, signal.SIGKILL)
            process.kill()
            await process.wait()

    async def __aenter__(self) -> Nginx:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
