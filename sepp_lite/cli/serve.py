"""``sepp-lite serve``: the in-process server of :mod:`sepp_lite.testing`, whose options
and run loop live in :mod:`sepp_lite.testing._cli` (also ``python -m sepp_lite.testing``)."""

from __future__ import annotations

import argparse

from sepp_lite.cli.common import CliError, Commands
from sepp_lite.testing._cli import ListenError, add_serve_arguments, serve

__all__ = ["add_parser"]


def add_parser(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to ``commands``."""
    parser = commands.add_parser(
        "serve",
        parents=parents,
        help="run the in-process sepp server (in memory)",
        description="Run the in-process sepp server of sepp_lite.testing until SIGINT or "
        "SIGTERM. Nothing is persisted. Its --api-key options are the keys it accepts.",
    )
    add_serve_arguments(parser)
    parser.set_defaults(handler=_cmd_serve)


async def _cmd_serve(args: argparse.Namespace) -> int:
    from sepp_lite.testing import ConfigError

    try:
        return await serve(args)
    except (ConfigError, RuntimeError, ListenError) as exc:
        raise CliError(str(exc)) from exc
    except OSError as exc:
        raise CliError(f"cannot listen: {exc}") from exc
