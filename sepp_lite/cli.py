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
import binascii
import collections
import contextlib
import dataclasses
import importlib
import inspect
import json
import logging
import math
import os
import re
import ssl
import sys
import time
import traceback
from collections.abc import Awaitable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import IO, Any, Callable, NoReturn, Optional

from sepp_lite import errors
from sepp_lite._codec.enqueue import write_enqueue_request
from sepp_lite._version import __version__
from sepp_lite.client import SeppClient
from sepp_lite.shutdown import shutdown_on_signals
from sepp_lite.testing._cli import add_serve_arguments, serve
from sepp_lite.types import (
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Payload,
    Primitive,
    ServerInfo,
    TraceContext,
)
from sepp_lite.worker import Worker

__all__ = [
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "CliError",
    "LineError",
    "ProgressBar",
    "StatusLine",
    "build_parser",
    "connect",
    "exit_code_for",
    "main",
    "parse_custom_value",
    "parse_line",
    "record_to_json",
]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

DEFAULT_ADDR = "127.0.0.1:50051"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT32_MAX = 2**32 - 1
# One EnqueueBatch call carries at most this many bytes of jobs: the server's message
# limit (16 MiB by default) refuses a whole call that is too big, not a single job.
_BATCH_BYTES = 8 * 1024 * 1024
_PROBLEMS_SHOWN = 20
_DRAIN_PAGE = 256
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_EPILOG = """\
exit status: 0 success; 1 the server refused (a rejected job, a wrong API key, an
invalid request), a worker was stopped hard, or an unexpected internal error; 2 usage,
input or connection errors.
Options go after the command: sepp-lite info --addr HOST:PORT
"""

_JSONL_HELP = """\
JSON lines (--jsonl FILE, or - for stdin): one JSON object per line, e.g.
  {"job_type": "send_email", "payload": {"to": "ada@example.com"}, "priority": 5}
keys (all optional but job_type, which may instead come from JOB_TYPE):
  job_type         str
  queue            str; overrides QUEUE for this line
  payload          a string is sent as UTF-8 (default encoding text/plain); any other
                   JSON value is sent as compact JSON (default application/json)
  payload_base64   bytes as base64 (default encoding application/octet-stream)
  encoding         str; the payload's encoding hint
  priority         int 0-9
  idempotency_key  str
  max_attempts     int >= 1
  custom           object of str -> string, number or boolean
  scheduled_at     ISO 8601 time, e.g. 2030-01-01T12:00:00Z (naive = UTC)
  delay            seconds from now (instead of scheduled_at)
  trace_context    {"traceparent": str, "tracestate": str}
null means "not set". drain-dead-letters output is accepted as is (its extra keys
job_id, cause, failed_at, final_attempt, last_reason, enqueued_at are ignored), so
drained jobs can be replayed. Blank lines are skipped; any other line that cannot be
read is reported with its number. Jobs go out in batches of the server's
max_enqueue_batch.
"""

_REFUSALS = (
    errors.UnauthenticatedError,
    errors.OverloadedError,
    errors.InvalidRequestError,
    errors.ServerInternalError,
    errors.UnexpectedStatusError,
    errors.JobRejectedError,
    errors.BatchValidationError,
    errors.LeaseError,
    errors.ReserveError,
)


class CliError(Exception):
    """A failure reported as one ``error: ...`` line, exiting with ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def exit_code_for(error: BaseException) -> int:
    """The exit status for ``error``: 1 when the server answered and refused, else 2
    (connection, protocol, usage and input errors)."""
    if isinstance(error, CliError):
        return error.code
    return EXIT_REFUSED if isinstance(error, _REFUSALS) else EXIT_USAGE


def describe(error: BaseException) -> str:
    """``error`` as one line (the API key never reaches an error message)."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, errors.UnauthenticatedError):
        return f"the server refused the credentials: {text}"
    if isinstance(error, (CliError, errors.ConnectError, errors.JobRejectedError)):
        return text
    return f"{type(error).__name__}: {text}"


