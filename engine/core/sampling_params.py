"""How a request picks tokens and when it stops (`SamplingParams`), and the grammar its output must match,
each checked field by field so a bad value is refused naming it before it reaches the sampler."""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, field

from engine.core.errors import InvalidRequestError

# Below this temperature sampling is greedy (as vLLM does): dividing logits by a smaller number
# overflows float32, and the distribution is argmax to within rounding anyway.
GREEDY_TEMPERATURE = 1e-5
# torch.Generator.manual_seed accepts exactly the 64-bit signed and unsigned ranges.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
LOGIT_BIAS_MAX = 100.0  # OpenAI's range for logit_bias values
PENALTY_MAX = 2.0  # OpenAI's range for presence_penalty and frequency_penalty: [-2, 2]
# vLLM and transformers take any repetition_penalty > 0; at 100 a seen token is as good as banned (as by
# logit_bias's -100), and the bound keeps every penalised logit finite.
REPETITION_PENALTY_MAX = 100.0
_FLOAT_MAX = sys.float_info.max  # a float is finite exactly when it lies in [-this, this] (NaN in none)
GRAMMAR_KINDS = ("json_schema", "json_object", "lark")


@dataclass(frozen=True)
class Grammar:
    """What a request's output must match (engine/worker/grammar/): a JSON schema (text), any JSON object, or a
    Lark grammar. `field` is the request field it came from, so a compile error's 400 names it."""

    kind: str
    source: str = ""
    field: str = "response_format"
    # Tokens the grammar forces after the JSON it constrains has closed (a tool call's `}` and closing tag,
    # and the end of sequence): the closing narrowing starts that much earlier (engine/worker/grammar/closing.py).
    closing_reserve: int = 0

    @property
    def key(self) -> str:
        """The compile cache's key: identical grammars compile once (engine/worker/grammar/compiler.py)."""
        digest = hashlib.sha256(self.kind.encode())
        digest.update(b"\0")
        digest.update(self.source.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature below GREEDY_TEMPERATURE (0 included) means greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    # -- penalties and min-p, as vLLM's (engine/worker/sampling_math.py, `penalize`; docs/engine.md, "Sampling") --
    presence_penalty: float = 0.0  # subtracted once from each token the output already holds
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = (
        1.0  # divides (or multiplies, if negative) the logit of each token of prompt+output
    )
    min_p: float = 0.0  # drops tokens less likely than min_p times the most likely (after temperature)
    # False: only the first output (the request started) and the last are emitted, each carrying the
    # text since the previous one. A non-streaming caller needs nothing in between, and every skipped
    # output is a message the engine does not send and the caller does not wake up for.
    stream_outputs: bool = True
    # Constrained decoding (engine/worker/grammar/): each sampled token is masked to those the grammar allows.
    grammar: Grammar | None = None
    # -- log probabilities and several choices (engine/worker/sampler.py; docs/gateway.md) --
    # None: no logprobs; k >= 0: each sampled token's logprob and the k most likely tokens' (RequestCaps caps k).
    logprobs: int | None = None
    # Choices (completions) of one prompt: prefilled once, then forked (engine/core/scheduler.py, `Family`).
    n: int = 1

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first field the sampler could not compute with.

        Size caps (how many stop strings, bias entries) are RequestCaps' (engine/core/limits.py); vocabulary
        bounds are RequestLimits'. Together they accept exactly what the engine can serve.
        """
        # Each test takes the common exact type (int, float, list, dict) without a call, and asks the
        # helpers only otherwise: both sides (the gateway and the engine's front) validate every request.
        max_tokens, temperature, top_p, top_k = self.max_tokens, self.temperature, self.top_p, self.top_k
        if not (type(max_tokens) is int or _integer(max_tokens)) or max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens"
            )
        finite = type(temperature) is float and -_FLOAT_MAX <= temperature <= _FLOAT_MAX
        if not (finite or _finite(temperature)) or temperature < 0:
            raise InvalidRequestError(
                f"temperature must be finite and >= 0, got {temperature!r}", "temperature"
            )
        finite = type(top_p) is float and -_FLOAT_MAX <= top_p <= _FLOAT_MAX
        if not (finite or _finite(top_p)) or not 0 < top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {top_p!r}", "top_p")
        if not (type(top_k) is int or _integer(top_k)) or top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 disables), got {top_k!r}", "top_k")
        if self.seed is not None and (not _integer(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            raise InvalidRequestError(
                f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed!r}", "seed"
            )
        stop, stop_ids = self.stop, self.stop_token_ids
        if not (type(stop) is list or isinstance(stop, list)) or (
            stop and any(not isinstance(s, str) or not s for s in stop)
        ):
            raise InvalidRequestError("stop must be a list of non-empty strings", "stop")
        if not (type(stop_ids) is list or isinstance(stop_ids, list)) or (
            stop_ids and any(not _integer(t) or t < 0 for t in stop_ids)
        ):
            raise InvalidRequestError("stop_token_ids must be non-negative integers", "stop_token_ids")
        if type(self.ignore_eos) is not bool:  # bool has no subclasses
            raise InvalidRequestError("ignore_eos must be a boolean", "ignore_eos")
        if type(self.logit_bias) is not dict or self.logit_bias:
            self._validate_logit_bias()
        if self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.min_p:
            self._validate_penalties()
        if self.grammar is not None:
            self._validate_grammar(self.grammar)
        if self.logprobs is not None and (not _integer(self.logprobs) or self.logprobs < 0):
            raise InvalidRequestError(
                f"logprobs must be an integer >= 0 or absent, got {self.logprobs!r}", "logprobs"
            )
        if type(self.n) is not int or self.n != 1:
            self._validate_n()

    def _validate_n(self) -> None:
        if not _integer(self.n) or self.n < 1:
            raise InvalidRequestError(f"n must be a positive integer, got {self.n!r}", "n")

    def _validate_grammar(self, grammar: object) -> None:
        if not isinstance(grammar, Grammar) or grammar.kind not in GRAMMAR_KINDS:
            raise InvalidRequestError(f"grammar kind must be one of {GRAMMAR_KINDS}", "grammar")
        if not isinstance(grammar.source, str) or (grammar.kind != "json_object" and not grammar.source):
            raise InvalidRequestError("a grammar needs its source text", grammar.field)
        if self.ignore_eos:  # the grammar ends the output with EOS; ignoring it would run past the grammar
            raise InvalidRequestError("ignore_eos cannot be combined with a grammar", "ignore_eos")

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -PENALTY_MAX <= value <= PENALTY_MAX:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {value!r}", name)
        rep = self.repetition_penalty
        if not _finite(rep) or not 0 < rep <= REPETITION_PENALTY_MAX:
            raise InvalidRequestError(
                f"repetition_penalty must be in (0, {REPETITION_PENALTY_MAX:g}] (1 disables), got {rep!r}",
                "repetition_penalty",
            )
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError(f"min_p must be in [0, 1] (0 disables), got {self.min_p!r}", "min_p")

    @property
    def penalized(self) -> bool:
        """Whether the logits depend on the tokens so far (presence, frequency or repetition penalty)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def _validate_logit_bias(self) -> None:
        if not isinstance(self.logit_bias, dict):
            raise InvalidRequestError("logit_bias must map token ids to numbers", "logit_bias")
        for token, bias in self.logit_bias.items():
            if not _integer(token) or token < 0:
                raise InvalidRequestError(f"logit_bias key {token!r} is not a token id", "logit_bias")
            if not _finite(bias) or abs(bias) > LOGIT_BIAS_MAX:
                raise InvalidRequestError(
                    f"logit_bias values must be in [-100, 100], got {bias!r}", "logit_bias"
                )

    @property
    def greedy(self) -> bool:
        """True when sampling degenerates to argmax."""
        return self.temperature < GREEDY_TEMPERATURE


def _integer(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
