"""`fairserve serve` as `make serve` runs it (the engine in its worker process, the embedded model): a
required tool call and a json_schema reply come back valid through the official client, so a new user sees
both, and a schema the engine cannot enforce is a 400 from the worker's compile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.shared_params import ResponseFormatJSONSchema

from tests.gateway.serve_process import ServeProcess

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "lookup", "parameters": SCHEMA},
}


def test_tools_and_structured_outputs_on_fairserve_serve(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path)
    try:
        api = openai.OpenAI(base_url=serve.url + "/v1", api_key=serve.banner["api_key"])
        model = api.models.list().data[0].id
        messages: list[Any] = [{"role": "user", "content": "look it up"}]
        called = api.chat.completions.create(
            model=model, messages=messages, tools=[TOOL], tool_choice="required", max_tokens=100
        )
        calls = called.choices[0].message.tool_calls or []
        assert calls and all(c.type == "function" and c.function.name == "lookup" for c in calls)
        for call in calls:
            assert call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
        fmt: ResponseFormatJSONSchema = {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": SCHEMA},
        }
        reply = api.chat.completions.create(
            model=model, messages=messages, response_format=fmt, max_tokens=100
        )
        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMA)
        bad: ResponseFormatJSONSchema = {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"type": "object", "not": {}}},
        }
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(model=model, messages=messages, response_format=bad, max_tokens=5)
        assert "not" in str(refused.value)
    finally:
        serve.stop()
