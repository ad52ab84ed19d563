"""Admin API handlers: tenants, API keys, usage and the audit log (routes in gateway/admin/routes.py).

Every change goes through BillingStore with the admin as actor, so it lands in the audit log. A
weight or class change is pushed to the running scheduler at once, and the key cache is cleared so
this process's tenant lookups (weight, quotas, disabled) see the change on the next request.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from billing import ApiKeyInfo, Tenant
from billing.validation import TENANT_FIELDS, check_tenant_fields
from gateway.admin.http import actor, in_store, json_object, query_int, reply
from gateway.admin.live import runtime
from gateway.cli.arg_types import parse_since
from gateway.edge.errors import APIError
from gateway.state import GatewayState

EDITABLE_FIELDS = TENANT_FIELDS
CREATE_FIELDS = tuple(f for f in TENANT_FIELDS if f != "disabled")


def _fields(body: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """Validate body fields one by one so a 400 names the offending field as `param`."""
    for name, value in body.items():
        if name not in allowed:
            raise APIError(
                400, f"unknown field {name!r}; allowed: {', '.join(allowed)}", "invalid_value", name
            )
        try:
            check_tenant_fields({name: value})
        except ValueError as exc:
            raise APIError(400, str(exc), "invalid_value", name) from None
    return body


async def _tenant(state: GatewayState, ref: str) -> Tenant:
    found = await in_store(state.store.get_tenant, ref)
    if found is None:
        raise APIError(404, f"no tenant {ref!r}", "tenant_not_found")
    return found


def _tenant_json(t: Tenant, active_keys: int | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": t.id,
        "name": t.name,
        "weight": t.weight,
        "priority_class": t.priority_class,
        "tokens_per_minute": t.tokens_per_minute,
        "tokens_per_day": t.tokens_per_day,
        "max_queued_requests": t.max_queued_requests,
        "cache_group": t.cache_group,
        "on_infeasible": t.on_infeasible,
        "disabled": t.disabled,
        "created_at": t.created_at,
        "updated_at": t.updated_at,
    }
    if active_keys is not None:
        row["active_keys"] = active_keys
    return row


def _key_json(k: ApiKeyInfo, names: dict[str, str]) -> dict[str, Any]:
    return {
        "id": k.id,
        "tenant_id": k.tenant_id,
        "tenant_name": names.get(k.tenant_id),
        "prefix": k.prefix,
        "name": k.name,
        "created_at": k.created_at,
        "last_used_at": k.last_used_at,
        "revoked_at": k.revoked_at,
        "revoked": k.revoked,
    }


async def _changed(request: Request, state: GatewayState, tenant_id: str) -> None:
    """After any tenant or key change: neither this process nor (with Redis) any replica keeps the old answer."""
    state.keys.invalidate()
    runtime(request).forget_tenants()
    if state.key_events is not None:
        await asyncio.to_thread(state.key_events.publish, tenant_id)


# -- tenants ----------------------------------------------------------------------------------------


async def list_tenants(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/tenants: every tenant with its count of active keys."""
    tenants = await in_store(state.store.list_tenants)
    keys = await in_store(state.store.list_keys)
    active: dict[str, int] = {}
    for k in keys:
        if not k.revoked:
            active[k.tenant_id] = active.get(k.tenant_id, 0) + 1
    return reply({"tenants": [_tenant_json(t, active.get(t.id, 0)) for t in tenants]})