# -- terminal output ------------------------------------------------------------------


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is an interactive terminal."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed or detached stream
        return False


class StatusLine:
    """One line redrawn in place (``\\r``) on a terminal, at most every ``interval``
    seconds; on a pipe or a file it draws nothing, so logs stay clean."""

    def __init__(self, stream: IO[str], interval: float = 0.1) -> None:
        self.stream = stream
        self.enabled = is_terminal(stream)
        self.interval = interval
        self._drawn_at = -math.inf
        self._shown = False

    def show(self, text: str, *, force: bool = False) -> None:
        """Draw ``text`` unless the last draw was less than ``interval`` ago."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < self.interval:
            return
        self._drawn_at = now
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def close(self, *, keep: bool) -> None:
        """End the line: keep the last text (newline) or erase it."""
        if self.enabled and self._shown:
            self.stream.write("\n" if keep else "\r\x1b[K")
            self.stream.flush()
            self._shown = False


def clock(seconds: Optional[float]) -> str:
    """``seconds`` as ``M:SS`` or ``H:MM:SS`` (``--:--`` when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "--:--"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    """A progress bar with rate and ETA on ``stream``, drawn only on a terminal."""

    WIDTH = 24

    def __init__(self, stream: IO[str], total: Optional[int], unit: str = "lines") -> None:
        self.line = StatusLine(stream)
        self.total = total
        self.unit = unit
        self.started = time.monotonic()

    @property
    def enabled(self) -> bool:
        """Whether anything is drawn (the stream is a terminal)."""
        return self.line.enabled

    def update(self, done: int, *, force: bool = False) -> None:
        """Redraw with ``done`` items processed (throttled unless ``force``)."""
        if self.line.enabled:
            self.line.show(self.render(done, time.monotonic() - self.started), force=force)

    def finish(self, done: int) -> None:
        """Draw the final state and end the line."""
        self.update(done, force=True)
        self.line.close(keep=True)

    def render(self, done: int, elapsed: float) -> str:
        """The bar's text after ``done`` items in ``elapsed`` seconds."""
        rate = done / elapsed if elapsed > 0 else 0.0
        speed = f"{rate:,.0f} {self.unit}/s"
        if self.total is None:
            return f"{done:,} {self.unit}  {speed}"
        fraction = min(done / self.total, 1.0) if self.total else 1.0
        filled = int(self.WIDTH * fraction)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        eta = (self.total - done) / rate if rate > 0 else None
        return f"[{bar}] {done:,}/{self.total:,} {fraction:4.0%}  {speed}  ETA {clock(eta)}"


# -- argument parsing -----------------------------------------------------------------


def _positive_seconds(text: str) -> float:
    value = _float_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    value = _float_arg(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _float_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")


def parse_custom_value(text: str) -> Primitive:
    """A ``--custom`` value: ``true``/``false`` are booleans, integers (64-bit) are
    ints, decimal numbers are floats, text in double quotes is that text, and anything
    else is the string itself."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if _INT.fullmatch(text):
        value = int(text)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"{text} does not fit in 64 bits (quote it to send a string)")
        return value
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _custom_arg(text: str) -> tuple[str, Primitive]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, parse_custom_value(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _connection_parent(*, embedded_default: bool = False) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection options")
    if embedded_default:
        group.add_argument(
            "--addr", help="run against the sepp server at this address instead of an embedded one"
        )
    else:
        group.add_argument(
            "--addr",
            default=os.environ.get("SEPP_ADDR") or DEFAULT_ADDR,
            help="host:port, http://host:port or https://host[:port] "
            f"(env SEPP_ADDR; default {DEFAULT_ADDR})",
        )
    group.add_argument(
        "--api-key",
        default=os.environ.get("SEPP_API_KEY") or None,
        metavar="KEY",
        help="API key, sent as a bearer token (env SEPP_API_KEY); never printed",
    )
    group.add_argument(
        "--tls", action="store_true", help="use TLS with the system's root certificates"
    )
    group.add_argument(
        "--ca", metavar="FILE", help="PEM file of the CA that signs the server's certificate (TLS)"
    )
    group.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="connect timeout and per-call deadline (default 5 s to connect, 30 s per call)",
    )
    return parent


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like the command's others."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def build_parser() -> argparse.ArgumentParser:
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
    client_parents = [_connection_parent(), _debug_parent()]
    _add_serve(commands, [_debug_parent()])
    _add_info(commands, client_parents)
    _add_enqueue(commands, client_parents)
    _add_worker(commands, client_parents)
    _add_drain(commands, client_parents)
    _add_demo(commands, [_connection_parent(embedded_default=True), _debug_parent()])
    return parser


Commands = Any  # argparse's _SubParsersAction is private


def _add_serve(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "serve",
        parents=parents,
        help="run the in-process sepp server (in memory)",
        description="Run the in-process sepp server of sepp_lite.testing until SIGINT or "
        "SIGTERM. Nothing is persisted. Its --api-key options are the keys it accepts.",
    )
    add_serve_arguments(parser)
    parser.set_defaults(handler=_cmd_serve)


def _add_info(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "info",
        parents=parents,
        help="show the server's version and limits",
        description="Show GetServerInfo: the server's version and global limits.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=_cmd_info)


def _add_enqueue(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "enqueue",
        parents=parents,
        help="enqueue one job, or many from JSON lines",
        description="Enqueue one job and print its id (followed by 'deduplicated' when "
        "an idempotency key matched an existing job), or enqueue many from JSON lines.",
        epilog=_JSONL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("queue", metavar="QUEUE")
    parser.add_argument(
        "job_type", metavar="JOB_TYPE", nargs="?", help="the job type (with --jsonl: a default)"
    )
    body = parser.add_mutually_exclusive_group()
    body.add_argument("--payload", metavar="TEXT", help="payload text (sent as UTF-8)")
    body.add_argument("--payload-file", metavar="FILE", help="payload bytes from FILE (- = stdin)")
    body.add_argument("--jsonl", metavar="FILE", help="enqueue the jobs of a JSON-lines file")
    parser.add_argument(
        "--encoding",
        metavar="E",
        help="payload encoding (default text/plain for --payload, "
        "application/octet-stream for --payload-file)",
    )
    parser.add_argument("--priority", type=_int_in(0, 9), metavar="N", help="0 (default) to 9")
    parser.add_argument("--key", dest="idempotency_key", metavar="K", help="idempotency key")
    parser.add_argument(
        "--delay", type=_non_negative_seconds, metavar="SECONDS", help="run no sooner than this"
    )
    parser.add_argument("--max-attempts", type=_int_in(1, _UINT32_MAX), metavar="N")
    parser.add_argument(
        "--custom",
        type=_custom_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a custom entry (repeatable): true/false, integers and decimals are typed, "
        'anything else (or "quoted") is a string',
    )
    parser.add_argument(
        "--rejected", metavar="FILE", help="with --jsonl: write lines not enqueued to FILE"
    )
    parser.set_defaults(handler=_cmd_enqueue)


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
    parser.set_defaults(handler=_cmd_worker)


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
        "--max", type=_int_in(0, 2**31), metavar="N", help="drain at most N (default: all)"
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
        "--jobs", type=_int_in(10, 1_000_000), default=3000, metavar="N", help="default 3000"
    )
    parser.add_argument("--seed", type=int, default=1, help="workload random seed (default 1)")
    parser.set_defaults(handler=_cmd_demo)


# -- connecting -----------------------------------------------------------------------


def _read_bytes(path: str, what: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def _load_ca(path: str) -> bytes:
    pem = _read_bytes(path, "--ca")
    try:
        ssl.create_default_context(cadata=pem.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:
        raise CliError(f"--ca {path} is not a PEM certificate file") from exc
    return pem


def connect_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :meth:`SeppClient.connect` the common options give."""
    options: dict[str, Any] = {"api_key": args.api_key or None, "tls": bool(args.tls)}
    if args.ca:
        options["tls_ca_cert"] = _load_ca(args.ca)
    if args.timeout is not None:
        options["connect_timeout"] = options["rpc_timeout"] = args.timeout
    return options


async def connect(
    args: argparse.Namespace,
    *,
    addr: Optional[str] = None,
    client_class: type[SeppClient] = SeppClient,
) -> SeppClient:
    """Connect with the common options (``addr`` overrides ``--addr``). Raises
    :class:`CliError` for a bad address or CA file and
    :class:`~sepp_lite.errors.ConnectError` when the server cannot be reached."""
    target = addr if addr is not None else args.addr
    options = connect_options(args)
    try:
        return await client_class.connect(target, **options)
    except ValueError as exc:
        raise CliError(f"bad address {target!r}: {exc}") from exc


# -- info ---------------------------------------------------------------------------------


def iso(moment: datetime) -> str:
    """A UTC time as ISO 8601 with a ``Z``."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def human_duration(span: timedelta) -> str:
    """``span`` as ``30d``, ``1h 30m``, ``45s`` or ``0.25s``."""
    seconds = span.total_seconds()
    if seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, whole = divmod(whole, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return " ".join(parts)


def _info_json(info: ServerInfo) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in dataclasses.fields(info):
        value = getattr(info, item.name)
        if isinstance(value, datetime):
            value = iso(value)
        elif isinstance(value, timedelta):
            value = value.total_seconds()
        out[item.name] = value
    return out


def _info_value(info: ServerInfo, name: str, value: object) -> str:
    if name == "allowed_encodings" and not info.restricts_encodings:
        return "any"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "(none)"
    if isinstance(value, timedelta):
        return human_duration(value)
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_info(info: ServerInfo) -> str:
    """``info`` as a two-column table."""
    rows = [
        (item.name.replace("_", " "), _info_value(info, item.name, getattr(info, item.name)))
        for item in dataclasses.fields(info)
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


async def _cmd_info(args: argparse.Namespace) -> int:
    async with await connect(args) as client:
        info = await client.get_server_info()
    if args.json:
        print(json.dumps(_info_json(info), indent=2))
    else:
        print(render_info(info))
    return EXIT_OK


# -- enqueue: one job -------------------------------------------------------------------

_SINGLE_OPTIONS = {
    "encoding": "--encoding",
    "priority": "--priority",
    "idempotency_key": "--key",
    "delay": "--delay",
    "max_attempts": "--max-attempts",
    "custom": "--custom",
}


def _check_enqueue_args(args: argparse.Namespace) -> None:
    if args.jsonl is not None:
        given = [flag for name, flag in _SINGLE_OPTIONS.items() if getattr(args, name)]
        if given:
            raise CliError(f"{', '.join(given)}: with --jsonl the job fields come from the lines")
        return
    if args.rejected is not None:
        raise CliError("--rejected goes with --jsonl")
    if args.job_type is None:
        raise CliError("JOB_TYPE is required (or use --jsonl FILE)")
    if args.encoding is not None and args.payload is None and args.payload_file is None:
        raise CliError("--encoding needs --payload or --payload-file")


def _check_request(request: EnqueueRequest) -> int:
    """Run the client's own encoder on ``request`` (what enqueue would refuse before
    sending); return the encoded size."""
    return len(write_enqueue_request(request))


def _payload_from_args(args: argparse.Namespace) -> Optional[Payload]:
    if args.payload is not None:
        return Payload(args.payload.encode("utf-8"), args.encoding or "text/plain")
    if args.payload_file is not None:
        data = _read_bytes(args.payload_file, "--payload-file")
        return Payload(data, args.encoding or "application/octet-stream")
    return None


def request_from_args(args: argparse.Namespace) -> EnqueueRequest:
    """The one job ``enqueue QUEUE JOB_TYPE ...`` describes; :class:`CliError` if bad."""
    _check_enqueue_args(args)
    scheduled = None
    if args.delay is not None:
        scheduled = datetime.now(timezone.utc) + timedelta(seconds=args.delay)
    try:
        request = EnqueueRequest(
            queue=args.queue,
            job_type=args.job_type,
            payload=_payload_from_args(args),
            idempotency_key=args.idempotency_key,
            priority=args.priority,
            max_attempts=args.max_attempts,
            custom=dict(args.custom),
            scheduled_at=scheduled,
        )
        _check_request(request)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    return request


async def _cmd_enqueue(args: argparse.Namespace) -> int:
    if args.jsonl is not None:
        _check_enqueue_args(args)
        return await _enqueue_jsonl(args)
    request = request_from_args(args)
    async with await connect(args) as client:
        ack = await client.enqueue(request)
    print(ack.job_id + (" deduplicated" if ack.deduplicated else ""))
    return EXIT_OK


# -- enqueue: JSON lines ----------------------------------------------------------------


class LineError(ValueError):
    """A JSON line that does not describe a job."""


_LINE_KEYS = frozenset(
    {
        "queue",
        "job_type",
        "payload",
        "payload_base64",
        "encoding",
        "priority",
        "idempotency_key",
        "max_attempts",
        "custom",
        "scheduled_at",
        "delay",
        "trace_context",
    }
)
# What drain-dead-letters writes beside the job's own fields: ignored, for replays.
_RECORD_KEYS = frozenset(
    {"job_id", "cause", "failed_at", "final_attempt", "last_reason", "enqueued_at"}
)


def _opt_str(obj: dict[str, Any], name: str) -> Optional[str]:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise LineError(f"{name} must be a string")
    return value


def _opt_int(obj: dict[str, Any], name: str, low: int, high: int) -> Optional[int]:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LineError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def _line_payload(obj: dict[str, Any]) -> Optional[Payload]:
    text, b64 = obj.get("payload"), obj.get("payload_base64")
    encoding = _opt_str(obj, "encoding")
    if text is not None and b64 is not None:
        raise LineError("give payload or payload_base64, not both")
    if b64 is not None:
        if not isinstance(b64, str):
            raise LineError("payload_base64 must be a string")
        try:
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise LineError("payload_base64 is not valid base64") from None
        return Payload(data, encoding or "application/octet-stream")
    if text is None:
        if encoding is not None:
            raise LineError("encoding given without a payload")
        return None
    if isinstance(text, str):
        return Payload(text.encode("utf-8"), encoding or "text/plain")
    data = json.dumps(text, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return Payload(data, encoding or "application/json")


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (``Z`` allowed; naive = UTC); :class:`LineError` if invalid."""
    value = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise LineError(f"scheduled_at is not an ISO 8601 time: {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _line_schedule(obj: dict[str, Any], now: datetime) -> Optional[datetime]:
    at, delay = obj.get("scheduled_at"), obj.get("delay")
    if at is not None and delay is not None:
        raise LineError("give scheduled_at or delay, not both")
    if delay is not None:
        if (
            isinstance(delay, bool)
            or not isinstance(delay, (int, float))
            or not math.isfinite(delay)
            or delay < 0
        ):
            raise LineError(f"delay must be a number of seconds >= 0, got {delay!r}")
        return now + timedelta(seconds=delay)
    if at is None:
        return None
    if not isinstance(at, str):
        raise LineError("scheduled_at must be a string")
    return parse_time(at)


def _line_custom(obj: dict[str, Any]) -> dict[str, Primitive]:
    custom = obj.get("custom")
    if custom is None:
        return {}
    if not isinstance(custom, dict):
        raise LineError("custom must be an object")
    for key, value in custom.items():
        if not isinstance(value, (str, int, float, bool)):
            raise LineError(f"custom[{key!r}] must be a string, number or boolean")
    return dict(custom)


def _line_trace(obj: dict[str, Any]) -> Optional[TraceContext]:
    trace = obj.get("trace_context")
    if trace is None:
        return None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceparent"), str):
        raise LineError("trace_context must be an object with a traceparent string")
    state = trace.get("tracestate")
    if state is not None and not isinstance(state, str):
        raise LineError("trace_context.tracestate must be a string")
    return TraceContext(trace["traceparent"], state)


def request_from_json(
    obj: dict[str, Any], queue: str, job_type: Optional[str], now: datetime
) -> EnqueueRequest:
    """The job a decoded JSON line describes; :class:`LineError` when it does not."""
    unknown = sorted(set(obj) - _LINE_KEYS - _RECORD_KEYS)
    if unknown:
        raise LineError(f"unknown key(s): {', '.join(unknown)}")
    line_queue, line_type = _opt_str(obj, "queue"), _opt_str(obj, "job_type")
    job_type = line_type if line_type is not None else job_type
    if job_type is None:
        raise LineError("no job_type (set it in the line or give JOB_TYPE)")
    try:
        return EnqueueRequest(
            queue=line_queue if line_queue is not None else queue,
            job_type=job_type,
            payload=_line_payload(obj),
            idempotency_key=_opt_str(obj, "idempotency_key"),
            priority=_opt_int(obj, "priority", 0, 9),
            max_attempts=_opt_int(obj, "max_attempts", 1, _UINT32_MAX),
            custom=_line_custom(obj),
            trace_context=_line_trace(obj),
            scheduled_at=_line_schedule(obj, now),
        )
    except LineError:
        raise
    except ValueError as exc:  # the request's own checks (empty names, trace context)
        raise LineError(str(exc)) from None


def parse_line(
    raw: bytes, queue: str, job_type: Optional[str], now: Optional[datetime] = None
) -> tuple[EnqueueRequest, int]:
    """One JSON line as a job and its encoded size; :class:`LineError` when the line
    is not valid UTF-8 JSON describing a job the client would send."""
    try:
        obj = json.loads(raw.decode("utf-8").strip())
    except UnicodeDecodeError as exc:
        raise LineError(f"not UTF-8 (byte {exc.start + 1})") from None
    except json.JSONDecodeError as exc:
        raise LineError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise LineError("invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {type(obj).__name__}")
    request = request_from_json(obj, queue, job_type, now or datetime.now(timezone.utc))
    try:
        return request, _check_request(request)
    except (TypeError, ValueError) as exc:
        raise LineError(str(exc)) from None


@dataclasses.dataclass
class _Line:
    number: int
    raw: bytes


class _JsonlRun:
    """The state of one ``enqueue --jsonl``: the lines waiting for the next batch, the
    tallies, the problems to report and the rejected-lines file."""

    def __init__(
        self,
        client: SeppClient,
        args: argparse.Namespace,
        batch_max: int,
        rejected: Optional[IO[bytes]],
        bar: ProgressBar,
    ) -> None:
        self.client = client
        self.queue: str = args.queue
        self.job_type: Optional[str] = args.job_type
        self.batch_max = max(1, batch_max)
        self.rejected = rejected
        self.bar = bar
        self.pending: list[tuple[_Line, EnqueueRequest | str]] = []  # str: why malformed
        self.pending_jobs = self.pending_bytes = 0
        self.read = self.blank = self.accepted = self.deduplicated = 0
        self.refused = self.malformed = self.unsent = 0
        self.first_unsent: Optional[int] = None
        self.problems: list[str] = []
        self.problem_count = 0
        self.reasons: collections.Counter[str] = collections.Counter()
        self.failure: Optional[errors.SeppError] = None
        self.stopped_at: Optional[int] = None  # the last line read before an interruption
        self.sending: list[_Line] = []  # the job lines of the call in flight

    async def feed(self, line: _Line) -> None:
        """Take one input line; sends a batch when it is full."""
        self.read = line.number
        if not line.raw.strip():
            self.blank += 1
            return
        try:
            request, size = parse_line(line.raw, self.queue, self.job_type)
            if size > _BATCH_BYTES:
                raise LineError(f"the job is {size:,} bytes, too large to send")
        except LineError as exc:
            # Kept in line order with the jobs, so reports and the rejected file are too.
            self.pending.append((line, str(exc)))
            return
        if self.pending_jobs and self.pending_bytes + size > _BATCH_BYTES:
            await self.flush()
        self.pending.append((line, request))
        self.pending_jobs += 1
        self.pending_bytes += size
        if self.pending_jobs >= self.batch_max:
            await self.flush()
        self.bar.update(self.read)

    async def flush(self) -> None:
        """Send the pending jobs (one EnqueueBatch call) and record every outcome."""
        pending, self.pending = self.pending, []
        jobs = [item for _, item in pending if isinstance(item, EnqueueRequest)]
        self.pending_jobs = self.pending_bytes = 0
        results: list[EnqueueAck | errors.JobRejection] = []
        if jobs:
            self.sending = [line for line, item in pending if isinstance(item, EnqueueRequest)]
            try:
                results = await self.client.enqueue_batch(jobs)
            except errors.SeppError as exc:
                self.failure = exc
            self.sending = []
        outcomes = iter(results)
        for line, item in pending:
            if isinstance(item, str):
                self.malformed += 1
                self._problem(line, f"malformed: {item}")
            elif self.failure is not None:
                self.not_sent(line)
            else:
                self._record(line, next(outcomes))
        self.bar.update(self.read)

    def _record(self, line: _Line, result: EnqueueAck | errors.JobRejection) -> None:
        if isinstance(result, EnqueueAck):
            self.accepted += 1
            self.deduplicated += result.deduplicated
            return
        self.refused += 1
        name = type(result).__name__
        self.reasons[name] += 1
        self._problem(line, f"rejected: {name}: {result.message}")

    def not_sent(self, line: _Line) -> None:
        """Record a line left unsent by a failed call (it goes to the rejected file)."""
        self.read = max(self.read, line.number)
        if not line.raw.strip():
            return
        self.unsent += 1
        if self.first_unsent is None or line.number < self.first_unsent:
            self.first_unsent = line.number
        self._write_rejected(line)

    def interrupted(self) -> None:
        """Record an interruption: the lines waiting for a batch were never sent."""
        self.stopped_at = self.read
        pending, self.pending = self.pending, []
        for line, _ in pending:
            self.not_sent(line)

    def _problem(self, line: _Line, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < _PROBLEMS_SHOWN:
            self.problems.append(f"line {line.number}: {text}")
        self._write_rejected(line)

    def _write_rejected(self, line: _Line) -> None:
        if self.rejected is not None:
            self.rejected.write(line.raw.rstrip(b"\r\n") + b"\n")

    def exit_code(self) -> int:
        """0 when every job line was accepted; 1 when some were rejected or malformed;
        the failure's code when a call failed as a whole."""
        if self.failure is not None:
            return exit_code_for(self.failure)
        return EXIT_REFUSED if self.refused or self.malformed else EXIT_OK

    def summary(self, rejected_path: Optional[str]) -> list[str]:
        """The report printed at the end."""
        head = f"{self.accepted:,} accepted"
        if self.deduplicated:
            head += f" ({self.deduplicated:,} deduplicated)"
        head += f", {self.refused:,} rejected, {self.malformed:,} malformed"
        if self.unsent:
            head += f", {self.unsent:,} not sent"
        if self.blank:
            head += f"; {self.blank:,} blank line(s) skipped"
        lines = [head] + ["  " + problem for problem in self.problems]
        if self.problem_count > len(self.problems):
            lines.append(f"  ... and {self.problem_count - len(self.problems):,} more")
        if self.reasons:
            counts = ", ".join(f"{name} {count:,}" for name, count in self.reasons.most_common())
            lines.append(f"rejections by reason: {counts}")
        if self.failure is not None:
            maybe = " (the server may have accepted some of them)" if self._ambiguous() else ""
            lines.append(
                f"not sent from line {self.first_unsent} on{maybe}: {describe(self.failure)}"
            )
        if self.stopped_at is not None:
            lines.append(self._interruption())
        if rejected_path is not None:
            count = self.refused + self.malformed + self.unsent
            lines.append(f"{count:,} line(s) not enqueued written to {rejected_path}")
        return lines

    def _interruption(self) -> str:
        text = f"interrupted after line {self.stopped_at}"
        if self.sending:
            first, last = self.sending[0].number, self.sending[-1].number
            text += f": lines {first}-{last} were being sent and may or may not be enqueued"
        return text + f"; the lines after line {self.stopped_at} were not read"

    def _ambiguous(self) -> bool:
        return bool(getattr(self.failure, "ambiguous", False))


@contextlib.contextmanager
def _open_lines(path: str) -> Iterator[tuple[Iterator[bytes], Optional[int]]]:
    """The lines of ``path`` (``-`` = stdin) and their count when it can be known."""
    if path == "-":
        yield iter(sys.stdin.buffer), None
        return
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with fh:
        total = None
        if fh.seekable():
            total = sum(1 for _ in fh)
            fh.seek(0)
        yield iter(fh), total


@contextlib.contextmanager
def _open_rejected(path: Optional[str]) -> Iterator[Optional[IO[bytes]]]:
    if path is None:
        yield None
        return
    try:
        fh = open(path, "wb")
    except OSError as exc:
        raise CliError(f"cannot write --rejected {path}: {exc.strerror or exc}") from exc
    with fh:
        yield fh


async def _feed_all(run: _JsonlRun, lines: Iterator[bytes]) -> None:
    numbered = enumerate(lines, 1)
    for number, raw in numbered:
        await run.feed(_Line(number, raw))
        if run.failure is not None:
            break
    if run.failure is None:
        await run.flush()
    if run.failure is not None:
        # Nothing is dropped silently: what was never sent goes to the rejected file.
        for number, raw in numbered:
            run.not_sent(_Line(number, raw))


async def _enqueue_jsonl(args: argparse.Namespace) -> int:
    with _open_lines(args.jsonl) as (lines, total), _open_rejected(args.rejected) as rejected:
        async with await connect(args) as client:
            info = await client.get_server_info()
            bar = ProgressBar(sys.stderr, total)
            run = _JsonlRun(client, args, info.max_enqueue_batch, rejected, bar)
            try:
                await _feed_all(run, lines)
            except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C: report, then stop
                bar.finish(run.read)
                run.interrupted()
                print("\n".join(run.summary(args.rejected)))
                raise
            bar.finish(run.read)
    for line in run.summary(args.rejected):
        print(line)
    if run.failure is not None:
        print(f"error: {describe(run.failure)}", file=sys.stderr)
    return run.exit_code()


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
        return await run_worker(worker, until_idle=args.until_idle)


# -- serve and demo -------------------------------------------------------------------


async def _cmd_serve(args: argparse.Namespace) -> int:
    from sepp_lite.testing import ConfigError

    try:
        return await serve(args)
    except (ConfigError, RuntimeError) as exc:
        raise CliError(str(exc)) from exc
    except OSError as exc:
        raise CliError(f"cannot listen: {exc}") from exc


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


def _report(error: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__)
    code = exit_code_for(error)
    message = describe(error)
    if not isinstance(error, (CliError, errors.SeppError)):
        code = EXIT_REFUSED
        message = f"unexpected {message}" + ("" if debug else " (--debug shows the traceback)")
    print(f"error: {message}", file=sys.stderr)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``sepp-lite`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    with _logging_for(args):
        try:
            code: int = asyncio.run(args.handler(args))
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            return _report(exc, bool(getattr(args, "debug", False)))
    sys.stdout.flush()
    return code
