"""``python -m sepp_lite.testing``: the in-process server as a standalone process.

``add_serve_arguments`` and ``serve`` are reused by the project CLI (``sepp-lite
serve``). Once listening, one line containing ``queue server listening`` and
``addr=HOST:PORT`` goes to stdout, like the real server's, for tools that wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Optional

from sepp_lite.testing._config import (
    ConfigError,
    QueueConfig,
    ServerConfig,
    from_toml_data,
    read_toml,
)

if TYPE_CHECKING:
    from sepp_lite.testing._server import SeppTestServer

__all__ = [
    "ListenError",
    "add_serve_arguments",
    "config_from_args",
    "listen_failure",
    "listening_line",
    "main",
    "serve",
]

DEFAULT_PORT = 50051


class ListenError(Exception):
    """The server could not listen where it was told to; the message names the
    address and why."""


_BIND_ERRORS = {
    errno.EADDRINUSE: "the address is already in use (is another server running there? "
    "--port 0 picks a free port)",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "that address is not one of this machine's",
}


def listen_failure(config: ServerConfig, exc: OSError) -> str:
    """The words for a failed bind of ``config``'s address."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    if exc.__class__.__name__ == "gaierror":
        words = f"cannot resolve the host name {config.host!r} ({exc.strerror or exc})"
    elif exc.errno in _BIND_ERRORS:
        words = _BIND_ERRORS[exc.errno]
    else:
        text = exc.strerror or str(exc)
        words = text[:1].lower() + text[1:]
    return f"cannot listen on {host}:{config.port}: {words}"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the server's options to ``parser``."""
    parser.add_argument(
        "--host", help="address to listen on (default 127.0.0.1, or the config's listen_addr)"
    )
    parser.add_argument(
        "--port", type=int, help=f"port to listen on; 0 picks a free one (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help="accept this API key (repeatable); turns auth on, replacing keys from --config",
    )
    parser.add_argument(
        "--strict-queues",
        nargs="?",
        const="",
        metavar="Q1,Q2",
        help="strict mode: only declared queues (these plus the config's) are accepted",
    )
    parser.add_argument(
        "--dead-letter-retention",
        type=float,
        metavar="SECONDS",
        help="keep dead letters this long, so DrainDeadLetters returns them (default: off)",
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain (with --tls-key)")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key (with --tls-cert)")
    parser.add_argument("--config", metavar="FILE", help="a sepp server TOML config file")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log level of the messages on stderr (default warning)",
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The :class:`ServerConfig` the options describe. Raises :class:`ConfigError`."""
    data = read_toml(args.config) if args.config else {}
    config = from_toml_data(data)
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    elif "listen_addr" not in data.get("server", {}):
        overrides["port"] = DEFAULT_PORT
    if args.api_keys is not None:
        overrides["api_keys"] = list(args.api_keys)
    if args.strict_queues is not None:
        overrides["strict_queues"] = True
        declared = {q.name for q in config.queues}
        extra = [n for n in args.strict_queues.split(",") if n and n not in declared]
        overrides["queues"] = [*config.queues, *(QueueConfig(n) for n in dict.fromkeys(extra))]
    if args.dead_letter_retention is not None:
        if args.dead_letter_retention < 0:
            raise ConfigError("--dead-letter-retention must not be negative")
        overrides["dead_letter_retention_ms"] = round(args.dead_letter_retention * 1000)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.tls_cert is not None:
        overrides["tls_cert"], overrides["tls_key"] = args.tls_cert, args.tls_key
    return config.with_overrides(**overrides)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def listening_line(server: SeppTestServer) -> str:
    """The ready line, in the real server's format (tracing's fmt layer)."""
    config = server.config

    def on_off(on: bool) -> str:
        return '"enabled"' if on else '"disabled"'

    return (
        f"{_now()}  INFO sepp_lite.testing: queue server listening addr={server.addr} "
        f"db_path=:memory: tls={on_off(config.tls_enabled)} "
        f"auth={on_off(config.api_key_set is not None)} "
        f"strict_queues={on_off(config.strict_queues)} declared_queues={len(config.queues)}"
    )


def _install_signal_handlers(stop: asyncio.Event) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    try:
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
    except NotImplementedError:  # pragma: no cover - Windows event loops
        previous = {
            sig: signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
            for sig in signals
        }

        def restore_previous() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore_previous

    def restore() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return restore


async def serve(
    args: argparse.Namespace, *, ready: Optional[Callable[[SeppTestServer], None]] = None
) -> int:
    """Run the server the options describe until SIGINT or SIGTERM; return the exit
    code (0). ``ready`` is called once the server is listening. Raises
    :class:`ConfigError` for a bad configuration and :class:`ListenError` when its
    address cannot be bound."""
    from sepp_lite.testing._server import SeppTestServer  # grpclib: only when serving

    config = config_from_args(args)
    server = SeppTestServer(config)
    stop = asyncio.Event()
    restore = _install_signal_handlers(stop)
    try:
        try:
            await server.start()
        except OSError as exc:
            raise ListenError(listen_failure(config, exc)) from exc
        print(listening_line(server), flush=True)
        if ready is not None:
            ready(server)
        await stop.wait()
    finally:
        await server.stop()
        restore()
    try:
        print(f"{_now()}  INFO sepp_lite.testing: queue server stopped", flush=True)
    except BrokenPipeError:  # whoever read the ready line is gone; stopping is still clean
        pass
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m sepp_lite.testing",
        description="Run the in-process sepp test server (in memory, nothing is persisted).",
    )
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(serve(args))
    except (ConfigError, RuntimeError) as exc:  # RuntimeError: no TOML parser
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ListenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot listen: {exc}", file=sys.stderr)
        return 1
