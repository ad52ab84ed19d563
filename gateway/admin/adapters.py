"""Admin API for LoRA adapters: POST/GET /admin/api/adapters, DELETE /admin/api/adapters/{name}.

Only the admin token reaches these (gateway/admin/http.py), so a tenant can neither register adapters nor
enumerate other tenants' private ones. The path is checked here (engine/worker/lora/adapter.py
`check_directory`: a PEFT directory whose rank is within `--max-lora-rank`, whose scale is finite and
bounded, whose target modules the engines adapt, `embed_tokens` and `lm_head` refused by name, and whose
weights are finite), so a broken adapter is a 400 naming `path` now rather than a failure on its first
request; the engines load the weights themselves on first use and check them again against the model. After a change the directory
is reloaded, so the next request resolves against it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from billing.adapters import AdapterExists, AdapterInfo, AdapterNotFound, TooManyAdapters
from billing.fields import MODEL_MAX
from engine.worker.lora.adapter import AdapterError, check_directory
from gateway.admin.http import actor, in_store, json_object, reply
from gateway.edge.errors import APIError
from gateway.state import GatewayState
from routing import served_models

FIELDS = ("name", "path", "tenant")
# A name is what a client puts in `model` and what the ledger stores as the request's model: letters,
# digits and . _ : - (no / : it is a path segment of DELETE), at most the ledger's model width.
NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MODEL_MAX - 1}}}")
MAX_PATH_CHARS = 4096


def adapter_json(a: AdapterInfo) -> dict[str, Any]:
    """An adapter as the API shows it; `source` says whether the config (`--lora`) or an admin made it."""
    return {
        "name": a.name,
        "path": a.path,
        "tenant_id": a.tenant_id,
        "public": a.tenant_id is None,
        "source": "config" if a.created_at is None else "admin",
        "created_at": a.created_at,
        "actor": a.actor,
    }


def _invalid(message: str, field: str) -> APIError:
    return APIError(400, message, "invalid_value", field)


def _check_name(body: dict[str, Any], state: GatewayState) -> str:
    """The new adapter's name: 400 when malformed, 409 when a model or another adapter has it."""
    name = body.get("name")
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise _invalid(
            f"name is required: 1-{MODEL_MAX} letters, digits and . _ : - (starting with a letter or digit)",
            "name",
        )
    if name in (client.model_name for client in served_models(state.engine)):
        raise APIError(409, f"{name!r} is the name of a served model", "adapter_exists", "name")
    if state.adapters.taken(name):
        raise APIError(409, f"an adapter named {name!r} is already registered", "adapter_exists", "name")
    return name


def check_path(raw: object, name: str, max_rank: int) -> str:
    """The adapter's directory: absolute, and an adapter the engines can serve (blocking: reads the whole
    adapter, so the caller runs it on a thread). 400 naming `path` otherwise."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_PATH_CHARS or not raw.isprintable():
        raise _invalid(
            f"path is required: an absolute directory path of at most {MAX_PATH_CHARS} characters", "path"
        )
    path = Path(raw)
    if not path.is_absolute():
        raise _invalid(
            f"path {raw!r} must be absolute (the engines read it, not this request's client)", "path"
        )
    if not path.is_dir() or not (path / "adapter_config.json").is_file():
        raise _invalid(f"path {raw!r} is not a PEFT adapter directory (no adapter_config.json in it)", "path")
    try:
        check_directory(name, path, max_rank)
    except AdapterError as exc:
        raise _invalid(f"path {raw!r}: {exc}", "path") from None
    return str(path)


async def _owner(body: dict[str, Any], state: GatewayState) -> str | None:
    """The owning tenant's id (`tenant` given as its id or name), None for a public adapter; 400 naming
    `tenant` when it names no tenant."""
    ref = body.get("tenant")
    if ref is None:
        return None
    if not isinstance(ref, str) or not ref:
        raise _invalid("tenant must be a tenant's id or name (omit it for a public adapter)", "tenant")
    tenant = await in_store(state.store.get_tenant, ref)
    if tenant is None:
        raise _invalid(f"no tenant {ref!r}", "tenant")
    return tenant.id


async def _in_adapter_store(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await in_store(fn, *args, **kwargs)
    except AdapterExists as exc:
        raise APIError(409, str(exc), "adapter_exists", "name") from None
    except AdapterNotFound as exc:
        raise APIError(404, str(exc), "adapter_not_found") from None
    except TooManyAdapters as exc:
        raise APIError(400, str(exc), "too_many_adapters", "name") from None


async def add_adapter(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/adapters {name, path, tenant?} → 201 with the registered adapter."""
    body = await json_object(request)
    for key in body:
        if key not in FIELDS:
            raise _invalid(f"unknown field {key!r}; allowed: {', '.join(FIELDS)}", key)
    name = _check_name(body, state)
    path = await run_in_threadpool(check_path, body.get("path"), name, state.settings.engine.max_lora_rank)
    owner = await _owner(body, state)
    registry = state.adapters
    info = await _in_adapter_store(registry.store.add, name, path, owner, actor=actor(request))
    await in_store(registry.reload)
    return reply(adapter_json(info), 201)


async def list_adapters(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/adapters: the `--lora` adapters, then every registered one, oldest first."""
    await in_store(state.adapters.reload)  # the admin sees the store, not this process's copy
    return reply({"adapters": [adapter_json(a) for a in state.adapters.all()]})


async def remove_adapter(request: Request, state: GatewayState) -> Response:
    """DELETE /admin/api/adapters/{name}: from the next request on, `model: NAME` is an unknown model
    (a request already running finishes with it); 409 for a `--lora` adapter, which the config owns."""
    name = request.path_params["name"]
    registry = state.adapters
    if name in registry.configured:
        raise APIError(
            409,
            f"adapter {name!r} comes from the server's --lora config; remove it there",
            "adapter_configured",
        )
    info = await _in_adapter_store(registry.store.remove, name, actor=actor(request))
    await in_store(registry.reload)
    return reply(adapter_json(info))
