"""The limits a request must fit before it is queued: per-request caps, vocabulary, context and KV capacity.

`RequestCaps` is the one place the host-work caps live, with their documented defaults (docs/engine.md,
"Request caps"). They bound what one request can make the engine do on the host, outside the forward
pass that VTC charges: stop strings are matched per new token, a logit bias is applied per step, stop
token ids are looked up per token. Beyond a cap the request is refused with a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from engine.core.errors import InvalidRequestError, PromptTooLongError
from engine.core.sampling_params import SamplingParams

# The types of a prompt token id that need no per-token test: bool is an int (True is id 1) as before.
_INT_TYPES = frozenset((int, bool))


class RequestCaps(BaseModel):
    """Per-request bounds on host work; each is checked before the request is queued."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_stop_strings: int = Field(default=16, ge=0, description="stop strings per request")
    # The stop matcher's work per token is O(this).
    max_stop_chars: int = Field(default=256, ge=1, description="characters per stop string")
    max_stop_token_ids: int = Field(default=64, ge=0, description="stop_token_ids per request")
    # OpenAI documents token ids with a bias in [-100, 100].
    max_logit_bias: int = Field(default=300, ge=0, description="logit_bias entries per request")
    # Each costs a log-softmax over the vocabulary and a top-k per sampled token; OpenAI's chat allows 20.
    max_logprobs: int = Field(default=20, ge=0, description="top logprobs per sampled token")
    # Each choice is a sequence of its own: a seat, KV blocks for its output, a sampler row per step.
    max_n: int = Field(default=8, ge=1, description="choices (n) per request")
    max_prompt_bytes: int = Field(
        default=256 * 1024, ge=1, description="UTF-8 bytes of a text prompt, checked before tokenising"
    )
    # A grammar's compile and masks grow with its text (engine/worker/grammar/); JSON-schema benchmark sets stay below.
    max_grammar_chars: int = Field(
        default=128 * 1024, ge=1, description="characters of a grammar (JSON schema or Lark) per request"
    )

    def check(self, params: SamplingParams) -> None:
        """Raise InvalidRequestError naming the field that is over its cap (an empty field, the common
        case, is under every cap without a call)."""
        if params.stop and len(params.stop) > self.max_stop_strings:
            raise InvalidRequestError(
                f"stop has {len(params.stop)} strings; at most {self.max_stop_strings} are allowed", "stop"
            )
        longest = max(map(len, params.stop)) if params.stop else 0
        if longest > self.max_stop_chars:
            raise InvalidRequestError(
                f"a stop string has {longest} characters; at most {self.max_stop_chars} are allowed", "stop"
            )
        if params.stop_token_ids and len(params.stop_token_ids) > self.max_stop_token_ids:
            raise InvalidRequestError(
                f"stop_token_ids has {len(params.stop_token_ids)} entries; at most "
                f"{self.max_stop_token_ids} are allowed",
                "stop_token_ids",
            )
        if params.logit_bias and len(params.logit_bias) > self.max_logit_bias:
            raise InvalidRequestError(
                f"logit_bias has {len(params.logit_bias)} entries; at most {self.max_logit_bias} are allowed",
                "logit_bias",
            )
        grammar = params.grammar
        if grammar is not None and len(grammar.source) > self.max_grammar_chars:
            raise InvalidRequestError(
                f"the grammar has {len(grammar.source)} characters; at most {self.max_grammar_chars} are allowed",
                grammar.field,
            )

        if params.n != 1 and params.n > self.max_n:
            raise InvalidRequestError(f"n is {params.n}; at most {self.max_n} choices are allowed", "n")
        if params.logprobs is not None and params.logprobs > self.max_logprobs:
            raise InvalidRequestError(
                f"logprobs asks for {params.logprobs} top tokens; at most {self.max_logprobs} are allowed",
                "logprobs",
            )

    def check_prompt_text(self, prompt: str, field_name: str = "prompt") -> None:
        """Refuse a text prompt over the byte cap before any tokenising work is spent on it."""
        # A character is 1-4 UTF-8 bytes: encode (O(n) once) only when the length alone cannot decide.
        size = len(prompt)
        if size <= self.max_prompt_bytes < size * 4:
            size = len(prompt.encode("utf-8", "surrogatepass"))
        if size > self.max_prompt_bytes:
            raise InvalidRequestError(
                f"{field_name} is over {self.max_prompt_bytes} bytes (at least {size})", field_name
            )


@dataclass
class RequestLimits:
    """What a request must fit, as the worker's engine reported it: vocabulary, context and KV capacity."""

    vocab_size: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    caps: RequestCaps = RequestCaps()

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise the same InvalidRequestError (or subclass) LLMEngine.validate would, before anything is queued."""
        params.validate()
        self.caps.check(params)
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        self._check_prompt_ids(prompt_token_ids)
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
            if ids and not (min(ids) >= 0 and max(ids) < self.vocab_size):  # validate() proved them ints
                outside = [t for t in ids if not 0 <= t < self.vocab_size]
                raise InvalidRequestError(
                    f"{name}: token id {outside[0]} is outside the vocabulary [0, {self.vocab_size})", name
                )
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise PromptTooLongError(
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds the "
                f"model context of {self.max_model_len} tokens",
                "max_tokens",
            )
        if -(-total // self.block_size) > self.num_kv_blocks:
            raise PromptTooLongError(
                f"prompt + max_tokens = {total} tokens exceeds the KV cache capacity of "
                f"{self.num_kv_blocks * self.block_size} tokens",
                "max_tokens",
            )

    def _check_prompt_ids(self, prompt_token_ids: Sequence[int]) -> None:
        """Every prompt token id an int inside the vocabulary, in C-level passes (a type set, min, max): a
        Python test per token was most of a short request's calls. Only a refused prompt is walked in
        Python, to name its first bad id."""
        if set(map(type, prompt_token_ids)) <= _INT_TYPES and (
            min(prompt_token_ids) >= 0 and max(prompt_token_ids) < self.vocab_size
        ):
            return
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]!r} is outside the vocabulary [0, {self.vocab_size})", "prompt"
            )
