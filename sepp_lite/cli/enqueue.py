"""``sepp-lite enqueue``: one job from the command line, or many from JSON lines.

A JSON-lines import reads its input line by line, sends the jobs in batches of the
server's ``max_enqueue_batch``, reports each line that was not enqueued (and, with
``--rejected``, writes it to a file), and on Ctrl-C says which lines may or may not
have been enqueued. ``drain-dead-letters`` writes lines this command reads back.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import json
import math
import re
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import IO, Any, Optional

from sepp_lite import _validate, errors
from sepp_lite._codec.enqueue import encode_enqueue_batch_request
from sepp_lite._sending import BatchLimits, sent_size
from sepp_lite.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    CliError,
    Commands,
    ProgressBar,
    connect,
    describe,
    exit_code_for,
    int_in,
    job_limit_problem,
    job_type_arg,
    non_negative_seconds,
    queue_name_arg,
    read_bytes,
)
from sepp_lite.client import SeppClient
from sepp_lite.types import (
    EnqueueAck,
    EnqueueRequest,
    Payload,
    Primitive,
    ServerInfo,
    TraceContext,
    check_enqueue_request,
)

__all__ = [
    "LineError",
    "JsonlRun",
    "add_parser",
    "checked",
    "decode_line",
    "enqueue_jsonl",
    "parse_custom_value",
    "parse_line",
    "parse_time",
    "request_from_args",
    "request_from_json",
]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_PROBLEMS_SHOWN = 20

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
job_id, cause, failed_at, final_attempt, last_reason, enqueued_at are ignored);
requeue-dead-letters replays it with an idempotency key per record. Blank lines
are skipped; any other line that cannot be read is reported with its number. Jobs go
out in batches of the server's max_enqueue_batch.
"""


