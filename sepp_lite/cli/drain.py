"""``sepp-lite drain-dead-letters``: remove dead-lettered jobs from the server and write
them as JSON lines that ``sepp-lite requeue-dead-letters`` replays.

Draining is destructive: the server deletes the records it returns. So nothing drained
is dropped unwritten: each call's records are written (and, into a regular file,
fsynced) before the next call asks for more, and the drain stops at the first failed
write. The records of the call whose write failed are no longer on the server; they
go to stderr instead, and the error line says how many were written and how many
went there. Calls start small (1 record, then 2, 4, ... up to ``--batch``), so output
that fails from the start costs one record, not a batch; into a pipe the batches stay
small (16): after each call the drain waits until the reader has taken the records
(and 20 ms more, for a reader such as ``head -1`` to exit), and before the next call
it checks that the pipe still has a reader.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import select
import signal
import stat
import sys
from collections.abc import Iterator
from typing import IO, Any, Optional

from sepp_lite import errors
from sepp_lite.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    CliError,
    Commands,
    connect,
    file_mode,
    int_in,
    is_terminal,
    iso,
    queue_name_arg,
    reader_gone,
    silence_stdout,
    unread_in_pipe,
)
from sepp_lite.client import SeppClient
from sepp_lite.types import DeadLetterRecord

__all__ = ["Output", "add_parser", "record_to_json"]

# Records per DrainDeadLetters call, at most: into a regular file a loss needs a failed
# write (a full disk), into a pipe only a reader that goes away, which happens.
FILE_BATCH = 256
STREAM_BATCH = 16
_EXIT_INTERRUPTED = 130


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``drain-dead-letters`` to ``commands``."""
    parser = commands.add_parser(
        "drain-dead-letters",
        parents=parents,
        help="remove dead-lettered jobs from the server and write them as JSON lines",
        description="Remove dead-lettered jobs from the server (destructive: they are gone "
        "from the server afterwards) and write them as JSON lines, payload as base64, "
        "which sepp-lite requeue-dead-letters FILE enqueues again. Each call's records "
        "are written (and fsynced into a file) before the next call; at the first failed "
        "write the drain stops, prints the records it could not write on stderr and "
        "exits 1. --yes is required unless stdout is not a terminal and --out is given.",
    )
    parser.add_argument(
        "--queue", metavar="Q", type=queue_name_arg, help="only this queue's dead letters"
    )
    parser.add_argument(
        "--max", type=int_in(0, 2**31), metavar="N", help="drain at most N (default: all)"
    )
    parser.add_argument(
        "--out", metavar="FILE", help="append the records to FILE instead of stdout"
    )
    parser.add_argument(
        "--batch",
        type=int_in(1, 2**31),
        metavar="N",
        help=f"records per call, at most (default {FILE_BATCH} into a regular file, "
        f"{STREAM_BATCH} into a pipe or terminal); the first calls ask for 1, 2, 4, ...",
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


def _line(record: DeadLetterRecord) -> bytes:
    return (json.dumps(record_to_json(record), ensure_ascii=False) + "\n").encode("utf-8")


# -- where the records go -------------------------------------------------------------


class Output:
    """Where drained records go: written one whole record at a time, straight to the
    file descriptor (no buffer that could hold records a failed flush loses track
    of), so after a failed write it is known which records made it. ``name`` is what
    messages call it; ``stream`` is used when there is no descriptor (an in-process
    caller's captured stdout). ``appending``: the descriptor is a file this command
    opened to append to, so a partial line a failed write leaves at its end is cut."""

    def __init__(
        self,
        name: str,
        fd: Optional[int],
        stream: Optional[IO[str]] = None,
        *,
        appending: bool = False,
    ) -> None:
        self.name = name
        self.fd = fd
        self.stream = stream
        mode = 0 if fd is None else file_mode(fd)
        self.is_file = stat.S_ISREG(mode)
        self.is_pipe = stat.S_ISFIFO(mode)
        self.appending = appending and self.is_file

    def write(self, line: bytes) -> None:
        """Write one record's line whole, or raise ``OSError``; a partial line left in
        a regular file by a failed write is cut off again."""
        if self.fd is None:
            assert self.stream is not None
            self.stream.write(line.decode("utf-8"))
            self.stream.flush()
            return
        end = os.fstat(self.fd).st_size if self.appending else 0
        try:
            _write_all(self.fd, line)
        except OSError:
            if self.appending:  # the archive stays whole lines, however it failed
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, end)
            raise

    def commit(self) -> None:
        """Make what was written durable (fsync, for a regular file) before the next
        call removes more records from the server; ``OSError`` when that fails."""
        if self.is_file:
            assert self.fd is not None
            os.fsync(self.fd)

    def reader_gone(self) -> bool:
        """Whether the output is a pipe whose reader has gone (writing would fail)."""
        return self.fd is not None and reader_gone(self.fd)

    async def taken(self) -> None:
        """Into a pipe: wait until its reader has taken what was written, then a
        moment more. A reader that wanted only part of the output (``head -1``) leaves
        right after reading it; the next call must not remove records from the server
        before that is seen. The drain goes at the reader's pace, as a full pipe would
        make it anyway. Nothing for files, terminals and sockets."""
        fd = self.fd
        if fd is None or not self.is_pipe:
            return
        # No wake-up exists for "the reader has emptied the pipe" (a writable pipe
        # polls ready as soon as it has room): poll it.
        while unread_in_pipe(fd) and not reader_gone(fd):  # noqa: ASYNC110
            await asyncio.sleep(_PIPE_POLL_S)
        await asyncio.sleep(_READER_EXIT_S)


