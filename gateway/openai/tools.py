"""Tools on chat completions: the tool definitions into the model's own chat template, `required` and a named
function enforced by a grammar, and the model's `<tool_call>` blocks back out as OpenAI `tool_calls`.

The call format is the Hermes one Qwen3's template teaches (and the embedded model's template uses too):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Parsing follows the facts of vLLM's hermes parser: each block's JSON gives a call (`name`, `arguments`),
the text before the first block is the content (none when empty), and a block that is not such JSON stays
text. Streaming (`ToolStream`) sends OpenAI's protocol: a call's first delta carries its `index`, `id`,
`type` and `name` with empty `arguments`, the following ones argument fragments under the same index.
"""

from __future__ import annotations

import json
import re
import uuid
from copy import deepcopy
from typing import Any

from engine.core.sampling_params import Grammar
from engine.core.tokenizer import Tokenizer
from gateway.edge.errors import APIError
from gateway.openai.schemas import ChatCompletionRequest, ChatMessage
from gateway.openai.tool_schemas import NamedToolChoice, ToolDefinition

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TAIL = "}\n" + CLOSE  # what the grammar writes after a call's arguments
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# The head of a call as the grammar writes it and models emit it: the arguments follow.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"arguments"\s*:\s*(?=\S)')


def check(body: ChatCompletionRequest) -> None:
    """400 naming `tool_choice` for a choice the tools cannot satisfy (the body models checked the rest)."""
    choice, names = body.tool_choice, {t.function.name for t in body.tools or []}
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        message = f"tool_choice names {choice.function.name!r}, which is not in tools"
        raise APIError(400, message, "invalid_value", "tool_choice")
    if choice == "required" and not names:
        raise APIError(400, "tool_choice 'required' needs tools", "invalid_value", "tool_choice")
    if body.response_format is not None and body.response_format.type != "text" and forced(body):
        message = "response_format and a required tool call both constrain the output; send one"
        raise APIError(400, message, "invalid_value", "tool_choice")


def offered(body: ChatCompletionRequest) -> list[ToolDefinition]:
    """The tools the model is shown: none with `tool_choice: "none"`, only the named one when one is named."""
    tools, choice = body.tools or [], body.tool_choice
    if choice == "none":
        return []
    if isinstance(choice, NamedToolChoice):
        return [t for t in tools if t.function.name == choice.function.name]
    return list(tools)


def forced(body: ChatCompletionRequest) -> bool:
    """True when the reply must be tool calls: `required`, or a named function."""
    return bool(body.tools) and (
        body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice)
    )


