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
import json
import logging
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any, NoReturn, Optional

from sepp_lite import errors
from sepp_lite._version import __version__
from sepp_lite.cli import enqueue, info, serve, worker
from sepp_lite.cli.common import (
    CONNECTION_OPTIONS,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Commands,
    connect,
    connection_parent,
    int_in,
    is_terminal,
    iso,
    report,
)
from sepp_lite.client import SeppClient
from sepp_lite.types import DeadLetterRecord

__all__ = [
    "build_parser",
    "main",
    "misplaced_options",
    "record_to_json",
]


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
    worker.add_parser(commands, client_parents)
    _add_drain(commands, client_parents)
    _add_demo(commands, [connection_parent(embedded_default=True), _debug_parent()])
    parser.command_names = tuple(commands.choices)
    return parser


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
