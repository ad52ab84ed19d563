"""OpenAI request bodies for completions and chat completions, validated strictly at the edge.

Unknown fields are refused (naming the field) but the fields OpenAI clients commonly send are
accepted when they hold the value that means "feature off", so an unchanged client works.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from billing.fields import MODEL_MAX
from engine.core.sampling_params import SamplingParams
from engine.serving.boundary.messages import WIRE_INT_MAX, WIRE_INT_MIN
from gateway.openai.tool_schemas import NamedToolChoice, ToolCall, ToolDefinition

# Every integer a body can carry fits the engine's wire types (a 400 naming the field, not a 500 in the
# encoder).
WireInt = Annotated[int, Field(ge=WIRE_INT_MIN, le=WIRE_INT_MAX)]
# `user` becomes a fairness key (--fairness-key user) and a label of the engine's state: bounded like the
# ledger's identifier columns.
USER_MAX_CHARS = 128
# OpenAI's bounds: a completion's `logprobs` and a chat's `top_logprobs` (the engine's RequestCaps.max_logprobs
# may be lower; each costs a log-softmax and a top-k over the vocabulary per token, and its JSON).
COMPLETION_LOGPROBS_MAX = 5
CHAT_TOP_LOGPROBS_MAX = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    """`stream_options`: usage after the last event, and/or in every event."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


# Content part types OpenAI defines that carry what a text-only engine cannot read: a 400 saying so.
UNSERVED_PARTS = ("image_url", "input_audio", "file", "input_image", "input_file")


def refuse_unserved(parts: object) -> object:
    """A before-validator: 400 saying an image, audio or file part is not supported (naming its index), not
    pydantic's "Input should be a valid string" of the text branch."""
    if isinstance(parts, list):
        for i, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in UNSERVED_PARTS:
                raise ValueError(
                    f"content part {i} has type {kind!r}, which is not supported: fairserve serves text only"
                )
    return parts


class TextPart(_Strict):
    """One text part of a multi-part chat message content."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """A chat turn: text content, and in a tool loop the assistant's `tool_calls` and the `tool` results
    (gateway/openai/tools.py). Image, audio and file parts fail validation, and `unserved_part` then names
    them as not supported: a before-validator saying so built every message's content as Python objects
    first, a third of the validation of 2,048 one-part lists (issue 54)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Before `content`, whose check reads it (pydantic validates fields in this order).
    tool_calls: list[ToolCall] | None = None
    content: str | list[TextPart] | None = Field(default=None, validate_default=True)
    name: str | None = None
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("content")
    @classmethod
    def _content_unless_calls(
        cls, content: str | list[TextPart] | None, info: ValidationInfo
    ) -> str | list[TextPart] | None:
        # A field validator, so a missing content is named `messages.N.content`, not the whole message.
        if content is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise ValueError("content is required (null only on an assistant message with tool_calls)")
        return content

    @model_validator(mode="after")
    def _tool_fields_by_role(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        return self

    def text(self) -> str:
        """The content as one string (read once or twice per message per request: a one-part list, the usual
        list, is its part's text, with no join)."""
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return content[0].text if len(content) == 1 else "".join([p.text for p in content])


_V = TypeVar("_V")


def _off(value: _V, off: tuple[object, ...], field: str, what: str) -> _V:
    if value not in off:
        raise ValueError(f"{field}={value!r} is not supported ({what})")
    return value


class _Sampling(_Strict):
    """Fields shared by both endpoints."""

    model: str = Field(min_length=1, max_length=MODEL_MAX)
    max_tokens: WireInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: WireInt | None = None
    n: WireInt | None = None
    seed: WireInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[WireInt] | None = None
    ignore_eos: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=USER_MAX_CHARS)
    # OpenAI's penalties and vLLM's two extensions, bounded by SamplingParams.validate (a 400 naming the field).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    # Narrows prefix-cache sharing below the tenant's cache group (engine/core/kv_cache.py), as vLLM's field does.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_token_ids(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            if not key.isascii() or not key.isdigit() or len(key) > 9:
                raise ValueError(f"keys must be token ids (decimal strings), got {key[:20]!r}")
        return v

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        """SamplingParams for the engine; OpenAI defaults where the body is silent."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=16 if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=self.min_p or 0.0,
            stream_outputs=bool(self.stream),  # a whole response needs only the start and the end
            logprobs=self.engine_logprobs,
            n=1
            if self.n is None
            else self.n,  # checked with the rest by SamplingParams.validate and the caps
        )

    @property
    def engine_logprobs(self) -> int | None:
        """SamplingParams.logprobs: how many alternatives per token, None for no logprobs."""
        return None

    @property
    def include_usage(self) -> bool:
        """Whether the final stream chunk carries usage."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every stream chunk carries the usage so far."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class JsonSchemaFormat(_Strict):
    """`response_format.json_schema`: the schema the output must validate against (gateway/openai/structured.py)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """`response_format`: text, any JSON object, or JSON valid against a schema (constrained decoding)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type 'json_schema', and only with it")
        return self


