"""Edge ASGI middleware: request ids on every response, and a hard cap on request body size."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from billing.fields import REQUEST_ID_MAX
from gateway.edge.errors import APIError, error_body

EARLY_REFUSAL_HOLD_S = 1.0
_VALID_ID = re.compile(rf"^[A-Za-z0-9._:\-]{{1,{REQUEST_ID_MAX}}}$")


def new_request_id() -> str:
    """A fresh request id."""
    return "req-" + uuid.uuid4().hex


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
        # A refusal decided from the headers alone (a tenant whose refusal budget is spent): answered with
        # `Connection: close` before any of the body is read.
        self.early = early

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"").decode("latin-1").strip()
        request_id = given if _VALID_ID.match(given) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        scope["state"]["request_id_chosen"] = request_id == given  # the client's own id, not one made here
        id_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                # A replayed or attached response names the original request; others get this one's id.
                if not any(k.lower() == b"x-request-id" for k, _ in raw):
                    message = {**message, "headers": [*raw, id_header]}
            await send(message)

        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send_with_id)
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send_with_id)
            return
        refusal = self.early(scope) if self.early is not None else None
        if refusal is not None:
            # Held for up to a second first (a tarpit): a client that ignores Retry-After and resends at
            # once costs a sleeping coroutine per second, not a request's CPU each time.
            await asyncio.sleep(min(float(refusal.headers.get("Retry-After", "1")), EARLY_REFUSAL_HOLD_S))
            await self._refuse(send_with_id, refusal)
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
        body = b"".join(chunks)
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
