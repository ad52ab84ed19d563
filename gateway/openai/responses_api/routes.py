"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

A POST passes the pipeline's door (drain, auth, shed) before its body is read, then is read here (its own
body model: a 400 names the Responses field), the stored turns of its
`previous_response_id` looked up for its tenant, and the whole request handed to the chat pipeline as the chat
body it translates to (gateway/openai/generation.py: the same context checks, admission, idempotency, ledger,
deadlines and cancel). `ResponsesReply` then rewrites what that pipeline sends: the chat JSON as a Response, a
chat stream as the typed event stream (gateway/openai/responses_api/events.py), a refusal's `param` as the
Responses field it came from. At the reply's end the response is stored for its tenant unless `store: false`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.edge.auth import authenticate
from gateway.edge.errors import APIError
from gateway.edge.middleware import BODY_KEY
from gateway.openai.body_shape import SHAPE_SCAN_BYTES, count_body
from gateway.openai.generation import door, generation
from gateway.openai.parsing import request_headers
from gateway.openai.responses_api import translate as tr
from gateway.openai.responses_api.events import EventStream, frame
from gateway.openai.responses_api.schemas import ResponsesRequest
from gateway.openai.schemas import first_error
from gateway.state import GatewayState


def _not_found(response_id: str, param: str) -> APIError:
    """The one 404 for an id this tenant has no response of: unknown, evicted, or another tenant's alike."""
    return APIError(404, f"Response with id '{response_id}' not found.", "not_found", param)


def renamed(param: str | None) -> str | None:
    """A chat field a refusal names, as the Responses field it came from (`messages.3.content` -> `input`)."""
    if param is None:
        return None
    head = param.split(".", 1)[0]
    return tr.CHAT_TO_RESPONSES.get(head, param)


def renamed_message(message: str, param: str | None) -> str:
    """A refusal's message naming the chat field of `param` as the Responses field the client sent
    ("max_completion_tokens must be >= 1" -> "max_output_tokens must be >= 1"); other words stay."""
    head = (param or "").split(".", 1)[0]
    if head not in tr.CHAT_TO_RESPONSES:
        return message
    return re.sub(rf"\b{re.escape(head)}\b", tr.CHAT_TO_RESPONSES[head], message)


def _parse(raw: bytes, cap: int) -> ResponsesRequest:
    """The body validated; 400 naming the field. A large body's items, their parts and any other field's
    entries are counted first (gateway/openai/body_shape.py), as validating costs the event loop per entry."""
    if not raw.strip():
        raise APIError(400, "request body is empty; send a JSON object", "invalid_json")
    count = count_body(raw, cap, "input") if len(raw) > SHAPE_SCAN_BYTES else None
    if count is not None:
        for name, n, what in (
            ("input", count.messages, "items"),
            ("input", count.parts, "content parts"),
            *([(count.widest[0], count.widest[1], "entries")] if count.widest else []),
        ):
            if n > cap:
                raise APIError(
                    400, f"{name} has {n} {what}; at most {cap} are allowed", "invalid_value", name
                )
    try:
        return ResponsesRequest.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise APIError(400, f"malformed JSON body: {err['msg']}", "invalid_json") from None
        if err["type"] in ("model_type", "model_attributes_type") and not err["loc"]:
            raise APIError(400, "request body must be a JSON object", "invalid_json") from None
        param, message = first_error(exc)
        raise APIError(400, message, "invalid_value", param) from None


