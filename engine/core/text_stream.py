"""Each request's text on the engine loop: its incremental detokenizer and its stop strings.

The engine releases text only as far as no stop string can still match (`StopMatcher`), and ends a request
whose text matched one. A request without stop strings may leave its detokenisation to the engine loop's
front, off this loop (`LLMEngine.front_detokenizes`); its stream then carries no detokenizer.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.detokenizer import Detokenizer
from engine.core.outputs import text_in_loop
from engine.core.request import FinishReason, Request
from engine.core.stop import StopMatcher
from engine.core.tokenizer import Tokenizer


class TextStream:
    """Per-request text state: incremental detokenizer and stop-string checker, and what went out."""

    __slots__ = ("detokenizer", "stop", "sent_tokens", "emitted_tokens", "held_delta")

    def __init__(self, detokenizer: Detokenizer | None, stops: list[str]) -> None:
        self.detokenizer = detokenizer
        self.stop = StopMatcher(stops)
        self.sent_tokens = 0  # tokens pushed through the detokenizer
        self.emitted_tokens = 0  # tokens already carried by an output
        self.held_delta = ""  # text decoded since the last output, when intermediate outputs are skipped


def open_stream(tokenizer: Tokenizer, request: Request, front_detokenizes: bool) -> TextStream:
    """A request's text state. A decode part (engine/serving/disagg.py) goes on from its prefill part's: the first
    token (its last prompt id) pushed unreleased, the start of a stop string held back (`held_text`)."""
    ids, params, split = request.prompt_token_ids, request.sampling, request.meta.decode_part
    if front_detokenizes and not text_in_loop(params):
        return TextStream(None, list(params.stop))
    stream = TextStream(tokenizer.detokenizer(ids[:-1] if split else ids), list(params.stop))
    if split and stream.detokenizer is not None:
        stream.detokenizer.push(ids[-1:])
        stream.stop.hold(request.meta.held_text)
    return stream


def new_text(request: Request, stream: TextStream, finish: Callable[[Request, FinishReason], None]) -> str:
    """Detokenise the request's new tokens and check its stop strings (`finish` ends a request that
    matched one); the text it may release now."""
    detokenizer = stream.detokenizer
    if detokenizer is None:  # the front turns this request's ids into text (`front_detokenizes`)
        return ""
    new_ids = request.output_token_ids[stream.sent_tokens :]
    delta = ""
    if new_ids:
        delta, stopped = stream.stop.push(detokenizer.push(new_ids))
        if stopped and not request.is_finished:
            finish(request, FinishReason.STOP)
    if (
        request.is_finished
        and not stream.stop.matched
        and request.finish_reason not in (FinishReason.ERROR, FinishReason.HANDOFF)
    ):
        # Release held-back text (an incomplete UTF-8 tail, a partial stop match); a hand-off keeps it.
        tail, _ = stream.stop.push(detokenizer.finish())
        delta += tail + stream.stop.flush()
    return delta
