"""The ``sepp-lite`` command (also ``python -m sepp_lite``).

Subcommands: ``serve`` (the in-process server of :mod:`sepp_lite.testing`), ``info``,
``enqueue`` (one job, or many from JSON lines), ``worker MODULE:OBJECT``,
``drain-dead-letters`` and ``demo``.

Exit status: 0 on success; 1 when the server answered and refused (a rejected job, a
wrong API key, an invalid request), a worker was stopped hard, or an unexpected
internal error; 2 for usage, input and connection errors. Failures are reported as one
``error: ...`` line on stderr, with the traceback only under ``--debug``. The API key
is never printed or logged.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import inspect
import json
import logging
import os
import shlex
import sys
from collections.abc import Awaitable, Iterator, Sequence
from typing import IO, Any, Callable, NoReturn, Optional

from sepp_lite import errors
from sepp_lite._version import __version__
from sepp_lite.cli import enqueue, info, serve
from sepp_lite.cli.common import (
    CONNECTION_OPTIONS,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    Commands,
    connect,
    connection_parent,
    describe,
    int_in,
    is_terminal,
    iso,
    positive_seconds,
    report,
)
from sepp_lite.client import SeppClient
from sepp_lite.shutdown import shutdown_on_signals
from sepp_lite.types import DeadLetterRecord
from sepp_lite.worker import Worker

__all__ = [
    "build_parser",
    "main",
    "misplaced_options",
    "record_to_json",
]

logger = logging.getLogger(__name__)


_DRAIN_PAGE = 256
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_EPILOG = """\
exit status: 0 success; 1 the server refused (a rejected job, a wrong API key, an
invalid request), a worker was stopped hard, or an unexpected internal error; 2 usage,
input or connection errors.
Options go after the command: sepp-lite info --addr HOST:PORT
"""


# -- argument parsing -----------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like the command's others."""

    command_names: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# What `sepp-lite` itself takes before the command; every other option is a command's.
_MAIN_OPTIONS = frozenset({"--debug", "--version", "-h", "--help"})


def misplaced_options(argv: Sequence[str], commands: Sequence[str]) -> Optional[str]:
    """A usage message when a command's options come before the command (``sepp-lite
    --addr X info``, which argparse would read as the command ``X``), else None."""
    for index, token in enumerate(argv):
        if token not in commands:
            continue
        before = [item for item in argv[:index] if item not in _MAIN_OPTIONS]
        names = [item.split("=", 1)[0] for item in before if item.startswith("-")]
        if not names:
            return None
        kept = [item for item in argv[:index] if item in _MAIN_OPTIONS]
        fixed = shlex.join(["sepp-lite", *kept, token, *before, *argv[index + 1 :]])
        verb = "goes" if len(names) == 1 else "go"
        return f"{', '.join(names)} {verb} after the command: {fixed}"
    first = argv[0].split("=", 1)[0] if argv else ""
    if first in CONNECTION_OPTIONS:
        return f"{first} goes after a command: sepp-lite COMMAND {first} ..."
    return None


def _debug_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not overwrite `sepp-lite --debug CMD`.
    parent.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print tracebacks and sepp_lite's debug logs",
    )
    return parent


