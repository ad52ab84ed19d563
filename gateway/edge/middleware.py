"""Edge ASGI middleware: request ids on every response, and a hard cap on request body size."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from billing.fields import REQUEST_ID_MAX
from gateway.edge.errors import APIError, error_body

EARLY_REFUSAL_HOLD_S = 1.0
_VALID_ID = re.compile(rf"^(?!\.{{1,2}}$)[A-Za-z0-9._:\-]{{1,{REQUEST_ID_MAX}}}$")
# Where the middleware leaves the request's whole body for the generation routes (gateway/openai/context.py),
# which then read it without Starlette's body stream; every other route reads it through `receive` as usual.
BODY_KEY = "fairserve.body"
# What the access log (gateway/ops/logs.py) reads from the scope's `state` once a response has ended: the
# caller's tenant name (set once authenticated) and the run's usage (set as the run ends).
TENANT_KEY, USAGE_KEY = "access_tenant", "access_usage"


def new_request_id() -> str:
    """A fresh id, "req-" and 32 random hex digits: unguessable, and it says nothing of other tenants' traffic
    (a counter would tell a tenant how many requests others sent between two of its own). The bytes are
    `os.urandom`'s, as `secrets.token_hex` takes them, without its three Python calls; a UUID object costs
    more still."""
    return "req-" + os.urandom(16).hex()


new_engine_id = (
    new_request_id  # an engine request id names the request to every engine (a KV pull asks by it)
)


class EdgeMiddleware:
    """Assigns `X-Request-Id` (the client's if well formed), echoes it, and buffers bodies up to a limit.

    Buffering here means every route sees a body that already fits, and an oversized body is
    refused with 413 before any JSON parsing or authentication work.
    """

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, early: Callable[[Scope], APIError | None] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        # A refusal decided from the headers alone (a tenant whose refusal or report budget is spent):
        # answered with `Connection: close` before any of the body is read or any route runs.
        self.early = early

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given_raw = declared = None
        for name, value in scope["headers"]:  # one pass; uvicorn gives the names in lower case
            if name == b"x-request-id":
                given_raw = value
            elif name == b"content-length":
                declared = value
        given = given_raw.decode("latin-1").strip() if given_raw is not None else ""
        chosen = bool(given) and _VALID_ID.match(given) is not None
        request_id = given if chosen else new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["request_id_chosen"] = chosen  # the client's own id, not one made here
        # A client's id outside the alphabet: the generation routes refuse it with a 400 naming the header
        # (gateway/openai/parsing.py `identity`), so the client never holds an id it cannot cancel by.
        state["request_id_refused"] = given if given and not chosen else None
        id_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = message.get("headers", ())
                # A replayed or attached response names the original request; others get this one's id.
                if not any(k.lower() == b"x-request-id" for k, _ in raw):
                    message = {**message, "headers": [*raw, id_header]}
            await send(message)

        bodiless = scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE")
        if (
            not bodiless
            and declared is not None
            and declared.isdigit()
            and int(declared) > self.max_body_bytes
        ):
            await self._too_large(send_with_id)
            return
        refusal = self.early(scope) if self.early is not None else None
        if refusal is not None:
            # Held for up to a second first (a tarpit): a client that ignores Retry-After and resends at
            # once costs a sleeping coroutine per second, not a request's CPU each time.
            await asyncio.sleep(min(float(refusal.headers.get("Retry-After", "1")), EARLY_REFUSAL_HOLD_S))
            await self._refuse(send_with_id, refusal)
            return
        if bodiless:
            await self.app(scope, receive, send_with_id)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send_with_id)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        scope[BODY_KEY] = body
        delivered = False

        async def replay(message_source: Receive = receive) -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await message_source()

        await self.app(scope, replay, send_with_id)

    async def _too_large(self, send: Send) -> None:
        message = f"request body exceeds {self.max_body_bytes} bytes"
        await self._refuse(send, APIError(413, message, "request_too_large"))

    async def _refuse(self, send: Send, err: APIError) -> None:
        """Answer `err` and close the connection: the body it leaves unread must not be parsed as a request."""
        body = json.dumps(error_body(err.status, err.message, err.code, err.param)).encode()
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
        await send(
            {
                "type": "http.response.start",
                "status": err.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