async def create_response(request: Request) -> ASGIApp:
    """POST /v1/responses: the chat pipeline's run of the translated request, its reply translated back."""
    state: GatewayState = request.app.state.gateway
    caller = await door(request, state, request_headers(request.scope))  # drain, auth, shed: before the body
    tenant_id = caller.tenant.id
    raw = request.scope.get(BODY_KEY)
    if raw is None:
        raw = await request.body()
    try:
        body = _parse(raw, state.settings.max_chat_messages)
    except APIError:
        state.refusals.charge(tenant_id)  # refused work costs its sender, as on the chat route
        raise
    earlier: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = state.responses.get(tenant_id, body.previous_response_id)
        if stored is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        earlier = stored.turns
    turns = tr.input_turns(body)
    request.scope[BODY_KEY] = json.dumps(tr.chat_body(body, earlier, turns)).encode()
    try:
        chat_reply = await generation(request, chat=True, caller=caller)
    except APIError as err:
        err.message = renamed_message(err.message, err.param)
        err.param = renamed(err.param)
        raise
    return ResponsesReply(chat_reply, body, state, tenant_id, earlier + turns)


class ResponsesReply:
    """Sends the chat pipeline's reply as the Responses API's: whole JSON rewritten at its end, a stream event
    by event. Everything else about the reply (headers, status, the run it reads, a hang-up) is the chat
    reply's own."""

    def __init__(
        self,
        chat_reply: ASGIApp,
        body: ResponsesRequest,
        state: GatewayState,
        tenant_id: str,
        turns: list[dict[str, Any]],
    ) -> None:
        self.chat_reply = chat_reply
        self.body = body
        self.state = state
        self.tenant_id = tenant_id
        self.turns = turns

    def _store(self, response: dict[str, Any]) -> None:
        if not self.body.stored or response["status"] not in ("completed", "incomplete"):
            return
        reply = tr.output_turn(response["output"])
        turns = self.turns if reply is None else [*self.turns, reply]
        self.state.responses.put(self.tenant_id, response["id"], turns, response)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        stream: EventStream | None = None
        held: list[bytes] = []
        pending = b""

        async def translated(message: Message) -> None:
            nonlocal start, stream, pending
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                if content_type.startswith(b"text/event-stream"):
                    stream = EventStream(self.body)
                    await send(message)
                else:
                    start = message  # sent with the rewritten body, whose length it must carry
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            more = bool(message.get("more_body", False))
            if stream is None:
                held.append(message.get("body", b""))
                if not more:
                    assert start is not None
                    await self._send_whole(send, start, b"".join(held))
                return
            pending += message.get("body", b"")
            frames = pending.split(b"\n\n")
            pending = frames.pop()
            out = b"".join(self._frame(stream, f) for f in frames if f)
            await send({"type": "http.response.body", "body": out, "more_body": more})

        await self.chat_reply(scope, receive, translated)

    def _frame(self, stream: EventStream, sse: bytes) -> bytes:
        data = sse.decode().removeprefix("data: ")
        if data == "[DONE]":
            events = stream.end()
            if stream.final is not None:
                self._store(stream.final)
        else:
            event = json.loads(data)
            events = stream.failed(event["error"]) if "error" in event else stream.chunk(event)
        return b"".join(frame(e) for e in events)

    async def _send_whole(self, send: Send, start: Message, data: bytes) -> None:
        payload = json.loads(data) if data else {}
        if start["status"] == 200:
            response = tr.from_chat(self.body, payload)
            self._store(response)
            payload = response
        elif isinstance(payload.get("error"), dict):
            error = payload["error"]
            error["message"] = renamed_message(str(error.get("message", "")), error.get("param"))
            error["param"] = renamed(error.get("param"))
        body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def retrieve_response(request: Request) -> Response:
    """GET /v1/responses/{id}: the caller's tenant's stored Response, else 404 (another tenant's alike)."""
    state: GatewayState = request.app.state.gateway
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    response_id = request.path_params["response_id"]
    stored = state.responses.get(caller.tenant.id, response_id)
    if stored is None:
        raise _not_found(response_id, "response_id")
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    """DELETE /v1/responses/{id}: forget the caller's tenant's stored Response, else 404."""
    state: GatewayState = request.app.state.gateway
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    response_id = request.path_params["response_id"]
    if not state.responses.delete(caller.tenant.id, response_id):
        raise _not_found(response_id, "response_id")
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


routes = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]
