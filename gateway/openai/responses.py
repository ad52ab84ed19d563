"""ASGI responses that read a Run while watching for the client going away.

Starlette's StreamingResponse stops sending on disconnect but gives no hook to abort the engine
request, and a plain Response cannot notice a client that hangs up while it waits; these can.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from gateway.edge.errors import APIError, error_body
from gateway.edge.protocol import HOLD_HEAD_KEY, WATCH_HANGUP_KEY
from gateway.idempotency.records import Followed, StoredResponse
from gateway.openai.format import sse
from gateway.openai.runs import Run

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _raw(headers: Mapping[str, str], content_type: str) -> list[tuple[bytes, bytes]]:
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    out.append((b"content-type", content_type.encode()))
    return out


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


def _watch_gone(scope: Scope, receive: Receive) -> tuple[asyncio.Future[None], Callable[[], object]]:
    """A future resolved when the client goes away, and the function that stops watching.

    Under the gateway's protocol (gateway/edge/protocol.py) a callback on the connection resolves it;
    elsewhere a task awaits ASGI's `http.disconnect`.
    """
    watch: Callable[[Callable[[], None]], Callable[[], None] | None] | None = scope.get(WATCH_HANGUP_KEY)
    if watch is None:
        task = asyncio.ensure_future(_wait_disconnect(receive))
        return task, task.cancel
    gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def hung_up() -> None:
        if not gone.done():
            gone.set_result(None)

    stop = watch(hung_up)
    if stop is None:
        gone.set_result(None)
        return gone, _nothing
    return gone, stop


def _nothing() -> None:
    pass


def _hold_head(scope: Scope) -> None:
    """Under the gateway's protocol, send the next response head with the body's first write."""
    hold: Callable[[], None] | None = scope.get(HOLD_HEAD_KEY)
    if hold is not None:
        hold()


async def _send_json(send: Send, status: int, body: str, headers: Mapping[str, str], scope: Scope) -> None:
    data = body.encode()
    raw = _raw(headers, "application/json")
    raw.append((b"content-length", str(len(data)).encode()))
    _hold_head(scope)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


async def _send_error(send: Send, err: APIError, headers: Mapping[str, str], scope: Scope) -> None:
    body = json.dumps(error_body(err.status, err.message, err.code, err.param))
    await _send_json(send, err.status, body, {**headers, **err.headers}, scope)


class RunResponse:
    """Sends a Run's output (JSON once done, or SSE as it arrives); a disconnect leaves the Run."""

    def __init__(self, run: Run, headers: Mapping[str, str]) -> None:
        self.run = run
        self.headers = dict(headers)
        self._change: asyncio.Future[None] | None = None  # what the reply waits on now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self.run
        run.readers += 1
        gone, stop_watching = _watch_gone(scope, receive)
        gone.add_done_callback(self._left)  # once for the reply, not once per wait
        completed = False
        try:
            completed = await self._send(scope, send, gone)
        finally:
            gone.remove_done_callback(self._left)
            stop_watching()
            if not completed:
                run.reader_left()
            else:
                run.readers -= 1

    def _timed(self) -> dict[str, str]:
        timing = self.run.server_timing()
        return self.headers if timing is None else {**self.headers, "Server-Timing": timing}

    def _left(self, _: object) -> None:
        """The client went away: end the wait in progress."""
        change = self._change
        if change is not None and not change.done():
            change.set_result(None)

    async def _until_change(self, gone: asyncio.Future[None], chunks: int = 0) -> bool:
        """Wait for the run to change (with `chunks`: to have that many chunks, or end); False when the
        client left first."""
        if gone.done():
            return False
        self._change = change = self.run.next_change(chunks)
        await change
        return not gone.done()

    async def _send(self, scope: Scope, send: Send, gone: asyncio.Future[None]) -> bool:
        run = self.run
        if not run.spec.stream:
            while not run.done:
                if not await self._until_change(gone):
                    return False
            if run.error is not None:
                await _send_error(send, run.error, self.headers, scope)
            else:
                assert run.final is not None
                await _send_json(send, run.final.status, run.final.chunks[0], self._timed(), scope)
            return True
        # Hold the headers until the first event or an error, so a failure is still a status code.
        while not run.chunks and not run.done:
            if not await self._until_change(gone):
                return False
        if not run.chunks and run.error is not None:
            await _send_error(send, run.error, self.headers, scope)
            return True
        _hold_head(scope)  # the first events follow at once
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _raw({**self._timed(), **_SSE_HEADERS}, "text/event-stream"),
            }
        )
        # Every event that is ready goes out in one write, and the last ones with the end of the stream:
        # each write is a syscall and a wake-up of the client, the largest per-event cost here.
        sent = 0
        while True:
            source = run.final.chunks if run.final is not None else run.chunks
            # One event (a stream's middle, the common case) without a generator and a join.
            ready = sse(source[sent]) if len(source) == sent + 1 else b"".join(map(sse, source[sent:]))
            sent = len(source)
            if run.final is not None:
                await send({"type": "http.response.body", "body": ready})
                return True
            if run.error is not None:
                err = run.error
                ready += sse(json.dumps(error_body(err.status, err.message, err.code))) + sse("[DONE]")
                await send({"type": "http.response.body", "body": ready})
                return True
            if ready:
                await send({"type": "http.response.body", "body": ready, "more_body": True})
                run.delivered_chunks = max(run.delivered_chunks, sent)
            # Wait for the next event, or with events_per_write N for N of them (the end comes at once).
            while len(run.chunks) - sent < run.events_per_write and not run.done:
                if not await self._until_change(gone, sent + run.events_per_write):
                    return False


