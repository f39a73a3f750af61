"""``sepp-lite worker MODULE:OBJECT``: import the user's Worker (or the factory that makes
it, or a ``sepp_lite.Tasks`` registry) and run it until SIGINT/SIGTERM, with ``/livez``,
``/readyz`` and ``/metrics`` under ``--http``; with ``--processes N`` this process
supervises N children (:mod:`sepp_lite.cli._supervisor`), each of them this same command
run again."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Awaitable
from typing import Any, Callable, Optional

from sepp_lite import errors
from sepp_lite._reach import until_reachable
from sepp_lite._retry import DEFAULT_WAIT_FOR_SERVER
from sepp_lite.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    CliError,
    Commands,
    connect,
    describe,
    int_in,
    non_negative_seconds,
    positive_seconds,
)
from sepp_lite.client import SeppClient
from sepp_lite.shutdown import shutdown_on_signals
from sepp_lite.worker import Worker

__all__ = ["add_parser", "build_when_reachable", "build_worker", "load_target", "run_worker"]

# The command line's one logger, as docs/logging.md names it.
logger = logging.getLogger("sepp_lite.cli")


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``worker`` to ``commands``."""
    parser = commands.add_parser(
        "worker",
        parents=parents,
        help="run a Worker from your code until SIGINT/SIGTERM",
        description="Import MODULE:OBJECT and run the Worker it gives. OBJECT is a "
        "factory, sync or async, called with the client this command connects "
        "(def make_worker(client) -> Worker), or with no arguments when it takes none "
        "(it then connects by itself); or a Worker instance; or a sepp_lite.Tasks, whose "
        "worker serves its tasks (--queues, --concurrency). The first SIGINT or SIGTERM "
        "stops reserving and drains the jobs in flight; a second one stops at once.",
    )
    parser.add_argument("target", metavar="MODULE:OBJECT")
    parser.add_argument(
        "--app-dir", metavar="DIR", help="import from DIR (default: the current directory)"
    )
    parser.add_argument(
        "--until-idle",
        action="store_true",
        help="stop once the queues are empty and nothing is in flight",
    )
    parser.add_argument(
        "--wait-for-server",
        type=non_negative_seconds,
        default=None,
        metavar="SECONDS",
        help="at start, keep trying to reach a server that cannot be reached for this "
        "long, logging each attempt, then fail (default 60; 0: fail at once). A refused "
        "API key or an undeclared queue fails at once",
    )
    parser.add_argument(
        "--unknown-type-delay",
        type=non_negative_seconds,
        default=None,
        metavar="SECONDS",
        help="how long a job of a type this worker has no handler for waits for a worker "
        "that has one before its second attempt, doubled for each further attempt "
        "(default 300: 5 min, then 10 min, ...; its last attempt dead-letters it)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level of the messages on stderr (default info)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line with the job's id, type, queue, "
        "attempt and trace id on the records of a job (default text)",
    )
    _add_tasks_options(parser)
    _add_worker_deployment(parser)
    parser.set_defaults(handler=_cmd_worker)


def _add_tasks_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("when OBJECT is a sepp_lite.Tasks")
    group.add_argument(
        "--queues",
        type=lambda text: [name for name in text.split(",") if name],
        metavar="Q1,Q2",
        help="serve only the tasks of these queues (default: every task's queue)",
    )
    group.add_argument(
        "--concurrency",
        type=int_in(1, 1_000_000),
        metavar="N",
        help="jobs handled at once: the worker's max_in_flight (default 16)",
    )
    group.add_argument(
        "--no-periodic",
        dest="periodic",
        action="store_false",
        help="do not enqueue the slots of periodic tasks (a pool that only consumes)",
    )


