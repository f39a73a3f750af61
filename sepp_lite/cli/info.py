"""``sepp-lite info``: the server's version and limits, as a table or as JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any

from sepp_lite.cli.common import EXIT_OK, Commands, connect, iso
from sepp_lite.types import ServerInfo

__all__ = ["add_parser", "human_duration", "render_info"]


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``info`` to ``commands``."""
    parser = commands.add_parser(
        "info",
        parents=parents,
        help="show the server's version and limits",
        description="Show GetServerInfo: the server's version and global limits.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=_cmd_info)


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