class CompletionRequest(_Sampling):
    """`POST /v1/completions`."""

    prompt: str | list[WireInt] | list[str]
    logprobs: WireInt | None = None
    echo: bool = False
    best_of: WireInt | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None  # as vLLM: structured output on completions too

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int] | list[str]:
        if isinstance(v, list) and v and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("batched prompts are not supported; send one prompt per request")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs_range(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= COMPLETION_LOGPROBS_MAX:
            raise ValueError(f"logprobs must be in [0, {COMPLETION_LOGPROBS_MAX}], got {v}")
        return v

    @property
    def engine_logprobs(self) -> int | None:
        """The k most likely tokens per position (plus the sampled one), as OpenAI's legacy field."""
        return self.logprobs

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        return _off(v, (False,), "echo", "the prompt is not echoed")

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v: int | None) -> int | None:
        return _off(v, (None, 1), "best_of", "only one candidate per request")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        return _off(v, (None, ""), "suffix", "insertion is not supported")


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: WireInt | None = None
    logprobs: bool | None = None
    top_logprobs: WireInt | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_range(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not 0 <= v <= CHAT_TOP_LOGPROBS_MAX:
            raise ValueError(f"top_logprobs must be in [0, {CHAT_TOP_LOGPROBS_MAX}], got {v}")
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    @property
    def engine_logprobs(self) -> int | None:
        """`logprobs: true` asks for each token's logprob, `top_logprobs` for that many alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, v: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
        names = [t.function.name for t in v or []]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same function name")
        return v

    @property
    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` (the newer name) wins over `max_tokens`."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# Union branches and validators appear in error locations; field names are snake_case or indices.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|(list|dict|literal|function-\w+)\[.*\]|[A-Z]\w*)$")


def unserved_part(raw: bytes, exc: ValidationError) -> tuple[str, str] | None:
    """(param, message) saying an image, audio or file part is not supported when the first validation error
    is in a chat message's content and that content holds one; else None. Only on the error path: the body
    is decoded again (its size and depth already bounded) rather than every message checked on the way."""
    loc = exc.errors(include_url=False)[0]["loc"]
    if len(loc) < 3 or loc[0] != "messages" or not isinstance(loc[1], int) or loc[2] != "content":
        return None
    try:
        message = json.loads(raw)["messages"][loc[1]]
        refuse_unserved(message.get("content") if isinstance(message, dict) else None)
    except ValueError as refused:  # json.JSONDecodeError is one too: then the body's error stands
        if isinstance(refused, json.JSONDecodeError):
            return None
        param = f"messages.{loc[1]}.content"
        return param, f"Invalid value for '{param}': {refused}"
    except (LookupError, TypeError):
        return None
    return None


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(param, message) for the first validation error, the param as a dotted path."""
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"] if not _UNION_TAG.match(str(p))]
    param = ".".join(loc) or None
    kind = err["type"]
    if kind == "extra_forbidden":
        return param or "body", f"Unrecognized request argument supplied: {param}"
    if kind == "missing":
        return param or "body", f"Missing required parameter: '{param}'"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return param or "body", f"Invalid value for '{param}': {msg}" if param else msg