def build_parser() -> _Parser:
    """The ``sepp-lite`` argument parser (environment defaults are read now)."""
    parser = _Parser(
        prog="sepp-lite",
        description="Command-line tools for the sepp job queue.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="print tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.required = True
    client_parents = [connection_parent(), _debug_parent()]
    serve.add_parser(commands, [_debug_parent()])
    info.add_parser(commands, client_parents)
    enqueue.add_parser(commands, client_parents)
    _add_worker(commands, client_parents)
    _add_drain(commands, client_parents)
    _add_demo(commands, [connection_parent(embedded_default=True), _debug_parent()])
    parser.command_names = tuple(commands.choices)
    return parser


def _add_worker(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "worker",
        parents=parents,
        help="run a Worker from your code until SIGINT/SIGTERM",
        description="Import MODULE:OBJECT and run the Worker it gives. OBJECT is a "
        "factory, sync or async, called with the client this command connects "
        "(def make_worker(client) -> Worker), or with no arguments when it takes none "
        "(it then connects by itself); or a Worker instance. The first SIGINT or SIGTERM "
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
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level of the messages on stderr (default info)",
    )
    _add_worker_deployment(parser)
    parser.set_defaults(handler=_cmd_worker)


def _processes_arg(text: str) -> int:
    from sepp_lite._supervisor import process_count

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
        "(:9464 for every interface); /metrics needs sepp-lite[metrics]",
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


def _add_drain(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "drain-dead-letters",
        parents=parents,
        help="remove dead-lettered jobs from the server and write them as JSON lines",
        description="Remove dead-lettered jobs from the server (destructive: they are gone "
        "from the server afterwards) and write them as JSON lines, payload as base64. "
        "The output can be replayed with: sepp-lite enqueue QUEUE --jsonl FILE. "
        "When stdout is a terminal, --yes is required.",
    )
    parser.add_argument("--queue", metavar="Q", help="only this queue's dead letters")
    parser.add_argument(
        "--max", type=int_in(0, 2**31), metavar="N", help="drain at most N (default: all)"
    )
    parser.add_argument(
        "--out", metavar="FILE", help="append the records to FILE instead of stdout"
    )
    parser.add_argument("--yes", action="store_true", help="yes, remove them from the server")
    parser.set_defaults(handler=_cmd_drain)


def _add_demo(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "demo",
        parents=parents,
        help="run a mixed workload through an embedded server and a Worker",
        description="Start an embedded sepp server (or use --addr), enqueue a mixed "
        "workload on two queues, process it with a Worker and print a summary. SEPP_ADDR "
        "is ignored: the demo uses a real server only when --addr is given.",
    )
    parser.add_argument(
        "--jobs", type=int_in(10, 1_000_000), default=3000, metavar="N", help="default 3000"
    )
    parser.add_argument("--seed", type=int, default=1, help="workload random seed (default 1)")
    parser.set_defaults(handler=_cmd_demo)


# -- drain-dead-letters ---------------------------------------------------------------


def record_to_json(record: DeadLetterRecord) -> dict[str, Any]:
    """A dead-letter record as one JSON object (payload as base64); its job fields use
    the ``enqueue --jsonl`` keys, so the line can be replayed."""
    payload = record.payload
    trace = record.trace_context
    return {
        "queue": record.queue,
        "job_id": record.job_id,
        "job_type": record.job_type,
        "payload_base64": None if payload is None else base64.b64encode(payload.data).decode(),
        "encoding": None if payload is None else payload.encoding,
        "priority": record.priority.value,
        "max_attempts": record.max_attempts or None,
        "custom": record.custom,
        "trace_context": None
        if trace is None
        else {"traceparent": trace.traceparent, "tracestate": trace.tracestate},
        "enqueued_at": iso(record.enqueued_at),
        "scheduled_at": None if record.scheduled_at is None else iso(record.scheduled_at),
        "cause": record.cause.value,
        "failed_at": iso(record.failed_at),
        "final_attempt": record.final_attempt,
        "last_reason": record.last_reason,
    }


async def _drain_into(
    client: SeppClient, queue: Optional[str], limit: Optional[int], out: IO[str]
) -> int:
    count = 0
    try:
        while limit is None or count < limit:
            want = _DRAIN_PAGE if limit is None else min(_DRAIN_PAGE, limit - count)
            records = await client.drain_dead_letters(queue, want)
            if not records:
                break
            for record in records:
                out.write(json.dumps(record_to_json(record), ensure_ascii=False) + "\n")
            out.flush()  # drained records exist nowhere else now: write them out at once
            count += len(records)
    except errors.SeppError:
        print(f"drained {count:,} dead-letter record(s) before the error", file=sys.stderr)
        raise
    return count


@contextlib.contextmanager
def _output(path: Optional[str]) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        # Appending: an earlier drain's output must never be overwritten.
        fh = open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write --out {path}: {exc.strerror or exc}") from exc
    with fh:
        yield fh


async def _cmd_drain(args: argparse.Namespace) -> int:
    if is_terminal(sys.stdout) and not args.yes:
        raise CliError(
            "draining removes the dead letters from the server for good; "
            "pass --yes to go ahead (and --out FILE to keep them in a file)"
        )
    async with await connect(args) as client:
        info = await client.get_server_info()
        with _output(args.out) as out:
            count = await _drain_into(client, args.queue, args.max, out)
    message = f"drained {count:,} dead-letter record(s)"
    if args.out is not None:
        message += f" into {args.out}"
    if count == 0 and not info.dead_letter_retention_enabled:
        message += " (dead-letter retention is off on this server: it keeps none)"
    print(message, file=sys.stderr)
    return EXIT_OK


# -- worker ---------------------------------------------------------------------------


def load_target(spec: str, app_dir: Optional[str] = None) -> object:
    """Import ``MODULE:OBJECT`` (``OBJECT`` may be dotted) from ``app_dir`` or the
    current directory; :class:`CliError` when it cannot be found."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CliError(f"expected MODULE:OBJECT, got {spec!r}")
    directory = os.path.abspath(app_dir or os.getcwd())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error it raises is reported
        raise CliError(f"cannot import {module_name!r}: {describe(exc)}") from exc
    target: object = module
    for part in attribute.split("."):
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
    target: object, spec: str, make_client: Callable[[], Awaitable[SeppClient]]
) -> Worker:
    """The Worker ``target`` gives: itself, or what the factory returns (awaited when
    it is a coroutine), called with ``await make_client()`` when it takes an argument."""
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
                "error: stopped hard by a second signal; the jobs that were in flight go "
                "back to their queues when their leases expire",
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

        worker = await build_worker(target, args.target, make_client)
        # The worker's client is closed too when a factory made its own: the command
        # owns everything that runs for it.
        stack.push_async_callback(worker.client.close)
        if args.status_fd is not None:
            from sepp_lite._supervisor import run_supervised

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
    from sepp_lite._supervisor import Supervisor

    supervisor = Supervisor(
        args.argv, args.processes, http=args.http, max_loop_lag=args.max_loop_lag
    )
    try:
        return await supervisor.run()
    except OSError as exc:
        raise CliError(f"--http: cannot listen on {args.http}: {exc}") from exc


# -- serve and demo -------------------------------------------------------------------


async def _cmd_demo(args: argparse.Namespace) -> int:
    from sepp_lite._demo import run_demo

    return await run_demo(args)


# -- main -----------------------------------------------------------------------------


@contextlib.contextmanager
def _logging_for(args: argparse.Namespace) -> Iterator[None]:
    """Logging for one run, undone afterwards (tests call :func:`main` in-process).

    One-shot commands keep sepp_lite's logs quiet (they report failures themselves,
    in one line) unless ``--debug``; ``serve`` and ``worker`` log at ``--log-level``.
    """
    debug = bool(getattr(args, "debug", False))
    chosen: Optional[str] = getattr(args, "log_level", None)
    root, library = logging.getLogger(), logging.getLogger("sepp_lite")
    saved = root.level, library.level
    handler: Optional[logging.Handler] = None
    if chosen is None and not debug:
        library.setLevel(logging.CRITICAL + 1)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        root.addHandler(handler)
        root.setLevel(getattr(logging, chosen.upper()) if chosen else logging.WARNING)
        library.setLevel(logging.DEBUG if debug else logging.NOTSET)
    try:
        yield
    finally:
        if handler is not None:
            root.removeHandler(handler)
        root.setLevel(saved[0])
        library.setLevel(saved[1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``sepp-lite`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        misplaced = misplaced_options(argv, parser.command_names)
        if misplaced is not None:
            parser.error(misplaced)
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.argv = list(sys.argv[1:] if argv is None else argv)  # worker --processes reruns it
    with _logging_for(args):
        try:
            code: int = asyncio.run(args.handler(args))
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            return report(exc, bool(getattr(args, "debug", False)))
    sys.stdout.flush()
    return code
