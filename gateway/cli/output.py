"""How the billing commands print rows: an aligned table, or JSON with --json."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any


def fmt(value: Any) -> str:
    """One cell: - for None, UTC datetimes to the second, floats without trailing zeros."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """`columns` of `rows` as left-aligned text columns under an upper-case header."""
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def emit(args: argparse.Namespace, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Print `rows` as JSON with --json, else as a table (or "(none)")."""
    if getattr(args, "json", False):
        print(json.dumps(rows, default=fmt, indent=2))
    else:
        print(table(rows, columns) if rows else "(none)")
