"""OpenAI-compatible routes: completions, chat completions, models."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.edge.auth import authenticate
from gateway.openai.generation import generation
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
    """GET /v1/models: each model the engines behind this gateway serve, the default first."""
    state: GatewayState = request.app.state.gateway
    await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": client.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "fairserve",
                    "max_model_len": client.max_model_len,
                }
                for client in served_models(state.engine)
            ],
        }
    )


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    *task_routes,
]
