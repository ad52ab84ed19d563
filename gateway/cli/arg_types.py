"""Argument types of the billing commands (and the admin API's `since`): points in time and quotas."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A point in time: ISO date/datetime (UTC if naive) or a relative age such as 30m, 24h, 7d."""
    now = now or datetime.now(UTC)
    match = _RELATIVE.match(text.strip())
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use ISO 8601 (2026-05-01, 2026-05-01T12:00Z) or an age like 24h, 7d"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def quota_arg(text: str) -> int | None:
    """A quota value: a non-negative integer, or 'none' / 'unlimited' for no limit."""
    if text.strip().lower() in ("none", "unlimited", "-"):
        return None
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid quota {text!r}: an integer >= 0 or 'none'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid quota {text!r}: must be >= 0")
    return value


def cache_group_arg(value: str) -> str | None:
    """A prefix-cache group name, or none / empty for the tenant's own blocks only."""
    return None if value.lower() in ("none", "") else value
