"""What every ``sepp-lite`` command shares: exit statuses and error reporting, terminal
output (status line, progress bar), argument types, and the connection options with
the client they connect."""

from __future__ import annotations

import argparse
import math
import os
import ssl
import stat
import sys
import time
import traceback
from datetime import datetime, timezone
from typing import IO, Any, Callable, Optional

from sepp_lite import _validate, errors
from sepp_lite._sending import MAX_MESSAGE_BYTES, job_rejection
from sepp_lite.client import SeppClient
from sepp_lite.types import EnqueueRequest, ServerInfo

__all__ = [
    "CONNECTION_OPTIONS",
    "DEFAULT_ADDR",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "CliError",
    "Commands",
    "ProgressBar",
    "StatusLine",
    "clock",
    "connect",
    "connect_options",
    "connection_parent",
    "describe",
    "exit_code_for",
    "file_mode",
    "int_in",
    "is_terminal",
    "iso",
    "job_limit_problem",
    "job_type_arg",
    "non_negative_seconds",
    "positive_seconds",
    "queue_name_arg",
    "read_bytes",
    "reader_gone",
    "report",
    "silence_stdout",
]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

DEFAULT_ADDR = "127.0.0.1:50051"


# -- errors and exit statuses ---------------------------------------------------------


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


_SELF_EXPLAINED = (CliError, errors.JobRejectedError, errors.UnknownQueuesError)


def describe(error: BaseException) -> str:
    """``error`` as one line (the API key never reaches an error message)."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, errors.UnauthenticatedError):
        return f"the server refused the credentials: {text}"
    if isinstance(error, errors.ConnectError):
        return _tls_mismatch(error) or text
    if isinstance(error, _SELF_EXPLAINED):
        return text
    return f"{type(error).__name__}: {text}"


# The transport tells a TLS server met in plaintext (True) from the reverse (False);
# the command line then says that one fact, with the options that fix it.
_TLS_MISMATCH = {
    True: "the server uses TLS: connect with --tls (or --ca FILE for a private CA)",
    False: "the server does not use TLS: connect without --tls, --ca and https://",
}


def _tls_mismatch(error: errors.ConnectError) -> Optional[str]:
    uses_tls = getattr(error, "server_uses_tls", None)
    if uses_tls is None:
        return None
    return f"cannot connect to the sepp server at {error.addr}: {_TLS_MISMATCH[bool(uses_tls)]}"


def report(error: BaseException, debug: bool) -> int:
    """Print ``error`` as one ``error: ...`` line on stderr (with its traceback when
    ``debug``) and return the exit status; an error that is neither a :class:`CliError`
    nor a :class:`~sepp_lite.errors.SeppError` is a bug, reported as unexpected (1)."""
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__)
    code = exit_code_for(error)
    message = describe(error)
    if not isinstance(error, (CliError, errors.SeppError)):
        code = EXIT_REFUSED
        message = f"unexpected {message}" + ("" if debug else " (--debug shows the traceback)")
    print(f"error: {message}", file=sys.stderr)
    return code


# -- output ---------------------------------------------------------------------------


def silence_stdout() -> None:
    """Point stdout at the null device once its reader has gone, so that the flush at
    exit has somewhere to go instead of failing again (and printing about it)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests capture it)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe or socket whose reader has gone (a write would fail
    with EPIPE); False for files, terminals and where it cannot be told."""
    try:
        import select

        poller = select.poll()
    except (ImportError, AttributeError):  # pragma: no cover - no poll() (Windows)
        return False
    mode = file_mode(fd)
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    # A pipe's write end polls as POLLERR once no reader is left (Linux, the BSDs and
    # macOS), a socket's as POLLHUP when its peer has closed.
    poller.register(fd, select.POLLOUT)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def unread_in_pipe(fd: int) -> int:
    """How many bytes written to the pipe ``fd`` (a FIFO: see :func:`file_mode`) its
    reader has not taken yet (0 where it cannot be told)."""
    try:
        import fcntl
        import termios

        buffer = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, buffer)
    except (ImportError, OSError):
        return 0
    return int.from_bytes(buffer, sys.byteorder)


def file_mode(fd: int) -> int:
    """``fd``'s ``st_mode`` (0 where it cannot be told), for the ``stat.S_IS*`` tests."""
    try:
        return os.fstat(fd).st_mode
    except OSError:
        return 0


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


def iso(moment: datetime) -> str:
    """A UTC time as ISO 8601 with a ``Z``."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


# -- argument parsing -----------------------------------------------------------------


def positive_seconds(text: str) -> float:
    """An argument type: a finite number of seconds greater than 0."""
    value = _float_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    """An argument type: a finite number of seconds, 0 or more."""
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


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argument type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return parse


def queue_name_arg(text: str) -> str:
    """An argument type: a queue name the server accepts (the client's own rule, so a
    bad name is a usage error in every command, before anything is sent)."""
    problem = _validate.queue_name_error(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"queue name {text!r} {problem}")
    return text


def job_type_arg(text: str) -> str:
    """An argument type: a job type (the server refuses only an empty one)."""
    if not text:
        raise argparse.ArgumentTypeError("the job type must not be empty")
    return text


def job_limit_problem(job: EnqueueRequest, size: int, info: Optional[ServerInfo]) -> Optional[str]:
    """Why the server would refuse ``job`` (``size`` bytes as a request alone) for its
    size or a name's length, in words, or None: ``_sending.job_rejection``'s answer, by
    the server's advertised global limits (``info``) and then its message limit."""
    rejection = job_rejection(job, info, size=size)
    if rejection is None:
        return None
    settings = {
        errors.QueueNameTooLong: ("queue name", "max_queue_name_bytes"),
        errors.JobTypeNameTooLong: ("job type", "max_job_type_bytes"),
        errors.IdempotencyKeyTooLong: ("idempotency key", "max_idempotency_key_bytes"),
        errors.PayloadTooLarge: ("payload", "max_payload_bytes"),
    }
    what, setting = settings.get(type(rejection), ("", ""))
    limit = getattr(rejection, "limit", None)
    if setting and limit == getattr(info, setting, None):  # else the message limit's
        actual = getattr(rejection, "actual", 0)
        return f"the {what} is {actual:,} bytes, over the server's {setting} ({limit:,})"
    return (
        f"the job is {size:,} bytes encoded, over the {MAX_MESSAGE_BYTES:,} bytes a "
        "request may carry"
    )


Commands = Any  # argparse's _SubParsersAction is private


# -- connecting -----------------------------------------------------------------------


def connection_parent(*, embedded_default: bool = False) -> argparse.ArgumentParser:
    """The connection options (:data:`CONNECTION_OPTIONS`) as a parent parser; with
    ``embedded_default``, ``--addr`` has no default (the command embeds a server)."""
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
        type=positive_seconds,
        metavar="SECONDS",
        help="connect timeout and per-call deadline (default 5 s to connect, 30 s per call)",
    )
    return parent


CONNECTION_OPTIONS = frozenset({"--addr", "--api-key", "--tls", "--ca", "--timeout"})


def read_bytes(path: str, what: str) -> bytes:
    """The bytes of the file ``path`` (``-`` = stdin); :class:`CliError` naming the
    option ``what`` when it cannot be read."""
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def _load_ca(path: str) -> bytes:
    pem = read_bytes(path, "--ca")
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
        # The address's message names the whole address and what is wrong with it.
        text = str(exc)
        raise CliError(f"--addr: {text}" if "the address" in text else text) from exc
