"""OpenAI-compatible routes: completions, chat completions, models."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.edge.auth import authenticate
from gateway.edge.errors import APIError, error_response
from gateway.openai.generation import generation
from gateway.openai.responses_api.routes import routes as responses_routes
from gateway.openai.tasks import routes as task_routes
from gateway.state import GatewayState
from routing import served_models


async def completions(request: Request) -> ASGIApp:
    """POST /v1/completions."""
    return await generation(request, chat=False)


async def chat_completions(request: Request) -> ASGIApp:
    """POST /v1/chat/completions."""
    return await generation(request, chat=True)


async def models(request: Request) -> JSONResponse:
    """GET /v1/models: each model the engines behind this gateway serve, the default first, then the LoRA
    adapters the caller's key may use (public ones and its tenant's own; never another tenant's)."""
    state: GatewayState = request.app.state.gateway
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    clients = served_models(state.engine)
    data: list[dict[str, object]] = [
        {
            "id": client.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "fairserve",
            "max_model_len": client.max_model_len,
        }
        for client in clients
    ]
    base = clients[0]  # adapters run over the default model (gateway/openai/served.py)
    data += [
        {
            "id": adapter.name,
            "object": "model",
            "created": 0 if adapter.created_at is None else int(adapter.created_at.timestamp()),
            "owned_by": "fairserve" if adapter.tenant_id is None else caller.tenant.name,
            "max_model_len": base.max_model_len,
            "parent": base.model_name,
        }
        for adapter in state.adapters.listed(caller.tenant.id)
    ]
    return JSONResponse({"object": "list", "data": data})


class GenerationRoutes:
    """Pure ASGI front of the two generation routes: a POST to either runs the pipeline straight from the
    scope, its refusals (APIError) rendered here; everything else goes on to Starlette's router.

    Starlette's way to the same handler (exception middleware, router, route match, request_response,
    each with its own wrapper around `send`) is the same work for every request and every streamed event;
    the routes below stay for everything else about these paths (405 for another method). An error other
    than an APIError reaches ServerErrorMiddleware as before (a logged 500).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chat = (
            _GENERATION.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if chat is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await generation(Request(scope, receive, send), chat)
        except APIError as err:
            response = error_response(err)
        await response(scope, receive, send)


_GENERATION = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat

routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    *responses_routes,
    *task_routes,
]
