"""`fairserve` command line: each subcommand family lives in its own module of this package
(`python -m gateway.cli` runs it too, through __main__.py).

Only the module of the command being run is imported: `fairserve tenants list` must answer at once, so it
never pays for `serve`'s web server or the engine's torch (tests/gateway/cli/test_lazy_imports.py). The
table below holds each command's one-line help, so `fairserve --help` lists them all without importing any.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points
from typing import Any, NoReturn

# Each command, the module whose `register(subparsers)` adds it (with a `func` default), and its help line.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.cli.serve", "run the OpenAI-compatible gateway and the engine"),
    "engine": ("gateway.cli.engine", "run one engine server that gateways attach to (serve --engine)"),
    "config": ("gateway.cli.config", "inspect the settings `serve` would run with"),
    "model": ("gateway.cli.model", "manage model directories"),
    "db": ("gateway.cli.billing", "database schema migrations"),
    "tenants": ("gateway.cli.billing", "manage tenants"),
    "keys": ("gateway.cli.billing", "manage API keys"),
    "usage": ("gateway.cli.usage", "per-tenant usage from the ledger"),
    "sim": ("gateway.cli.sim", "simulate the scheduler with a virtual clock and a cost model"),
    "prefixes": ("gateway.cli.prefixes", "public prompt prefixes shared by every tenant"),
}
# Layers above the gateway (bench) plug their subcommands in through this entry-point group, so the
# gateway never imports them; an entry point's name is the command it adds.
PLUGIN_GROUP = "fairserve.commands"


class CommandParser(argparse.ArgumentParser):
    """argparse with a short refusal: a bad value prints its one error line and where the help is, not
    the usage (`serve`'s runs to a hundred lines and buries the error above the fold)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for `command` alone (only its module imported), or every installed command's (None)."""
    parser, sub = _top()
    plugins = {plugin.name: plugin for plugin in entry_points(group=PLUGIN_GROUP)}
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command][0]).register(sub)
    elif command in plugins:
        plugins[command].load()(sub)
    else:  # every command: for an unknown word's error, and for tests that walk them all
        for module in dict.fromkeys(m for m, _ in COMMANDS.values()):
            _register(sub, module)
        for plugin in plugins.values():
            plugin.load()(sub)
    return parser


def listing_parser() -> argparse.ArgumentParser:
    """`fairserve` alone or `fairserve --help`: every command and its help line, from the table (the
    plugins' from their own light modules), with no command module imported."""
    parser, sub = _top()
    for name, (_module, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_)
    for plugin in entry_points(group=PLUGIN_GROUP):
        plugin.load()(sub)
    return parser


def _top() -> tuple[argparse.ArgumentParser, Any]:
    parser = CommandParser(prog="fairserve", description="Multi-tenant fair-share LLM serving.")
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def _register(sub: Any, name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return
        raise
    module.register(sub)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fairserve` console script."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(words)
    parser = listing_parser() if command is None else build_parser(command)
    args = parser.parse_args(words)
    args.argv = words  # `serve --workers N` starts its workers with it
    return int(args.func(args) or 0)
