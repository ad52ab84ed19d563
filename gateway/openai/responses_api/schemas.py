"""The Responses API's request body, validated strictly at the edge like the chat body (gateway/openai/schemas.py).

Only what fairserve can serve is accepted: text input, function tools and their outputs fed back, a text
format. Images, audio and files in `input` are a 400 saying they are not supported (naming the item), and
every field OpenAI clients send with the value that means "off" (`include: []`, `truncation: "disabled"`)
is accepted so an unchanged client works.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from billing.fields import MODEL_MAX
from gateway.openai.schemas import UNSERVED_PARTS, USER_MAX_CHARS, WireInt, refuse_unserved
from gateway.openai.tool_schemas import FUNCTION_NAME

# Ids of stored responses are `resp_` and the chat reply's id (gateway/openai/responses_api/translate.py).
RESPONSE_ID_MAX = 200


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Lenient(BaseModel):
    """Items a client sends back as it received them: extra fields it got from us (ids, status,
    annotations, logprobs) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextContent(_Lenient):
    """A text part: `input_text` (a user's), `output_text` (an assistant's fed back) or `text`."""

    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Lenient):
    """A message: the easy form (`role` and `content`, `type` optional) or an output message fed back."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextContent]

    def text(self) -> str:
        """The content as one string."""
        content = self.content
        return content if isinstance(content, str) else "".join(p.text for p in content)


class FunctionCallItem(_Lenient):
    """A call the model made, fed back so the next turn sees it."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=128)
    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str


class FunctionCallOutputItem(_Lenient):
    """A call's result, answering `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=128)
    output: str | list[TextContent]

    def text(self) -> str:
        """The output as one string."""
        output = self.output
        return output if isinstance(output, str) else "".join(p.text for p in output)


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(union_mode="left_to_right")
]


class FunctionTool(_Strict):
    """`tools[]`: a function (the Responses API's flat form: name and parameters at the top)."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = Field(default=None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Strict):
    """`tool_choice: {"type": "function", "name": ...}`."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)


class TextFormat(_Strict):
    """`text.format`: plain text, any JSON object, or JSON valid against a schema (constrained decoding)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if (self.type == "json_schema") != (self.schema_ is not None and self.name is not None):
            raise ValueError("name and schema are required with type 'json_schema', and only with it")
        return self


class TextConfig(_Strict):
    """`text`: its format (`verbosity` is accepted only as the default)."""

    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class ResponsesRequest(_Strict):
    """`POST /v1/responses`."""

    model: str = Field(min_length=1, max_length=MODEL_MAX)
    input: str | list[InputItem] = Field(min_length=1)
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: WireInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=RESPONSE_ID_MAX)
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=USER_MAX_CHARS)
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _served_items(cls, v: object) -> object:
        return refuse_unserved_items(v)

    @field_validator("include")
    @classmethod
    def _nothing_included(cls, v: list[str] | None) -> list[str] | None:
        if v:
            raise ValueError(f"{v[0]!r} is not supported: fairserve includes nothing extra")
        return v

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, v: list[FunctionTool] | None) -> list[FunctionTool] | None:
        names = [t.name for t in v or []]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same function name")
        return v

    @property
    def stored(self) -> bool:
        """Whether the reply is kept for `previous_response_id` (OpenAI's default: yes)."""
        return self.store is not False


def refuse_unserved_items(items: object) -> object:
    """400 for an item that is itself an image, audio or file (or an item type fairserve cannot take), named
    by its index; parts inside messages are checked by the message."""
    if isinstance(items, list):
        for i, item in enumerate(items):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind in UNSERVED_PARTS:
                raise ValueError(
                    f"item {i} has type {kind!r}, which is not supported: fairserve serves text only"
                )
            if kind is not None and kind not in ("message", "function_call", "function_call_output"):
                raise ValueError(
                    f"item {i} has type {kind!r}, which is not supported: fairserve takes messages, "
                    "function_call and function_call_output items"
                )
            inner = item.get("content", item.get("output")) if isinstance(item, dict) else None
            if isinstance(inner, list):
                try:
                    refuse_unserved(inner)
                except ValueError as exc:
                    raise ValueError(f"item {i}: {exc}") from None
    return items
