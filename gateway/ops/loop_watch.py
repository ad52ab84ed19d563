"""`--loop-debug`: every event-loop callback that runs longer than the loop budget is logged, with its route.

The loop's own debug mode measures every callback, task steps and plain callbacks alike, and logs one over
`slow_callback_duration` as "Executing <Task ... name='...'> took 0.052 seconds" (asyncio and uvloop
both: checked with uvloop 0.23). A request's task is named after its route here, so that the line says
which route held the loop. Debug mode also records where every callback was scheduled, which slows the
loop several times over: a tool for finding what breaks the budget, off by default
(docs/gateway.md, "The event loop's budget").
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send


def watch_loop(budget_ms: float) -> None:
    """Put the running loop in debug mode, logging any callback over `budget_ms` (logger `asyncio`)."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = budget_ms / 1e3


class RouteNamedTasks:
    """ASGI middleware naming the task that serves each request "METHOD PATH request-id", for the slow
    callback log (uvicorn runs each request in a task of its own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if task is not None and scope["type"] == "http":
            request_id = scope.get("state", {}).get("request_id", "")
            task.set_name(f"{scope['method']} {scope['path']} {request_id}".rstrip())
        await self.app(scope, receive, send)