class StoredResponseSender:
    """Replays a finished idempotent response: the JSON body, or every stored SSE event."""

    def __init__(self, stored: StoredResponse, headers: Mapping[str, str]) -> None:
        self.stored = stored
        self.headers = {**stored.headers, **headers}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.stored.kind == "json":
            await _send_json(send, self.stored.status, self.stored.chunks[0], self.headers, scope)
            return
        _hold_head(scope)
        await send(
            {
                "type": "http.response.start",
                "status": self.stored.status,
                "headers": _raw({**self.headers, **_SSE_HEADERS}, "text/event-stream"),
            }
        )
        body = b"".join(sse(c) for c in self.stored.chunks)
        await send({"type": "http.response.body", "body": body})


class FollowResponse:
    """Attaches to an owner in another process through the idempotency store."""

    def __init__(
        self, followed: AsyncGenerator[Followed, None], stream: bool, headers: Mapping[str, str]
    ) -> None:
        self.followed = followed
        self.stream = stream
        self.headers = dict(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone, stop_watching = _watch_gone(scope, receive)
        try:
            await self._send(scope, send, gone)
        finally:
            stop_watching()
            with contextlib.suppress(Exception):
                await self.followed.aclose()

    async def _next(self) -> Followed:
        return await anext(self.followed)

    async def _send(self, scope: Scope, send: Send, gone: asyncio.Future[None]) -> None:
        started = False
        sent = 0
        while not gone.done():
            step: asyncio.Future[Followed] = asyncio.ensure_future(self._next())
            racing: list[asyncio.Future[Any]] = [step, gone]
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                return
            item = step.result()
            if item.abandoned:
                err = APIError(
                    409,
                    "the original request with this Idempotency-Key ended without a result; retry it",
                    "idempotency_abandoned",
                )
                if not started:
                    await _send_error(send, err, self.headers, scope)
                else:
                    await send({"type": "http.response.body", "body": b""})
                return
            if item.final is not None and not started:
                await StoredResponseSender(item.final, self.headers)(scope, _never, send)
                return
            if not self.stream:
                continue
            if not started:
                started = True
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": _raw({**self.headers, **_SSE_HEADERS}, "text/event-stream"),
                    }
                )
            chunks = item.final.chunks if item.final is not None else item.chunks
            skip = sent if item.final is not None else 0
            for chunk in chunks[skip:]:
                await send({"type": "http.response.body", "body": sse(chunk), "more_body": True})
            sent = len(chunks) if item.final is not None else sent + len(chunks)
            if item.final is not None:
                await send({"type": "http.response.body", "body": b""})
                return


async def _never() -> Message:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}
