"""Absolute deadlines from request headers, converted once at the edge."""

from __future__ import annotations

import math
from datetime import datetime

# Epoch values above this are almost certainly milliseconds sent by mistake (year 5138 in seconds).
_MAX_EPOCH_S = 1e11
# A relative timeout beyond a day is a client bug, not a deadline.
_MAX_TIMEOUT_MS = 86_400_000


class DeadlineError(ValueError):
    """A deadline header that cannot be read; `header` names it for the error body."""

    def __init__(self, message: str, header: str) -> None:
        super().__init__(message)
        self.header = header


def parse_deadline(x_deadline: str | None, x_timeout_ms: str | None, now: float) -> float | None:
    """Absolute deadline (epoch seconds) from `X-Deadline` or `X-Timeout-Ms`; None when neither is sent.

    When both are sent the earlier one wins, so a hop can only tighten the contract.
    """
    candidates: list[float] = []
    if x_deadline is not None:
        candidates.append(_parse_absolute(x_deadline.strip()))
    if x_timeout_ms is not None:
        candidates.append(now + _parse_timeout_ms(x_timeout_ms.strip()) / 1000.0)
    return min(candidates) if candidates else None


def _parse_absolute(value: str) -> float:
    if not value:
        raise DeadlineError("X-Deadline is empty; send RFC 3339 or epoch seconds", "X-Deadline")
    try:
        epoch = float(value)
    except ValueError:
        epoch = _parse_rfc3339(value)
    else:
        if not math.isfinite(epoch) or epoch <= 0:
            raise DeadlineError(f"X-Deadline must be positive epoch seconds, got {value!r}", "X-Deadline")
        if epoch > _MAX_EPOCH_S:
            raise DeadlineError(
                f"X-Deadline {value!r} is too large for epoch seconds (milliseconds?)", "X-Deadline"
            )
    return epoch


def _parse_rfc3339(value: str) -> float:
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise DeadlineError(
            f"X-Deadline {value!r} is neither RFC 3339 (2026-01-01T00:00:00Z) nor epoch seconds", "X-Deadline"
        ) from None
    if parsed.tzinfo is None or "T" not in text.upper():
        raise DeadlineError(
            f"X-Deadline {value!r} needs a date, a time and a UTC offset (RFC 3339)", "X-Deadline"
        )
    return parsed.timestamp()


def _parse_timeout_ms(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        raise DeadlineError(
            f"X-Timeout-Ms must be a number of milliseconds, got {value!r}", "X-Timeout-Ms"
        ) from None
    if not math.isfinite(ms) or ms < 0 or ms > _MAX_TIMEOUT_MS:
        raise DeadlineError(
            f"X-Timeout-Ms must be between 0 and {_MAX_TIMEOUT_MS}, got {value!r}", "X-Timeout-Ms"
        )
    return ms
