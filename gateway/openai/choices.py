"""The per-choice state of a run of n > 1 choices: each choice's text, finish reason and logprobs.

The engine sends each choice's outputs under the request's id with the choice's `index`; a choice's own
end shows as a `finish_reason` on its output, and the request's end (`finished`) comes with the last
choice's (engine/core/outputs.py). A stream interleaves the choices' events as their outputs arrive, each
naming its index; a whole reply lists the choices by index (docs/gateway.md, "Several choices").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from engine import FinishReason, RequestOutput
from gateway.openai.format import Choice
from gateway.openai.logprobs import LogprobsView

# A request ends as its worst choice: one that failed, ran out of time or was cancelled says so.
_WORST_FIRST = (FinishReason.ERROR, FinishReason.DEADLINE, FinishReason.CANCELLED, FinishReason.REJECTED)


@dataclass
class Choices:
    """What each of a run's n choices has produced so far."""

    n: int
    view: LogprobsView | None  # the request's logprobs view: each choice writes through a copy of its own
    texts: list[str] = field(default_factory=list)
    reasons: list[FinishReason | None] = field(default_factory=list)
    started: list[bool] = field(default_factory=list)
    views: list[LogprobsView | None] = field(default_factory=list)
    last_reason: FinishReason | None = None

    def __post_init__(self) -> None:
        view = self.view
        self.texts = [""] * self.n
        self.reasons = [None] * self.n
        self.started = [False] * self.n
        self.views = [
            None if view is None else replace(view, _pending_ids=[], _pending=[]) for _ in range(self.n)
        ]

    def add(self, out: RequestOutput) -> tuple[bool, FinishReason | None]:
        """Take one output: (whether it is its choice's first, the choice's finish reason if it ended)."""
        i = out.index
        first = not self.started[i]
        self.started[i] = True
        self.texts[i] = out.text
        view = self.views[i]
        if view is not None and out.new_logprobs:
            view.add(out.new_token_ids, out.new_logprobs)
        if out.finish_reason is not None:
            self.reasons[i] = self.last_reason = out.finish_reason
        return first, out.finish_reason

    def logprobs(self, index: int) -> dict[str, Any] | None:
        """Choice `index`'s logprobs since the last call (a stream event's), None without logprobs."""
        view = self.views[index]
        return None if view is None else view.take()

    def reason(self) -> FinishReason | None:
        """The request's finish reason: its worst choice's when one failed, else the last to end's."""
        for worst in _WORST_FIRST:
            if worst in self.reasons:
                return worst
        return self.last_reason

    def listed(self) -> list[Choice]:
        """(text, finish reason, logprobs) of every choice by index, for a whole reply's body."""
        return [(self.texts[i], self.reasons[i], self.logprobs(i)) for i in range(self.n)]
