"""`authenticate` takes the key the edge peeked at before the body was read, but never one the key cache
has invalidated since (a revocation in between is refused). Real SQLite store, real KeyCache."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from billing import BillingStore, Database, KeyCache
from gateway.edge.auth import PEEKED_KEY, authenticate, authenticate_bearer
from gateway.edge.auth_guard import FailureBudget
from gateway.edge.errors import APIError
from gateway.openai.parsing import request_headers


def _store(tmp_path: Path) -> tuple[Database, BillingStore, KeyCache]:
    db = Database(f"sqlite:///{tmp_path / 'fairserve.db'}")
    db.upgrade()
    store = BillingStore(db)
    return db, store, KeyCache(store, ttl_s=60.0)


def _scope(secret: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"authorization", f"Bearer {secret}".encode())],
        "client": ("127.0.0.1", 40000),
    }


def test_a_key_revoked_after_the_edge_peeked_is_refused(tmp_path: Path) -> None:
    db, store, keys = _store(tmp_path)
    tenant = store.create_tenant("acme")
    secret, info = store.create_key(tenant.id)
    budget = FailureBudget(20, 2.0)
    scope = _scope(secret)
    assert keys.verify(secret) is not None
    scope[PEEKED_KEY] = (secret, keys.peek(secret)[1], keys.generation)  # what the edge leaves
    hits = keys.hits
    assert asyncio.run(authenticate(Request(scope), keys, budget)).tenant.id == tenant.id
    assert keys.hits == hits  # served from the peek: the cache was not asked again
    store.revoke_key(info.id)
    keys.invalidate(secret)  # as a revocation through this process (or a key event) does
    with pytest.raises(APIError) as refused:
        asyncio.run(authenticate(Request(scope), keys, budget))
    assert refused.value.status == 401
    db.dispose()


def test_the_generation_path_reads_its_token_once_and_still_honours_an_invalidation(tmp_path: Path) -> None:
    """The pipeline's way in: the bearer token from the one-pass header read (kept in the scope by the edge),
    the peeked key taken only while no invalidation came in between."""
    db, store, keys = _store(tmp_path)
    tenant = store.create_tenant("acme")
    secret, info = store.create_key(tenant.id)
    budget = FailureBudget(20, 2.0)
    scope = _scope(secret)
    token = request_headers(scope).bearer
    assert token == secret
    assert keys.verify(secret) is not None
    scope[PEEKED_KEY] = (token, keys.peek(secret)[1], keys.generation)
    hits = keys.hits
    caller = asyncio.run(authenticate_bearer(Request(scope), request_headers(scope).bearer, keys, budget))
    assert caller.tenant.id == tenant.id and keys.hits == hits
    store.revoke_key(info.id)
    keys.invalidate(secret)
    with pytest.raises(APIError) as refused:
        asyncio.run(authenticate_bearer(Request(scope), request_headers(scope).bearer, keys, budget))
    assert refused.value.status == 401
    db.dispose()
