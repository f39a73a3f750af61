"""``sepp-lite periodic MODULE:OBJECT``: the schedules of a ``sepp_lite.Tasks`` registry's
periodic tasks and their next slots (computed here; no server is asked)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from sepp_lite.cli.common import EXIT_OK, CliError, Commands, int_in
from sepp_lite.cli.worker import load_target

__all__ = ["add_parser"]


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``periodic`` to ``commands``."""
    parser = commands.add_parser(
        "periodic",
        parents=parents,
        help="list the periodic tasks of a sepp_lite.Tasks and their next slots",
        description=(
            "List the periodic tasks of MODULE:OBJECT (a sepp_lite.Tasks): each one's "
            "queue, schedule, look-ahead and misfire grace, and its next slots in UTC "
            "(and in the schedule's time zone). Nothing is sent to a server."
        ),
    )
    parser.add_argument("target", metavar="MODULE:OBJECT")
    parser.add_argument(
        "--app-dir", metavar="DIR", help="import from DIR (default: the current directory)"
    )
    parser.add_argument(
        "--count", type=int_in(1, 1000), default=3, metavar="N", help="slots to show (3)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(handler=_cmd_periodic)


def _schedules(args: argparse.Namespace) -> list[dict[str, Any]]:
    target = load_target(args.target, args.app_dir)
    module = sys.modules.get("sepp_lite.tasks")
    if module is None or not isinstance(target, module.Tasks):
        raise CliError(f"{args.target} is {type(target).__name__!r}, not a sepp_lite.Tasks")
    now = datetime.now(timezone.utc)
    out = []
    for job in target.periodic_jobs:
        grace = job.misfire_grace
        out.append(
            {
                "job_type": job.job_type,
                "queue": job.queue,
                "schedule": job.describe(),
                "lookahead_s": job.lookahead.total_seconds(),
                "misfire_grace_s": None if grace is None else grace.total_seconds(),
                "next_slots": job.next_slots(now, args.count),
                "tz": getattr(job.schedule, "tz", None),
            }
        )
    return out


def _shown_slot(slot: datetime, tz: Any) -> str:
    text = slot.strftime("%Y-%m-%dT%H:%M:%SZ")
    if tz is None or tz is timezone.utc:
        return text
    return f"{text}  ({slot.astimezone(tz).strftime('%Y-%m-%d %H:%M %Z')})"


async def _cmd_periodic(args: argparse.Namespace) -> int:
    schedules = _schedules(args)
    if args.json:
        for item in schedules:
            item["next_slots"] = [s.strftime("%Y-%m-%dT%H:%M:%SZ") for s in item["next_slots"]]
            del item["tz"]
        print(json.dumps(schedules, indent=2))
        return EXIT_OK
    if not schedules:
        print(f"{args.target} has no periodic tasks")
    for item in schedules:
        grace = item["misfire_grace_s"]
        grace_text = "to the next slot, at most 600 s" if grace is None else f"{grace:g} s"
        print(
            f"{item['job_type']} on {item['queue']}: {item['schedule']}; "
            f"lookahead {item['lookahead_s']:g} s, misfire_grace {grace_text}"
        )
        for slot in item["next_slots"]:
            print(f"  {_shown_slot(slot, item['tz'])}")
    return EXIT_OK