_PIPE_POLL_S = 0.005
# How long a reader that has taken all it wanted gets to exit before the next call:
# `head` exits within a millisecond or two of its read; 20 ms per call is at most
# about 1.3 s over 1,000 records in batches of 16.
_READER_EXIT_S = 0.02


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a non-blocking descriptor handed down to us
            select.select([], [fd], [])


@contextlib.contextmanager
def _output(path: Optional[str]) -> Iterator[Output]:
    if path is None:
        try:
            sys.stdout.flush()
            fd: Optional[int] = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # no descriptor: captured output
            fd = None
        yield Output("stdout", fd, sys.stdout)
        return
    try:
        # Appending: an earlier drain's output must never be overwritten. Unbuffered:
        # each record goes to the file whole, or the failure says which did not.
        fh = open(path, "ab", buffering=0)
    except OSError as exc:
        raise CliError(f"cannot write --out {path}: {exc.strerror or exc}") from exc
    with fh:
        yield Output(path, fh.fileno(), appending=True)


# -- the drain ------------------------------------------------------------------------


class _WriteFailed(Exception):
    """Writing a call's records failed: ``unwritten`` were removed from the server but
    are not in the output."""

    def __init__(self, error: OSError, unwritten: list[DeadLetterRecord]) -> None:
        super().__init__(str(error))
        self.error = error
        self.unwritten = unwritten


class _Drain:
    """One drain: how many records were written, and whether Ctrl-C asked it to stop
    (after the call in flight is answered and written, so that call loses nothing)."""

    def __init__(self, client: SeppClient, out: Output, batch: int) -> None:
        self.client = client
        self.out = out
        self.batch = batch
        self.written = 0
        self.interrupted = False
        self.reader_left = False

    async def run(self, queue: Optional[str], limit: Optional[int]) -> None:
        """Drain until the server has no more, ``limit`` records were drained, Ctrl-C,
        or the output's reader has gone; raises :class:`_WriteFailed` or the call's
        :class:`~sepp_lite.errors.SeppError`."""
        size = 1  # the first calls are small: output that fails at once costs little
        while (limit is None or self.written < limit) and not self.interrupted:
            if self.out.reader_gone():
                self.reader_left = True
                return
            want = min(size, self.batch)
            if limit is not None:
                want = min(want, limit - self.written)
            records = await self.client.drain_dead_letters(queue, want)
            if not records:
                return
            self.write(records)
            await self.out.taken()
            size = min(size * 2, self.batch)

    def write(self, records: list[DeadLetterRecord]) -> None:
        """Write one call's records and commit them; :class:`_WriteFailed` with the
        ones not known to be in the output."""
        done = 0
        try:
            for record in records:
                self.out.write(_line(record))
                done += 1
            self.out.commit()
        except OSError as exc:
            # After a failed fsync nothing of this call is known to be on disk: all of
            # it goes to stderr too (a record twice is better than a record lost).
            kept = 0 if done == len(records) else done
            self.written += kept
            raise _WriteFailed(exc, records[kept:]) from exc
        self.written += done


