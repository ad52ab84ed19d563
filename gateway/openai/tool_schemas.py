"""OpenAI's tool shapes on chat completions: tool definitions, tool_choice, and the tool calls an assistant
message carries back (a tool loop sends them again). Strict like every body model: a malformed definition
is a 400 naming its field (e.g. `tools.0.function.name`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# OpenAI's rule for a function name; it is also spliced into the tool-call grammar (gateway/openai/tools.py).
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionDefinition(_Strict):
    """`tools[].function`: a name, what it does, and its arguments' JSON schema (an object schema)."""

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = Field(default=None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("a function's parameters must be a JSON schema of type 'object'")
        return v


class ToolDefinition(_Strict):
    """One entry of `tools`."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    """`tool_choice.function` / a tool call's function name."""

    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(_Strict):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: that function must be called."""

    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Strict):
    """The function of an assistant message's tool call: its name and its arguments as JSON text."""

    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str


class ToolCall(_Strict):
    """One of an assistant message's `tool_calls`, as a client sends it back in a tool loop."""

    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"]
    function: CalledFunction
