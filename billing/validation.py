"""Validation of tenant fields at the repository edge: specific ValueErrors that name the field."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

TENANT_FIELDS = (
    "name",
    "weight",
    "priority_class",
    "tokens_per_minute",
    "tokens_per_day",
    "max_queued_requests",
    "disabled",
    "cache_group",
    "on_infeasible",
)
# A tenant's default answer to an infeasible deadline (gateway/openai/degrade.py); None: the server's.
ON_INFEASIBLE_VALUES = ("reject", "fallback", "partial", "truncate")
MAX_CACHE_GROUP_LENGTH = 64
MAX_NAME_LENGTH = 128
MAX_PRIORITY_CLASS = 9


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_name(name: object) -> str:
    """A tenant name: non-empty, at most 128 printable characters, no surrounding spaces."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("tenant name must be a non-empty string")
    name = name.strip()
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise ValueError(f"tenant name must be at most {MAX_NAME_LENGTH} printable characters")
    return name


def check_weight(weight: object) -> float:
    """A fair-share weight: a finite number > 0."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ValueError(f"weight must be a finite number > 0, got {weight!r}")
    return float(weight)


def check_priority_class(value: object) -> int:
    """A priority class: an integer in 0..9, 0 being the most important."""
    if not _is_int(value) or not 0 <= value <= MAX_PRIORITY_CLASS:
        raise ValueError(f"priority_class must be an integer in 0..{MAX_PRIORITY_CLASS}, got {value!r}")
    return int(value)


def check_optional_count(field_name: str, value: object) -> int | None:
    """A quota or bound: None (unlimited) or an integer >= 0."""
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise ValueError(f"{field_name} must be None (unlimited) or an integer >= 0, got {value!r}")
    return int(value)


def check_cache_group(value: object) -> str | None:
    """A prefix-cache group: None (the tenant's own blocks only) or 1-64 letters, digits and ._:-"""
    if value is None or value == "":
        return None
    if (
        not isinstance(value, str)
        or len(value) > MAX_CACHE_GROUP_LENGTH
        or not all(c.isascii() and (c.isalnum() or c in "._:-") for c in value)
    ):
        raise ValueError(
            f"cache_group must be 1-{MAX_CACHE_GROUP_LENGTH} letters, digits or ._:- (or null), got {value!r}"
        )
    return value


def check_tenant_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Validate a partial tenant update; raises ValueError naming the first unknown or bad field."""
    unknown = sorted(set(fields) - set(TENANT_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown tenant field(s): {', '.join(unknown)}; allowed: {', '.join(TENANT_FIELDS)}"
        )
    clean: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "name":
            clean[key] = check_name(value)
        elif key == "weight":
            clean[key] = check_weight(value)
        elif key == "priority_class":
            clean[key] = check_priority_class(value)
        elif key == "cache_group":
            clean[key] = check_cache_group(value)
        elif key == "on_infeasible":
            if value is not None and value not in ON_INFEASIBLE_VALUES:
                raise ValueError(
                    f"on_infeasible must be one of {', '.join(ON_INFEASIBLE_VALUES)} or null, got {value!r}"
                )
            clean[key] = value
        elif key == "disabled":
            if not isinstance(value, bool):
                raise ValueError(f"disabled must be a boolean, got {value!r}")
            clean[key] = value
        else:
            clean[key] = check_optional_count(key, value)
    return clean
