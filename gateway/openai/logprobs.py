"""OpenAI's `logprobs` objects from the engine's per-token log probabilities (engine/core/outputs.py TokenLogprobs).

Completions (`logprobs: int`, 0-5) get the legacy four lists, `{tokens, token_logprobs, top_logprobs,
text_offset}`, where each `top_logprobs` entry maps token text to logprob for the k most likely tokens
plus the sampled one (so up to k + 1 entries, as OpenAI documents). Chat (`logprobs: true`,
`top_logprobs` 0-20) gets `{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
refusal: null}`. A stream's chunk carries the entries of its own tokens; `text_offset` counts on across
chunks.

The values are those of the distribution the token was drawn from (docs/gateway.md, "Log
probabilities"); a token that top-k or top-p excluded has probability 0, whose log JSON cannot carry:
it is written as -9999.0, OpenAI's own stand-in.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core.token_logprobs import TokenLogprobs
from engine.core.tokenizer import Tokenizer

NO_PROBABILITY = -9999.0  # what OpenAI writes for log(0)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else NO_PROBABILITY


class TokenTexts:
    """Each token's text and bytes, made once per token id (the vocabulary bounds the cache)."""

    __slots__ = ("_tokenizer", "_cache")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(text, UTF-8 bytes): a token that is not whole UTF-8 (a piece of a character) is written as
        `bytes:\\xNN...`, as OpenAI does; its `bytes` are the raw bytes either way."""
        found = self._cache.get(token_id)
        if found is None:
            raw = self._tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            found = self._cache[token_id] = (text, list(raw))
        return found


@dataclass
class LogprobsView:
    """How one request's logprobs are written: the endpoint, how many alternatives, and (completions) the
    text offset reached so far."""

    chat: bool
    top: int
    texts: TokenTexts
    offset: int = 0
    _pending_ids: list[int] = field(default_factory=list)
    _pending: list[TokenLogprobs] = field(default_factory=list)

    def add(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> None:
        """Tokens whose logprobs go out with the next `take` (a stream chunk, or the whole body)."""
        self._pending_ids.extend(token_ids[: len(logprobs)])
        self._pending.extend(logprobs[: len(token_ids)])

    def take(self) -> dict[str, Any]:
        """The `logprobs` object of the tokens added since the last call."""
        ids, values = self._pending_ids, self._pending
        self._pending_ids, self._pending = [], []
        return self._chat(ids, values) if self.chat else self._completion(ids, values)

    def _chat(self, ids: list[int], values: list[TokenLogprobs]) -> dict[str, Any]:
        texts, top = self.texts, self.top
        content = []
        for token_id, lp in zip(ids, values, strict=True):
            text, raw = texts(token_id)
            alternatives = []
            for other, value in zip(lp.top_ids[:top], lp.top_logprobs[:top], strict=True):
                other_text, other_raw = texts(other)
                alternatives.append({"token": other_text, "logprob": _finite(value), "bytes": other_raw})
            entry = {
                "token": text,
                "logprob": _finite(lp.logprob),
                "bytes": raw,
                "top_logprobs": alternatives,
            }
            content.append(entry)
        return {"content": content, "refusal": None}

    def _completion(self, ids: list[int], values: list[TokenLogprobs]) -> dict[str, Any]:
        texts, top = self.texts, self.top
        tokens: list[str] = []
        token_logprobs: list[float] = []
        top_logprobs: list[dict[str, float]] = []
        offsets: list[int] = []
        for token_id, lp in zip(ids, values, strict=True):
            text = texts(token_id)[0]
            tokens.append(text)
            token_logprobs.append(_finite(lp.logprob))
            ranked = {
                texts(o)[0]: _finite(v) for o, v in zip(lp.top_ids[:top], lp.top_logprobs[:top], strict=True)
            }
            ranked.setdefault(text, _finite(lp.logprob))  # the sampled token is always there
            top_logprobs.append(ranked)
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }


_TEXTS: weakref.WeakKeyDictionary[Tokenizer, TokenTexts] = weakref.WeakKeyDictionary()


def logprobs_view(chat: bool, count: int | None, tokenizer: Tokenizer) -> LogprobsView | None:
    """The view of a request that asked for `count` alternatives per token (None: no logprobs); token
    texts are shared by every request of the same tokenizer."""
    if count is None:
        return None
    texts = _TEXTS.get(tokenizer)
    if texts is None:
        texts = _TEXTS[tokenizer] = TokenTexts(tokenizer)
    return LogprobsView(chat, count, texts)
