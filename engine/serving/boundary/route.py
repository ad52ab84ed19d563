"""`OutputRoute`: where one request's outputs go on the front's side of the engine boundary, with its totals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.core.detokenizer import Detokenizer
from engine.core.outputs import OutputDelta, RequestInfo, RequestOutput, TokenPrefix

# Called inside the front's delivery, so it must not wait; what it raises is logged and goes no further.
Sink = Callable[[RequestOutput | BaseException], None]


class OutputRoute:
    """Where one request's outputs go, and its running totals (the loop sends only what is new).

    With a `detokenizer` the loop sends this request's token ids without text (it has no stop strings,
    see engine/core/outputs.py `text_in_loop`) and the route makes the text here, on the consumer's side.
    """

    __slots__ = ("loop", "put", "prompt_token_ids", "token_ids", "text", "detokenizer", "info", "choices")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        put: Sink,
        prompt_token_ids: list[int],
        detokenizer: Detokenizer | None = None,
        info: RequestInfo | None = None,
    ) -> None:
        self.loop = loop
        self.put = put
        self.prompt_token_ids = prompt_token_ids
        self.token_ids: list[int] = []
        self.text = ""
        self.detokenizer = detokenizer
        self.info = info  # the live table's entry, whose state each output updates (no second lookup)
        # n > 1: the totals of choices 1..n-1, each a route of its own (this one keeps choice 0's).
        self.choices: list[OutputRoute] = []

    def add_choices(self, detokenizers: list[Detokenizer | None]) -> None:
        """Keep totals for choices 1.. too, one detokenizer each (None where the loop sends text)."""
        self.choices = [
            OutputRoute(self.loop, self.put, self.prompt_token_ids, d, self.info) for d in detokenizers
        ]

    def expand(self, delta: OutputDelta) -> RequestOutput:
        """The whole RequestOutput the consumer sees: its token ids a snapshot of the totals, not a copy."""
        if delta.index:
            return self.choices[delta.index - 1].expand_choice(delta)
        return self.expand_choice(delta)

    def expand_choice(self, delta: OutputDelta) -> RequestOutput:
        """`expand` on this route's own totals (choice `delta.index`'s)."""
        self.token_ids += delta.new_token_ids
        text = delta.delta_text
        detokenizer = self.detokenizer
        if detokenizer is not None:
            # What the loop did before it left the text to the front: push the new ids, and at the end
            # release a held-back incomplete character (a request without stop strings holds nothing else).
            text = detokenizer.push(delta.new_token_ids) if delta.new_token_ids else ""
            if delta.finished or delta.finish_reason is not None:  # the request's end, or this choice's
                text += detokenizer.finish()
        self.text += text
        return RequestOutput(
            delta.request_id,
            self.prompt_token_ids,
            delta.new_token_ids,
            TokenPrefix(self.token_ids, len(self.token_ids)),
            text,
            self.text,
            delta.finished,
            delta.finish_reason,
            delta.metrics,
            delta.held_text,
            delta.logprobs,
            delta.index,
            delta.fault,
        )
