"""`fairserve config show`: the effective settings of `fairserve serve` and where each value came from."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from gateway.settings_base import settings_error_text
from gateway.settings_flags import add_knob_flags, effective_rows


def register(subparsers: Any) -> None:
    """Add the `config` command family (`config show`)."""
    config = subparsers.add_parser("config", help="inspect the settings `serve` would run with")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser(
        "show",
        usage="%(prog)s [--json] [any flag of `fairserve serve` ...]",
        help="print each setting's effective value and its source "
        "(flag, FAIRSERVE_* environment, --config file or default)",
    )
    show.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_knob_flags(show)
    show.set_defaults(func=show_config)


def show_config(args: argparse.Namespace) -> int:
    """Print the table; 2 with the reason when the settings do not validate."""
    try:
        rows = effective_rows(args)
    except (ValidationError, ValueError) as exc:
        print(f"fairserve config show: invalid settings:\n{settings_error_text(exc)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{"key": k, "value": v, "source": s} for k, v, s in rows], indent=2))
        return 0
    width = max(len(k) for k, _, _ in rows)
    value_width = max(len(v) for _, v, _ in rows)
    for key, value, source in rows:
        print(f"{key.ljust(width)}  {value.ljust(value_width)}  {source}")
    return 0
