"""The ``sepp-lite`` command (also ``python -m sepp_lite``).

Subcommands: ``serve`` (the in-process server of :mod:`sepp_lite.testing`), ``info``,
``enqueue`` (one job, or many from JSON lines), ``worker MODULE:OBJECT``,
``periodic MODULE:OBJECT`` (a Tasks registry's schedules), ``drain-dead-letters``,
``requeue-dead-letters`` and ``demo``.

Exit status: 0 on success; 1 when the server answered and refused (a rejected job, a
wrong API key, an invalid request), a worker was stopped hard, the drain could not
write what it drained, or an unexpected internal error; 2 for usage, input and
connection errors. Failures are reported as one ``error: ...`` line on stderr, with the
traceback only under ``--debug``. The API key is never printed or logged. A reader that
goes away (a closed pipe) ends a command quietly with 0, except the drain.

This module builds the parser and runs a command. Each command lives in its own
module (:mod:`~sepp_lite.cli.serve`, :mod:`~sepp_lite.cli.info`,
:mod:`~sepp_lite.cli.enqueue`, :mod:`~sepp_lite.cli.worker`,
:mod:`~sepp_lite.cli.drain`, :mod:`~sepp_lite.cli.requeue`,
:mod:`~sepp_lite.cli.demo`), which adds its subparser with ``add_parser`` and sets the
coroutine that runs it as ``handler``; what they share (exit statuses, error
reporting, terminal output, argument types, connecting) is
:mod:`~sepp_lite.cli.common`. Imports go one way: this module, then the commands, then
``common``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn, Optional

from sepp_lite._log import JsonLogFormatter, TextLogFormatter
from sepp_lite._version import __version__
from sepp_lite.cli import (
    demo,
    drain,
    enqueue,
    info,
    periodic,
    requeue,
    serve,
    worker,
    workflows,
)
from sepp_lite.cli.common import (
    CONNECTION_OPTIONS,
    EXIT_OK,
    EXIT_USAGE,
    connection_parent,
    report,
    silence_stdout,
)

__all__ = ["build_parser", "main", "misplaced_options"]

_EPILOG = """\
exit status: 0 success; 1 the server refused (a rejected job, a wrong API key, an
invalid request), a worker was stopped hard, the drain could not write its output, or
an unexpected internal error; 2 usage, input or connection errors.
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
    periodic.add_parser(commands, [_debug_parent()])
    workflows.add_parser(commands, [_debug_parent()])
    drain.add_parser(commands, client_parents)
    requeue.add_parser(commands, client_parents)
    demo.add_parser(commands, [connection_parent(embedded_default=True), _debug_parent()])
    parser.command_names = tuple(commands.choices)
    return parser


# -- main -----------------------------------------------------------------------------


@contextlib.contextmanager
def _logging_for(args: argparse.Namespace) -> Iterator[None]:
    """Logging for one run, undone afterwards (tests call :func:`main` in-process).

    One-shot commands keep sepp_lite's logs quiet (they report failures themselves,
    in one line) unless ``--debug``; ``serve`` and ``worker`` log at ``--log-level``,
    ``worker`` as text or JSON lines (``--log-format``).
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
        json_lines = getattr(args, "log_format", "text") == "json"
        handler.setFormatter(JsonLogFormatter() if json_lines else TextLogFormatter())
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
    """Run ``sepp-lite`` with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    When the reader of the output goes away (``sepp-lite info | head -1``), the command
    ends quietly with status 0, as ``git log | head`` does: the reader got what it
    wanted. (``drain-dead-letters`` handles its own output, and fails then: what it
    could not write matters.)"""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a broken pipe could not be handled
    except BrokenPipeError:
        silence_stdout()
        return EXIT_OK
    return code


def _main(argv: Optional[Sequence[str]]) -> int:
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
        except BrokenPipeError:
            raise  # the reader has gone: see main()
        except Exception as exc:
            return report(exc, bool(getattr(args, "debug", False)))
    return code
