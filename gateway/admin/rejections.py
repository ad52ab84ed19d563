"""A bounded, thread-safe log of recent admission rejections, for the admin dashboard."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

RECENT_REJECTIONS = 200


@dataclass(frozen=True)
class RejectionEvent:
    """One request refused at the edge: when, whose, why, and the Retry-After it was given."""

    at: float
    tenant_id: str | None
    reason: str
    status: int
    retry_after_s: int | None
    message: str


class RejectionLog:
    """The last `capacity` rejections, newest last; recording is O(1) and never fails the request."""

    def __init__(self, capacity: int = RECENT_REJECTIONS) -> None:
        self._events: deque[RejectionEvent] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def record(
        self,
        reason: str,
        status: int,
        retry_after: str | int | None,
        tenant_id: str | None = None,
        message: str = "",
    ) -> None:
        """Append one rejection; `retry_after` is the Retry-After header value as sent (or None)."""
        seconds: int | None
        try:
            seconds = None if retry_after is None else int(retry_after)
        except ValueError:
            seconds = None
        event = RejectionEvent(time.time(), tenant_id, reason, status, seconds, message[:300])
        with self._lock:
            self._events.append(event)

    def recent(self, limit: int = 50) -> list[RejectionEvent]:
        """The newest `limit` rejections, newest first."""
        with self._lock:
            events = list(self._events)
        return events[::-1][:limit]

    def as_json(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest rejections as JSON-ready dicts."""
        return [asdict(e) for e in self.recent(limit)]
