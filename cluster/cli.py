"""`fairserve ray up|status|scale|down`: the parser (the commands themselves are cluster/commands.py).

Plugged into `fairserve` through the `fairserve.commands` entry-point group (pyproject.toml), so the
gateway never imports Ray. The entry point exists whether or not the `ray` extra is installed, and every
`fairserve` command loads it: so this module imports no Ray, and a `ray` command without it says how to
get it. `up` takes every `serve` flag too (model, budgets, --db, --redis, ...): the engine part goes to
the engine actors, the whole tree to the gateway actors.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from cluster.config import ENV_PREFIX, ClusterConfig
from gateway.settings_flags import add_knob_flags

_CONNECT = ("address", "namespace")


def register(subparsers: Any) -> None:
    """Add `ray` and its four subcommands."""
    ray_parser = subparsers.add_parser("ray", help="run engines and gateways on a Ray cluster")
    sub = ray_parser.add_subparsers(dest="ray_command", required=True)
    # `resolve`: the cluster's --engines (a count) replaces serve's --engines (addresses, meaningless here).
    up = sub.add_parser(
        "up",
        help="start engines and gateways (and a local cluster unless --address)",
        conflict_handler="resolve",
    )
    add_knob_flags(up)
    _cluster_flags(
        up,
        (
            "address",
            "namespace",
            "engines",
            "gateways",
            "engine_cpus",
            "gateway_cpus",
            "max_restarts",
            "engine_host",
            "num_cpus",
            "poll_interval_s",
            "ping_timeout_s",
            "drain_timeout_s",
            "ready_timeout_s",
        ),
    )
    up.set_defaults(func=_command("cmd_up"))
    status = sub.add_parser("status", help="list engines and gateways with their health and load")
    _cluster_flags(status, _CONNECT)
    status.set_defaults(func=_command("cmd_status"))
    scale = sub.add_parser("scale", help="change the number of engines (scale-down drains first) or gateways")
    _cluster_flags(scale, (*_CONNECT, "engines", "gateways", "drain_timeout_s"))
    scale.set_defaults(func=_command("cmd_scale"))
    down = sub.add_parser("down", help="stop the gateways (draining), the engines and the registry")
    _cluster_flags(down, _CONNECT)
    down.set_defaults(func=_command("cmd_down"))


def _cluster_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """One flag per ClusterConfig field named (unset flags fall back to FAIRSERVE_RAY__* and the default)."""
    group = parser.add_argument_group("cluster (each also FAIRSERVE_RAY__<NAME> in the environment)")
    for name in names:
        field = ClusterConfig.model_fields[name]
        kind = next((t for t in (int, float) if t in _types(field.annotation)), str)
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest="ray__" + name,
            type=kind,
            default=argparse.SUPPRESS,
            metavar={int: "N", float: "X"}.get(kind, name.upper()),
            help=f"{field.description} [{ENV_PREFIX}{name.upper()}; default {field.default}]",
        )


def _types(annotation: Any) -> tuple[Any, ...]:
    return getattr(annotation, "__args__", (annotation,))


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The command `name` of cluster/commands.py, imported when it runs (it needs the `ray` extra)."""

    def run(args: argparse.Namespace) -> int:
        try:
            commands = importlib.import_module("cluster.commands")
        except ModuleNotFoundError as exc:
            if exc.name != "ray":
                raise
            print(
                "fairserve ray: Ray is not installed; install the extra: pip install 'fairserve[ray]'",
                file=sys.stderr,
            )
            return 2
        return int(getattr(commands, name)(args))

    return run
