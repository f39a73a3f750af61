"""``sepp-lite workflows MODULE[:OBJECT]``: the workflows (``sepp_lite.tasks.Chain``
objects) a module defines at its top level, or the one OBJECT names, step by step:
each step's job type and queue, and which steps take each element of the previous
step's sequence (``map``). Nothing is sent to a server."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sepp_lite.cli.common import EXIT_OK, CliError, Commands
from sepp_lite.cli.worker import load_target

__all__ = ["add_parser"]


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``workflows`` to ``commands``."""
    parser = commands.add_parser(
        "workflows",
        parents=parents,
        help="list the workflows (task.then/task.map chains) a module defines",
        description=(
            "List the workflows of MODULE (every sepp_lite.tasks.Chain at its top level) "
            "or the one MODULE:OBJECT names: each step's job type and queue, in order, "
            "with 'map' before a step that takes each element of the previous step's "
            "sequence. Nothing is sent to a server."
        ),
    )
    parser.add_argument("target", metavar="MODULE[:OBJECT]")
    parser.add_argument(
        "--app-dir", metavar="DIR", help="import from DIR (default: the current directory)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(handler=_cmd_workflows)


def _chains(args: argparse.Namespace) -> list[tuple[str, Any]]:
    target = load_target(args.target, args.app_dir, module_ok=True)
    module = sys.modules.get("sepp_lite.tasks")
    chain_type = module.Chain if module is not None else None
    if chain_type is not None and isinstance(target, chain_type):
        return [(args.target.partition(":")[2], target)]
    if ":" in args.target or chain_type is None:
        raise CliError(f"{args.target} is {type(target).__name__!r}, not a sepp_lite.tasks.Chain")
    return [(name, value) for name, value in vars(target).items() if isinstance(value, chain_type)]


def _steps(chain: Any) -> list[dict[str, Any]]:
    first = {"type": chain.first.job_type, "queue": chain.first.queue}
    return [first, *chain.steps]


async def _cmd_workflows(args: argparse.Namespace) -> int:
    chains = _chains(args)
    if args.json:
        print(json.dumps([{"name": name, "steps": _steps(c)} for name, c in chains], indent=2))
        return EXIT_OK
    if not chains:
        print(f"{args.target} defines no workflows at its top level")
    for name, chain in chains:
        print(f"{name}:")
        for line in chain.describe().splitlines():
            print(f"  {line}")
    return EXIT_OK
