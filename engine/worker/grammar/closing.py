"""Closing a constrained output before its token budget ends, so that it always parses.

`response_format` promises output that parses and validates. A grammar alone keeps that promise only if the
model ends the structure on its own: one that keeps writing inside a string (a small or random model does:
the built-in one writes `{"name":"N3333…` until `max_tokens`) returns JSON cut in half with `finish_reason`
"length", which `client.chat.completions.parse` raises on. So in the last stretch of a grammar request's
budget (`closing_budget`: a quarter of its `max_tokens`, at least 64 tokens or three quarters of a smaller
budget; or what the context has left) its mask is narrowed to the tokens that move toward the end, when the
grammar allows any of them. Which
those are depends on where the output is, read by a JSON lexer over the output so far (in a string or
not, kept per request and advanced by a per-token table): inside a string, the closing quote; outside,
end of sequence, then a token of only `}` and `]`, then a comma (the grammar then forces or allows the
next member). So a string closes, a number ends at the next allowed `}` or `,`, an object or array closes
once its required members are there. What is left of a structure needs about a token per nesting level
and per remaining required key, so the stretch covers any schema of sane depth; what it cannot cover still
ends `length`, as before. Tool calls are JSON inside tags the grammar forces, so they close the same way;
what the grammar forces after the JSON (a call's `}` and closing tag, then end of sequence) is the grammar's
`closing_reserve`, counted by the gateway in the model's own tokens, and the stretch starts that much earlier
so that the tail fits too (a byte-level tokenizer spends 14 tokens on `}\n</tool_call>`). A call whose
shortest form cannot fit in max_tokens at all still ends `length`; the gateway returns it as a call with the
arguments written so far (gateway/openai/tools.py).

This is engine policy, not llguidance's: llguidance computes what is allowed, never how far the end is.
vLLM and SGLang return the cut output; here a quarter of the budget is the price of the promise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from engine.core.request import Request

CLOSING_FRACTION = 0.25
MIN_CLOSING_TOKENS = 64  # a byte-level tokenizer spends a token per character of the keys still required
_WHITESPACE = b" \t\r\n"
OUTSIDE, IN_STRING, ESCAPED = 0, 1, 2  # the JSON lexer's states


def closing_budget(max_tokens: int) -> int:
    """How many tokens before its end a request's output starts closing."""
    return max(int(max_tokens * CLOSING_FRACTION), min(MIN_CLOSING_TOKENS, max_tokens * 3 // 4))


def is_closing(request: Request, max_model_len: int) -> bool:
    """True when `request` is within its closing budget (its max_tokens, or the context's end)."""
    params = request.sampling
    left = min(params.max_tokens - len(request.output_token_ids), max_model_len - request.num_tokens)
    reserve = params.grammar.closing_reserve if params.grammar is not None else 0
    return left <= closing_budget(params.max_tokens) + reserve


def _lex(state: int, text: bytes) -> int:
    for byte in text:
        if state == ESCAPED:
            state = IN_STRING
        elif state == IN_STRING:
            state = ESCAPED if byte == 0x5C else OUTSIDE if byte == 0x22 else IN_STRING
        elif byte == 0x22:
            state = IN_STRING
    return state


class Closers:
    """The vocabulary's closing tokens by lexer state and preference, and each token's lexer transition."""

    def __init__(
        self, token_bytes: Callable[[int], bytes], vocab_size: int, eos_token_ids: Iterable[int]
    ) -> None:
        quotes: list[int] = []
        ends: list[int] = []
        commas: list[int] = []
        self._moves = np.zeros((vocab_size, 3), dtype=np.int8)  # token, state before -> state after
        for token in range(vocab_size):
            raw = token_bytes(token)
            self._moves[token] = [_lex(state, raw) for state in (OUTSIDE, IN_STRING, ESCAPED)]
            text = raw.strip(_WHITESPACE)
            if text == b'"':
                quotes.append(token)
            elif text and set(text) <= set(b"}]"):
                ends.append(token)
            elif text and set(text) == {ord(",")}:
                commas.append(token)
        eos = sorted(t for t in set(eos_token_ids) if 0 <= t < vocab_size)
        groups = [np.array(g, dtype=np.int64) for g in (quotes, eos, ends, commas)]
        self._groups = {IN_STRING: groups[:1], OUTSIDE: [g for g in groups[1:] if g.size]}
        self._lexed: dict[str, tuple[int, int]] = {}  # request -> (output tokens read, lexer state)

    def state(self, request: Request) -> int:
        """Where `request`'s output is, reading only the tokens added since the last call."""
        read, state = self._lexed.get(request.request_id, (0, OUTSIDE))
        tokens = request.output_token_ids
        for token in tokens[read:]:
            state = int(self._moves[token, state]) if 0 <= token < len(self._moves) else state
        self._lexed[request.request_id] = (len(tokens), state)
        return state

    def forget(self, request_id: str) -> None:
        """The request ended."""
        self._lexed.pop(request_id, None)

    def narrow(self, words: np.ndarray, state: int) -> None:
        """Keep only the allowed tokens of the first group (for `state`) that has any, in one row of
        32-token words (int32, in place); a row allowing none of them is left as it is."""
        flat = words.view(np.uint32)
        for ids in self._groups.get(state, []):
            allowed = ids[((flat[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]
            if allowed.size:
                flat[:] = 0
                np.bitwise_or.at(flat, allowed >> 5, np.uint32(1) << (allowed & 31).astype(np.uint32))
                return
