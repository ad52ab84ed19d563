"""Per-request failure isolation: an exception that belongs to one request ends that request, not the loop.

Sampling, logits processing, detokenisation and stop checks each work on one request at a time;
whatever raises there is that request's fault (or its input's), so the caller runs those steps through
`RequestFailures.run` and ends the collected requests with `finish_reason="error"` afterwards. Only a
failure of the whole batch's forward pass is allowed to stop the engine loop. The helper is tiny on
purpose: wherever these steps run (the engine loop today, a front tomorrow) can wrap them the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")
log = logging.getLogger("fairserve.engine.isolation")


class RequestFailures:
    """Collects the exceptions of individual requests during one pass over a batch."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: dict[str, Exception] = {}

    def run(self, request_id: str, action: Callable[[], R], fallback: R) -> R:
        """`action()`, or `fallback` with the exception recorded against `request_id` when it raises.

        Only Exception is caught: KeyboardInterrupt, SystemExit and MemoryError-as-BaseException
        subclasses are the process's business, not one request's.
        """
        try:
            return action()
        except Exception as exc:
            log.warning("request %s failed alone: %s: %s", request_id, type(exc).__name__, exc)
            self.errors.setdefault(request_id, exc)
            return fallback

    def take(self) -> dict[str, Exception]:
        """The failures collected so far; the collector starts empty again."""
        errors, self.errors = self.errors, {}
        return errors

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.errors
