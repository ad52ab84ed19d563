"""The limits a request must fit before it is queued: vocabulary, model context and KV capacity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.request import InvalidRequestError, PromptTooLongError, SamplingParams


@dataclass
class RequestLimits:
    """What a request must fit, as the worker's engine reported it: vocabulary, context and KV capacity."""

    vocab_size: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise the same InvalidRequestError (or subclass) LLMEngine.validate would, before anything is queued."""
        params.validate()
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]!r} is outside the vocabulary [0, {self.vocab_size})", "prompt")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise PromptTooLongError(
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds the "
                f"model context of {self.max_model_len} tokens", "max_tokens")
        if -(-total // self.block_size) > self.num_kv_blocks:
            raise PromptTooLongError(
                f"prompt + max_tokens = {total} tokens exceeds the KV cache capacity of "
                f"{self.num_kv_blocks * self.block_size} tokens", "max_tokens")
