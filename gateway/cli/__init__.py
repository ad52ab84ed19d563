"""`fairserve` command line: each subcommand family lives in its own module of this package
(`python -m gateway.cli` runs it too, through __main__.py)."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

# Modules that define `register(subparsers)`; each adds its subcommands with a `func` default.
COMMAND_MODULES = (
    "gateway.cli.serve",  # serve
    "gateway.cli.engine",  # engine
    "gateway.cli.config",  # config show
    "gateway.cli.model",  # model init
    "gateway.cli.billing",  # db, tenants, keys
    "gateway.cli.usage",  # usage [reconcile]
    "gateway.cli.sim",  # sim
    "gateway.cli.prefixes",  # prefixes add|list|remove
)
# Layers above the gateway (bench) plug their subcommands in through this entry-point group, so the
# gateway never imports them.
PLUGIN_GROUP = "fairserve.commands"


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every subcommand family that is installed."""
    parser = argparse.ArgumentParser(prog="fairserve", description="Multi-tenant fair-share LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    for plugin in entry_points(group=PLUGIN_GROUP):
        plugin.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fairserve` console script."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `serve --workers N` starts its workers with it
    return int(args.func(args) or 0)
