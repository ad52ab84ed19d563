"""The edge's refusals decided from the headers alone (EdgeMiddleware `early`), one per route family.

A generation POST whose tenant has spent its refusal budget (generation.py `refuse_spent_tenant`) and a
report GET whose tenant has spent its report budget (tasks.py `refuse_polling_tenant`) are answered 429
before their bodies are read or any route runs, held up to a second first: a client that ignores
Retry-After costs a sleeping coroutine, not a request's work, each time.
"""

from __future__ import annotations

from starlette.types import Scope

from gateway.edge.errors import APIError
from gateway.openai.generation import refuse_spent_tenant
from gateway.openai.tasks import refuse_polling_tenant


def refuse_at_door(scope: Scope) -> APIError | None:
    """The refusal for this request, if the edge can decide it from its method, path and key alone."""
    if scope["method"] == "POST":
        return refuse_spent_tenant(scope)
    if scope["method"] == "GET":
        return refuse_polling_tenant(scope)
    return None