def template_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as chat templates take them (OpenAI's JSON shape), or None."""
    tools = offered(body)
    return [t.model_dump(exclude_none=True) for t in tools] or None


def template_message(message: ChatMessage, text: str | None = None) -> dict[str, Any]:
    """One message as chat templates take it: role and text (`text`, when the caller has it already), an
    assistant's tool calls, a tool's call id."""
    out: dict[str, Any] = {"role": message.role, "content": message.text() if text is None else text}
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def tool_grammar(body: ChatCompletionRequest, tokenizer: Tokenizer) -> Grammar | None:
    """For `required` or a named function, a Lark grammar that admits only calls of the offered tools with
    arguments valid against their parameters (several, newline-separated, when parallel calls are allowed).

    Its `closing_reserve` is the call's tail after the arguments (`}`, the closing tag, end of sequence) in
    the served model's own tokens: the closing narrowing (engine/worker/grammar/closing.py) starts that much
    earlier, so a call that fits at all closes within max_tokens rather than being cut inside its tag."""
    if not forced(body):
        return None
    tools = offered(body)
    lines = []
    for i, tool in enumerate(tools):
        name = tool.function.name  # [A-Za-z0-9_-] only: safe inside a Lark string
        head = json.dumps(f'{OPEN}\n{{"name": "{name}", "arguments": ')
        lines.append(f'call_{i}: {head} args_{i} "}}\\n{CLOSE}"')
        lines.append(f"args_{i}: %json {json.dumps(_arguments_schema(tool))}")
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    many = body.parallel_tool_calls is not False and not isinstance(body.tool_choice, NamedToolChoice)
    start = 'start: call ("\\n" call)*' if many else "start: call"
    reserve = len(tokenizer.encode(TAIL, add_special_tokens=False)) + 1  # + the end of sequence
    return Grammar("lark", "\n".join([start, f"call: {calls}", *lines]), "tools", closing_reserve=reserve)


def _arguments_schema(tool: ToolDefinition) -> dict[str, Any]:
    schema = deepcopy(tool.function.parameters) if tool.function.parameters is not None else {}
    schema.setdefault("type", "object")
    # Compact arguments, as response_format's JSON (engine/worker/grammar/backend.py).
    schema["x-guidance"] = {**schema.get("x-guidance", {}), "whitespace_flexible": False}
    return schema


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse(
    text: str, parallel: bool, names: tuple[str, ...] | None = None
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a whole reply; no calls leaves the text as the content. A last call cut
    short (max_tokens) is a call with the arguments it wrote (`_cut_call`; `names`: a forced reply's tools)."""
    calls: list[dict[str, Any]] = []
    first = -1
    for match in _BLOCK.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", {})
        if first < 0:
            first = match.start()
        function = {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}
        calls.append({"id": _call_id(), "type": "function", "function": function})
    end = max((m.end() for m in _BLOCK.finditer(text)), default=0)
    cut = _cut_call(text[end:], names)  # a last call cut short by max_tokens is still a call
    if cut is not None:
        if first < 0:
            first = end + max(text[end:].find(OPEN), 0)
        calls.append({"id": _call_id(), "type": "function", "function": cut})
    if names is not None:  # forced: the grammar admits nothing but calls, so no text is content
        return None, calls if parallel else calls[:1]
    if not calls:
        return text, []
    content = text[:first].strip()
    return content or None, calls if parallel else calls[:1]


def _cut_call(rest: str, names: tuple[str, ...] | None) -> dict[str, str] | None:
    """The call a reply cut short inside its last `<tool_call>` was writing: its name and what it wrote of
    the arguments (JSON cut where it was cut); None when `rest` holds no such call.

    `names` (a forced reply: required or a named function) are the offered tools: the whole reply is
    calls, so text that is only the start of the tag or of the head still names the one tool it can be."""
    at = rest.find(OPEN)
    if at >= 0:
        body = rest[at + len(OPEN) :]
    elif names is not None and rest.strip() and OPEN.startswith(rest.strip()):
        body = ""  # cut inside the tag itself
    else:
        return None
    head = _HEAD.match(body)
    if head is not None:
        return {"name": head.group(1), "arguments": _cut_arguments(body[head.end() :])}
    if names is None:
        return None
    heads = {n for n in names if _head_text(n).startswith(body) or body.startswith(_head_text(n))}
    if len(heads) != 1:  # the name was cut before it told the tools apart: nothing to call
        return None
    return {"name": heads.pop(), "arguments": ""}


def _head_text(name: str) -> str:
    """The head the tool grammar writes after the tag for `name` (tool_grammar)."""
    return f'\n{{"name": "{name}", "arguments": '


def _cut_arguments(text: str) -> str:
    """The arguments of a call without its closing tag: the JSON value, whole if it was finished (the call's
    own `}` and a part of the tag may follow it), else as far as it was written."""
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return text
    return text[:end]


class ToolStream:
    """A streamed reply's text split into content deltas and OpenAI `delta.tool_calls` entries."""

    def __init__(self, parallel: bool, names: tuple[str, ...] | None = None) -> None:
        self.parallel = parallel
        self.names = names  # a forced reply's tools (required or named): every text is a call (`_cut_call`)
        self.called = False  # a call has begun: the reply ends with finish_reason "tool_calls"
        self._buf = ""
        self._in_call = False
        self._head_sent = False
        self._sent = 0  # argument characters of the current call already sent
        self._index = -1
        self._closed = False  # parallel calls off and one call complete: the rest is dropped

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """Take the next text; return the content it releases and the tool-call deltas (merged per index)."""
        self._buf += text
        content, deltas = "", []
        while self._buf and not self._closed:
            if not self._in_call:
                released, more = self._outside(final)
                content += released
                if not more:
                    break
                continue
            released, found, more = self._inside(final)
            content += released
            deltas += found
            if not more:
                break
        if self._closed:
            self._buf = ""
        if (self.called and not content.strip()) or self.names is not None:  # forced: only calls (`parse`)
            content = ""
        return content, _merged(deltas)

    def _outside(self, final: bool) -> tuple[str, bool]:
        at = self._buf.find(OPEN)
        if at >= 0 and (self.parallel or self._index < 0):
            released, self._buf = self._buf[:at], self._buf[at + len(OPEN) :]
            self._in_call, self._head_sent, self._sent = True, False, 0
            return released, True
        cut_in_tag = self.names is not None and self._buf.strip() and OPEN.startswith(self._buf.strip())
        if final and cut_in_tag and self._index < 0:  # a forced reply cut inside its first tag
            self._buf, self._in_call, self._head_sent, self._sent = "", True, False, 0
            return "", True
        keep = 0 if final else _partial_suffix(self._buf, OPEN)
        released, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return released, False

    def _inside(self, final: bool) -> tuple[str, list[dict[str, Any]], bool]:
        """(content released, tool-call deltas, whether the buffer can move on now)."""
        buf, deltas = self._buf, []
        end = buf.find(CLOSE)
        if not self._head_sent:
            head = _HEAD.match(buf)
            if head is None:
                if end < 0 and not final:
                    return "", [], False  # the head may still come
                cut = _cut_call(OPEN + buf, self.names) if end < 0 else None
                if cut is not None:  # a forced reply cut inside its head: the one tool it can be
                    self._index += 1
                    self.called, self._buf, self._in_call = True, "", False
                    entry = {"index": self._index, "id": _call_id(), "type": "function", "function": cut}
                    return "", [entry], True
                raw = buf if end < 0 else buf[: end + len(CLOSE)]
                self._buf, self._in_call = buf[len(raw) :], False
                return OPEN + raw, [], True  # not a call: its text stays content
            self._index += 1
            self.called = self._head_sent = True
            function = {"name": head.group(1), "arguments": ""}
            deltas.append({"index": self._index, "id": _call_id(), "type": "function", "function": function})
            buf = self._buf = buf[head.end() :]
            end = buf.find(CLOSE)
        if end >= 0 or final:
            if end >= 0:
                body = buf[:end]
                brace = body.rfind("}")
                arguments = body[:brace] if brace >= 0 else body
            else:  # cut short: the arguments as far as they were written, no part of the tag
                arguments = _cut_arguments(buf)
            if len(arguments) > self._sent:
                deltas.append({"index": self._index, "function": {"arguments": arguments[self._sent :]}})
            self._buf = buf[end + len(CLOSE) :] if end >= 0 else ""
            self._in_call = False
            self._closed = not self.parallel
            return "", deltas, True
        # Everything before the last "}" is arguments: the last one may be the call's own closing brace.
        brace = buf.rfind("}")
        if brace > self._sent:
            deltas.append({"index": self._index, "function": {"arguments": buf[self._sent : brace]}})
            self._sent = brace
        return "", deltas, False


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (held back until it is decided)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _merged(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per call index in one chunk: a call's head and its first fragment together."""
    out: list[dict[str, Any]] = []
    for delta in deltas:
        if out and out[-1]["index"] == delta["index"]:
            out[-1]["function"]["arguments"] += delta["function"]["arguments"]
        else:
            out.append(delta)
    return out


def reply_stream(body: object) -> ToolStream | None:
    """The parser a chat reply's text goes through when the model was offered tools; None otherwise."""
    if not isinstance(body, ChatCompletionRequest) or not offered(body):
        return None
    names = tuple(t.function.name for t in offered(body)) if forced(body) else None
    return ToolStream(parallel=body.parallel_tool_calls is not False, names=names)
