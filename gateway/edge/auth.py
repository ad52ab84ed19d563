"""Who is calling: API keys to tenants, the admin token, and the demo tenant's key on first start."""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter
from starlette.requests import Request

from billing import ApiKeyInfo, BillingStore, KeyCache, StoreUnavailable, Tenant, TenantExists
from gateway.edge.auth_guard import FailureBudget
from gateway.edge.connections import prove_connection
from gateway.edge.errors import APIError
from gateway.edge.middleware import TENANT_KEY

ADMIN_TOKEN_FILE = "admin_token"
METRICS_TOKEN_FILE = "metrics_token"
API_KEY_FILE = "api_key"
# Where the edge's pre-body check (gateway/openai/generation.py, refuse_spent_tenant) leaves the key cache's
# answer for this request's token, so `authenticate` does not hash and look the same token up again.
PEEKED_KEY = "fairserve.peeked_key"


@dataclass(frozen=True)
class Caller:
    """An authenticated tenant and the key it used."""

    tenant: Tenant
    key: ApiKeyInfo


def bearer(request: Request) -> str | None:
    """The bearer token of the Authorization header, or None."""
    return bearer_token(request.headers.get("authorization"))


def bearer_token(header: str | None) -> str | None:
    """The bearer token of an Authorization header's value (None: not sent), or None."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if not token or scheme.lower() != "bearer":
        return None
    return token


def _client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


async def authenticate(
    request: Request, keys: KeyCache, budget: FailureBudget, failures: Counter | None = None
) -> Caller:
    """The calling tenant, or 401 `invalid_api_key` (503 if the key store is down with nothing cached).

    A cached key is answered on the event loop; only a key the cache cannot answer is looked up, on a
    worker thread, and only while the client address has authentication-failure budget left (else 429
    `too_many_auth_failures` with Retry-After, before any lookup) or the key verified before (an expired
    entry is refreshed: a paying tenant sharing an address with a flood keeps working). Every failure is
    charged to the address and counted in `failures` (by outcome: missing, invalid, limited).
    """
    caller = await authenticate_bearer(request, bearer(request), keys, budget, failures)
    request.scope.setdefault("state", {})[TENANT_KEY] = caller.tenant.name  # the access log's (never a key)
    return caller


async def authenticate_bearer(
    request: Request,
    token: str | None,
    keys: KeyCache,
    budget: FailureBudget,
    failures: Counter | None = None,
) -> Caller:
    """`authenticate` with the bearer token already read (the generation routes read their headers in one
    pass, gateway/openai/parsing.py `request_headers`)."""
    peeked = request.scope.get(PEEKED_KEY)
    if token is not None and peeked is not None and peeked[0] == token and peeked[2] == keys.generation:
        known, found = True, peeked[1]  # a cached key, peeked at the edge, nothing invalidated since
    else:
        known, found = (False, None) if token is None else keys.peek(token)
    if found is not None:
        prove_connection(request.scope)
        return Caller(*found)
    address = _client_address(request)
    wait = budget.retry_after(address)
    if wait is not None and not (token is not None and keys.recently_valid(token)):
        if failures is not None:
            failures.labels("limited").inc()
        raise APIError(
            429,
            "too many failed authentications from this address",
            "too_many_auth_failures",
            headers={"Retry-After": str(wait)},
        )
    if token is not None and not known:
        try:
            found = await asyncio.to_thread(keys.verify, token)
        except StoreUnavailable:
            raise APIError(
                503, "the key store is unavailable", "store_unavailable", headers={"Retry-After": "1"}
            ) from None
    if found is not None:
        prove_connection(request.scope)
        return Caller(*found)
    budget.charge(address)
    if failures is not None:
        failures.labels("missing" if token is None else "invalid").inc()
    if token is None:
        raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", "invalid_api_key")
    raise APIError(401, "invalid API key", "invalid_api_key")


def _write_private(path: Path, text: str) -> None:
    """Write a secret file readable by the owner only (created 0600, never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, 0o600)


def _ensure_token(path: Path, prefix: str) -> str:
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = prefix + secrets.token_urlsafe(32)
    _write_private(path, token)
    return token


def ensure_admin_token(data_dir: Path) -> str:
    """The admin token stored in `data_dir`, generated on first start."""
    return _ensure_token(data_dir / ADMIN_TOKEN_FILE, "fsa-")


def ensure_metrics_token(data_dir: Path) -> str:
    """The scrape-only metrics token stored in `data_dir`, generated on first start.

    /metrics names tenants and counts their requests and tokens, so it is not open; a Prometheus server gets
    this token (it can read metrics and nothing else) rather than the admin token.
    """
    return _ensure_token(data_dir / METRICS_TOKEN_FILE, "fsm-")


def check_metrics(request: Request, metrics_token: str, admin_token: str) -> None:
    """Allow the metrics token or the admin token: 401 without credentials, 403 for any other token."""
    token = bearer(request)
    if token is None:
        raise APIError(
            401,
            "missing metrics token: send 'Authorization: Bearer <metrics_token>'",
            "invalid_metrics_token",
        )
    given = token.encode()
    # Both compared, each in constant time, so timing tells neither which token nor how much of it matched.
    ok_metrics = hmac.compare_digest(given, metrics_token.encode())
    ok_admin = hmac.compare_digest(given, admin_token.encode())
    if ok_metrics or ok_admin:
        return
    raise APIError(403, "this endpoint needs the metrics token or the admin token", "forbidden")


def check_admin(request: Request, admin_token: str) -> None:
    """Allow only the admin token: 401 without credentials, 403 for a tenant key or a wrong token."""
    token = bearer(request)
    if token is None:
        raise APIError(
            401, "missing admin token: send 'Authorization: Bearer <admin_token>'", "invalid_admin_token"
        )
    # Constant-time compare so response timing does not reveal a matching prefix.
    if hmac.compare_digest(token.encode(), admin_token.encode()):
        return
    raise APIError(403, "this endpoint needs the admin token", "forbidden")


def ensure_demo_key(store: BillingStore, data_dir: Path, tenant_name: str) -> str | None:
    """A working API key of the demo tenant, minted only on the deployment's first start.

    The key stored in `data_dir` if still valid; else a new demo tenant and key (saved 0600) when the
    database has no demo tenant yet; else None. Replicas sharing one database each have their own data
    directory, so minting whenever the file is missing gave every fresh replica another demo key.
    """
    path = data_dir / API_KEY_FILE
    if path.exists():
        secret = path.read_text().strip()
        if secret and store.verify_key(secret) is not None:
            return secret
    if store.get_tenant(tenant_name) is not None:
        return None
    try:
        tenant = store.create_tenant(tenant_name)
    except TenantExists:  # another replica's first start won the race
        return None
    secret, _info = store.create_key(tenant.id, name="demo")
    _write_private(path, secret)
    return secret
