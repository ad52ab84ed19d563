"""Absolute deadlines: fixed once per call, and the question every retry must answer first.

A deadline is the caller's promise about when an answer stops being useful. The server enforces it
(`X-Deadline`), so the client's job is to send the same instant on every attempt of a call and to
stop retrying once the next attempt could not even start before it. openai-python's retry loop would
otherwise keep going for as long as its retry budget lasts, and a relative timeout header would move
the deadline forward with every retry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from openai._constants import INITIAL_RETRY_DELAY, MAX_RETRY_AFTER_DELAY, MAX_RETRY_DELAY

Deadline = datetime | float | int  # an aware datetime, or epoch seconds


def epoch_of(deadline: Deadline) -> float:
    """Epoch seconds of a deadline; a naive datetime is refused rather than guessed."""
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError("deadline must be timezone-aware (a naive datetime has no instant)")
        return deadline.timestamp()
    value = float(deadline)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"deadline must be positive epoch seconds, got {deadline!r}")
    return value


@dataclass(frozen=True)
class DeadlinePolicy:
    """A client's (or one `with_options` copy's) deadline: absolute, relative to each call's start, or both."""

    at: float | None = None  # epoch seconds
    within_s: float | None = None  # seconds from the call's first attempt

    def __post_init__(self) -> None:
        if self.within_s is not None and not (math.isfinite(self.within_s) and self.within_s > 0):
            raise ValueError(f"deadline_in must be positive seconds, got {self.within_s!r}")

    @classmethod
    def of(cls, deadline: Deadline | None, deadline_in: float | None) -> DeadlinePolicy:
        """From the `deadline=` / `deadline_in=` arguments."""
        return cls(None if deadline is None else epoch_of(deadline), deadline_in)

    def resolve(self, now: float) -> float | None:
        """The absolute deadline of a call starting at `now`; the earlier one when both are set."""
        candidates = [
            d for d in (self.at, None if self.within_s is None else now + self.within_s) if d is not None
        ]
        return min(candidates) if candidates else None


def header_deadline(headers: Mapping[str, str]) -> float | None:
    """The `X-Deadline` a request was sent with, as epoch seconds (None when absent or unreadable)."""
    raw = headers.get("x-deadline")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def longest_backoff(retries_taken: int) -> float:
    """The longest wait openai-python's own back-off picks before retry `retries_taken + 1` (its jitter only shortens)."""
    return min(INITIAL_RETRY_DELAY * 2.0 ** min(retries_taken, 1000), MAX_RETRY_DELAY)


def next_start(
    now: float, retry_after_s: float | None, estimated_start_ms: str | None, retries_taken: int
) -> float:
    """The earliest instant the next attempt could start running on the server.

    The client waits the server's `Retry-After` when it gives one the SDK honours, else its own
    back-off; the server's `X-Estimated-Start-Ms` says how long the queue would hold a request sent
    now. The queue drains while the client waits, so the start is the later of the two, not their sum.
    """
    if (
        retry_after_s is not None
        and math.isfinite(retry_after_s)
        and 0 < retry_after_s <= MAX_RETRY_AFTER_DELAY
    ):
        wait = retry_after_s
    else:
        wait = longest_backoff(retries_taken)
    queue = 0.0
    if estimated_start_ms is not None:
        try:
            queue = max(float(estimated_start_ms) / 1000.0, 0.0)
        except ValueError:
            queue = 0.0
    return now + max(wait, queue)


def now() -> float:
    """Wall-clock epoch seconds (deadlines are absolute instants shared with the server)."""
    return time.time()
