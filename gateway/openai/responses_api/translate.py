"""A Responses request as the chat completion the pipeline serves, and a chat reply as a Response.

The chat body is built as JSON the chat route would accept, so everything after it (parsing, context checks,
admission, idempotency, the ledger, deadlines, cancel) is the chat pipeline's own. `instructions` become the
first system message; the input's items become turns (a run of `function_call` items one assistant message
with `tool_calls`, each `function_call_output` a `tool` message); `previous_response_id` puts the stored
turns of that response first (gateway/openai/responses_api/store.py). `max_output_tokens` is
`max_completion_tokens`, `text.format` is `response_format`, function tools are chat tools.
"""

from __future__ import annotations

from typing import Any

from gateway.openai.responses_api.schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    MessageItem,
    ResponsesRequest,
)

Turn = dict[str, Any]  # one chat message as the chat route takes it
# The chat body's fields, by the Responses field a refusal should name instead.
CHAT_TO_RESPONSES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "prompt": "input",
}


def input_turns(body: ResponsesRequest) -> list[Turn]:
    """The request's own input as chat turns (without instructions or earlier responses)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    turns: list[Turn] = []
    for item in body.input:
        if isinstance(item, MessageItem):
            turns.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = turns[-1] if turns else None
            if last is not None and last["role"] == "assistant":  # calls after (or beside) the reply's text
                last.setdefault("tool_calls", []).append(call)
            else:
                turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            turns.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return turns


def chat_body(body: ResponsesRequest, earlier: list[Turn], turns: list[Turn]) -> dict[str, Any]:
    """The chat completion request serving `body`, after the `earlier` turns of its previous response."""
    messages = (
        ([{"role": "system", "content": body.instructions}] if body.instructions else []) + earlier + turns
    )
    chat: dict[str, Any] = {"model": body.model, "messages": messages}
    if body.tools:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in body.tools
        ]
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    fmt = body.text.format if body.text is not None else None
    # A forced call's reply is calls only: the format is for a text reply, which this turn cannot have (an
    # agent with an output type sends both; the turn after the call, its choice reset to auto, answers in it).
    forced = bool(body.tools) and (choice == "required" or isinstance(choice, FunctionChoice))
    if fmt is not None and not forced:
        if fmt.type == "json_schema":
            schema = {
                "name": fmt.name,
                "schema": fmt.schema_,
                "description": fmt.description,
                "strict": fmt.strict,
            }
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {k: v for k, v in schema.items() if v is not None},
            }
        else:
            chat["response_format"] = {"type": fmt.type}
    for source, target in (
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("user", "user"),
    ):
        value = getattr(body, source)
        if value is not None:
            chat[target] = value
    if body.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the usage of `response.completed`
    return chat


def response_id(chat_id: str) -> str:
    """The Response's id from the chat reply's (the caller's request id): an idempotent replay of the same
    request keeps it."""
    return "resp_" + chat_id


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A chat `usage` as the Responses API's."""
    if chat_usage is None:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        # Prefix-cache hits are `cached_tokens`; nothing is written to a cache on request (`cache_write_tokens`).
        "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0), "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """An assistant output message of one text part."""
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """A function call output item."""
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def status_of(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details) of a Response from the chat finish reason: cut short by the token limit
    is `incomplete` (`max_output_tokens`); fairserve's own endings (deadline, cancelled) are passed through by
    name, as the chat API does."""
    if finish_reason in (None, "stop", "tool_calls"):
        return "completed", None
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "incomplete", {"reason": finish_reason}


def response_object(
    body: ResponsesRequest,
    resp_id: str,
    created: float,
    status: str,
    output: list[dict[str, Any]],
    incomplete: dict[str, str] | None = None,
    chat_usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Response: the request's settings echoed, its output items, status and usage."""
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    choice = body.tool_choice
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "model": body.model,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.stored,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "text": {
            "format": {"type": "text"} if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True)
        },
        "tool_choice": "auto"
        if choice is None
        else choice
        if isinstance(choice, str)
        else choice.model_dump(),
        "tools": [t.model_dump() for t in body.tools or []],
        "truncation": "disabled",
        "user": body.user,
        "usage": usage(chat_usage),
    }


def from_chat(body: ResponsesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion as a Response."""
    resp_id = response_id(chat["id"])
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    status, incomplete = status_of(choice["finish_reason"])
    item_status = "completed" if status == "completed" else "incomplete"
    if message.get("content"):
        output.append(message_item(f"msg_{chat['id']}", message["content"], item_status))
    for n, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        output.append(
            call_item(
                f"fc_{chat['id']}_{n}", call["id"], function["name"], function["arguments"], item_status
            )
        )
    return response_object(body, resp_id, chat["created"], status, output, incomplete, chat.get("usage"))


def output_turn(output: list[dict[str, Any]]) -> Turn | None:
    """A Response's output as the assistant turn a later request continues from (`previous_response_id`)."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in output
        if i["type"] == "function_call"
    ]
    if not text and not calls:
        return None
    turn: Turn = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = calls
    return turn
