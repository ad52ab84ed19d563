"""Streaming detokenizers: output ids in, text deltas out, whose concatenation equals the full decode.

`Tokenizer.detokenizer` (engine/core/tokenizer.py) picks one per request: DecodeStream's for most prompts, the
window decoder for a prompt that ends inside a character.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import tokenizers

# Prompt tokens kept as left context when detokenizing, so tokenizers that drop a leading space
# at the start of a decode (SentencePiece "▁") still produce the right first output character.
DETOK_CONTEXT = 5


class Decoding(Protocol):
    """What a detokenizer reads of engine/core/tokenizer.py's `Tokenizer`, typed here by its shape: tokenizer.py
    builds the detokenizers, so this module imports nothing of it back (the import contract "detokenizer
    below tokenizer", pyproject.toml)."""

    @property
    def _tk(self) -> tokenizers.Tokenizer:
        """The `tokenizers` tokenizer itself: DecodeStream steps through it."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; incomplete UTF-8 sequences become U+FFFD."""


class IncrementalDetokenizer:
    """Turns a stream of output ids into text deltas whose concatenation equals the full decode.

    Text ending in U+FFFD (a multi-byte character split across tokens) is held back until the
    next token completes it; `finish()` releases whatever is still held.

    Each token goes through `tokenizers`' DecodeStream (one call into Rust: 0.9 us a token here, against
    1.7 us for the pair of window decodes per push of WindowDetokenizer), which holds back the same incomplete
    characters. DecodeStream has no end, though: a character still incomplete when the request ends
    would never come out. So the ids it holds are tracked here, and `finish()` decodes them after the
    ids of the last delta, as the window decode did, releasing U+FFFD like a full decode does.
    """

    __slots__ = ("_tk", "_stream", "_tail", "_pending", "_held")

    def __init__(self, tokenizer: Decoding, prompt_ids: Sequence[int]) -> None:
        self._tk = tokenizer._tk
        context = list(prompt_ids[-DETOK_CONTEXT:])
        self._stream = tokenizers.decoders.DecodeStream(ids=context, skip_special_tokens=True)
        self._tail = context  # the ids of the last text released: left context for finish()
        self._pending: list[int] = []  # ids the stream holds (no text yet)
        self._held = ""  # text the stream gave that waits for the pending ids (see push)

    def push(self, new_ids: Sequence[int]) -> str:
        """Append new output ids; return the text they complete (possibly empty)."""
        step, tk, pending = self._stream.step, self._tk, self._pending
        out = ""
        for token_id in new_ids:
            chunk = step(tk, token_id)
            if chunk is None:
                pending.append(token_id)
                continue
            if pending:
                pending.append(token_id)
                self._tail, self._pending = pending, []
                pending = self._pending
            else:
                self._tail = [token_id]
            out += chunk
        if (
            pending
            and (out or self._held)
            and tk.decode(pending, skip_special_tokens=True).endswith("\ufffd")
        ):
            # Several ids whose last ones are an incomplete character: the text of the whole push waits for
            # it, as it did when each push was decoded as one window (the deltas stay what they were).
            self._held += out
            return ""
        out, self._held = self._held + out, ""
        return out

    def finish(self) -> str:
        """Release held-back text at the end of the request (U+FFFD for a truly incomplete character)."""
        delta, self._held = self._held, ""
        if self._pending:
            before = self._tk.decode(self._tail, skip_special_tokens=True)
            after = self._tk.decode(self._tail + self._pending, skip_special_tokens=True)
            self._tail, self._pending = self._tail + self._pending, []
            delta += after[len(before) :] if len(after) > len(before) else ""
        return str(delta)


class WindowDetokenizer:
    """Incremental detokenization by decoding a window of ids twice per push (the engine's original method).

    Kept for prompts that end inside a character (see `Tokenizer.detokenizer`); same interface and
    behaviour as IncrementalDetokenizer otherwise, at four times its cost per token.
    """

    def __init__(self, tokenizer: Decoding, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-DETOK_CONTEXT:])
        self._prefix_offset = 0  # start of the decode window (context tokens)
        self._read_offset = len(self._ids)  # tokens before this are already emitted

    def push(self, new_ids: Sequence[int]) -> str:
        """Append new output ids; return the text they complete (possibly empty)."""
        self._ids.extend(new_ids)
        return self._emit(hold_incomplete=True)

    def finish(self) -> str:
        """Release held-back text at the end of the request (U+FFFD for a truly incomplete character)."""
        return self._emit(hold_incomplete=False)

    def _emit(self, hold_incomplete: bool) -> str:
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or (hold_incomplete and new_text.endswith("\ufffd")):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return delta


Detokenizer = IncrementalDetokenizer | WindowDetokenizer