async def create_tenant(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/tenants {name, weight?, priority_class?, quotas?, max_queued_requests?} → 201."""
    body = _fields(await json_object(request), CREATE_FIELDS)
    if "name" not in body:
        raise APIError(400, "name is required", "invalid_value", "name")
    tenant = await in_store(state.store.create_tenant, actor=actor(request), **body)
    await asyncio.to_thread(state.tenant_watch.apply)  # known here at once, as a change would be
    await _changed(request, state, tenant.id)
    state.metrics.labels.learn(tenant.id, tenant.name)
    return reply(_tenant_json(tenant, 0), 201)


async def get_tenant(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/tenants/{tenant}: one tenant by id or name."""
    return reply(_tenant_json(await _tenant(state, request.path_params["tenant"])))


async def _update(request: Request, state: GatewayState, fields: dict[str, Any]) -> Response:
    ref = request.path_params["tenant"]
    before = await _tenant(state, ref)
    after = await in_store(state.store.update_tenant, before.id, actor=actor(request), **fields)
    pushed = (after.weight, after.priority_class) != (before.weight, before.priority_class)
    # The one path of every tenant change (gateway/tenant_watch.py), run now rather than at the next poll:
    # a changed weight reaches the scheduler's policy for requests not yet admitted and for service
    # charged from now on; other gateways apply it at their next read of the table.
    await asyncio.to_thread(state.tenant_watch.apply)
    await _changed(request, state, after.id)
    if after.name != before.name:
        state.refresh_tenant_labels(force=True)
    return reply({**_tenant_json(after), "engine_updated": pushed})


async def update_tenant(request: Request, state: GatewayState) -> Response:
    """PATCH /admin/api/tenants/{tenant}: change weight, class, quotas, queue bound, name or disabled."""
    body = _fields(await json_object(request), EDITABLE_FIELDS)
    if not body:
        raise APIError(
            400, f"nothing to change; send one or more of: {', '.join(EDITABLE_FIELDS)}", "invalid_value"
        )
    return await _update(request, state, body)


async def disable_tenant(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/tenants/{tenant}/disable: its keys stop authenticating (in-flight requests finish)."""
    return await _update(request, state, {"disabled": True})


async def enable_tenant(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/tenants/{tenant}/enable."""
    return await _update(request, state, {"disabled": False})


# -- keys -------------------------------------------------------------------------------------------


async def _names(state: GatewayState) -> dict[str, str]:
    return {t.id: t.name for t in await in_store(state.store.list_tenants)}


async def list_keys(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/keys[?tenant=T] or /admin/api/tenants/{tenant}/keys: keys without their secrets."""
    ref = request.path_params.get("tenant") or request.query_params.get("tenant") or None
    if ref is not None:
        ref = (await _tenant(state, ref)).id
    keys = await in_store(state.store.list_keys, ref)
    names = await _names(state)
    return reply({"keys": [_key_json(k, names) for k in keys]})


async def create_key(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/tenants/{tenant}/keys {name?} → 201 with the secret, shown this once only."""
    body = await json_object(request)
    unknown = sorted(set(body) - {"name"})
    if unknown:
        raise APIError(400, f"unknown field {unknown[0]!r}; allowed: name", "invalid_value", unknown[0])
    name = body.get("name", "default")
    if not isinstance(name, str) or not name.strip() or len(name) > 128:
        raise APIError(
            400, "key name must be a non-empty string of at most 128 characters", "invalid_value", "name"
        )
    tenant = await _tenant(state, request.path_params["tenant"])
    secret, info = await in_store(state.store.create_key, tenant.id, name=name, actor=actor(request))
    return reply({"secret": secret, "key": _key_json(info, {tenant.id: tenant.name})}, 201)


async def revoke_key(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/keys/{key}/revoke (key id or display prefix); idempotent."""
    info = await in_store(state.store.revoke_key, request.path_params["key"], actor=actor(request))
    await _changed(request, state, info.tenant_id)
    return reply(_key_json(info, await _names(state)))


# -- usage and audit --------------------------------------------------------------------------------


def _when(request: Request, name: str, now: datetime) -> datetime | None:
    text = request.query_params.get(name)
    if not text:
        return None
    try:
        return parse_since(text, now)
    except argparse.ArgumentTypeError as exc:
        raise APIError(400, f"{name}: {exc}", "invalid_value", name) from None


async def usage(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/usage?window=1h | since=&until= [&tenant=]: ledger totals per tenant.

    Requests by status, tokens by kind and charged service for requests that finished in the window.
    The ledger writes behind the request path, so the last half second or so may not be counted yet.
    """
    now = datetime.now(UTC)
    if request.query_params.get("window") and request.query_params.get("since"):
        raise APIError(400, "give either window or since, not both", "invalid_value", "window")
    since = _when(request, "window", now) or _when(request, "since", now)
    until = _when(request, "until", now)
    if since is None:
        since = parse_since("1h", now)
    if until is not None and until <= since:
        raise APIError(400, "until must be later than since", "invalid_value", "until")
    ref = request.query_params.get("tenant") or None
    tenant_id = (await _tenant(state, ref)).id if ref is not None else None
    rows = await in_store(state.store.usage_summary, tenant_id, since, until)
    # Wasted share per tenant (billing/tasks.py): engine tokens of cancelled requests and of attempts a retry replaced.
    wasted = {
        w.tenant_id: {**asdict(w), "wasted_share": w.wasted_share}
        for w in await in_store(state.store.wasted_share, since, until)
    }
    # Serving model and degradations per tenant (billing/degradations.py, migration 0007).
    served = {s.tenant_id: asdict(s) for s in await in_store(state.store.served_share, since, until)}
    return reply({"since": since, "until": until or now, "tenants": rows, "wasted": wasted, "served": served})


async def audit(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/audit?limit=50[&tenant=]: newest changes first (who, what, before, after, when)."""
    limit = query_int(request, "limit", 50, 1, 1000)
    ref = request.query_params.get("tenant") or None
    tenant_id = (await _tenant(state, ref)).id if ref is not None else None
    entries = await in_store(state.store.list_audit, limit, tenant_id)
    return reply({"entries": entries})
