"""Fairness keys: tenant, API key or end user, with fallbacks, and fairness among the chosen keys."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fairness import FairnessConfig, FairnessError, key_function, make_policy
from tests.fairness.stand_in import Job, Meta, Server


def test_key_functions_and_their_fallbacks() -> None:
    full = Job("1", Meta(tenant_id="acme", api_key_id="key-7", user="alice"))
    bare = Job("2", Meta(tenant_id="acme"))
    assert [key_function(k)(full) for k in ("tenant", "api_key", "user")] == ["acme", "key-7", "acme/alice"]
    assert [key_function(k)(bare) for k in ("tenant", "api_key", "user")] == ["acme", "acme", "acme"]
    # Users are qualified by tenant: the same user name in two tenants is two keys.
    other = Job("3", Meta(tenant_id="globex", user="alice"))
    assert key_function("user")(other) != key_function("user")(full)


def test_unknown_key_name_is_refused() -> None:
    with pytest.raises(FairnessError, match="tenant | api_key | user"):
        key_function("ip")


def served_shares(key: Any) -> dict[str, float]:
    """Serve tenant acme (users alice, bob) against tenant globex (one user), all backlogged."""
    policy: Any = make_policy(FairnessConfig(policy="vtc", key=key, priority_classes=False))
    server = Server(policy, capacity=128)
    rng = random.Random(1)
    for i in range(600):
        for tenant, user in (("acme", "alice"), ("acme", "bob"), ("globex", "carol")):
            length = rng.randint(1, 32)
            server.submit(Job(f"{user}{i}", Meta(tenant_id=tenant, user=user), length, rng.randint(1, 32)))
    for _ in range(3000):
        server.step()
    service = policy.service()
    total = sum(service.values())
    return {k: v / total for k, v in service.items()}


def test_tenant_key_splits_service_between_tenants() -> None:
    shares = served_shares("tenant")
    assert shares["acme"] == pytest.approx(0.5, abs=0.02)


def test_user_key_splits_service_between_end_users() -> None:
    shares = served_shares("user")
    assert sorted(shares) == ["acme/alice", "acme/bob", "globex/carol"]
    for share in shares.values():
        assert share == pytest.approx(1 / 3, abs=0.02)
