"""A streamed chat reply as the Responses API's typed event stream.

The chat stream's events (text deltas, `tool_calls` deltas, the finish reason, the usage event) arrive one by
one; each becomes the events the official client's types define (openai.types.responses), in the order the
OpenAI API sends them:

    response.created, response.in_progress
    per text reply:  response.output_item.added (message), response.content_part.added,
                     response.output_text.delta..., response.output_text.done, response.content_part.done,
                     response.output_item.done
    per tool call:   response.output_item.added (function_call), response.function_call_arguments.delta...,
                     response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete when cut short), or `error` when the run failed.

Every event carries its `sequence_number`; each is framed with its `event:` line as well as its `data:`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from gateway.openai.responses_api import translate as tr
from gateway.openai.responses_api.schemas import ResponsesRequest

Event = dict[str, Any]


def frame(event: Event) -> bytes:
    """One server-sent event with its type as the `event:` line."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class EventStream:
    """The state of one streamed Response: its output items so far and the next sequence number."""

    def __init__(self, body: ResponsesRequest) -> None:
        self.body = body
        self.resp_id = ""
        self.chat_id = ""
        self.created = 0.0
        self.output: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.chat_usage: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None  # the Response of `response.completed` / `.incomplete`
        self._seq = 0
        self._message: int | None = None  # the open message item's output index
        self._calls: dict[int, int] = {}  # chat tool-call index -> output index
        self._open_calls: list[int] = []
        self._failed = False

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _response(self, status: str, incomplete: dict[str, str] | None = None) -> dict[str, Any]:
        # A copy: the items go on changing after this event is framed.
        output = copy.deepcopy(self.output)
        return tr.response_object(
            self.body, self.resp_id, self.created, status, output, incomplete, self.chat_usage
        )

    def chunk(self, chunk: dict[str, Any]) -> list[Event]:
        """The events of one chat stream event."""
        events: list[Event] = []
        if not self.resp_id:
            self.chat_id, self.created = chunk["id"], chunk["created"]
            self.resp_id = tr.response_id(self.chat_id)
            events.append(self._event("response.created", response=self._response("in_progress")))
            events.append(self._event("response.in_progress", response=self._response("in_progress")))
        if chunk.get("usage") is not None and not chunk.get("choices"):
            self.chat_usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                events += self._close_all()
        return events

    def _text(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._message is None:
            index = len(self.output)
            item = tr.message_item(f"msg_{self.chat_id}_{index}", "", "in_progress")
            item["content"] = []
            self.output.append(item)
            self._message = index
            events.append(
                self._event("response.output_item.added", output_index=index, item=dict(item, content=[]))
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                )
            )
        item = self.output[self._message]
        item["content"][0]["text"] += text
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._message,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call(self, call: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        fragment = call.get("function", {}).get("arguments") or ""
        index = self._calls.get(call["index"])
        if index is None:  # a call's first delta: its id and name
            events += self._close_message() + self._close_calls()
            index = self._calls[call["index"]] = len(self.output)
            item = tr.call_item(
                f"fc_{self.chat_id}_{index}", call["id"], call["function"]["name"], "", "in_progress"
            )
            self.output.append(item)
            self._open_calls.append(index)
            events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        item = self.output[index]
        if fragment:
            item["arguments"] += fragment
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=fragment,
                )
            )
        return events

    def _item_status(self) -> str:
        return "completed" if tr.status_of(self.finish_reason)[0] == "completed" else "incomplete"

    def _close_message(self) -> list[Event]:
        index = self._message
        if index is None:
            return []
        self._message = None
        item = self.output[index]
        part = item["content"][0]
        item["status"] = self._item_status() if self.finish_reason is not None else "completed"
        item_id = item["id"]
        return [
            self._event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self._event(
                "response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
            self._event("response.output_item.done", output_index=index, item=json.loads(json.dumps(item))),
        ]

    def _close_all(self) -> list[Event]:
        return self._close_message() + self._close_calls()

    def _close_calls(self) -> list[Event]:
        """Each open call done: at the reply's end, or as the next call begins (calls are generated one after
        the other, so a call is whole once the next one starts)."""
        events: list[Event] = []
        for index in self._open_calls:
            item = self.output[index]
            item["status"] = self._item_status() if self.finish_reason is not None else "completed"
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        self._open_calls = []
        return events

    def end(self) -> list[Event]:
        """The chat stream's end: `response.completed`, or `response.incomplete` when cut short (nothing more
        after a failure)."""
        if self._failed:
            return []
        events = self._close_all()
        status, incomplete = tr.status_of(self.finish_reason)
        self.final = self._response(status, incomplete)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=self.final))
        return events

    def failed(self, error: dict[str, Any]) -> list[Event]:
        """The run failed after the stream began: an `error` event, then `response.failed` carrying the
        error (nothing is stored, and no `response.completed` follows)."""
        self._failed = True
        code, message = error.get("code"), error.get("message", "the request failed")
        events = [self._event("error", code=code, message=message, param=error.get("param"))]
        if self.resp_id:
            response = self._response("failed")
            response["error"] = {"code": code or "server_error", "message": message}
            events.append(self._event("response.failed", response=response))
        return events
