"""The live requests' absolute deadlines, earliest first, and which are due at the start of a step.

A request past its deadline leaves (`deadline`). A partial one (`RequestMeta.partial_at_deadline`, the
gateway's `X-On-Infeasible: partial`) that has tokens leaves one step early, as `length`: the step now
starting would end after its deadline, and its answer is due by then. The coming step's length is taken
as the longest of the last RECENT_STEPS (schedule to schedule, while requests ran): a step that admits a
prefill lasts several decode steps, and an answer cut one decode step early would still come late.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator

from engine.core.request import FinishReason, Request

RECENT_STEPS = 16


class Deadlines:
    """A heap of (deadline, request id) and the recent steps' lengths."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self._step_at: float | None = None

    def add(self, deadline: float, request_id: str) -> None:
        """Watch a request's deadline."""
        heapq.heappush(self._heap, (deadline, request_id))

    def due(
        self, now: float, running: bool, lookup: Callable[[str], Request | None]
    ) -> Iterator[tuple[Request, FinishReason]]:
        """The live requests to end at a step starting `now`, and how each ends."""
        if self._step_at is not None and running:
            self._steps.append(max(now - self._step_at, 0.0))
        self._step_at = now
        step = max(self._steps) if running and self._steps else 0.0
        not_yet: list[tuple[float, str]] = []
        while self._heap and self._heap[0][0] <= now + step:
            deadline, request_id = heapq.heappop(self._heap)
            request = lookup(request_id)
            if request is None or request.is_finished:
                continue
            if request.meta.partial_at_deadline and request.output_token_ids:
                yield request, FinishReason.LENGTH  # the tokens so far are the answer
            elif deadline <= now:
                yield request, FinishReason.DEADLINE
            else:  # due within the coming step, but only a partial answer leaves early
                not_yet.append((deadline, request_id))
        for item in not_yet:
            heapq.heappush(self._heap, item)
