"""``sepp-lite enqueue --tasks MODULE:OBJECT JOB_TYPE [INPUT]``: one job of a typed task,
its input given as the task reads it (JSON for a dataclass, say) and checked against
the task's type before anything is sent; queue, priority and attempts are the task's
unless the options say otherwise."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from sepp_lite.cli.common import CliError, read_bytes
from sepp_lite.cli.worker import load_target
from sepp_lite.types import EnqueueRequest

__all__ = ["request_from_task"]


def _task_of(args: argparse.Namespace) -> Any:
    target = load_target(args.tasks, args.app_dir)
    tasks_module = sys.modules.get("sepp_lite.tasks")
    if tasks_module is None or not isinstance(target, tasks_module.Tasks):
        raise CliError(f"--tasks: {args.tasks} is {type(target).__name__!r}, not a sepp_lite.Tasks")
    job_type = args.queue  # with --tasks the first positional is the job type
    if job_type not in target:
        known = ", ".join(target.job_types) or "none"
        raise CliError(f"{args.tasks} has no task {job_type!r} (its job types: {known})")
    return target[job_type]


def _input_bytes(args: argparse.Namespace) -> bytes:
    given = [text for text in (args.job_type, args.payload, args.payload_file) if text is not None]
    if len(given) > 1:
        raise CliError("give the input once: INPUT, --payload or --payload-file")
    if args.payload_file is not None:
        return read_bytes(args.payload_file, "--payload-file")
    text = args.job_type if args.job_type is not None else args.payload
    return b"" if text is None else text.encode("utf-8")


def request_from_task(args: argparse.Namespace) -> EnqueueRequest:
    """The job ``enqueue --tasks MODULE:OBJECT JOB_TYPE [INPUT]`` describes;
    :class:`CliError` when the task is unknown or the input does not fit its type."""
    for name, flag in (
        ("jsonl", "--jsonl"),
        ("encoding", "--encoding"),
        ("rejected", "--rejected"),
    ):
        if getattr(args, name) is not None:
            raise CliError(f"{flag} does not go with --tasks (the task's codec decides)")
    task = _task_of(args)
    try:
        value = task.decode(_input_bytes(args))
    except ValueError as exc:
        raise CliError(f"input does not fit: {exc}") from None
    scheduled = None
    if args.delay is not None:
        scheduled = datetime.now(timezone.utc) + timedelta(seconds=args.delay)
    try:
        request: EnqueueRequest = task.request(
            value,
            scheduled_at=scheduled,
            priority=args.priority,
            idempotency_key=args.idempotency_key,
            max_attempts=args.max_attempts,
            custom=dict(args.custom),
        )
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    return request
