"""The floor bench.gateway_cpu measures the gateway against: a bare Starlette app on the same uvicorn
(uvloop + httptools), served on a free port with a banner like `fairserve serve`'s."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def floor_app() -> Starlette:
    """The floor: Starlette parsing the request's JSON and answering in the shape fairserve does."""

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
            choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}
            usage = {"prompt_tokens": 6, "completion_tokens": n, "total_tokens": 6 + n}
            return JSONResponse({**head, "choices": [choice], "usage": usage})

        async def events() -> Any:
            for i in range(n):
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


def serve_floor() -> None:
    """Run the floor on a free port, printing a banner like `fairserve serve`'s."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # connections wait in the backlog until uvicorn runs
    print(f"url: http://127.0.0.1:{sock.getsockname()[1]}\napi_key: none\nadmin_token: none", flush=True)
    uvicorn.Server(uvicorn.Config(floor_app(), loop="uvloop", http="httptools", log_level="warning")).run(
        [sock]
    )


if __name__ == "__main__":
    serve_floor()