# -- arguments ------------------------------------------------------------------------


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


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``enqueue`` to ``commands``."""
    parser = commands.add_parser(
        "enqueue",
        parents=parents,
        help="enqueue one job, or many from JSON lines",
        description="Enqueue one job and print its id (followed by 'deduplicated' when "
        "an idempotency key matched an existing job), or enqueue many from JSON lines.",
        epilog=_JSONL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("queue", metavar="QUEUE", type=queue_name_arg)
    parser.add_argument(
        "job_type",
        metavar="JOB_TYPE",
        nargs="?",
        type=job_type_arg,
        help="the job type (with --jsonl: a default)",
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
    parser.add_argument("--priority", type=int_in(0, 9), metavar="N", help="0 (default) to 9")
    parser.add_argument("--key", dest="idempotency_key", metavar="K", help="idempotency key")
    parser.add_argument(
        "--delay", type=non_negative_seconds, metavar="SECONDS", help="run no sooner than this"
    )
    parser.add_argument("--max-attempts", type=int_in(*_validate.MAX_ATTEMPTS), metavar="N")
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
    parser.add_argument(
        "--tasks",
        metavar="MODULE:OBJECT",
        help="a sepp_lite.Tasks: then the arguments are JOB_TYPE [INPUT], the input as the "
        "task reads it (JSON for a dataclass), checked against its type; queue and "
        "defaults come from the task",
    )
    parser.add_argument(
        "--app-dir", metavar="DIR", help="with --tasks: import from DIR (default: here)"
    )
    parser.set_defaults(handler=_cmd_enqueue)


# -- one job --------------------------------------------------------------------------


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
    """Check ``request`` as the client does before sending it (``TypeError`` or
    ``ValueError`` for what enqueue would refuse), and its queue name by the server's
    rule (which the server would answer with a rejection); return the size of its
    request alone, which its limits and batches are measured by."""
    check_enqueue_request(request)
    problem = _validate.queue_name_error(request.queue)
    if problem is not None:
        raise ValueError(f"queue name {request.queue!r} {problem}")
    return len(encode_enqueue_batch_request([request]))


def _payload_from_args(args: argparse.Namespace) -> Optional[Payload]:
    if args.payload is not None:
        return Payload(args.payload.encode("utf-8"), args.encoding or "text/plain")
    if args.payload_file is not None:
        data = read_bytes(args.payload_file, "--payload-file")
        return Payload(data, args.encoding or "application/octet-stream")
    return None


def request_from_args(args: argparse.Namespace) -> EnqueueRequest:
    """The one job ``enqueue QUEUE JOB_TYPE ...`` describes; :class:`CliError` (a
    usage error) if the client would refuse it."""
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
    if args.tasks is not None:
        from sepp_lite.cli.tasks import request_from_task

        request = request_from_task(args)
    elif args.jsonl is not None:
        _check_enqueue_args(args)
        return await enqueue_jsonl(args)
    else:
        request = request_from_args(args)
    async with await connect(args) as client:
        # The server's limits, so that a job over them is a usage error too.
        info = await client.get_server_info()
        size = len(encode_enqueue_batch_request([request]))
        problem = job_limit_problem(request, size, info)
        if problem is not None:
            raise CliError(problem)
        ack = await client.enqueue(request)
    print(ack.job_id + (" deduplicated" if ack.deduplicated else ""))
    return EXIT_OK


# -- JSON lines: reading a line -------------------------------------------------------


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
            max_attempts=_opt_int(obj, "max_attempts", *_validate.MAX_ATTEMPTS),
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
    obj = decode_line(raw)
    return checked(request_from_json(obj, queue, job_type, now or datetime.now(timezone.utc)))


def checked(request: EnqueueRequest) -> tuple[EnqueueRequest, int]:
    """``request`` and its encoded size, once the client's checks pass;
    :class:`LineError` when they do not."""
    try:
        return request, _check_request(request)
    except (TypeError, ValueError) as exc:
        raise LineError(str(exc)) from None


def decode_line(raw: bytes) -> dict[str, Any]:
    """One JSON line as the object it holds; :class:`LineError` when it is not valid
    UTF-8 JSON or not an object."""
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
    return obj


# -- JSON lines: the import -----------------------------------------------------------


@dataclasses.dataclass
class _Line:
    number: int
    raw: bytes


class JsonlRun:
    """The state of one ``enqueue --jsonl``: the lines waiting for the next batch, the
    tallies, the problems to report and the rejected-lines file."""

    def __init__(
        self,
        client: SeppClient,
        args: argparse.Namespace,
        info: ServerInfo,
        rejected: Optional[IO[bytes]],
        bar: ProgressBar,
    ) -> None:
        self.client = client
        self.queue: str = args.queue
        self.job_type: Optional[str] = args.job_type
        self.info = info
        self.limits = BatchLimits.of(info)
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
        self.unread_after: Optional[int] = None  # nothing after this line was read
        self.in_flight: list[tuple[_Line, EnqueueRequest | str]] = []  # the call's batch
        self.sending: list[_Line] = []  # the job lines of the call in flight

    async def feed(self, line: _Line) -> None:
        """Take one input line; sends a batch when it is full."""
        self.read = line.number
        if not line.raw.strip():
            self.blank += 1
            return
        try:
            request, size = self.parse(line.raw)
            problem = job_limit_problem(request, size, self.info)
            if problem is not None:
                raise LineError(problem)
        except LineError as exc:
            # Kept in line order with the jobs, so reports and the rejected file are too.
            self.pending.append((line, str(exc)))
            return
        share = sent_size(request, size)
        if not self.limits.fits(self.pending_jobs, self.pending_bytes, share):
            await self.flush()
        self.pending.append((line, request))
        self.pending_jobs += 1
        self.pending_bytes += share
        if self.limits.full(self.pending_jobs, self.pending_bytes):
            await self.flush()
        self.bar.update(self.read)

    def parse(self, raw: bytes) -> tuple[EnqueueRequest, int]:
        """One input line as a job and its encoded size; :class:`LineError` if bad."""
        return parse_line(raw, self.queue, self.job_type)

    async def flush(self) -> None:
        """Send the pending jobs (one EnqueueBatch call) and record every outcome."""
        pending, self.pending = self.pending, []
        jobs = [item for _, item in pending if isinstance(item, EnqueueRequest)]
        self.pending_jobs = self.pending_bytes = 0
        results: list[EnqueueAck | errors.JobRejection] = []
        if jobs:
            # Kept until the answer is recorded: an interruption writes them out.
            self.in_flight = pending
            self.sending = [line for line, item in pending if isinstance(item, EnqueueRequest)]
            try:
                results = await self.client.enqueue_batch(jobs)
            except errors.SeppError as exc:
                self.failure = exc
            self.in_flight, self.sending = [], []
        outcomes = iter(results)
        for line, item in pending:
            if isinstance(item, str):
                self._malformed(line, item)
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

    def _malformed(self, line: _Line, why: str) -> None:
        self.malformed += 1
        self._problem(line, f"malformed: {why}")

    def not_sent_rest(self, rest: Iterator[tuple[int, bytes]]) -> None:
        """Record the lines not read yet as not sent; a (second) Ctrl-C stops reading."""
        try:
            for number, raw in rest:
                self.not_sent(_Line(number, raw))
        except KeyboardInterrupt:
            self.unread_after = self.read

    def interrupted(self, rest: Optional[Iterator[tuple[int, bytes]]]) -> None:
        """Record an interruption. Every line not known to be enqueued goes to the
        rejected file, so the import can resume from it: the batch whose answer never
        came, the lines waiting for the next batch, and the lines not read yet
        (``rest``, or None when reading them could wait forever, as on stdin)."""
        self.stopped_at = self.read
        waiting, self.in_flight, self.pending = self.in_flight + self.pending, [], []
        for line, item in waiting:
            if isinstance(item, str):
                self._malformed(line, item)
            else:
                self.not_sent(line)
        if rest is None:
            self.unread_after = self.stopped_at
        else:
            self.not_sent_rest(rest)

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
            text += (
                f": lines {first}-{last} were being sent and may or may not be enqueued "
                "(an idempotency key makes sending one again safe)"
            )
        if self.unread_after is not None:
            return text + f"; the lines after line {self.unread_after} were not read"
        return text

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


async def _feed_all(run: JsonlRun, numbered: Iterator[tuple[int, bytes]]) -> None:
    for number, raw in numbered:
        await run.feed(_Line(number, raw))
        if run.failure is not None:
            break
    if run.failure is None:
        await run.flush()
    if run.failure is not None:
        # Nothing is dropped silently: what was never sent goes to the rejected file.
        run.not_sent_rest(numbered)


async def enqueue_jsonl(args: argparse.Namespace, run_class: type[JsonlRun] = JsonlRun) -> int:
    """Enqueue the lines of ``args.jsonl`` (``enqueue --jsonl``; a subclass of the run
    that parses lines its own way for ``requeue-dead-letters``); return the status."""
    with _open_lines(args.jsonl) as (lines, total), _open_rejected(args.rejected) as rejected:
        async with await connect(args) as client:
            info = await client.get_server_info()
            bar = ProgressBar(sys.stderr, total)
            run = run_class(client, args, info, rejected, bar)
            numbered = enumerate(lines, 1)
            try:
                await _feed_all(run, numbered)
            except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C: report, then stop
                bar.finish(run.read)
                # A file's remaining lines are read at once; stdin's may never end.
                run.interrupted(None if args.jsonl == "-" else numbered)
                print("\n".join(run.summary(args.rejected)))
                raise
            bar.finish(run.read)
    for line in run.summary(args.rejected):
        print(line)
    if run.failure is not None:
        print(f"error: {describe(run.failure)}", file=sys.stderr)
    return run.exit_code()