@contextlib.contextmanager
def _first_sigint(drain: _Drain) -> Iterator[None]:
    """While the drain runs, the first Ctrl-C stops it after the call in flight (whose
    records the server may already have removed); a second one interrupts at once."""
    loop = asyncio.get_running_loop()

    def first() -> None:
        drain.interrupted = True
        loop.remove_signal_handler(signal.SIGINT)  # the next one interrupts at once
        print("stopping after the call in flight (Ctrl-C again to stop now)", file=sys.stderr)

    try:
        loop.add_signal_handler(signal.SIGINT, first)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread; Windows
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _check_confirmation(args: argparse.Namespace) -> None:
    if args.yes:
        return
    if is_terminal(sys.stdout):
        raise CliError(
            "draining removes the dead letters from the server for good; "
            "pass --yes to go ahead (and --out FILE to keep them in a file)"
        )
    if args.out is None:
        raise CliError(
            "draining removes the dead letters from the server for good; without a "
            "terminal, pass --out FILE to append them to a file, or --yes to write them "
            "to stdout"
        )


def _write_failure(drain: _Drain, failed: _WriteFailed) -> str:
    """The error line of a failed write; the unwritten records go to stderr first."""
    for record in failed.unwritten:
        with contextlib.suppress(OSError):
            sys.stderr.write(_line(record).decode("utf-8"))
    reason = failed.error.strerror or str(failed.error)
    text = (
        f"cannot write to {drain.out.name}: {reason[:1].lower() + reason[1:]}; "
        f"{drain.written:,} dead-letter record(s) written"
    )
    if failed.unwritten:
        text += (
            f"; the {len(failed.unwritten):,} record(s) of the last call, no longer on the "
            "server, could not be written: they are above, on stderr"
        )
    return text + "; any others are still on the server"


def _summary(drain: _Drain, out: Optional[str], retention: bool) -> str:
    message = f"drained {drain.written:,} dead-letter record(s)"
    if out is not None:
        message += f" into {out}"
    if drain.written == 0 and not retention:
        message += " (dead-letter retention is off on this server: it keeps none)"
    return message


async def _cmd_drain(args: argparse.Namespace) -> int:
    _check_confirmation(args)
    async with await connect(args) as client:
        info = await client.get_server_info()
        with _output(args.out) as out:
            batch = args.batch or (FILE_BATCH if out.is_file else STREAM_BATCH)
            drain = _Drain(client, out, min(batch, max(1, info.max_reserve_batch)))
            try:
                with _first_sigint(drain):
                    await drain.run(args.queue, args.max)
            except _WriteFailed as failed:
                if out.fd is not None and args.out is None:
                    silence_stdout()
                raise CliError(_write_failure(drain, failed), EXIT_REFUSED) from failed.error
            except errors.SeppError as exc:
                maybe = ""
                if getattr(exc, "ambiguous", False):
                    maybe = " (the failed call may have removed records it could not return)"
                written = f"drained {drain.written:,} dead-letter record(s) before the error"
                print(written + maybe, file=sys.stderr)
                raise
    if drain.reader_left:
        silence_stdout()
        raise CliError(
            f"stopped: the reader of stdout has gone; {drain.written:,} dead-letter "
            "record(s) written, any others are still on the server",
            EXIT_REFUSED,
        )
    print(_summary(drain, args.out, info.dead_letter_retention_enabled), file=sys.stderr)
    if drain.interrupted:
        print("error: interrupted; any others are still on the server", file=sys.stderr)
        return _EXIT_INTERRUPTED
    return EXIT_OK
