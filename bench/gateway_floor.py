"""The floor bench.gateway_cpu measures the gateway against: a bare Starlette app on the same uvicorn
(uvloop + httptools), served on a free port with a banner like `fairserve serve`'s.

    python -m bench.gateway_floor [--tick-ms MS --reply-ticks K]

With a tick it is the *waiting floor*, paced the way an engine paces a gateway: one shared timer fires
every `--tick-ms` (an engine iteration, whose report carries every running request's output), each
stream event waits for the next tick and a whole reply for `--reply-ticks` of them. The same few lines
then run after the idle waits a gateway's replies always run after, and on the shared VM code that runs
after an idle wait finds the caches cold (docs/gateway.md, "Where the CPU goes, in place").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


class Ticker:
    """One timer for every waiter: `wait(n)` returns after the n-th tick from now. A tick wakes the loop
    once for all its waiters, as one engine report wakes a gateway once for all the outputs in it."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self._next: asyncio.Future[None] | None = None

    async def wait(self, ticks: int) -> None:
        for _ in range(ticks):
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_later(self.tick_s, self._tick)
            await self._next

    def _tick(self) -> None:
        fired, self._next = self._next, None  # the next waiter arms the next tick
        if fired is not None:
            fired.set_result(None)


def floor_app(tick_s: float = 0.0, reply_ticks: int = 1) -> Starlette:
    """The floor: Starlette parsing the request's JSON and answering in the shape fairserve does; with
    `tick_s`, paced by a Ticker: a whole reply waits `reply_ticks` ticks, each stream event one."""
    ticker = Ticker(tick_s) if tick_s > 0 else None

    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        head = {
            "id": "req-0",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body["model"],
        }
        n = int(body["max_tokens"])
        if not body.get("stream"):
            if ticker is not None:
                await ticker.wait(reply_ticks)
            choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}
            usage = {"prompt_tokens": 6, "completion_tokens": n, "total_tokens": 6 + n}
            return JSONResponse({**head, "choices": [choice], "usage": usage})

        async def events() -> Any:
            for i in range(n):
                if ticker is not None:
                    await ticker.wait(1)
                choice = {
                    "index": 0,
                    "text": "x",
                    "logprobs": None,
                    "finish_reason": "length" if i == n - 1 else None,
                }
                yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def serve_floor(tick_s: float = 0.0, reply_ticks: int = 1) -> None:
    """Run the floor on a free port, printing a banner like `fairserve serve`'s."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # connections wait in the backlog until uvicorn runs
    print(f"url: http://127.0.0.1:{sock.getsockname()[1]}\napi_key: none\nadmin_token: none", flush=True)
    uvicorn.Server(
        uvicorn.Config(floor_app(tick_s, reply_ticks), loop="uvloop", http="httptools", log_level="warning")
    ).run([sock])


if __name__ == "__main__":
    flags = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    flags.add_argument("--tick-ms", type=float, default=0.0, help="the shared timer's period (0: no waits)")
    flags.add_argument("--reply-ticks", type=int, default=1, help="ticks a whole (non-streamed) reply waits")
    args = flags.parse_args()
    serve_floor(args.tick_ms / 1e3, args.reply_ticks)