def _processes_arg(text: str) -> int:
    from sepp_lite.cli._supervisor import process_count

    try:
        return process_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen_arg(text: str) -> str:
    from sepp_lite._httpd import parse_listen_address

    try:
        parse_listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_worker_deployment(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("running in production")
    group.add_argument(
        "--processes",
        type=_processes_arg,
        default=1,
        metavar="N",
        help="run N worker processes under a supervisor that restarts them (default 1: "
        "this process only; 0 or auto: one per available CPU)",
    )
    group.add_argument(
        "--http",
        type=_listen_arg,
        metavar="ADDR",
        help="serve /livez, /readyz and /metrics on ADDR, e.g. 127.0.0.1:9464 "
        "(:9464 for every interface); /metrics needs prometheus-client (the metrics extra)",
    )
    group.add_argument(
        "--max-loop-lag",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="/livez fails when a worker's event loop is blocked longer (default 10)",
    )
    # A supervised child's status pipe (set by the supervisor, not by hand).
    group.add_argument("--status-fd", type=int, help=argparse.SUPPRESS)


def load_target(spec: str, app_dir: Optional[str] = None, *, module_ok: bool = False) -> object:
    """Import ``MODULE:OBJECT`` (``OBJECT`` may be dotted; with ``module_ok``, a bare
    ``MODULE`` gives the module) from ``app_dir`` or the current directory;
    :class:`CliError` when it cannot be found."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not (attribute or module_ok and ":" not in spec):
        raise CliError(f"expected MODULE:OBJECT, got {spec!r}")
    directory = os.path.abspath(app_dir or os.getcwd())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error it raises is reported
        raise CliError(f"cannot import {module_name!r}: {describe(exc)}") from exc
    target: object = module
    for part in attribute.split(".") if attribute else ():
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no attribute {attribute!r}") from None
    return target


def _takes_client(factory: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return True
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(parameter.kind in positional for parameter in parameters)


async def build_worker(
    target: object,
    spec: str,
    make_client: Callable[[], Awaitable[SeppClient]],
    *,
    queues: Optional[list[str]] = None,
    concurrency: Optional[int] = None,
    periodic: bool = True,
) -> Worker:
    """The Worker ``target`` gives: itself, or what the factory returns (awaited when
    it is a coroutine), called with ``await make_client()`` when it takes an argument;
    for a ``Tasks`` (or a factory returning one), its worker on ``await make_client()``
    for ``queues`` with ``max_in_flight=concurrency``, which only such a worker takes."""
    if _is_tasks(target):
        return await _tasks_worker(target, spec, make_client, queues, concurrency, periodic)
    if queues is not None or concurrency is not None:
        raise CliError("--queues and --concurrency go with a sepp_lite.Tasks target")
    if not periodic:
        raise CliError("--no-periodic goes with a sepp_lite.Tasks target")
    if isinstance(target, Worker):
        return target
    if not callable(target):
        raise CliError(f"{spec} is {type(target).__name__!r}, not a Worker or a factory")
    try:
        result = target(await make_client()) if _takes_client(target) else target()
        if inspect.isawaitable(result):
            result = await result
    except (CliError, errors.SeppError):
        raise
    except Exception as exc:  # the user's factory failed
        raise CliError(f"{spec} raised {describe(exc)}") from exc
    if not isinstance(result, Worker):
        raise CliError(f"{spec} returned {type(result).__name__!r}, not a sepp_lite.Worker")
    return result


async def build_when_reachable(
    target: object,
    spec: str,
    make_client: Callable[[], Awaitable[SeppClient]],
    wait: float,
    **options: Any,
) -> Worker:
    """:func:`build_worker`, tried again while the server cannot be reached (connecting
    fails, in this command or in the user's factory), for at most ``wait`` seconds,
    with one log line per attempt (``_reach``); then :class:`CliError`. Other errors (a
    refused key, a bad address or TLS setting) are raised at once."""
    return await until_reachable(
        lambda: build_worker(target, spec, make_client, **options),
        wait,
        setting=f"--wait-for-server {wait:g}",
        gave_up=CliError,
        text=describe,
    )


def _is_tasks(target: object) -> bool:
    # sepp_lite.tasks is imported only when the user's module has imported it already.
    module = sys.modules.get("sepp_lite.tasks")
    return module is not None and isinstance(target, module.Tasks)


async def _tasks_worker(
    tasks: Any,
    spec: str,
    make_client: Callable[[], Awaitable[SeppClient]],
    queues: Optional[list[str]],
    concurrency: Optional[int],
    periodic: bool = True,
) -> Worker:
    if not len(tasks):
        raise CliError(f"{spec} has no tasks")
    options: dict[str, Any] = {} if concurrency is None else {"max_in_flight": concurrency}
    if not periodic:
        options["periodic"] = False
    unknown = [queue for queue in queues or () if queue not in tasks.queues]
    if unknown:  # checked before connecting
        raise CliError(
            f"--queues: no task of {spec} uses {', '.join(unknown)} (its queues: "
            f"{', '.join(tasks.queues)})"
        )
    worker: Worker = tasks.worker(await make_client(), queues=queues, **options)
    return worker


async def run_worker(worker: Worker, *, until_idle: bool = False) -> int:
    """Run ``worker`` with graceful shutdown on SIGINT/SIGTERM (a second signal stops
    it hard); return 0 after a graceful stop, 1 after a hard one."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(shutdown_on_signals(worker.shutdown_handle()))
        except (ValueError, RuntimeError, NotImplementedError) as exc:
            # Signal handlers need the main thread (and a Unix event loop).
            logger.warning("signals will not stop this worker: %s", exc)
        try:
            await worker.run(until_idle=until_idle)
        except asyncio.CancelledError:
            print(
                "error: stopped hard by a second signal; the jobs in flight were handed "
                "back to their queues (one on its last attempt, or whose handler would not "
                "stop, goes back when its lease expires)",
                file=sys.stderr,
            )
            return EXIT_REFUSED
    return EXIT_OK


async def _cmd_worker(args: argparse.Namespace) -> int:
    if args.processes > 1 and args.status_fd is None:
        return await _supervise(args)
    target = load_target(args.target, args.app_dir)
    async with contextlib.AsyncExitStack() as stack:

        async def make_client() -> SeppClient:
            client = await connect(args)
            stack.push_async_callback(client.close)
            return client

        wait = args.wait_for_server
        if wait is None:
            wait = DEFAULT_WAIT_FOR_SERVER.total_seconds()
        worker = await build_when_reachable(
            target,
            args.target,
            make_client,
            wait,
            queues=args.queues,
            concurrency=args.concurrency,
            periodic=args.periodic,
        )
        if args.wait_for_server is not None:
            worker.wait_for_server = args.wait_for_server
        if args.unknown_type_delay is not None:
            worker.unknown_type_delay = args.unknown_type_delay
        # The worker's client is closed too when a factory made its own: the command
        # owns everything that runs for it.
        stack.push_async_callback(worker.client.close)
        if args.status_fd is not None:
            from sepp_lite.cli._supervisor import run_supervised

            return await run_supervised(
                worker, args.status_fd, until_idle=args.until_idle, max_loop_lag=args.max_loop_lag
            )
        if args.http:
            await _serve_endpoints(stack, worker, args)
        return await run_worker(worker, until_idle=args.until_idle)


async def _serve_endpoints(
    stack: contextlib.AsyncExitStack, worker: Worker, args: argparse.Namespace
) -> None:
    from sepp_lite.monitor import serve_endpoints

    endpoints = serve_endpoints(worker, args.http, max_loop_lag=args.max_loop_lag)
    try:
        await stack.enter_async_context(endpoints)
    except OSError as exc:
        raise CliError(f"--http: cannot listen on {args.http}: {exc}") from exc


async def _supervise(args: argparse.Namespace) -> int:
    from sepp_lite.cli._supervisor import Supervisor

    supervisor = Supervisor(
        args.argv, args.processes, http=args.http, max_loop_lag=args.max_loop_lag
    )
    try:
        return await supervisor.run()
    except OSError as exc:
        raise CliError(f"--http: cannot listen on {args.http}: {exc}") from exc
