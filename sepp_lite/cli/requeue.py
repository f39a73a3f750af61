"""``sepp-lite requeue-dead-letters FILE``: enqueue again the jobs of a file that
``drain-dead-letters`` wrote, so drained work can be replayed, and replayed again
without duplicates.

A dead-letter record does not carry the job's idempotency key (the wire has none for
it), and the original key would not do anyway: the server remembers a key after its
job was dead-lettered, so a replay with it would be deduplicated into the dead job
and nothing would run. Each record's replay gets a key of its own instead,
``requeue:<job_id>`` (a line that sets ``idempotency_key`` keeps it): replaying the
same file twice within the server's dedup window (``dedup_window_ms``, 24 h by
default) enqueues each job once, and the second run reports them deduplicated. A line
without ``job_id`` and without a key goes out without one; the report counts those,
as running the file again would enqueue them again.

A replay is a new job: its attempts count from 1 again, up to the record's
``max_attempts`` (the queue's default when the record has none); queue, job type,
payload and encoding, priority, custom values and trace context are the record's.
The record's ``scheduled_at`` has passed, so the job is ready at once.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Optional

from sepp_lite.cli.common import Commands
from sepp_lite.cli.enqueue import (
    JsonlRun,
    LineError,
    checked,
    decode_line,
    enqueue_jsonl,
    request_from_json,
)
from sepp_lite.types import EnqueueRequest

__all__ = ["KEY_PREFIX", "add_parser", "replay_key"]

KEY_PREFIX = "requeue:"


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``requeue-dead-letters`` to ``commands``."""
    parser = commands.add_parser(
        "requeue-dead-letters",
        parents=parents,
        help="enqueue again the jobs a drain-dead-letters file holds",
        description="Enqueue again the jobs of a file drain-dead-letters wrote (- for "
        "stdin), each on its own queue, as new jobs (attempts count from 1). Each gets "
        "the idempotency key requeue:<job_id> unless its line sets one, so running the "
        "same file twice within the server's dedup window enqueues each job once. "
        "Lines are reported as enqueue --jsonl reports them.",
    )
    parser.add_argument("jsonl", metavar="FILE")
    parser.add_argument("--rejected", metavar="FILE", help="write the lines not enqueued to FILE")
    parser.set_defaults(handler=_cmd_requeue, queue="", job_type=None)


def replay_key(job_id: str) -> str:
    """The idempotency key of a dead-lettered job's replay."""
    return KEY_PREFIX + job_id


class _RequeueRun(JsonlRun):
    """``enqueue --jsonl`` for dead-letter records: each line names its own queue and
    job type, and gets an idempotency key from its ``job_id``."""

    keyless = 0

    def parse(self, raw: bytes) -> tuple[EnqueueRequest, int]:
        obj = decode_line(raw)
        for name in ("queue", "job_type"):
            if not isinstance(obj.get(name), str):
                raise LineError(f"no {name} (a dead-letter record names its queue and job type)")
        job_id: Optional[object] = obj.get("job_id")
        if obj.get("idempotency_key") is None and isinstance(job_id, str) and job_id:
            obj["idempotency_key"] = replay_key(job_id)
        request, size = checked(request_from_json(obj, "", None, datetime.now(timezone.utc)))
        if request.idempotency_key is None:
            self.keyless += 1
        return request, size

    def summary(self, rejected_path: Optional[str]) -> list[str]:
        lines = super().summary(rejected_path)
        if self.keyless:
            lines.append(
                f"{self.keyless:,} job(s) had no job_id and no idempotency_key: running "
                "this file again would enqueue them again"
            )
        return lines


async def _cmd_requeue(args: argparse.Namespace) -> int:
    return await enqueue_jsonl(args, _RequeueRun)
