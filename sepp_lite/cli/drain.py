"""``sepp-lite drain-dead-letters``: remove dead-lettered jobs from the server and write
them as JSON lines that ``sepp-lite enqueue --jsonl`` replays."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import IO, Any, Optional

from sepp_lite import errors
from sepp_lite.cli.common import EXIT_OK, CliError, Commands, connect, int_in, is_terminal, iso
from sepp_lite.client import SeppClient
from sepp_lite.types import DeadLetterRecord

__all__ = ["add_parser", "record_to_json"]

_DRAIN_PAGE = 256


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``drain-dead-letters`` to ``commands``."""
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
