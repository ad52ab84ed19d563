"""Admin API for public prompt prefixes: POST/GET /admin/api/prefixes, DELETE /admin/api/prefixes/{ref}.

Only the admin token reaches these (gateway/admin/http.py: 401 without a token, 403 with a tenant's key),
so a tenant can neither register nor enumerate public prefixes. A prefix is registered as `text`
(tokenised here exactly as a /v1/completions prompt is) or as `token_ids`, for a model this gateway
serves. After a change the index is reloaded, so the next request is matched against it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from billing.prefixes import (
    MAX_NAME_LENGTH,
    MAX_PREFIX_TOKENS,
    PrefixExists,
    PrefixInfo,
    PrefixNotFound,
    TooManyPrefixes,
)
from gateway.admin.http import actor, in_store, json_object, reply
from gateway.edge.errors import APIError
from gateway.state import GatewayState

FIELDS = ("model", "name", "text", "token_ids")
MAX_TEXT_CHARS = 256 * 1024
TOKEN_ID_MAX = 2**31 - 1


def prefix_json(p: PrefixInfo) -> dict[str, Any]:
    """A registered prefix as the API shows it (its token count, not its ids)."""
    return {
        "id": p.id,
        "model": p.model,
        "name": p.name,
        "text": p.text,
        "tokens": len(p.token_ids),
        "created_at": p.created_at,
    }


def _invalid(message: str, field: str) -> APIError:
    return APIError(400, message, "invalid_value", field)


def _check_body(body: dict[str, Any], state: GatewayState) -> tuple[str, str]:
    """(model, name) of a well-formed body; 400 naming the first bad field."""
    for key in body:
        if key not in FIELDS:
            raise _invalid(f"unknown field {key!r}; allowed: {', '.join(FIELDS)}", key)
    model, name = body.get("model"), body.get("name")
    if not isinstance(model, str) or not model:
        raise _invalid("model is required (a string)", "model")
    if model != state.engine.model_name:
        raise _invalid(
            f"model {model!r} is not served here; this server serves {state.engine.model_name!r}", "model"
        )
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH or not name.isprintable():
        raise _invalid(f"name is required: 1-{MAX_NAME_LENGTH} printable characters", "name")
    if ("text" in body) == ("token_ids" in body):
        raise _invalid("give exactly one of text and token_ids", "text")
    return model, name


def _token_ids(body: dict[str, Any], state: GatewayState) -> list[int]:
    """The prefix's token ids: the given ones checked, or the text tokenised as a completions prompt is."""
    if "text" in body:
        text = body["text"]
        if not isinstance(text, str) or not text or len(text) > MAX_TEXT_CHARS:
            raise _invalid(f"text must be a non-empty string of at most {MAX_TEXT_CHARS} characters", "text")
        ids = state.engine.tokenizer.encode(text)
        field = "text"
    else:
        ids = body["token_ids"]
        field = "token_ids"
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= TOKEN_ID_MAX for t in ids
        ):
            raise _invalid("token_ids must be a list of non-negative integer token ids", field)
    limit = min(MAX_PREFIX_TOKENS, state.engine.max_model_len - 1)
    if not 2 <= len(ids) <= limit:
        raise _invalid(f"a public prefix must be 2-{limit} tokens, got {len(ids)}", field)
    return list(ids)


async def _in_prefix_store(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await in_store(fn, *args, **kwargs)
    except PrefixExists as exc:
        raise APIError(409, str(exc), "prefix_exists", "name") from None
    except PrefixNotFound as exc:
        raise APIError(404, str(exc), "prefix_not_found") from None
    except TooManyPrefixes as exc:
        raise APIError(400, str(exc), "too_many_prefixes", "model") from None


async def add_prefix(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/prefixes {model, name, text | token_ids} → 201 with the registered prefix."""
    body = await json_object(request)
    model, name = _check_body(body, state)
    ids = await asyncio.to_thread(_token_ids, body, state)
    text = body.get("text")
    registry = state.prefixes
    info = await _in_prefix_store(registry.store.add, model, name, ids, text, actor=actor(request))
    await asyncio.to_thread(registry.reload)
    return reply(prefix_json(info), 201)


async def list_prefixes(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/prefixes[?model=]: every registered public prefix, oldest first."""
    model = request.query_params.get("model") or None
    prefixes = await _in_prefix_store(state.prefixes.store.list, model)
    return reply({"prefixes": [prefix_json(p) for p in prefixes]})


async def remove_prefix(request: Request, state: GatewayState) -> Response:
    """DELETE /admin/api/prefixes/{ref}[?model=]: unregister by id or name; its blocks stop being shared
    from the next request on (cached ones age out of the pool like any freed block)."""
    model = request.query_params.get("model") or None
    registry = state.prefixes
    info = await _in_prefix_store(
        registry.store.remove, request.path_params["ref"], model, actor=actor(request)
    )
    await asyncio.to_thread(registry.reload)
    return reply(prefix_json(info))
